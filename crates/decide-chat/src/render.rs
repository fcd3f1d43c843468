//! Rendering a conversation as the `{"messages":[{"role","text"}]}` input of a decision model.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::message::{AssistantMessage, ChatMessage, ToolCall, ToolResultMessage};

/// The marker put in the middle of a shortened message.
pub const ELISION_MARKER: &str = " […] ";

/// One message as a decision model sees it: a role and plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionMessage {
    /// `"system"`, `"user"`, `"assistant"` or `"tool"`.
    pub role: String,
    /// The rendered text, never blank.
    pub text: String,
}

impl DecisionMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> Self {
        DecisionMessage {
            role: role.into(),
            text: text.into(),
        }
    }

    /// The message as `{"role": .., "text": ..}`.
    pub fn to_json(&self) -> Value {
        json!({"role": self.role, "text": self.text})
    }
}

/// What [`decision_messages`] keeps.
///
/// The default is LangChain4j 1.21.0's `DecisionModelInputUtils`: user and assistant text only, nothing shortened.
/// Its later form, which the filtering provider documents, also sends system messages and tool traffic (so that a
/// follow-up such as "do the same for Berlin" carries the earlier call) and shortens long messages; set the fields
/// to get that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// Render system messages, with role `"system"`.
    pub include_system: bool,
    /// Render tool calls as assistant text (`called get_weather({"city":"Paris"})`) and tool results with role
    /// `"tool"` (`get_weather returned: sunny`).
    pub include_tools: bool,
    /// Shorten texts longer than this many characters, keeping the start and the end around [`ELISION_MARKER`].
    pub max_message_length: Option<usize>,
}

/// Renders a conversation for a decision model, dropping messages whose text is blank.
///
/// Every rendered text is at most `opts.max_message_length` characters. Roles are the OpenAI ones, so a decision
/// model trained on chat logs sees familiar labels.
pub fn decision_messages(messages: &[ChatMessage], opts: &RenderOptions) -> Vec<DecisionMessage> {
    // Tool results usually carry only the call id; remember the names of the calls seen so far to name the tool.
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    let mut rendered = Vec::new();
    for message in messages {
        let (role, text) = match message {
            ChatMessage::System(m) if opts.include_system => ("system", m.text.clone()),
            ChatMessage::System(_) => continue,
            ChatMessage::User(m) => ("user", m.text()),
            ChatMessage::Assistant(m) => {
                for call in &m.tool_calls {
                    if let Some(id) = &call.id {
                        call_names.insert(id, &call.name);
                    }
                }
                ("assistant", assistant_text(m, opts.include_tools))
            }
            ChatMessage::ToolResult(m) if opts.include_tools => {
                if m.text.trim().is_empty() {
                    continue;
                }
                ("tool", tool_result_text(m, &call_names))
            }
            ChatMessage::ToolResult(_) => continue,
        };
        let text = match opts.max_message_length {
            Some(max) => shorten(&text, max),
            None => text,
        };
        // Checked after shortening, which can leave only the leading whitespace of a text.
        if text.trim().is_empty() {
            continue;
        }
        rendered.push(DecisionMessage::new(role, text));
    }
    rendered
}

/// The `{"messages": [{"role": .., "text": ..}, ...]}` fields of a decision request.
pub fn decision_fields(msgs: &[DecisionMessage]) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert(
        "messages".to_owned(),
        Value::Array(msgs.iter().map(DecisionMessage::to_json).collect()),
    );
    fields
}

/// Shortens `text` to at most `max` characters, keeping its start and end around [`ELISION_MARKER`].
///
/// Both ends are kept because the start of a message usually says what it is about and the end what is asked. When
/// `max` leaves no room for the marker, only the start is kept.
pub fn shorten(text: &str, max: usize) -> String {
    let length = text.chars().count();
    if length <= max {
        return text.to_owned();
    }
    let marker_length = ELISION_MARKER.chars().count();
    if max <= marker_length {
        return text.chars().take(max).collect();
    }
    let kept = max - marker_length;
    let tail_length = kept / 2;
    let head_length = kept - tail_length;
    let head: String = text.chars().take(head_length).collect();
    let tail: String = text.chars().skip(length - tail_length).collect();
    format!("{head}{ELISION_MARKER}{tail}")
}

fn assistant_text(message: &AssistantMessage, include_tools: bool) -> String {
    let text = message.text.clone().unwrap_or_default();
    if !include_tools || message.tool_calls.is_empty() {
        return text;
    }
    let calls = message
        .tool_calls
        .iter()
        .map(render_call)
        .collect::<Vec<_>>()
        .join("; ");
    if text.trim().is_empty() {
        calls
    } else {
        format!("{text}\n{calls}")
    }
}

fn render_call(call: &ToolCall) -> String {
    // Models often pretty-print their arguments; compact them so the call fits on one line and wastes no budget.
    let arguments = serde_json::from_str::<Value>(&call.arguments)
        .map(|value| value.to_string())
        .unwrap_or_else(|_| call.arguments.trim().to_owned());
    format!("called {}({arguments})", call.name)
}

fn tool_result_text(message: &ToolResultMessage, call_names: &HashMap<&str, &str>) -> String {
    let name = message.tool_name.as_deref().or_else(|| {
        message
            .tool_call_id
            .as_deref()
            .and_then(|id| call_names.get(id).copied())
    });
    match name {
        Some(name) => format!("{name} returned: {}", message.text),
        None => format!("returned: {}", message.text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Content, UserMessage};

    fn all() -> RenderOptions {
        RenderOptions {
            include_system: true,
            include_tools: true,
            max_message_length: None,
        }
    }

    fn pairs(messages: &[DecisionMessage]) -> Vec<(&str, &str)> {
        messages
            .iter()
            .map(|m| (m.role.as_str(), m.text.as_str()))
            .collect()
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("You help with travel."),
            ChatMessage::user("Weather in Paris?"),
            ChatMessage::tool_calls(vec![ToolCall::new(
                Some("call_1"),
                "get_weather",
                "{\n  \"city\": \"Paris\"\n}",
            )]),
            ChatMessage::tool_result(Some("call_1"), None, "sunny, 24°C"),
            ChatMessage::assistant("It is sunny in Paris."),
            ChatMessage::user("Do the same for Berlin"),
        ]
    }

    #[test]
    fn default_is_langchain4j_1_21() {
        let rendered = decision_messages(&conversation(), &RenderOptions::default());
        assert_eq!(
            pairs(&rendered),
            [
                ("user", "Weather in Paris?"),
                ("assistant", "It is sunny in Paris."),
                ("user", "Do the same for Berlin"),
            ]
        );
    }

    #[test]
    fn tools_and_system_included() {
        let rendered = decision_messages(&conversation(), &all());
        assert_eq!(
            pairs(&rendered),
            [
                ("system", "You help with travel."),
                ("user", "Weather in Paris?"),
                ("assistant", r#"called get_weather({"city":"Paris"})"#),
                ("tool", "get_weather returned: sunny, 24°C"),
                ("assistant", "It is sunny in Paris."),
                ("user", "Do the same for Berlin"),
            ]
        );
    }

    #[test]
    fn several_calls_after_text() {
        let messages = vec![
            ChatMessage::Assistant(AssistantMessage {
                text: Some("Checking both.".into()),
                tool_calls: vec![
                    ToolCall::new(Some("a"), "get_weather", r#"{"city":"Paris"}"#),
                    ToolCall::new(Some("b"), "get_time", ""),
                    ToolCall::new(None, "broken", "{city: Paris "),
                ],
            }),
            ChatMessage::tool_result(Some("b"), None, "12:00"),
            ChatMessage::tool_result(Some("a"), Some("weather"), "rain"),
            ChatMessage::tool_result(Some("zzz"), None, "lost"),
            ChatMessage::tool_result(None, None, "anonymous"),
            ChatMessage::tool_result(Some("a"), None, "   "),
        ];
        let rendered = decision_messages(&messages, &all());
        assert_eq!(
            pairs(&rendered),
            [
                (
                    "assistant",
                    "Checking both.\ncalled get_weather({\"city\":\"Paris\"}); called get_time(); called broken({city: Paris)"
                ),
                ("tool", "get_time returned: 12:00"),
                ("tool", "weather returned: rain"),
                ("tool", "returned: lost"),
                ("tool", "returned: anonymous"),
            ]
        );
    }

    #[test]
    fn calls_are_hidden_without_include_tools() {
        let messages = vec![ChatMessage::Assistant(AssistantMessage {
            text: Some("Checking.".into()),
            tool_calls: vec![ToolCall::new(Some("a"), "f", "{}")],
        })];
        let rendered = decision_messages(&messages, &RenderOptions::default());
        assert_eq!(pairs(&rendered), [("assistant", "Checking.")]);
    }

    #[test]
    fn blank_messages_dropped_and_attachments_marked() {
        let messages = vec![
            ChatMessage::system("  "),
            ChatMessage::user(""),
            ChatMessage::User(UserMessage::from_contents(vec![Content::image("u")])),
            ChatMessage::assistant("\n"),
        ];
        let rendered = decision_messages(&messages, &all());
        assert_eq!(pairs(&rendered), [("user", "[attached image]")]);
    }

    #[test]
    fn long_messages_shortened() {
        let options = RenderOptions {
            max_message_length: Some(15),
            ..all()
        };
        let messages = vec![
            ChatMessage::user("abcdefghijklmnopqrstuvwxyz"),
            ChatMessage::assistant("short"),
        ];
        let rendered = decision_messages(&messages, &options);
        assert_eq!(
            pairs(&rendered),
            [("user", "abcde […] vwxyz"), ("assistant", "short")]
        );
        assert!(rendered.iter().all(|m| m.text.chars().count() <= 15));
    }

    #[test]
    fn shorten_edges() {
        assert_eq!(shorten("abcdef", 6), "abcdef");
        assert_eq!(shorten("abcdefgh", 6), "a […] ");
        assert_eq!(shorten("abcdefgh", 7), "a […] h");
        assert_eq!(shorten("abcdefgh", 5), "abcde");
        assert_eq!(shorten("abcdefgh", 0), "");
        assert_eq!(shorten("", 0), "");
        // Multi-byte characters are counted as characters and never split.
        let text = "äöü".repeat(10);
        let short = shorten(&text, 11);
        assert_eq!(short, "äöü […] äöü");
        assert_eq!(short.chars().count(), 11);
        for max in 0..40 {
            assert!(shorten(&text, max).chars().count() <= max);
        }
    }

    #[test]
    fn shortened_to_blank_is_dropped() {
        let options = RenderOptions {
            max_message_length: Some(2),
            ..all()
        };
        let messages = vec![ChatMessage::user("   hello"), ChatMessage::user("hello")];
        let rendered = decision_messages(&messages, &options);
        assert_eq!(pairs(&rendered), [("user", "he")]);
    }

    #[test]
    fn fields() {
        let fields = decision_fields(&[
            DecisionMessage::new("user", "Will it rain?"),
            DecisionMessage::new("assistant", "No."),
        ]);
        assert_eq!(
            Value::Object(fields),
            json!({"messages": [
                {"role": "user", "text": "Will it rain?"},
                {"role": "assistant", "text": "No."}
            ]})
        );
        assert_eq!(Value::Object(decision_fields(&[])), json!({"messages": []}));
    }
}
