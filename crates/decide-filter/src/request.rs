//! The tool selection as users ask for it (a `/v1/select` body, the command line's options): read once with serde,
//! unknown keys refused, and checked on the way in, so that every front end sets the filter up alike.

use decide_chat::{conversation, from_slice, from_value, messages_field, tools_field};
use decide_chat::{ChatMessage, ParseError, ToolProviderRequest, ToolSpecification};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::FilterError;
use crate::filter::FilteringToolProviderBuilder;
use crate::selection::{Fallback, FallbackUsed, Gate, Reason, Selection, ToolDecision};

/// The filter's options as a request or a command line gives them; `None` (or no names) keeps the builder's
/// default. Their values are checked by [`FilteringToolProviderBuilder::build`], whose errors name the option.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilterOptions {
    /// [`FilteringToolProviderBuilder::min_probability`].
    pub min_probability: Option<f64>,
    /// [`FilteringToolProviderBuilder::target_recall`], with the table [`apply`](Self::apply) is given.
    pub target_recall: Option<f64>,
    /// [`FilteringToolProviderBuilder::max_results`].
    pub max_results: Option<usize>,
    /// [`FilteringToolProviderBuilder::max_messages`].
    pub max_messages: Option<usize>,
    /// [`FilteringToolProviderBuilder::max_message_length`].
    pub max_message_length: Option<usize>,
    /// [`FilteringToolProviderBuilder::always_include`].
    pub always_include: Vec<String>,
    /// [`FilteringToolProviderBuilder::fallback`].
    pub fallback: Option<Fallback>,
    /// [`FilteringToolProviderBuilder::needs_tool_gate`]: on, off, or (`None`) on when the decision model has a
    /// needs-tool head and no target recall is set; see [`apply`](Self::apply).
    pub needs_tool_gate: Option<bool>,
}

impl FilterOptions {
    /// Refuses an `always_include` name that no tool of `tools` has: a misspelt name would
    /// otherwise be ignored without a word.
    pub fn check_always_include(&self, tools: &[ToolSpecification]) -> Result<(), FilterError> {
        let names: std::collections::HashSet<&str> =
            tools.iter().map(|t| t.name.as_str()).collect();
        match self
            .always_include
            .iter()
            .find(|n| !names.contains(n.as_str()))
        {
            Some(unknown) => Err(FilterError::InvalidConfig {
                option: "always_include",
                message: format!("no tool is named {unknown:?}"),
            }),
            None => Ok(()),
        }
    }

    /// Sets these options on `builder`, which has its decision model: the conformal table of a target recall and
    /// the needs-tool gate's companion threshold are the model's own ([`selection_hints`]). `needs_tool_gate`
    /// unset leaves the builder's default (on for a model with a needs-tool head unless a target recall is set);
    /// turned on for a model without a head, further tools pass at `min_probability`, which selects what the
    /// one-threshold rule does.
    ///
    /// [`selection_hints`]: decide_contract::DecisionModel::selection_hints
    pub fn apply(
        &self,
        mut builder: FilteringToolProviderBuilder,
    ) -> Result<FilteringToolProviderBuilder, FilterError> {
        // Only an option that needs them asks the model here; the default gate is `build`'s to find.
        let hints = if self.needs_tool_gate == Some(true) || self.target_recall.is_some() {
            builder.hints()
        } else {
            decide_contract::SelectionHints::default()
        };
        builder = match self.needs_tool_gate {
            Some(false) => builder.without_needs_tool_gate(),
            Some(true) => builder.needs_tool_gate(
                hints.companion_min_probability.unwrap_or(
                    self.min_probability
                        .unwrap_or(crate::filter::DEFAULT_MIN_PROBABILITY),
                ),
            ),
            None => builder,
        };
        if let Some(p) = self.min_probability {
            builder = builder.min_probability(p);
        }
        if let Some(r) = self.target_recall {
            let Some(table) = &hints.conformal else {
                let model = builder
                    .model_name()
                    .unwrap_or_else(|| "the decision model".into());
                return Err(FilterError::config(
                    "target_recall",
                    format!("model {model} has no conformal calibration; run decide calibrate on held-out labelled cases to add one"),
                ));
            };
            builder = builder.target_recall(r, table);
        }
        if let Some(k) = self.max_results {
            builder = builder.max_results(k);
        }
        if let Some(n) = self.max_messages {
            builder = builder.max_messages(n);
        }
        if let Some(n) = self.max_message_length {
            builder = builder.max_message_length(n);
        }
        if !self.always_include.is_empty() {
            builder = builder.always_include(self.always_include.clone());
        }
        if let Some(f) = self.fallback {
            builder = builder.fallback(f);
        }
        Ok(builder)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectBody {
    #[serde(default, deserialize_with = "messages_field")]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default, deserialize_with = "tools_field")]
    tools: Option<Vec<ToolSpecification>>,
    #[serde(default)]
    min_probability: Option<f64>,
    #[serde(default)]
    target_recall: Option<f64>,
    #[serde(default)]
    max_results: Option<usize>,
    #[serde(default)]
    max_messages: Option<usize>,
    #[serde(default)]
    max_message_length: Option<usize>,
    #[serde(default)]
    always_include: Option<Vec<String>>,
    #[serde(default)]
    fallback: Option<String>,
    #[serde(default)]
    needs_tool_gate: Option<bool>,
}

/// Which tools a conversation needs: the request to the filter, the tools it chooses among and its options, as a
/// `/v1/select` body gives them (`{"messages" | "text", "tools", "min_probability"? | "target_recall"?,
/// "max_results"?, "max_messages"?, "max_message_length"?, "always_include"?, "fallback"?, "needs_tool_gate"?}`).
#[derive(Debug, Clone)]
pub struct SelectRequest {
    /// The conversation, as [`provider_request`] makes it.
    pub request: ToolProviderRequest,
    /// The tools to choose among; never empty.
    pub tools: Vec<ToolSpecification>,
    /// The filter's options.
    pub options: FilterOptions,
}

impl SelectRequest {
    /// Reads a request body; unknown keys are refused and every error names its JSON path.
    pub fn from_value(json: Value) -> Result<Self, ParseError> {
        let body: SelectBody = from_value(json)?;
        let messages = conversation(body.messages, body.text)?;
        let tools = body
            .tools
            .ok_or_else(|| ParseError::invalid("tools", "missing"))?;
        let fallback = body
            .fallback
            .map(|f| f.parse().map_err(|e| option_error(e, "fallback")))
            .transpose()?;
        let options = FilterOptions {
            min_probability: body.min_probability,
            target_recall: body.target_recall,
            max_results: body.max_results,
            max_messages: body.max_messages,
            max_message_length: body.max_message_length,
            always_include: body.always_include.unwrap_or_default(),
            fallback,
            needs_tool_gate: body.needs_tool_gate,
        };
        Self::new(&messages, tools, options)
    }

    /// The request of a conversation, its tools and options however a front end read them (the
    /// command line from its files and flags): every rule of the input is here, so each front end
    /// accepts and refuses the same things in the same words, each error naming the field
    /// (`messages`, `tools`, `always_include`).
    pub fn new(
        messages: &[ChatMessage],
        tools: Vec<ToolSpecification>,
        options: FilterOptions,
    ) -> Result<Self, ParseError> {
        if tools.is_empty() {
            return Err(ParseError::invalid("tools", "empty"));
        }
        let request = provider_request(messages).ok_or_else(|| {
            ParseError::invalid("messages", "the conversation has no user message")
        })?;
        // With nothing to decide on, the filter would pass every tool.
        if request.user_message().text().trim().is_empty() {
            return Err(ParseError::invalid(
                "messages",
                "the last user message is blank",
            ));
        }
        options
            .check_always_include(&tools)
            .map_err(|e| option_error(e, "always_include"))?;
        Ok(Self {
            request,
            tools,
            options,
        })
    }

    /// [`from_value`](Self::from_value) of JSON text; a syntax error names the line and column.
    pub fn from_slice(json: &[u8]) -> Result<Self, ParseError> {
        Self::from_value(from_slice(json)?)
    }
}

/// A filter error about an option as a request's error, naming the option (`field` when the
/// error does not name one).
fn option_error(error: FilterError, field: &'static str) -> ParseError {
    match error {
        FilterError::InvalidConfig { option, message } => ParseError::invalid(option, message),
        other => ParseError::invalid(field, other.to_string()),
    }
}

/// The request an agent would make for this conversation: its last user message, with everything before it (and any
/// tool traffic after it) as the previous messages; `None` when no message is the user's.
pub fn provider_request(messages: &[ChatMessage]) -> Option<ToolProviderRequest> {
    let user = messages.iter().rev().find_map(|m| match m {
        ChatMessage::User(u) => Some(u.clone()),
        _ => None,
    })?;
    Some(
        ToolProviderRequest::builder(user)
            .messages(messages.to_vec())
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tools() -> Value {
        json!([{"name": "get_weather"}, {"name": "send_email"}])
    }

    /// A decision model that knows its own selection facts, as decide's engine does.
    struct Hinted(decide_contract::SelectionHints);

    impl decide_contract::DecisionModel for Hinted {
        fn do_decide(
            &self,
            _: &decide_contract::DecisionRequest,
        ) -> decide_contract::Result<decide_contract::DecisionResponse> {
            Err(decide_contract::DecisionError::model(
                "not asked in these tests",
            ))
        }

        fn model_name(&self) -> Option<String> {
            Some("hinted".into())
        }

        fn selection_hints(&self) -> decide_contract::SelectionHints {
            self.0.clone()
        }
    }

    fn builder_over(hints: decide_contract::SelectionHints) -> FilteringToolProviderBuilder {
        crate::FilteringToolProvider::builder()
            .tool_provider(std::sync::Arc::new(
                decide_chat::StaticToolProvider::from_specifications(vec![ToolSpecification::new(
                    "get_weather",
                )]),
            ))
            .decision_model(std::sync::Arc::new(Hinted(hints)))
    }

    #[test]
    fn the_filter_learns_the_gate_and_the_conformal_table_from_its_model() {
        let table = decide_contract::Conformal::from_needed([0.1, 0.3, 0.6, 0.9]).unwrap();
        let hints = decide_contract::SelectionHints {
            conformal: Some(table.clone()),
            companion_min_probability: Some(0.2),
        };
        // No option given: the model's gate, at its companion threshold.
        let filter = FilterOptions::default()
            .apply(builder_over(hints.clone()))
            .and_then(|b| b.build())
            .unwrap();
        assert_eq!(filter.companion_min_probability(), Some(0.2));
        // A target recall: the model's table gives the threshold, and the gate steps aside.
        let options = FilterOptions {
            target_recall: Some(0.5),
            ..FilterOptions::default()
        };
        let filter = options
            .apply(builder_over(hints.clone()))
            .and_then(|b| b.build())
            .unwrap();
        assert_eq!(filter.companion_min_probability(), None);
        assert_eq!(filter.min_probability(), table.threshold(0.5).unwrap());
        // The gate turned off: one threshold.
        let options = FilterOptions {
            needs_tool_gate: Some(false),
            ..FilterOptions::default()
        };
        let filter = options
            .apply(builder_over(hints))
            .and_then(|b| b.build())
            .unwrap();
        assert_eq!(filter.companion_min_probability(), None);
    }

    #[test]
    fn a_target_recall_of_a_model_without_a_table_names_the_option() {
        let options = FilterOptions {
            target_recall: Some(0.9),
            ..FilterOptions::default()
        };
        let error = options
            .apply(builder_over(decide_contract::SelectionHints::default()))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("target_recall: model hinted has no conformal calibration"),
            "{error}"
        );
        // And a model without a head selects with one threshold by default.
        let filter = FilterOptions::default()
            .apply(builder_over(decide_contract::SelectionHints::default()))
            .and_then(|b| b.build())
            .unwrap();
        assert_eq!(filter.companion_min_probability(), None);
    }

    #[test]
    fn a_blank_last_user_message_is_refused() {
        let body = json!({"messages": [{"role": "user", "content": "rain?"}, {"role": "assistant", "content": "Where?"},
                                       {"role": "user", "content": "\n"}], "tools": tools()});
        let error = SelectRequest::from_value(body).unwrap_err().to_string();
        assert!(error.contains("the last user message is blank"), "{error}");
    }

    #[test]
    fn a_body_gives_the_conversation_the_tools_and_the_options() {
        let request = SelectRequest::from_value(json!({
            "text": "rain?", "tools": tools(), "max_results": 1, "always_include": ["send_email"],
            "fallback": "NO_TOOLS"
        }))
        .unwrap();
        assert_eq!(request.request.user_message().text(), "rain?");
        assert_eq!(request.tools.len(), 2);
        assert_eq!(
            request.options,
            FilterOptions {
                max_results: Some(1),
                always_include: vec!["send_email".into()],
                fallback: Some(Fallback::NoTools),
                ..FilterOptions::default()
            }
        );
    }

    #[test]
    fn errors_name_the_field() {
        let error = |json: Value| SelectRequest::from_value(json).unwrap_err();
        let cases = [
            (json!({"text": "x", "tool": tools()}), "tool"),
            (json!({"text": "x"}), "tools"),
            (json!({"text": "x", "tools": []}), "tools"),
            (
                json!({"text": "x", "tools": tools(), "max_results": -1}),
                "max_results",
            ),
            (
                json!({"text": "x", "tools": tools(), "target_recall": "high"}),
                "target_recall",
            ),
            (
                json!({"text": "x", "tools": tools(), "always_include": [1]}),
                "always_include[0]",
            ),
            (
                json!({"text": "x", "tools": tools(), "fallback": "maybe"}),
                "fallback",
            ),
            (
                json!({"messages": [{"role": "system", "content": "x"}], "tools": tools()}),
                "messages",
            ),
        ];
        for (json, path) in cases {
            assert_eq!(error(json.clone()).path(), Some(path), "{json}");
        }
    }
}

/// One tool of a [`SelectResponse`]: its probability of being needed (none when it passed without
/// asking) and why it passed or not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoredTool {
    /// The tool's name.
    pub name: String,
    /// The decision model's probability that the tool is needed, when it was asked.
    pub probability: Option<f64>,
    /// Why it was passed on or not.
    pub reason: Reason,
}

/// What a selection answers, as `decide select --json` prints it and `POST /v1/select` returns
/// it: `{"selected": [...], "scores": [...], "needs_tool"?, "fallback"?}`, serialized here once
/// so that every front end answers alike.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectResponse {
    /// The tools passed on, in the catalogue's order.
    pub selected: Vec<ScoredTool>,
    /// Every tool of the catalogue, in its order.
    pub scores: Vec<ScoredTool>,
    /// What the needs-tool gate decided on, when it is on and something was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs_tool: Option<Gate>,
    /// The fallback applied, when the decision model failed or refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackUsed>,
}

impl From<&Selection> for SelectResponse {
    fn from(selection: &Selection) -> Self {
        let scored = |d: &ToolDecision| ScoredTool {
            name: d.name.clone(),
            probability: d.probability,
            reason: d.reason,
        };
        Self {
            selected: selection
                .decisions
                .iter()
                .filter(|d| d.passed)
                .map(scored)
                .collect(),
            scores: selection.decisions.iter().map(scored).collect(),
            needs_tool: selection.gate,
            fallback: selection.fallback.clone(),
        }
    }
}
