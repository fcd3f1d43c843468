//! What a caller asks: the input, the named questions, and the request parameters.

use std::fmt;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{DecisionError, Result};
use crate::serde_util::ordered_entries;

// ---------------------------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------------------------

/// The data every question of a request is answered against.
///
/// The input is user data: its `Debug` output is redacted, and it never appears in the
/// `Debug` output of a [`DecisionRequest`]. A blank text or an empty map is rejected when the
/// request is built (or deserialized).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, try_from = "RawInput")]
pub enum DecisionInput {
    /// Plain text, for example the user's last message.
    Text(String),
    /// Ordered JSON fields, for example `{"messages": [{"role": "user", "text": "..."}]}`.
    Fields(Map<String, Value>),
}

impl DecisionInput {
    /// How a model that reads plain text sees the input.
    ///
    /// Text is returned as is. Fields are rendered in order, one per line, as
    /// `key: value` (strings raw, other values as compact JSON); a `messages` array of
    /// `{role, text}` objects becomes one `role: text` line per message instead, so a
    /// conversation reads like a transcript rather than like JSON.
    pub fn render(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Fields(fields) => {
                let mut lines = Vec::with_capacity(fields.len());
                for (key, value) in fields {
                    match (key.as_str(), transcript(value)) {
                        ("messages", Some(messages)) => lines.extend(messages),
                        _ => lines.push(format!("{key}: {}", render_value(value))),
                    }
                }
                lines.join("\n")
            }
        }
    }

    /// The text of the last `{"role": "user"}` entry of a `messages` field, if the input has
    /// one: what the user is asking now, which a model can weigh apart from the history.
    pub fn last_user_text(&self) -> Option<&str> {
        let Self::Fields(fields) = self else {
            return None;
        };
        fields
            .get("messages")?
            .as_array()?
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?
            .get("text")?
            .as_str()
    }

    fn check(&self) -> std::result::Result<(), &'static str> {
        match self {
            Self::Text(text) if text.trim().is_empty() => Err("the input text must not be blank"),
            Self::Fields(fields) if fields.is_empty() => Err("the input fields must not be empty"),
            _ => Ok(()),
        }
    }
}

/// `role: text` lines, or `None` when the value is not an array of `{role, text}` objects.
fn transcript(value: &Value) -> Option<Vec<String>> {
    value
        .as_array()?
        .iter()
        .map(|message| {
            let role = message.get("role")?.as_str()?;
            let text = message.get("text")?.as_str()?;
            Some(format!("{role}: {text}"))
        })
        .collect()
}

fn render_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl fmt::Debug for DecisionInput {
    // Only the size is shown: the content is user data and must not reach logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(text) => write!(f, "<redacted {} chars>", text.chars().count()),
            Self::Fields(fields) => write!(f, "<redacted {} fields>", fields.len()),
        }
    }
}

impl From<String> for DecisionInput {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<&str> for DecisionInput {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl From<Map<String, Value>> for DecisionInput {
    fn from(fields: Map<String, Value>) -> Self {
        Self::Fields(fields)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawInput {
    Text(String),
    Fields(Map<String, Value>),
}

impl RawInput {
    fn unchecked(self) -> DecisionInput {
        match self {
            Self::Text(text) => DecisionInput::Text(text),
            Self::Fields(fields) => DecisionInput::Fields(fields),
        }
    }
}

impl TryFrom<RawInput> for DecisionInput {
    type Error = DecisionError;

    fn try_from(raw: RawInput) -> Result<Self> {
        let input = raw.unchecked();
        input
            .check()
            .map_err(|msg| DecisionError::InvalidRequest(msg.to_owned()))?;
        Ok(input)
    }
}

// ---------------------------------------------------------------------------------------------
// Questions
// ---------------------------------------------------------------------------------------------

/// How an error message names a question: by its name when the request is known, otherwise by
/// (the start of) its text, because a question on its own has no name.
#[derive(Clone, Copy)]
enum Subject<'a> {
    Name(&'a str),
    Text(&'a str, &'static str),
}

impl<'a> Subject<'a> {
    fn new(name: Option<&'a str>, text: &'a str, kind: &'static str) -> Self {
        match name {
            Some(name) => Self::Name(name),
            None => Self::Text(text, kind),
        }
    }

    fn invalid(self, message: impl fmt::Display) -> DecisionError {
        DecisionError::InvalidRequest(format!("{self}: {message}"))
    }
}

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX_CHARS: usize = 40;
        match *self {
            Self::Name(name) => write!(f, "question '{name}'"),
            Self::Text(text, kind) if text.trim().is_empty() => write!(f, "{kind} question"),
            Self::Text(text, _) => {
                let text = text.trim();
                if text.chars().count() > MAX_CHARS {
                    let head: String = text.chars().take(MAX_CHARS).collect();
                    write!(f, "question '{head}…'")
                } else {
                    write!(f, "question '{text}'")
                }
            }
        }
    }
}

fn check_text(subject: Subject<'_>, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Err(subject.invalid("the text must not be blank"));
    }
    Ok(())
}

fn non_blank(subject: Subject<'_>, what: &str, value: String) -> Result<String> {
    if value.trim().is_empty() {
        return Err(subject.invalid(format_args!("{what} must not be blank")));
    }
    Ok(value)
}

/// Blank descriptions count as absent, so callers can pass through empty strings from config.
fn description_or_none(description: Option<String>) -> Option<String> {
    description.filter(|d| !d.trim().is_empty())
}

/// What a question is about, carried as data so that an engine can score the candidate's text
/// itself (for example a tool whose relevance is asked), instead of digging it out of the
/// question text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// A short identifier, for example a tool name.
    pub name: String,
    /// What the candidate is or does; the name when no description was given.
    pub description: String,
    /// The names of the candidate's parameters (for a tool, its arguments, in the order its
    /// schema gives them), never blank; empty when there are none or they are unknown. Whether
    /// a model reads them is the model's choice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
    /// The server or product the candidate belongs to (for an MCP tool, its server's name), never
    /// blank; `None` when unknown. Whether a model reads it is the model's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Candidate {
    /// A candidate; a blank description is replaced by the name. The name must not be blank.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.trim().is_empty() {
            return Err(DecisionError::InvalidRequest(
                "a candidate's name must not be blank".to_owned(),
            ));
        }
        let description = description.into();
        let description = if description.trim().is_empty() {
            name.clone()
        } else {
            description
        };
        Ok(Self {
            name,
            description,
            parameters: Vec::new(),
            server: None,
        })
    }

    /// The candidate with these parameter names; blank ones are left out.
    pub fn with_parameters<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.parameters = names
            .into_iter()
            .map(Into::into)
            .filter(|n| !n.trim().is_empty())
            .collect();
        self
    }

    /// The candidate with the server it belongs to; a blank name leaves it unknown.
    pub fn with_server(mut self, server: Option<impl Into<String>>) -> Self {
        self.server = server.map(Into::into).filter(|s| !s.trim().is_empty());
        self
    }
}

/// A question answered with the probability of "yes".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawYesNo")]
pub struct YesNoQuestion {
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    yes_when: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    no_when: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidate: Option<Candidate>,
}

/// The text of [`YesNoQuestion::needs_tool`], the question about a conversation as a whole
/// that a tool filter asks beside one question per tool.
pub const NEEDS_TOOL_QUESTION: &str =
    "Does answering the conversation's latest message need a call to one of the tools?";

/// Whether a conversation needs a tool, from the answer to [`YesNoQuestion::needs_tool`]
/// (`None` when the model refused it) and the probability of its most probable tool: the
/// larger of the best tool's probability and the two taken as independent evidence (their
/// log-odds added). So the answer can only raise it: a conversation the head finds in need of
/// a tool passes with a less probable best tool, and a best tool that passes on its own passes
/// whatever the head says, since a head that reads only the conversation is least sure where
/// the tools' probabilities are surest, after tool results. Without the answer it is the best
/// tool's probability.
pub fn needs_tool_probability(needs_tool: Option<f64>, best_tool: f64) -> f64 {
    let logit = |p: f64| {
        let p = p.clamp(1e-9, 1.0 - 1e-9);
        (p / (1.0 - p)).ln()
    };
    match needs_tool {
        Some(p) => best_tool.max(1.0 / (1.0 + (-(logit(p) + logit(best_tool))).exp())),
        None => best_tool,
    }
}

/// How many of the most probable candidates, the best among them, may pass from the lower bar
/// of [`COMPANION_SHARE`] once the gate is open.
pub const COMPANION_RANKS: usize = 5;

/// Once the gate is open, a candidate among the [`COMPANION_RANKS`] most probable passes when
/// its probability reaches this share of the best one's, even under the companions' bar: on a
/// catalogue the model never read, the best tool itself is often at 0.1 to 0.3, and the tools a
/// request needs beside it lower still, so a fixed bar holds them back just where the model is
/// least sure. Where the best tool is sure (above the companions' bar over this share), the
/// fixed bar is the lower one and decides alone.
pub const COMPANION_SHARE: f64 = 0.3;

/// The needs-tool gate over one conversation's candidates: its probability
/// ([`needs_tool_probability`] of `needs_tool` and `probabilities[best]`), and which candidates
/// pass. While that probability is under `min_probability` none does; once it reaches it, the
/// candidate at `best` does, with every one whose probability reaches
/// `companion_min_probability`, the bar of the tools a request needs beside its best one, and
/// every one of the [`COMPANION_RANKS`] most probable whose probability reaches
/// [`COMPANION_SHARE`] of the best one's. `best` is the caller's: its ranking decides ties, and
/// which candidates may be the best.
///
/// # Panics
///
/// If `best` is not an index of `probabilities`.
pub fn needs_tool_gate(
    needs_tool: Option<f64>,
    probabilities: &[f64],
    best: usize,
    min_probability: f64,
    companion_min_probability: f64,
) -> (f64, Vec<bool>) {
    let top = probabilities[best];
    let probability = needs_tool_probability(needs_tool, top);
    let open = probability >= min_probability;
    // The most probable first, earlier candidates first among equals, as rankings order them.
    let mut order: Vec<usize> = (0..probabilities.len()).filter(|&i| i != best).collect();
    order.sort_by(|&a, &b| {
        probabilities[b]
            .total_cmp(&probabilities[a])
            .then(a.cmp(&b))
    });
    let mut near_the_best = vec![false; probabilities.len()];
    for &i in order.iter().take(COMPANION_RANKS.saturating_sub(1)) {
        near_the_best[i] = probabilities[i] >= COMPANION_SHARE * top;
    }
    let passing = probabilities
        .iter()
        .enumerate()
        .map(|(i, &p)| open && (i == best || p >= companion_min_probability || near_the_best[i]))
        .collect();
    (probability, passing)
}

impl YesNoQuestion {
    const KIND: &'static str = "yes/no";

    /// Whether the conversation needs any tool at all: a question with [`NEEDS_TOOL_QUESTION`]
    /// as its text and nothing else. A model that reads questions (an LLM) answers it as it
    /// reads; a model that scores documents cannot, and should refuse it unless it knows the
    /// question ([`is_needs_tool`](Self::is_needs_tool)) and has a way to answer it (decide's
    /// engine answers it with a model's needs-tool head).
    pub fn needs_tool() -> Self {
        Self {
            text: NEEDS_TOOL_QUESTION.to_owned(),
            yes_when: None,
            no_when: None,
            candidate: None,
        }
    }

    /// Whether this is [`needs_tool`](Self::needs_tool)'s question.
    pub fn is_needs_tool(&self) -> bool {
        self.text == NEEDS_TOOL_QUESTION
            && self.yes_when.is_none()
            && self.no_when.is_none()
            && self.candidate.is_none()
    }

    /// A yes/no question with only a text, which must not be blank.
    pub fn new(text: impl Into<String>) -> Result<Self> {
        Self::builder(text).build()
    }

    /// Starts a yes/no question with descriptions or a candidate; see [`YesNoQuestionBuilder`].
    pub fn builder(text: impl Into<String>) -> YesNoQuestionBuilder {
        YesNoQuestionBuilder {
            text: text.into(),
            yes_when: None,
            no_when: None,
            candidate: None,
            parameters: Vec::new(),
            server: None,
        }
    }

    /// The question.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// When the answer is "yes", if the caller said.
    pub fn yes_when(&self) -> Option<&str> {
        self.yes_when.as_deref()
    }

    /// When the answer is "no", if the caller said.
    pub fn no_when(&self) -> Option<&str> {
        self.no_when.as_deref()
    }

    /// The candidate the question is about, if any.
    pub fn candidate(&self) -> Option<&Candidate> {
        self.candidate.as_ref()
    }

    fn from_parts(name: Option<&str>, parts: YesNoQuestionBuilder) -> Result<Self> {
        let YesNoQuestionBuilder {
            text,
            yes_when,
            no_when,
            candidate,
            parameters,
            server,
        } = parts;
        let subject = Subject::new(name, &text, Self::KIND);
        check_text(subject, &text)?;
        let yes_when = yes_when
            .map(|d| non_blank(subject, "yes_when", d))
            .transpose()?;
        let no_when = no_when
            .map(|d| non_blank(subject, "no_when", d))
            .transpose()?;
        let candidate = match candidate {
            None if !parameters.is_empty() => {
                return Err(subject.invalid("parameters need a candidate"));
            }
            None if server.is_some() => {
                return Err(subject.invalid("a server needs a candidate"));
            }
            None => None,
            Some((name, description)) => Some(
                Candidate::new(name, description.unwrap_or_default())
                    .map_err(|_| subject.invalid("a candidate's name must not be blank"))?
                    .with_parameters(parameters)
                    .with_server(server),
            ),
        };
        Ok(Self {
            text,
            yes_when,
            no_when,
            candidate,
        })
    }
}

/// Builds a [`YesNoQuestion`]; all checks happen in [`build`](Self::build).
#[derive(Clone, Debug)]
pub struct YesNoQuestionBuilder {
    text: String,
    yes_when: Option<String>,
    no_when: Option<String>,
    candidate: Option<(String, Option<String>)>,
    parameters: Vec<String>,
    server: Option<String>,
}

impl YesNoQuestionBuilder {
    /// Describes when the answer is "yes"; must not be blank.
    pub fn yes_when(mut self, description: impl Into<String>) -> Self {
        self.yes_when = Some(description.into());
        self
    }

    /// Describes when the answer is "no"; must not be blank.
    pub fn no_when(mut self, description: impl Into<String>) -> Self {
        self.no_when = Some(description.into());
        self
    }

    /// Attaches the candidate the question is about; see [`Candidate::new`].
    pub fn candidate(mut self, name: impl Into<String>, description: impl Into<String>) -> Self {
        self.candidate = Some((name.into(), Some(description.into())));
        self
    }

    /// The candidate's parameter names (see [`Candidate::parameters`]); a question with
    /// parameters must have a candidate.
    pub fn parameters<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.parameters = names.into_iter().map(Into::into).collect();
        self
    }

    /// The server the candidate belongs to (see [`Candidate::server`]); a question with a
    /// server must have a candidate.
    pub fn server(mut self, name: impl Into<String>) -> Self {
        self.server = Some(name.into());
        self
    }

    /// Checks the text, the descriptions (non-blank when set) and the candidate's name.
    pub fn build(self) -> Result<YesNoQuestion> {
        YesNoQuestion::from_parts(None, self)
    }
}

/// One option of a [`ChoiceQuestion`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChoiceOption {
    /// The name an answer uses to pick this option.
    pub name: String,
    /// What the option means; the name when none was given, because models decide with more
    /// confidence when every option has a description.
    pub description: String,
}

/// A question answered by picking exactly one of at least two named options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawChoice")]
pub struct ChoiceQuestion {
    text: String,
    options: Vec<ChoiceOption>,
}

impl ChoiceQuestion {
    const KIND: &'static str = "choice";

    /// Starts a choice question; add options, then [`build`](ChoiceQuestionBuilder::build).
    pub fn builder(text: impl Into<String>) -> ChoiceQuestionBuilder {
        ChoiceQuestionBuilder {
            text: text.into(),
            options: Vec::new(),
        }
    }

    /// A choice between the given option names, each described by its name.
    pub fn with_options<I, S>(text: impl Into<String>, names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        names
            .into_iter()
            .fold(Self::builder(text), |b, name| b.option(name))
            .build()
    }

    /// The question.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The options, in the order they were added.
    pub fn options(&self) -> &[ChoiceOption] {
        &self.options
    }

    /// The option names, in order.
    pub fn option_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.options.iter().map(|o| o.name.as_str())
    }

    /// The option with this name.
    pub fn option(&self, name: &str) -> Option<&ChoiceOption> {
        self.options.iter().find(|o| o.name == name)
    }

    /// Whether an option has this name.
    pub fn has_option(&self, name: &str) -> bool {
        self.option(name).is_some()
    }

    fn from_parts(
        name: Option<&str>,
        text: String,
        options: Vec<(String, Option<String>)>,
    ) -> Result<Self> {
        let subject = Subject::new(name, &text, Self::KIND);
        check_text(subject, &text)?;
        if options.len() < 2 {
            return Err(subject.invalid(format_args!(
                "a choice needs at least 2 options, got {}",
                options.len()
            )));
        }
        let mut checked: Vec<ChoiceOption> = Vec::with_capacity(options.len());
        for (name, description) in options {
            if name.trim().is_empty() {
                return Err(subject.invalid("an option name must not be blank"));
            }
            if checked.iter().any(|o| o.name == name) {
                return Err(subject.invalid(format_args!("option '{name}' is already defined")));
            }
            let description = description_or_none(description).unwrap_or_else(|| name.clone());
            checked.push(ChoiceOption { name, description });
        }
        Ok(Self {
            text,
            options: checked,
        })
    }
}

/// Builds a [`ChoiceQuestion`]; all checks happen in [`build`](Self::build).
#[derive(Clone, Debug)]
pub struct ChoiceQuestionBuilder {
    text: String,
    options: Vec<(String, Option<String>)>,
}

impl ChoiceQuestionBuilder {
    /// Adds an option described by its name.
    pub fn option(mut self, name: impl Into<String>) -> Self {
        self.options.push((name.into(), None));
        self
    }

    /// Adds an option with a description; a blank description means the name.
    pub fn option_with_description(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        self.options.push((name.into(), Some(description.into())));
        self
    }

    /// Checks the text (non-blank) and the options (at least 2, non-blank, no duplicate).
    pub fn build(self) -> Result<ChoiceQuestion> {
        ChoiceQuestion::from_parts(None, self.text, self.options)
    }
}

/// One level of a [`ScaleQuestion`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScaleLevel {
    /// The level's label, for example `"high"`.
    pub label: String,
    /// What the level means, if the caller said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A question answered on an ordered scale of at least two levels, lowest first; a level's
/// number is its index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawScale")]
pub struct ScaleQuestion {
    text: String,
    levels: Vec<ScaleLevel>,
}

impl ScaleQuestion {
    const KIND: &'static str = "scale";

    /// Starts a scale question; add levels lowest first, then [`build`](ScaleQuestionBuilder::build).
    pub fn builder(text: impl Into<String>) -> ScaleQuestionBuilder {
        ScaleQuestionBuilder {
            text: text.into(),
            levels: Vec::new(),
        }
    }

    /// A scale with the given labels, lowest first, without descriptions.
    pub fn with_levels<I, S>(text: impl Into<String>, labels: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        labels
            .into_iter()
            .fold(Self::builder(text), |b, label| b.level(label))
            .build()
    }

    /// The question.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The levels, lowest first.
    pub fn levels(&self) -> &[ScaleLevel] {
        &self.levels
    }

    /// The level labels, lowest first.
    pub fn level_labels(&self) -> impl Iterator<Item = &str> + '_ {
        self.levels.iter().map(|l| l.label.as_str())
    }

    fn from_parts(
        name: Option<&str>,
        text: String,
        levels: Vec<(String, Option<String>)>,
    ) -> Result<Self> {
        let subject = Subject::new(name, &text, Self::KIND);
        check_text(subject, &text)?;
        if levels.len() < 2 {
            return Err(subject.invalid(format_args!(
                "a scale needs at least 2 levels, got {}",
                levels.len()
            )));
        }
        let mut checked: Vec<ScaleLevel> = Vec::with_capacity(levels.len());
        for (label, description) in levels {
            if label.trim().is_empty() {
                return Err(subject.invalid("a level label must not be blank"));
            }
            if checked.iter().any(|l| l.label == label) {
                return Err(subject.invalid(format_args!("level '{label}' is already defined")));
            }
            checked.push(ScaleLevel {
                label,
                description: description_or_none(description),
            });
        }
        Ok(Self {
            text,
            levels: checked,
        })
    }
}

/// Builds a [`ScaleQuestion`]; all checks happen in [`build`](Self::build).
#[derive(Clone, Debug)]
pub struct ScaleQuestionBuilder {
    text: String,
    levels: Vec<(String, Option<String>)>,
}

impl ScaleQuestionBuilder {
    /// Adds the next level up, without a description.
    pub fn level(mut self, label: impl Into<String>) -> Self {
        self.levels.push((label.into(), None));
        self
    }

    /// Adds the next level up, with a description; a blank description counts as none.
    pub fn level_with_description(
        mut self,
        label: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        self.levels.push((label.into(), Some(description.into())));
        self
    }

    /// Checks the text (non-blank) and the levels (at least 2, non-blank, no duplicate).
    pub fn build(self) -> Result<ScaleQuestion> {
        ScaleQuestion::from_parts(None, self.text, self.levels)
    }
}

/// One question of a request. The set is closed on purpose: the validator must know every
/// question type to check its answer, and an engine that meets a type it cannot answer reports
/// [`DecisionError::UnsupportedFeature`] before running anything.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "RawQuestion")]
pub enum Question {
    /// Answered with the probability of "yes".
    YesNo(YesNoQuestion),
    /// Answered with one of the options.
    Choice(ChoiceQuestion),
    /// Answered with a level of the scale.
    Scale(ScaleQuestion),
}

impl Question {
    /// The question's text.
    pub fn text(&self) -> &str {
        match self {
            Self::YesNo(q) => q.text(),
            Self::Choice(q) => q.text(),
            Self::Scale(q) => q.text(),
        }
    }

    /// The kind of answer this question expects.
    pub fn answer_kind(&self) -> crate::AnswerKind {
        match self {
            Self::YesNo(_) => crate::AnswerKind::YesNo,
            Self::Choice(_) => crate::AnswerKind::Choice,
            Self::Scale(_) => crate::AnswerKind::Scale,
        }
    }

    /// The yes/no question, if it is one.
    pub fn as_yes_no(&self) -> Option<&YesNoQuestion> {
        match self {
            Self::YesNo(q) => Some(q),
            _ => None,
        }
    }

    /// The choice question, if it is one.
    pub fn as_choice(&self) -> Option<&ChoiceQuestion> {
        match self {
            Self::Choice(q) => Some(q),
            _ => None,
        }
    }

    /// The scale question, if it is one.
    pub fn as_scale(&self) -> Option<&ScaleQuestion> {
        match self {
            Self::Scale(q) => Some(q),
            _ => None,
        }
    }
}

impl From<YesNoQuestion> for Question {
    fn from(q: YesNoQuestion) -> Self {
        Self::YesNo(q)
    }
}

impl From<ChoiceQuestion> for Question {
    fn from(q: ChoiceQuestion) -> Self {
        Self::Choice(q)
    }
}

impl From<ScaleQuestion> for Question {
    fn from(q: ScaleQuestion) -> Self {
        Self::Scale(q)
    }
}

// Wire forms: unchecked shapes that go through the same checks as the builders. Options and
// levels may be plain strings or objects, because both read naturally in hand-written JSON.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCandidate {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Vec<String>,
    #[serde(default)]
    server: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawYesNo {
    text: String,
    #[serde(default)]
    yes_when: Option<String>,
    #[serde(default)]
    no_when: Option<String>,
    #[serde(default)]
    candidate: Option<RawCandidate>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawOption {
    Plain(String),
    Described {
        name: String,
        #[serde(default)]
        description: Option<String>,
    },
}

impl RawOption {
    fn into_pair(self) -> (String, Option<String>) {
        match self {
            Self::Plain(name) => (name, None),
            Self::Described { name, description } => (name, description),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawLevel {
    Plain(String),
    Described {
        label: String,
        #[serde(default)]
        description: Option<String>,
    },
}

impl RawLevel {
    fn into_pair(self) -> (String, Option<String>) {
        match self {
            Self::Plain(label) => (label, None),
            Self::Described { label, description } => (label, description),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChoice {
    text: String,
    options: Vec<RawOption>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScale {
    text: String,
    levels: Vec<RawLevel>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum RawQuestion {
    YesNo(RawYesNo),
    Choice(RawChoice),
    Scale(RawScale),
}

impl RawQuestion {
    /// Runs the builders' checks; errors name the question by `name` when it is known.
    fn check(self, name: Option<&str>) -> Result<Question> {
        Ok(match self {
            Self::YesNo(raw) => Question::YesNo(raw.check(name)?),
            Self::Choice(raw) => Question::Choice(raw.check(name)?),
            Self::Scale(raw) => Question::Scale(raw.check(name)?),
        })
    }
}

impl RawYesNo {
    fn check(self, name: Option<&str>) -> Result<YesNoQuestion> {
        let (candidate, parameters, server) = match self.candidate {
            Some(c) => (Some((c.name, c.description)), c.parameters, c.server),
            None => (None, Vec::new(), None),
        };
        let parts = YesNoQuestionBuilder {
            text: self.text,
            yes_when: self.yes_when,
            no_when: self.no_when,
            candidate,
            parameters,
            server,
        };
        YesNoQuestion::from_parts(name, parts)
    }
}

impl RawChoice {
    fn check(self, name: Option<&str>) -> Result<ChoiceQuestion> {
        let options = self.options.into_iter().map(RawOption::into_pair).collect();
        ChoiceQuestion::from_parts(name, self.text, options)
    }
}

impl RawScale {
    fn check(self, name: Option<&str>) -> Result<ScaleQuestion> {
        let levels = self.levels.into_iter().map(RawLevel::into_pair).collect();
        ScaleQuestion::from_parts(name, self.text, levels)
    }
}

impl TryFrom<RawQuestion> for Question {
    type Error = DecisionError;

    fn try_from(raw: RawQuestion) -> Result<Self> {
        raw.check(None)
    }
}

impl TryFrom<RawYesNo> for YesNoQuestion {
    type Error = DecisionError;

    fn try_from(raw: RawYesNo) -> Result<Self> {
        raw.check(None)
    }
}

impl TryFrom<RawChoice> for ChoiceQuestion {
    type Error = DecisionError;

    fn try_from(raw: RawChoice) -> Result<Self> {
        raw.check(None)
    }
}

impl TryFrom<RawScale> for ScaleQuestion {
    type Error = DecisionError;

    fn try_from(raw: RawScale) -> Result<Self> {
        raw.check(None)
    }
}

// ---------------------------------------------------------------------------------------------
// Parameters and request
// ---------------------------------------------------------------------------------------------

/// Per-request settings. A model has defaults; values set on the request win.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DecisionRequestParameters {
    /// Which model should answer; `None` leaves it to the model's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
}

impl DecisionRequestParameters {
    /// Parameters that only name the model.
    pub fn for_model(model_name: impl Into<String>) -> Self {
        Self {
            model_name: Some(model_name.into()),
        }
    }

    /// These parameters with every value that `other` sets taking precedence.
    pub fn override_with(&self, other: &Self) -> Self {
        Self {
            model_name: other.model_name.clone().or_else(|| self.model_name.clone()),
        }
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// An input and the named questions to answer against it, in one call.
///
/// Built with [`DecisionRequest::builder`]; once built it is valid: an input that is not blank,
/// at least one question, and unique non-blank question names. `Debug` never shows the input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawRequest")]
pub struct DecisionRequest {
    input: DecisionInput,
    questions: IndexMap<String, Question>,
    #[serde(skip_serializing_if = "DecisionRequestParameters::is_empty")]
    parameters: DecisionRequestParameters,
}

impl DecisionRequest {
    /// Starts an empty request.
    pub fn builder() -> DecisionRequestBuilder {
        DecisionRequestBuilder::default()
    }

    /// A builder holding this request's input, questions and parameters.
    pub fn to_builder(&self) -> DecisionRequestBuilder {
        DecisionRequestBuilder {
            input: Some(self.input.clone()),
            questions: self
                .questions
                .iter()
                .map(|(n, q)| (n.clone(), q.clone()))
                .collect(),
            parameters: self.parameters.clone(),
        }
    }

    /// The input every question is answered against.
    pub fn input(&self) -> &DecisionInput {
        &self.input
    }

    /// The questions by name, in the order they were added.
    pub fn questions(&self) -> &IndexMap<String, Question> {
        &self.questions
    }

    /// The question with this name.
    pub fn question(&self, name: &str) -> Option<&Question> {
        self.questions.get(name)
    }

    /// The request parameters.
    pub fn parameters(&self) -> &DecisionRequestParameters {
        &self.parameters
    }

    /// Shortcut for `parameters().model_name`.
    pub fn model_name(&self) -> Option<&str> {
        self.parameters.model_name.as_deref()
    }

    /// A copy of this request with other parameters.
    pub fn with_parameters(&self, parameters: DecisionRequestParameters) -> DecisionRequest {
        DecisionRequest {
            input: self.input.clone(),
            questions: self.questions.clone(),
            parameters,
        }
    }
}

/// Builds a [`DecisionRequest`]; all checks happen in [`build`](Self::build).
#[derive(Clone, Debug, Default)]
pub struct DecisionRequestBuilder {
    input: Option<DecisionInput>,
    questions: Vec<(String, Question)>,
    parameters: DecisionRequestParameters,
}

impl DecisionRequestBuilder {
    /// Sets the input (a `String`, `&str`, JSON map or [`DecisionInput`]).
    pub fn input(mut self, input: impl Into<DecisionInput>) -> Self {
        self.input = Some(input.into());
        self
    }

    /// Adds a named question.
    pub fn question(mut self, name: impl Into<String>, question: impl Into<Question>) -> Self {
        self.questions.push((name.into(), question.into()));
        self
    }

    /// Sets the parameters, replacing earlier ones.
    pub fn parameters(mut self, parameters: DecisionRequestParameters) -> Self {
        self.parameters = parameters;
        self
    }

    /// Checks that there is a non-blank input and at least one question, and that question names
    /// are non-blank and unique.
    pub fn build(self) -> Result<DecisionRequest> {
        let input = self.input.ok_or_else(|| {
            DecisionError::InvalidRequest("a decision request needs an input".to_owned())
        })?;
        input
            .check()
            .map_err(|msg| DecisionError::InvalidRequest(msg.to_owned()))?;
        if self.questions.is_empty() {
            return Err(DecisionError::InvalidRequest(
                "a decision request needs at least one question".to_owned(),
            ));
        }
        let mut questions = IndexMap::with_capacity(self.questions.len());
        for (name, question) in self.questions {
            if name.trim().is_empty() {
                let subject = Subject::Text(question.text(), "");
                return Err(subject.invalid("the name must not be blank"));
            }
            if questions.contains_key(&name) {
                return Err(DecisionError::InvalidRequest(format!(
                    "question '{name}' is already defined"
                )));
            }
            questions.insert(name, question);
        }
        Ok(DecisionRequest {
            input,
            questions,
            parameters: self.parameters,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    #[serde(default)]
    input: Option<RawInput>,
    #[serde(default, deserialize_with = "ordered_entries")]
    questions: Vec<(String, RawQuestion)>,
    #[serde(default)]
    parameters: DecisionRequestParameters,
}

impl TryFrom<RawRequest> for DecisionRequest {
    type Error = DecisionError;

    fn try_from(raw: RawRequest) -> Result<Self> {
        let mut builder = DecisionRequest::builder().parameters(raw.parameters);
        if let Some(input) = raw.input {
            builder = builder.input(input.unchecked());
        }
        for (name, question) in raw.questions {
            // Here the name is known, so errors name the question by it.
            let question = question.check(Some(&name))?;
            builder = builder.question(name, question);
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    fn err_msg<T: fmt::Debug>(result: Result<T>) -> String {
        match result {
            Err(DecisionError::InvalidRequest(msg)) => msg,
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    fn yes_no(text: &str) -> YesNoQuestion {
        YesNoQuestion::new(text).unwrap()
    }

    // --- input ---

    #[test]
    fn render_text_is_verbatim() {
        let input = DecisionInput::from("  Will it rain?\nTomorrow ");
        assert_eq!(input.render(), "  Will it rain?\nTomorrow ");
    }

    #[test]
    fn render_messages_one_line_each() {
        let input = DecisionInput::Fields(fields(json!({
            "messages": [
                {"role": "user", "text": "Hi"},
                {"role": "assistant", "text": "Hello!"},
                {"role": "user", "text": "Book a flight"}
            ]
        })));
        assert_eq!(
            input.render(),
            "user: Hi\nassistant: Hello!\nuser: Book a flight"
        );
    }

    #[test]
    fn render_other_fields_in_order() {
        let input = DecisionInput::Fields(fields(json!({
            "query": "weather in Paris",
            "messages": [{"role": "user", "text": "Hi"}],
            "count": 3,
            "tags": ["a", "b"],
            "extra": {"k": null}
        })));
        assert_eq!(
            input.render(),
            "query: weather in Paris\nuser: Hi\ncount: 3\ntags: [\"a\",\"b\"]\nextra: {\"k\":null}"
        );
    }

    #[test]
    fn render_malformed_messages_as_json() {
        let input = DecisionInput::Fields(fields(json!({"messages": [{"role": "user"}]})));
        assert_eq!(input.render(), "messages: [{\"role\":\"user\"}]");
    }

    #[test]
    fn input_debug_is_redacted() {
        let text = DecisionInput::from("secret ünïcode");
        assert_eq!(format!("{text:?}"), "<redacted 14 chars>");
        let map = DecisionInput::Fields(fields(json!({"a": "secret", "b": 1})));
        assert_eq!(format!("{map:?}"), "<redacted 2 fields>");
    }

    #[test]
    fn input_deserializes_text_or_fields_and_rejects_blank() {
        let text: DecisionInput = serde_json::from_value(json!("hi")).unwrap();
        assert_eq!(text, DecisionInput::from("hi"));
        let map: DecisionInput = serde_json::from_value(json!({"a": 1})).unwrap();
        assert!(matches!(map, DecisionInput::Fields(_)));
        assert!(serde_json::from_value::<DecisionInput>(json!("  ")).is_err());
        assert!(serde_json::from_value::<DecisionInput>(json!({})).is_err());
        assert_eq!(serde_json::to_value(&text).unwrap(), json!("hi"));
    }

    // --- yes/no ---

    #[test]
    fn yes_no_rejects_blank_text() {
        let msg = err_msg(YesNoQuestion::new("  "));
        assert_eq!(msg, "yes/no question: the text must not be blank");
    }

    #[test]
    fn yes_no_optional_descriptions() {
        let q = YesNoQuestion::builder("Is it urgent?")
            .yes_when("a deadline is today")
            .no_when("no deadline")
            .build()
            .unwrap();
        assert_eq!(q.text(), "Is it urgent?");
        assert_eq!(q.yes_when(), Some("a deadline is today"));
        assert_eq!(q.no_when(), Some("no deadline"));
        assert_eq!(q.candidate(), None);
        assert_eq!(yes_no("Is it urgent?").yes_when(), None);
    }

    #[test]
    fn yes_no_rejects_blank_descriptions_naming_the_question() {
        let msg = err_msg(
            YesNoQuestion::builder("Is it urgent?")
                .yes_when(" ")
                .build(),
        );
        assert_eq!(msg, "question 'Is it urgent?': yes_when must not be blank");
        let msg = err_msg(YesNoQuestion::builder("Is it urgent?").no_when("").build());
        assert_eq!(msg, "question 'Is it urgent?': no_when must not be blank");
    }

    #[test]
    fn a_candidates_parameters_are_kept_in_order_without_blanks_and_need_a_candidate() {
        let q = YesNoQuestion::builder("Relevant?")
            .candidate("get_forecast", "Gets the forecast")
            .parameters(["latitude", " ", "longitude"])
            .build()
            .unwrap();
        assert_eq!(q.candidate().unwrap().parameters, ["latitude", "longitude"]);
        let json = serde_json::to_value(&q).unwrap();
        assert_eq!(
            json["candidate"]["parameters"],
            serde_json::json!(["latitude", "longitude"])
        );
        assert_eq!(serde_json::from_value::<YesNoQuestion>(json).unwrap(), q);
        // Without parameters the wire form is what it was before they existed.
        let plain = YesNoQuestion::builder("Relevant?")
            .candidate("get_forecast", "Gets the forecast")
            .build()
            .unwrap();
        assert!(serde_json::to_value(&plain).unwrap()["candidate"]
            .get("parameters")
            .is_none());
        let msg = err_msg(
            YesNoQuestion::builder("Relevant?")
                .parameters(["x"])
                .build(),
        );
        assert!(msg.contains("parameters need a candidate"), "{msg}");
    }

    #[test]
    fn a_candidates_server_travels_on_the_wire_and_a_blank_one_is_unknown() {
        let q = YesNoQuestion::builder("Relevant?")
            .candidate("send_message", "Posts a message")
            .server("slack-mcp-server")
            .build()
            .unwrap();
        assert_eq!(
            q.candidate().unwrap().server.as_deref(),
            Some("slack-mcp-server")
        );
        let json = serde_json::to_value(&q).unwrap();
        assert_eq!(json["candidate"]["server"], "slack-mcp-server");
        assert_eq!(serde_json::from_value::<YesNoQuestion>(json).unwrap(), q);
        let blank = YesNoQuestion::builder("Relevant?")
            .candidate("send_message", "Posts a message")
            .server("  ")
            .build()
            .unwrap();
        assert_eq!(blank.candidate().unwrap().server, None);
        assert!(serde_json::to_value(&blank).unwrap()["candidate"]
            .get("server")
            .is_none());
        let msg = err_msg(YesNoQuestion::builder("Relevant?").server("x").build());
        assert!(msg.contains("a server needs a candidate"), "{msg}");
    }

    #[test]
    fn yes_no_candidate_description_defaults_to_name() {
        let q = YesNoQuestion::builder("Relevant?")
            .candidate("weather", " ")
            .build()
            .unwrap();
        assert_eq!(
            q.candidate(),
            Some(&Candidate {
                name: "weather".into(),
                description: "weather".into(),
                parameters: Vec::new(),
                server: None,
            })
        );
        let q = YesNoQuestion::builder("Relevant?")
            .candidate("weather", "Gets the forecast")
            .build()
            .unwrap();
        assert_eq!(q.candidate().unwrap().description, "Gets the forecast");
        let msg = err_msg(
            YesNoQuestion::builder("Relevant?")
                .candidate("", "x")
                .build(),
        );
        assert_eq!(
            msg,
            "question 'Relevant?': a candidate's name must not be blank"
        );
    }

    #[test]
    fn long_question_texts_are_shortened_in_messages() {
        let text = "a".repeat(100);
        let msg = err_msg(YesNoQuestion::builder(text).yes_when("").build());
        assert_eq!(
            msg,
            format!("question '{}…': yes_when must not be blank", "a".repeat(40))
        );
    }

    // --- choice ---

    #[test]
    fn choice_keeps_order_and_defaults_description_to_name() {
        let q = ChoiceQuestion::builder("Which model?")
            .option("small")
            .option_with_description("large", "For hard questions")
            .option_with_description("medium", "")
            .build()
            .unwrap();
        let names: Vec<_> = q.option_names().collect();
        assert_eq!(names, ["small", "large", "medium"]);
        assert_eq!(q.options()[0].description, "small");
        assert_eq!(q.options()[1].description, "For hard questions");
        assert_eq!(q.options()[2].description, "medium");
        assert!(q.has_option("large"));
        assert!(!q.has_option("Large"));
        assert_eq!(q.option("large").unwrap().name, "large");
    }

    #[test]
    fn choice_needs_two_options() {
        let msg = err_msg(ChoiceQuestion::builder("Which?").option("a").build());
        assert_eq!(
            msg,
            "question 'Which?': a choice needs at least 2 options, got 1"
        );
    }

    #[test]
    fn choice_rejects_duplicate_and_blank_options() {
        let msg = err_msg(ChoiceQuestion::with_options("Which?", ["a", "b", "a"]));
        assert_eq!(msg, "question 'Which?': option 'a' is already defined");
        let msg = err_msg(ChoiceQuestion::with_options("Which?", ["a", " "]));
        assert_eq!(msg, "question 'Which?': an option name must not be blank");
    }

    #[test]
    fn choice_rejects_blank_text() {
        let msg = err_msg(ChoiceQuestion::with_options("", ["a", "b"]));
        assert_eq!(msg, "choice question: the text must not be blank");
    }

    // --- scale ---

    #[test]
    fn scale_levels_in_order_with_optional_descriptions() {
        let q = ScaleQuestion::builder("How urgent?")
            .level("low")
            .level_with_description("medium", "")
            .level_with_description("high", "Act now")
            .build()
            .unwrap();
        assert_eq!(
            q.level_labels().collect::<Vec<_>>(),
            ["low", "medium", "high"]
        );
        assert_eq!(q.levels()[1].description, None);
        assert_eq!(q.levels()[2].description.as_deref(), Some("Act now"));
    }

    #[test]
    fn scale_needs_two_distinct_levels() {
        let msg = err_msg(ScaleQuestion::with_levels("How urgent?", ["only"]));
        assert_eq!(
            msg,
            "question 'How urgent?': a scale needs at least 2 levels, got 1"
        );
        let msg = err_msg(ScaleQuestion::with_levels("How urgent?", ["a", "a"]));
        assert_eq!(msg, "question 'How urgent?': level 'a' is already defined");
        let msg = err_msg(ScaleQuestion::with_levels("How urgent?", ["a", ""]));
        assert_eq!(
            msg,
            "question 'How urgent?': a level label must not be blank"
        );
    }

    // --- question ---

    #[test]
    fn question_text_and_kind() {
        let q: Question = ChoiceQuestion::with_options("Which?", ["a", "b"])
            .unwrap()
            .into();
        assert_eq!(q.text(), "Which?");
        assert_eq!(q.answer_kind(), crate::AnswerKind::Choice);
        assert!(q.as_choice().is_some());
        assert!(q.as_yes_no().is_none());
        assert!(q.as_scale().is_none());
    }

    #[test]
    fn question_json_round_trip() {
        let questions: Vec<Question> = vec![
            YesNoQuestion::builder("Urgent?")
                .yes_when("today")
                .candidate("t", "d")
                .build()
                .unwrap()
                .into(),
            ChoiceQuestion::builder("Which?")
                .option("a")
                .option_with_description("b", "B")
                .build()
                .unwrap()
                .into(),
            ScaleQuestion::builder("How?")
                .level("low")
                .level_with_description("high", "H")
                .build()
                .unwrap()
                .into(),
        ];
        for q in questions {
            let json = serde_json::to_value(&q).unwrap();
            let back: Question = serde_json::from_value(json).unwrap();
            assert_eq!(back, q);
        }
        let json = serde_json::to_value(Question::from(yes_no("Urgent?"))).unwrap();
        assert_eq!(json, json!({"type": "yes_no", "text": "Urgent?"}));
    }

    #[test]
    fn question_json_accepts_plain_option_names() {
        let q: Question = serde_json::from_value(json!({
            "type": "choice", "text": "Which?", "options": ["a", {"name": "b", "description": "B"}]
        }))
        .unwrap();
        let names: Vec<_> = q.as_choice().unwrap().option_names().collect();
        assert_eq!(names, ["a", "b"]);
        let q: Question = serde_json::from_value(json!({
            "type": "scale", "text": "How?", "levels": ["low", {"label": "high", "description": "H"}]
        }))
        .unwrap();
        assert_eq!(
            q.as_scale().unwrap().levels()[1].description.as_deref(),
            Some("H")
        );
        assert!(serde_json::from_value::<Question>(json!({
            "type": "choice", "text": "Which?", "options": ["a", {"label": "b"}]
        }))
        .is_err());
    }

    #[test]
    fn question_json_is_checked() {
        let err = serde_json::from_value::<Question>(json!({
            "type": "choice", "text": "Which?", "options": ["a"]
        }))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("question 'Which?': a choice needs at least 2 options, got 1"),
            "{err}"
        );
        assert!(serde_json::from_value::<Question>(json!({
            "type": "yes_no", "text": "x", "yes_whne": "typo"
        }))
        .is_err());
    }

    // --- parameters ---

    #[test]
    fn override_with_prefers_the_others_values() {
        let defaults = DecisionRequestParameters::for_model("small");
        let empty = DecisionRequestParameters::default();
        let large = DecisionRequestParameters::for_model("large");
        assert_eq!(defaults.override_with(&empty), defaults);
        assert_eq!(defaults.override_with(&large), large);
        assert_eq!(empty.override_with(&large), large);
        assert!(empty.is_empty());
        assert!(!large.is_empty());
    }

    // --- request ---

    fn request() -> DecisionRequest {
        DecisionRequest::builder()
            .input("my secret text")
            .question("urgent", yes_no("Urgent?"))
            .question(
                "route",
                ChoiceQuestion::with_options("Which?", ["a", "b"]).unwrap(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn request_keeps_question_order_and_accessors() {
        let r = request();
        let names: Vec<_> = r.questions().keys().map(String::as_str).collect();
        assert_eq!(names, ["urgent", "route"]);
        assert_eq!(r.question("route").unwrap().text(), "Which?");
        assert!(r.question("missing").is_none());
        assert_eq!(r.input(), &DecisionInput::from("my secret text"));
        assert_eq!(r.model_name(), None);
        assert!(r.parameters().is_empty());
    }

    #[test]
    fn request_needs_input() {
        let msg = err_msg(
            DecisionRequest::builder()
                .question("q", yes_no("Q?"))
                .build(),
        );
        assert_eq!(msg, "a decision request needs an input");
    }

    #[test]
    fn request_rejects_blank_input() {
        let msg = err_msg(
            DecisionRequest::builder()
                .input(" \n")
                .question("q", yes_no("Q?"))
                .build(),
        );
        assert_eq!(msg, "the input text must not be blank");
        let msg = err_msg(
            DecisionRequest::builder()
                .input(Map::new())
                .question("q", yes_no("Q?"))
                .build(),
        );
        assert_eq!(msg, "the input fields must not be empty");
    }

    #[test]
    fn request_needs_a_question() {
        let msg = err_msg(DecisionRequest::builder().input("x").build());
        assert_eq!(msg, "a decision request needs at least one question");
    }

    #[test]
    fn request_rejects_duplicate_names() {
        let msg = err_msg(
            DecisionRequest::builder()
                .input("x")
                .question("q", yes_no("A?"))
                .question("q", yes_no("B?"))
                .build(),
        );
        assert_eq!(msg, "question 'q' is already defined");
    }

    #[test]
    fn request_rejects_blank_names() {
        let msg = err_msg(
            DecisionRequest::builder()
                .input("x")
                .question(" ", yes_no("Is it late?"))
                .build(),
        );
        assert_eq!(msg, "question 'Is it late?': the name must not be blank");
    }

    #[test]
    fn request_debug_redacts_input() {
        let r = request();
        for rendered in [format!("{r:?}"), format!("{r:#?}")] {
            assert!(!rendered.contains("secret"), "{rendered}");
            assert!(rendered.contains("<redacted 14 chars>"), "{rendered}");
            assert!(rendered.contains("route"), "{rendered}");
        }
        let builder = r.to_builder();
        assert!(!format!("{builder:?}").contains("secret"));
    }

    #[test]
    fn with_parameters_changes_only_parameters() {
        let r = request();
        let p = DecisionRequestParameters::for_model("m");
        let changed = r.with_parameters(p.clone());
        assert_eq!(changed.parameters(), &p);
        assert_eq!(changed.model_name(), Some("m"));
        assert_eq!(changed.input(), r.input());
        assert_eq!(changed.questions(), r.questions());
    }

    #[test]
    fn to_builder_round_trips() {
        let r = request();
        assert_eq!(r.to_builder().build().unwrap(), r);
    }

    #[test]
    fn request_json_round_trip() {
        let r = request().with_parameters(DecisionRequestParameters::for_model("m"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["input"], json!("my secret text"));
        assert_eq!(json["parameters"], json!({"model_name": "m"}));
        let back: DecisionRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn request_json_errors_name_the_question() {
        let err = serde_json::from_value::<DecisionRequest>(json!({
            "input": "x",
            "questions": {"route": {"type": "choice", "text": "Which?", "options": ["a"]}}
        }))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("question 'route': a choice needs at least 2 options, got 1"),
            "{err}"
        );
    }

    #[test]
    fn request_json_rejects_duplicate_names() {
        let err = serde_json::from_str::<DecisionRequest>(
            r#"{"input":"x","questions":{"q":{"type":"yes_no","text":"A?"},"q":{"type":"yes_no","text":"B?"}}}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("question 'q' is already defined"),
            "{err}"
        );
    }

    #[test]
    fn the_needs_tool_question_is_known_by_its_text_alone_and_survives_the_wire() {
        let q = YesNoQuestion::needs_tool();
        assert!(q.is_needs_tool());
        let back: YesNoQuestion =
            serde_json::from_value(serde_json::to_value(&q).unwrap()).unwrap();
        assert!(back.is_needs_tool());
        // The same text about a candidate is a question about that candidate.
        let about_a_tool = YesNoQuestion::builder(NEEDS_TOOL_QUESTION)
            .candidate("get_weather", "Weather")
            .build()
            .unwrap();
        assert!(!about_a_tool.is_needs_tool());
        assert!(!YesNoQuestion::new("Needs a tool?").unwrap().is_needs_tool());
    }

    #[test]
    fn the_head_only_ever_raises_the_best_tools_probability() {
        assert_eq!(needs_tool_probability(None, 0.3), 0.3);
        // logit(0.8) + logit(0.4) = 1.386 - 0.405: 0.727.
        assert!((needs_tool_probability(Some(0.8), 0.4) - 0.72727).abs() < 1e-5);
        // A head that finds no need leaves the best tool's probability.
        assert_eq!(needs_tool_probability(Some(0.01), 0.9), 0.9);
        assert_eq!(needs_tool_probability(Some(0.5), 0.42), 0.42);
        // Certain answers stay finite.
        assert!(needs_tool_probability(Some(1.0), 0.0) <= 1.0);
        assert!(needs_tool_probability(Some(0.0), 0.0) < 1e-12);
    }

    #[test]
    fn the_gate_passes_its_best_candidate_and_the_companions_once_open_and_nothing_while_shut() {
        let probabilities = [0.3, 0.6, 0.25, 0.1];
        // Open on the best tool alone: it and the companions at 0.25 or more pass.
        assert_eq!(
            needs_tool_gate(None, &probabilities, 1, 0.5, 0.25),
            (0.6, vec![true, true, true, false])
        );
        // The caller's best passes under the companions' bar; the head's answer opens the gate.
        let (probability, passing) = needs_tool_gate(Some(0.8), &probabilities, 3, 0.5, 0.5);
        assert!((probability - 0.30769).abs() < 1e-5);
        assert_eq!(passing, vec![false; 4]);
        let (probability, passing) = needs_tool_gate(Some(0.95), &probabilities, 3, 0.5, 0.5);
        assert!(probability >= 0.5);
        // The others are within the first ranks and over 0.3 of the best's 0.1.
        assert_eq!(passing, vec![true; 4]);
        // Shut: nothing, however probable the companions.
        assert_eq!(
            needs_tool_gate(None, &probabilities, 0, 0.5, 0.0),
            (0.3, vec![false; 4])
        );
    }

    #[test]
    fn an_unsure_best_tool_brings_the_nearest_tools_under_the_companions_bar() {
        // The best at 0.15: 0.3 of it is 0.045, so the next four most probable pass from there,
        // and the sixth, under it anyway, does not; nor does one under 0.045.
        let probabilities = [0.05, 0.15, 0.06, 0.07, 0.08, 0.01, 0.046];
        let (_, passing) = needs_tool_gate(Some(0.99), &probabilities, 1, 0.5, 0.2);
        assert_eq!(
            passing,
            vec![true, true, true, true, true, false, false],
            "the best, the four next (0.08, 0.07, 0.06, 0.05), not the sixth (0.046)"
        );
        // A sure best tool: 0.3 of 0.9 is over the companions' bar, which decides alone.
        let probabilities = [0.9, 0.25, 0.21, 0.19];
        let (_, passing) = needs_tool_gate(None, &probabilities, 0, 0.5, 0.2);
        assert_eq!(passing, vec![true, true, true, false]);
        // Equals among the ranks: the earlier candidate first.
        let probabilities = [0.1, 0.04, 0.04, 0.04, 0.04, 0.04];
        let (_, passing) = needs_tool_gate(Some(0.99), &probabilities, 0, 0.5, 0.2);
        assert_eq!(passing, vec![true, true, true, true, true, false]);
    }
}
