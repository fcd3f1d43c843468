//! The filtering provider, its builder, and the selection algorithm.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use decide_chat::{
    decision_fields, decision_messages, ChatMessage, ProvidedTool, RenderOptions, SearchBehavior,
    ToolProvider, ToolProviderError, ToolProviderRequest, ToolProviderResult, ToolSpecification,
    UserMessage,
};
use decide_contract::{
    needs_tool_gate, Conformal, DecisionError, DecisionInput, DecisionModel, DecisionRequest,
    InvalidTargetRecall, YesNoQuestion,
};

use crate::error::FilterError;
use crate::selection::{Fallback, FallbackUsed, Gate, Reason, Selection, ToolDecision};
use crate::template::{QuestionTemplate, DEFAULT_QUESTION_TEMPLATE};

/// The default [`min_probability`](FilteringToolProviderBuilder::min_probability): a tool passes when the model
/// finds it at least as likely useful as not.
pub const DEFAULT_MIN_PROBABILITY: f64 = 0.5;
/// The default [`max_messages`](FilteringToolProviderBuilder::max_messages).
pub const DEFAULT_MAX_MESSAGES: usize = 10;
/// The default [`max_message_length`](FilteringToolProviderBuilder::max_message_length), in characters.
pub const DEFAULT_MAX_MESSAGE_LENGTH: usize = 2000;

type MessageFilter = Arc<dyn Fn(&ChatMessage) -> bool + Send + Sync>;

/// A [`ToolProvider`] that passes on only the tools of another provider that a [`DecisionModel`] finds relevant
/// to the conversation. See the [crate documentation](crate) for the rules.
#[derive(Clone)]
pub struct FilteringToolProvider {
    tool_provider: Arc<dyn ToolProvider>,
    decision_model: Arc<dyn DecisionModel>,
    min_probability: f64,
    target_recall: Option<f64>,
    companion_min_probability: Option<f64>,
    max_results: Option<usize>,
    max_messages: usize,
    message_filter: Option<MessageFilter>,
    max_message_length: usize,
    max_tools_per_decision_request: Option<usize>,
    always_include: Vec<String>,
    fallback: Fallback,
    question_template: QuestionTemplate,
    score_called_tools: bool,
}

impl FilteringToolProvider {
    /// A filter with every option at its default.
    pub fn new(
        tool_provider: Arc<dyn ToolProvider>,
        decision_model: Arc<dyn DecisionModel>,
    ) -> Self {
        let companion_min_probability = decision_model.selection_hints().companion_min_probability;
        Self {
            tool_provider,
            decision_model,
            min_probability: DEFAULT_MIN_PROBABILITY,
            target_recall: None,
            companion_min_probability,
            max_results: None,
            max_messages: DEFAULT_MAX_MESSAGES,
            message_filter: None,
            max_message_length: DEFAULT_MAX_MESSAGE_LENGTH,
            max_tools_per_decision_request: None,
            always_include: Vec::new(),
            fallback: Fallback::default(),
            question_template: QuestionTemplate::default(),
            score_called_tools: false,
        }
    }

    /// Starts a filter; the wrapped provider and the decision model are required.
    pub fn builder() -> FilteringToolProviderBuilder {
        FilteringToolProviderBuilder::default()
    }

    /// The minimum probability of a tool passed on (inclusive): the one given, or the threshold of
    /// the target recall.
    pub fn min_probability(&self) -> f64 {
        self.min_probability
    }

    /// The recall the threshold was chosen for, when it was set with
    /// [`target_recall`](FilteringToolProviderBuilder::target_recall).
    pub fn target_recall(&self) -> Option<f64> {
        self.target_recall
    }

    /// With the needs-tool gate ([`needs_tool_gate`](FilteringToolProviderBuilder::needs_tool_gate)), the
    /// probability at which further tools pass once the conversation needs one; `None` without the gate.
    pub fn companion_min_probability(&self) -> Option<f64> {
        self.companion_min_probability
    }

    /// The most tools the model may select, on top of those passed without asking; `None` for no limit.
    pub fn max_results(&self) -> Option<usize> {
        self.max_results
    }

    /// How many of the latest messages the decision sees, system messages not counted.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// The longest message text the decision sees, in characters.
    pub fn max_message_length(&self) -> usize {
        self.max_message_length
    }

    /// How many tools one decision request asks about; `None` for all in one request.
    pub fn max_tools_per_decision_request(&self) -> Option<usize> {
        self.max_tools_per_decision_request
    }

    /// The names of the tools always passed on without asking.
    pub fn always_include(&self) -> &[String] {
        &self.always_include
    }

    /// What is passed on when the decision model fails or refuses.
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// Whether the tools the conversation already called are also scored (they pass either way).
    pub fn score_called_tools(&self) -> bool {
        self.score_called_tools
    }

    /// The template of the question asked about each tool.
    pub fn question_template(&self) -> &QuestionTemplate {
        &self.question_template
    }

    /// The question asked about `tool`.
    pub fn question_text(&self, tool: &ToolSpecification) -> String {
        self.question_template
            .render(&tool.name, tool.description.as_deref())
    }

    /// The input the decision model receives for `request`, or `None` when the user message has no text (then all
    /// tools are passed on without asking).
    ///
    /// The current user message is the original one if it has text, else the one sent to the LLM. Without previous
    /// messages the input is that message alone. With them, it is the system messages plus the latest
    /// `max_messages` other messages (user and assistant text, tool calls, tool results), always including the
    /// current user message, which replaces the stored copy of this turn's user message (recognised by its text,
    /// original or augmented, followed only by tool calls and results) or is appended. `message_filter` applies to
    /// the previous messages, never to the current one; every text is shortened to `max_message_length`.
    /// The input is always `{"messages": [{"role", "text"}, ...]}`.
    pub fn decision_input(&self, request: &ToolProviderRequest) -> Option<DecisionInput> {
        let current = current_user_message(request)?;
        let conversation = self.conversation(request, current);
        let options = RenderOptions {
            include_system: true,
            include_tools: true,
            max_message_length: Some(self.max_message_length),
        };
        let rendered = decision_messages(&conversation, &options);
        // The current message is the last user message of the conversation built above, so it is the last user
        // entry unless shortening left it blank.
        let current_index = rendered.iter().rposition(|m| m.role == "user");
        let mut keep = vec![false; rendered.len()];
        let mut kept = 0;
        for (i, message) in rendered.iter().enumerate().rev() {
            if message.role == "system" {
                keep[i] = true;
            } else if kept < self.max_messages {
                keep[i] = true;
                kept += 1;
            }
        }
        if let Some(current) = current_index {
            if !keep[current] {
                // Tool rounds after the user message filled the window: the request itself matters more than the
                // oldest of them.
                if let Some(oldest) =
                    (current + 1..rendered.len()).find(|&i| keep[i] && rendered[i].role != "system")
                {
                    keep[oldest] = false;
                }
                keep[current] = true;
            }
        }
        let window: Vec<_> = rendered
            .into_iter()
            .zip(keep)
            .filter_map(|(message, keep)| keep.then_some(message))
            .collect();
        if window.is_empty() {
            return None;
        }
        Some(DecisionInput::Fields(decision_fields(&window)))
    }

    /// The decision requests for `candidates`: one per batch of `max_tools_per_decision_request` tools, each with
    /// the whole `input` and one yes/no question per tool, named `tool0`, `tool1`, … (restarting in every batch),
    /// whose text is the rendered template and whose candidate is the tool's name, description and parameter names,
    /// so that an engine can score the tool itself.
    pub fn decision_requests(
        &self,
        input: &DecisionInput,
        candidates: &[&ToolSpecification],
    ) -> Result<Vec<DecisionRequest>, DecisionError> {
        let batch = self
            .max_tools_per_decision_request
            .unwrap_or(candidates.len())
            .max(1);
        candidates
            .chunks(batch)
            .map(|chunk| {
                let mut builder = DecisionRequest::builder().input(input.clone());
                for (i, tool) in chunk.iter().enumerate() {
                    let mut question = YesNoQuestion::builder(self.question_text(tool))
                        .candidate(
                            tool.name.clone(),
                            tool.description.clone().unwrap_or_default(),
                        )
                        .parameters(tool.parameter_names());
                    if let Some(server) = tool.server() {
                        question = question.server(server);
                    }
                    let question = question.build()?;
                    builder = builder.question(format!("tool{i}"), question);
                }
                builder.build()
            })
            .collect()
    }

    /// Selects the tools to pass on for `request`, and says why for each tool of the wrapped provider.
    ///
    /// Fails only when the wrapped provider fails, or when the decision model fails or refuses with
    /// [`Fallback::Fail`].
    pub fn select(&self, request: &ToolProviderRequest) -> Result<Selection, FilterError> {
        let tools = self.tool_provider.provide_tools(request)?.tools;
        if tools.is_empty() {
            return Ok(Selection::default());
        }
        let Some(input) = self.decision_input(request) else {
            let decisions = tools
                .iter()
                .map(|tool| decision(tool, Reason::NoText, true))
                .collect();
            return Ok(Selection {
                tools,
                decisions,
                fallback: None,
                decision_requests: 0,
                gate: None,
            });
        };

        let called = called_tools(request.messages().unwrap_or_default());
        let mut decisions: Vec<ToolDecision> = tools
            .iter()
            .map(|tool| match self.reason_without_asking(tool, &called) {
                Some(reason) => decision(tool, reason, true),
                None => decision(tool, Reason::Asked, false),
            })
            .collect();
        // Called tools pass whatever the model says; with `score_called_tools` the model is asked
        // about them too, so that an evaluation ranks them by the model rather than first.
        let candidates: Vec<usize> = (0..tools.len())
            .filter(|&i| match decisions[i].reason {
                Reason::Asked => true,
                Reason::AlreadyCalled => self.score_called_tools,
                _ => false,
            })
            .collect();
        let asked: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| decisions[i].reason == Reason::Asked)
            .collect();

        let mut selection = Selection::default();
        if !candidates.is_empty() {
            let specifications: Vec<&ToolSpecification> = candidates
                .iter()
                .map(|&i| &tools[i].specification)
                .collect();
            let (probabilities, requests, outcome) = self.ask(&input, &specifications);
            selection.decision_requests = requests;
            for (&i, probability) in candidates.iter().zip(&probabilities) {
                decisions[i].probability = *probability;
            }
            match outcome {
                Ok(answer) => {
                    let asked_probabilities: Vec<Option<f64>> =
                        asked.iter().map(|&i| decisions[i].probability).collect();
                    let (passing, gate) = self.passing(&asked, &asked_probabilities, answer);
                    for i in passing {
                        decisions[i].passed = true;
                    }
                    selection.gate = gate;
                }
                Err(error) => {
                    let pass_all = match self.fallback {
                        Fallback::Fail => return Err(FilterError::Decision(error)),
                        Fallback::AllTools => true,
                        Fallback::NoTools => false,
                    };
                    tracing::warn!(
                        fallback = %self.fallback,
                        candidates = candidates.len(),
                        "the decision model failed, so the tool filter falls back: {error}"
                    );
                    for &i in &asked {
                        decisions[i].passed = pass_all;
                    }
                    selection.fallback = Some(FallbackUsed {
                        strategy: self.fallback,
                        reason: error.to_string(),
                    });
                }
            }
        }
        selection.tools = tools
            .into_iter()
            .zip(&decisions)
            .filter_map(|(tool, decision)| decision.passed.then_some(tool))
            .collect();
        selection.decisions = decisions;
        Ok(selection)
    }

    fn reason_without_asking(&self, tool: &ProvidedTool, called: &HashSet<&str>) -> Option<Reason> {
        if tool.specification.search_behavior() == SearchBehavior::AlwaysVisible {
            Some(Reason::AlwaysVisible)
        } else if self.always_include.iter().any(|n| n == tool.name()) {
            Some(Reason::AlwaysIncluded)
        } else if called.contains(tool.name()) {
            Some(Reason::AlreadyCalled)
        } else {
            None
        }
    }

    /// Asks the model about every candidate, batch after batch, and stops at the first failure or refusal. Returns
    /// the probabilities answered so far (for the report), how many requests were sent, and the outcome: with the
    /// needs-tool gate, the answer to [`YesNoQuestion::needs_tool`], asked in the first request (`None` when the
    /// model refused that one question, which is no failure: the gate then reads the tools alone).
    fn ask(
        &self,
        input: &DecisionInput,
        candidates: &[&ToolSpecification],
    ) -> (Vec<Option<f64>>, usize, Result<Option<f64>, DecisionError>) {
        let mut probabilities = vec![None; candidates.len()];
        let requests = match self.decision_requests(input, candidates) {
            Ok(requests) => requests,
            Err(error) => return (probabilities, 0, Err(error)),
        };
        let batch = self
            .max_tools_per_decision_request
            .unwrap_or(candidates.len())
            .max(1);
        let mut sent = 0;
        let mut needs_tool = None;
        for (b, request) in requests.iter().enumerate() {
            sent += 1;
            let gated = b == 0 && self.companion_min_probability.is_some();
            let with_gate;
            let to_send = if gated {
                match with_gate_question(request) {
                    Ok(r) => {
                        with_gate = r;
                        &with_gate
                    }
                    Err(error) => return (probabilities, sent, Err(error)),
                }
            } else {
                request
            };
            let answered = self.decision_model.decide(to_send).and_then(|response| {
                let tools = (0..request.questions().len())
                    .map(|i| Ok(response.yes_no(&format!("tool{i}"))?.probability()))
                    .collect::<Result<Vec<f64>, DecisionError>>()?;
                let answer = match gated && !response.is_refused(NEEDS_TOOL) {
                    true => Some(response.yes_no(NEEDS_TOOL)?.probability()),
                    false => None,
                };
                Ok((tools, answer))
            });
            match answered {
                Ok((answers, answer)) => {
                    for (i, p) in answers.into_iter().enumerate() {
                        let index = b * batch + i;
                        tracing::debug!(tool = %candidates[index].name, probability = p, "tool relevance");
                        probabilities[index] = Some(p);
                    }
                    if gated {
                        tracing::debug!(probability = ?answer, "needs a tool");
                        needs_tool = answer;
                    }
                }
                Err(error) => return (probabilities, sent, Err(error)),
            }
        }
        (probabilities, sent, Ok(needs_tool))
    }

    /// The candidates that pass, and with the needs-tool gate what it decided on. Without the gate: probability at
    /// least `min_probability`. With it, [`needs_tool_gate`]: nothing unless the gate's probability (of the model's
    /// `answer` and the best candidate's probability) reaches `min_probability`, and then the best candidate and
    /// every one whose probability reaches `companion_min_probability`. Then the `max_results` most probable
    /// (earlier tools win ties, so the result does not depend on sort stability).
    fn passing(
        &self,
        candidates: &[usize],
        probabilities: &[Option<f64>],
        answer: Option<f64>,
    ) -> (Vec<usize>, Option<Gate>) {
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .zip(probabilities)
            .filter_map(|(&i, p)| p.map(|p| (i, p)))
            .collect();
        let (mut passing, gate): (Vec<(usize, f64)>, Option<Gate>) =
            match self.companion_min_probability {
                None => (
                    scored
                        .into_iter()
                        .filter(|(_, p)| *p >= self.min_probability)
                        .collect(),
                    None,
                ),
                Some(companion) => {
                    let only: Vec<f64> = scored.iter().map(|&(_, p)| p).collect();
                    // The first of equally probable tools is the best, as in the ranking.
                    let Some(best) =
                        (0..only.len()).reduce(|b, k| if only[b] >= only[k] { b } else { k })
                    else {
                        return (Vec::new(), None);
                    };
                    let (probability, passes) =
                        needs_tool_gate(answer, &only, best, self.min_probability, companion);
                    // Once open, the gate passes at least the best tool.
                    let open = passes.iter().any(|&p| p);
                    let passing = scored
                        .into_iter()
                        .zip(passes)
                        .filter_map(|(scored, passes)| passes.then_some(scored))
                        .collect();
                    (
                        passing,
                        Some(Gate {
                            answer,
                            probability,
                            open,
                        }),
                    )
                }
            };
        if let Some(max) = self.max_results {
            passing.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            passing.truncate(max);
        }
        (passing.into_iter().map(|(i, _)| i).collect(), gate)
    }

    /// The messages to render: the previous ones (filtered) with the current user message in place of this turn's
    /// stored copy, or after them.
    fn conversation(
        &self,
        request: &ToolProviderRequest,
        current: &UserMessage,
    ) -> Vec<ChatMessage> {
        let Some(history) = request.messages() else {
            return vec![ChatMessage::User(current.clone())];
        };
        let texts: Vec<String> = std::iter::once(request.user_message())
            .chain(request.original_user_message())
            .map(UserMessage::text)
            .collect();
        let turn = current_turn(history, &texts);
        let mut conversation: Vec<ChatMessage> = history
            .iter()
            .enumerate()
            .filter_map(|(i, message)| {
                if Some(i) == turn {
                    Some(ChatMessage::User(current.clone()))
                } else if self
                    .message_filter
                    .as_ref()
                    .is_none_or(|keep| keep(message))
                {
                    Some(message.clone())
                } else {
                    None
                }
            })
            .collect();
        if turn.is_none() {
            conversation.push(ChatMessage::User(current.clone()));
        }
        conversation
    }
}

impl ToolProvider for FilteringToolProvider {
    fn provide_tools(
        &self,
        request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError> {
        Ok(self.select(request)?.into_result())
    }

    fn is_dynamic(&self) -> bool {
        self.tool_provider.is_dynamic()
    }
}

impl fmt::Debug for FilteringToolProvider {
    // The provider, the model and the filter are trait objects with nothing useful to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilteringToolProvider")
            .field("dynamic", &self.tool_provider.is_dynamic())
            .field("decision_model", &self.decision_model.model_name())
            .field("min_probability", &self.min_probability)
            .field("target_recall", &self.target_recall)
            .field("companion_min_probability", &self.companion_min_probability)
            .field("max_results", &self.max_results)
            .field("max_messages", &self.max_messages)
            .field("message_filter", &self.message_filter.is_some())
            .field("max_message_length", &self.max_message_length)
            .field(
                "max_tools_per_decision_request",
                &self.max_tools_per_decision_request,
            )
            .field("always_include", &self.always_include)
            .field("fallback", &self.fallback)
            .field("question_template", &self.question_template.as_str())
            .field("score_called_tools", &self.score_called_tools)
            .finish()
    }
}

fn decision(tool: &ProvidedTool, reason: Reason, passed: bool) -> ToolDecision {
    ToolDecision {
        name: tool.name().to_owned(),
        reason,
        probability: None,
        passed,
    }
}

/// The message to select for: the original one if it has text (retrieved documents and format instructions would
/// otherwise decide), else the one sent to the LLM; `None` if neither has text.
fn current_user_message(request: &ToolProviderRequest) -> Option<&UserMessage> {
    request
        .original_user_message()
        .filter(|m| m.has_text())
        .or_else(|| Some(request.user_message()).filter(|m| m.has_text()))
}

/// The index of this turn's user message in `history`: the last user message, if its text is one of `texts` and
/// only tool calls and tool results follow it (the rounds of the tool-calling loop). An assistant answer after it
/// means that turn is over and the current message is a new one, even with the same text.
fn current_turn(history: &[ChatMessage], texts: &[String]) -> Option<usize> {
    for (i, message) in history.iter().enumerate().rev() {
        match message {
            ChatMessage::User(m) => return texts.contains(&m.text()).then_some(i),
            ChatMessage::Assistant(m) if !m.tool_calls.is_empty() => {}
            ChatMessage::ToolResult(_) => {}
            _ => return None,
        }
    }
    None
}

/// The name of the needs-tool question in the first decision request; the tools' are `tool0`, `tool1`, ….
const NEEDS_TOOL: &str = "needs_tool";

/// `request` with [`YesNoQuestion::needs_tool`] added.
fn with_gate_question(request: &DecisionRequest) -> Result<DecisionRequest, DecisionError> {
    request
        .to_builder()
        .question(NEEDS_TOOL, YesNoQuestion::needs_tool())
        .build()
}

/// The names of every tool called in `messages`, whatever the window or the message filter: the LLM provider sees
/// the whole conversation.
fn called_tools(messages: &[ChatMessage]) -> HashSet<&str> {
    messages
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Assistant(a) => Some(a.tool_calls.iter().map(|c| c.name.as_str())),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Builds a [`FilteringToolProvider`]; every check happens in [`build`](Self::build), and each error names its
/// option.
#[derive(Clone)]
pub struct FilteringToolProviderBuilder {
    tool_provider: Option<Arc<dyn ToolProvider>>,
    decision_model: Option<Arc<dyn DecisionModel>>,
    min_probability: Option<f64>,
    /// The target recall and the threshold the table gave for it, checked in `build`.
    target_recall: Option<(f64, Result<f64, InvalidTargetRecall>)>,
    gate: GateChoice,
    max_results: Option<usize>,
    max_messages: usize,
    message_filter: Option<MessageFilter>,
    max_message_length: usize,
    max_tools_per_decision_request: Option<usize>,
    always_include: Vec<String>,
    fallback: Fallback,
    question_template: String,
    score_called_tools: bool,
}

/// Whether the builder's filter gates on whether any tool is needed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum GateChoice {
    /// As the decision model's selection hints say.
    ModelDefault,
    /// On, with this companion threshold.
    On(f64),
    Off,
}

impl Default for FilteringToolProviderBuilder {
    fn default() -> Self {
        Self {
            tool_provider: None,
            decision_model: None,
            min_probability: None,
            target_recall: None,
            gate: GateChoice::ModelDefault,
            max_results: None,
            max_messages: DEFAULT_MAX_MESSAGES,
            message_filter: None,
            max_message_length: DEFAULT_MAX_MESSAGE_LENGTH,
            max_tools_per_decision_request: None,
            always_include: Vec::new(),
            fallback: Fallback::default(),
            question_template: DEFAULT_QUESTION_TEMPLATE.to_owned(),
            score_called_tools: false,
        }
    }
}

impl FilteringToolProviderBuilder {
    /// The provider whose tools are filtered (required).
    pub fn tool_provider(mut self, provider: Arc<dyn ToolProvider>) -> Self {
        self.tool_provider = Some(provider);
        self
    }

    /// The model that decides (required).
    pub fn decision_model(mut self, model: Arc<dyn DecisionModel>) -> Self {
        self.decision_model = Some(model);
        self
    }

    /// Pass on tools whose probability reaches this (inclusive); between 0 and 1, default 0.5.
    pub fn min_probability(mut self, min_probability: f64) -> Self {
        self.min_probability = Some(min_probability);
        self
    }

    /// Instead of [`min_probability`](Self::min_probability), pass on the smallest set that
    /// covers the needed tools `target_recall` of the time: the threshold is
    /// [`Conformal::threshold`] of `conformal`, the table of the decision model's probabilities for
    /// the needed tools of held-out cases (`decide_engine::Engine::conformal`, written by
    /// `decide calibrate`). The filter works over any [`DecisionModel`], so the table is the
    /// caller's to give, and it must come from the same model and calibration as
    /// [`decision_model`](Self::decision_model). The recall is marginal (on average over cases
    /// like the table's), must lie in `(0, 1)`, and is measured before `max_results`, which still
    /// caps the set. Setting both this and `min_probability` fails at `build`.
    pub fn target_recall(mut self, target_recall: f64, conformal: &Conformal) -> Self {
        self.target_recall = Some((target_recall, conformal.threshold(target_recall)));
        self
    }

    /// Decide first whether the conversation needs any tool, then which: the first decision request also asks
    /// [`YesNoQuestion::needs_tool`], and no tool passes unless
    /// [`needs_tool_probability`](decide_contract::needs_tool_probability) of its answer and the best tool's probability reaches
    /// [`min_probability`](Self::min_probability); then the best tool passes, and with it every tool whose
    /// probability reaches `companion_min_probability` (between 0 and 1), and the next most probable that reach
    /// a share of the best one's ([`needs_tool_gate`](decide_contract::needs_tool_gate)). A model that refuses the question
    /// (one without a needs-tool head) leaves the gate to the best tool's probability alone.
    ///
    /// One threshold on each tool's probability trades the tools a request needs against the requests that need
    /// none: the best tool of a tersely written request is often under 0.5, and a follow-up that needs no tool
    /// still has tools near it. The gate decides the second question on the conversation as a whole, so the
    /// further tools can pass at a lower bar. Cannot be combined with
    /// [`target_recall`](Self::target_recall), whose guarantee is for one threshold.
    ///
    /// Unless set, or turned off with [`without_needs_tool_gate`](Self::without_needs_tool_gate), the gate is
    /// on with the companion threshold of the decision model's
    /// [`selection_hints`](DecisionModel::selection_hints) when it has one and no target recall is set: every
    /// front end selects by the same rule by default.
    pub fn needs_tool_gate(mut self, companion_min_probability: f64) -> Self {
        self.gate = GateChoice::On(companion_min_probability);
        self
    }

    /// One threshold on each tool's probability, even for a decision model with a needs-tool head.
    pub fn without_needs_tool_gate(mut self) -> Self {
        self.gate = GateChoice::Off;
        self
    }

    /// The decision model's name, when it has one set.
    pub(crate) fn model_name(&self) -> Option<String> {
        self.decision_model.as_ref().and_then(|m| m.model_name())
    }

    /// The decision model's own facts about selecting (none before one is set).
    pub(crate) fn hints(&self) -> decide_contract::SelectionHints {
        self.decision_model
            .as_ref()
            .map(|m| m.selection_hints())
            .unwrap_or_default()
    }

    /// Keep at most this many of the tools the model selects, the most probable ones, on top of the tools passed
    /// without asking; at least 1, default no limit.
    pub fn max_results(mut self, max_results: usize) -> Self {
        self.max_results = Some(max_results);
        self
    }

    /// How many of the latest messages the decision sees (system messages come on top); at least 1, default 10.
    pub fn max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// Drops the previous messages for which `keep` is false from the decision's input (the current user message
    /// is always kept). Dropped messages do not count towards `max_messages`, and tools they called still pass
    /// without asking.
    pub fn message_filter(
        mut self,
        keep: impl Fn(&ChatMessage) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.message_filter = Some(Arc::new(keep));
        self
    }

    /// Shorten message texts longer than this many characters, keeping the start and the end around a marker; at
    /// least 1, default 2000.
    pub fn max_message_length(mut self, max_message_length: usize) -> Self {
        self.max_message_length = max_message_length;
        self
    }

    /// Ask about at most this many tools per decision request; the conversation is sent with every batch. At least
    /// 1, default all tools in one request. This does not limit how many tools are passed on.
    pub fn max_tools_per_decision_request(mut self, max_tools: usize) -> Self {
        self.max_tools_per_decision_request = Some(max_tools);
        self
    }

    /// Tools always passed on without asking; replaces the names given before.
    pub fn always_include<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.always_include = names.into_iter().map(Into::into).collect();
        self
    }

    /// What to pass on when the decision model fails or refuses; default [`Fallback::AllTools`].
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// The question asked about each tool, with `{{name}}` (required) and `{{description}}`; default
    /// [`DEFAULT_QUESTION_TEMPLATE`].
    pub fn question_template(mut self, template: impl Into<String>) -> Self {
        self.question_template = template.into();
        self
    }

    /// Also ask the model about the tools the conversation already called; default false. They are
    /// passed on either way (some LLM providers reject requests whose messages call tools that are
    /// not in the request), so this changes no selection: it costs one pair per called tool and
    /// gives each its probability, which an evaluation of the model needs to rank it as the model
    /// would rather than first.
    pub fn score_called_tools(mut self, score: bool) -> Self {
        self.score_called_tools = score;
        self
    }

    /// Checks every option and builds the filter.
    pub fn build(self) -> Result<FilteringToolProvider, FilterError> {
        let tool_provider = self
            .tool_provider
            .ok_or_else(|| FilterError::config("tool_provider", "is required"))?;
        let decision_model = self
            .decision_model
            .ok_or_else(|| FilterError::config("decision_model", "is required"))?;
        let (min_probability, target_recall) = match (self.min_probability, self.target_recall) {
            (Some(_), Some(_)) => {
                return Err(FilterError::config(
                    "target_recall",
                    "replaces min_probability: set one of them, not both",
                ))
            }
            (_, Some((_, Err(error)))) => {
                return Err(FilterError::config("target_recall", error.to_string()))
            }
            (_, Some((recall, Ok(threshold)))) => (threshold, Some(recall)),
            (p, None) => (p.unwrap_or(DEFAULT_MIN_PROBABILITY), None),
        };
        if !(0.0..=1.0).contains(&min_probability) {
            return Err(FilterError::config(
                "min_probability",
                format!("must be between 0 and 1, but was {min_probability}"),
            ));
        }
        let companion_min_probability = match self.gate {
            GateChoice::On(companion) => Some(companion),
            GateChoice::Off => None,
            GateChoice::ModelDefault if target_recall.is_none() => {
                decision_model.selection_hints().companion_min_probability
            }
            GateChoice::ModelDefault => None,
        };
        if let GateChoice::On(companion) = self.gate {
            if target_recall.is_some() {
                return Err(FilterError::config(
                    "needs_tool_gate",
                    "cannot be combined with target_recall, whose recall is promised for one threshold",
                ));
            }
            if !(0.0..=1.0).contains(&companion) {
                return Err(FilterError::config(
                    "needs_tool_gate",
                    format!("its companion_min_probability must be between 0 and 1, but was {companion}"),
                ));
            }
        }
        for (option, value) in [
            ("max_results", self.max_results),
            ("max_messages", Some(self.max_messages)),
            ("max_message_length", Some(self.max_message_length)),
            (
                "max_tools_per_decision_request",
                self.max_tools_per_decision_request,
            ),
        ] {
            if value == Some(0) {
                return Err(FilterError::config(option, "must be at least 1, but was 0"));
            }
        }
        let question_template = QuestionTemplate::parse(&self.question_template)?;
        Ok(FilteringToolProvider {
            tool_provider,
            decision_model,
            min_probability,
            target_recall,
            companion_min_probability,
            max_results: self.max_results,
            max_messages: self.max_messages,
            message_filter: self.message_filter,
            max_message_length: self.max_message_length,
            max_tools_per_decision_request: self.max_tools_per_decision_request,
            always_include: self.always_include,
            fallback: self.fallback,
            question_template,
            score_called_tools: self.score_called_tools,
        })
    }
}

impl fmt::Debug for FilteringToolProviderBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilteringToolProviderBuilder")
            .field("tool_provider", &self.tool_provider.is_some())
            .field("decision_model", &self.decision_model.is_some())
            .field("min_probability", &self.min_probability)
            .field("target_recall", &self.target_recall)
            .field("gate", &self.gate)
            .field("max_results", &self.max_results)
            .field("max_messages", &self.max_messages)
            .field("message_filter", &self.message_filter.is_some())
            .field("max_message_length", &self.max_message_length)
            .field(
                "max_tools_per_decision_request",
                &self.max_tools_per_decision_request,
            )
            .field("always_include", &self.always_include)
            .field("fallback", &self.fallback)
            .field("question_template", &self.question_template)
            .field("score_called_tools", &self.score_called_tools)
            .finish()
    }
}
