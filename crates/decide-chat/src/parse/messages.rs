//! The OpenAI chat-completions conversation format.

use serde_json::Value;

use super::{expect_object, optional_string, required_name, required_string, Object};
use crate::error::{quote, type_name, ParseError};
use crate::message::{
    AssistantMessage, ChatMessage, Content, FileRef, SystemMessage, ToolCall, ToolResultMessage,
    UserMessage,
};

/// Parses a conversation in OpenAI chat format from JSON text; see [`parse_messages`].
pub fn parse_messages_str(text: &str) -> Result<Vec<ChatMessage>, ParseError> {
    let value: Value = serde_json::from_str(text)?;
    parse_messages(&value)
}

/// Parses a conversation in OpenAI chat format: an array of messages, or an object with a `"messages"` array such as
/// a whole chat-completions request.
///
/// Roles `system` and `developer` become [`ChatMessage::System`]; `user`, `assistant`, `tool` and the legacy
/// `function` map to the other variants. Content may be a string, `null` (an assistant that only calls tools) or an
/// array of parts: `text`, `image_url`, `input_audio`, `file` (a PDF when its name or data says so), `video_url`, and
/// the Responses API's `input_text`, `input_image` and `input_file`. Tool-call arguments given as an object are kept
/// as compact JSON text.
///
/// Fields this crate does not model (`refusal` fields, `audio`, `annotations`, ...) are ignored rather than rejected,
/// because exports carry whatever their provider added; fields it does model must have the right type.
pub fn parse_messages(json: &Value) -> Result<Vec<ChatMessage>, ParseError> {
    const EXPECTED: &str = r#"expected an array of messages or an object with "messages""#;
    let items = match json {
        Value::Array(items) => items,
        Value::Object(object) => match object.get("messages") {
            Some(Value::Array(items)) => items,
            Some(other) => {
                return Err(ParseError::invalid(
                    "messages",
                    format!("expected an array, got {}", type_name(other)),
                ))
            }
            // A lone message is a common slip; say so instead of the generic complaint.
            None if object.contains_key("role") => {
                return Err(ParseError::invalid(
                    "messages",
                    format!("{EXPECTED}, got a single message (wrap it in [ ])"),
                ))
            }
            None => {
                return Err(ParseError::invalid(
                    "messages",
                    format!(r#"{EXPECTED}, got an object without "messages""#),
                ))
            }
        },
        other => {
            return Err(ParseError::invalid(
                "messages",
                format!("{EXPECTED}, got {}", type_name(other)),
            ))
        }
    };
    if items.is_empty() {
        return Err(ParseError::invalid("messages", "empty conversation"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_message(item, &format!("messages[{index}]")))
        .collect()
}

fn parse_message(value: &Value, path: &str) -> Result<ChatMessage, ParseError> {
    let object = expect_object(value, path)?;
    let role = match object.get("role") {
        None | Some(Value::Null) => {
            return Err(ParseError::invalid(path, r#"missing "role""#));
        }
        Some(Value::String(role)) => role.as_str(),
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{path}.role"),
                format!("expected a string, got {}", type_name(other)),
            ))
        }
    };
    match role {
        "system" | "developer" => Ok(ChatMessage::System(SystemMessage {
            text: text_content(object, path, "a system")?,
        })),
        "user" => parse_user(object, path).map(ChatMessage::User),
        "assistant" => parse_assistant(object, path).map(ChatMessage::Assistant),
        "tool" | "function" => Ok(ChatMessage::ToolResult(ToolResultMessage {
            tool_call_id: optional_string(object, "tool_call_id", path)?,
            tool_name: optional_string(object, "name", path)?,
            text: text_content(object, path, "a tool")?,
        })),
        other => Err(ParseError::invalid(
            format!("{path}.role"),
            format!("unknown role {}", quote(other)),
        )),
    }
}

fn parse_user(object: &Object, path: &str) -> Result<UserMessage, ParseError> {
    let contents = match object.get("content") {
        None => return Err(ParseError::invalid(path, r#"missing "content""#)),
        Some(Value::String(text)) => vec![Content::Text(text.clone())],
        Some(Value::Array(parts)) if parts.is_empty() => {
            return Err(ParseError::invalid(format!("{path}.content"), "empty"));
        }
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(index, part)| parse_part(part, &format!("{path}.content[{index}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(content_type_error(other, path)),
    };
    Ok(UserMessage {
        contents,
        name: optional_string(object, "name", path)?,
    })
}

fn parse_assistant(object: &Object, path: &str) -> Result<AssistantMessage, ParseError> {
    let text = match object.get("content") {
        None | Some(Value::Null) => None,
        Some(_) => Some(text_content(object, path, "an assistant")?),
    };
    let mut tool_calls = match object.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(index, call)| parse_tool_call(call, &format!("{path}.tool_calls[{index}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{path}.tool_calls"),
                format!("expected an array, got {}", type_name(other)),
            ))
        }
    };
    // The pre-2023 single `function_call` has no id; the tool result that answers it names the function instead.
    if let Some(call) = object.get("function_call").filter(|v| !v.is_null()) {
        let call_path = format!("{path}.function_call");
        let call = expect_object(call, &call_path)?;
        tool_calls.push(ToolCall {
            id: None,
            name: required_name(call, "name", &call_path)?,
            arguments: arguments(call, "arguments", &call_path)?,
        });
    }
    Ok(AssistantMessage { text, tool_calls })
}

fn parse_tool_call(value: &Value, path: &str) -> Result<ToolCall, ParseError> {
    let object = expect_object(value, path)?;
    let id = optional_string(object, "id", path)?;
    // OpenAI's free-form "custom" tools carry their input as plain text instead of JSON arguments.
    let (key, arguments_key) = match optional_string(object, "type", path)?.as_deref() {
        None | Some("function") => ("function", "arguments"),
        Some("custom") => ("custom", "input"),
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{path}.type"),
                format!("unknown tool call type {}", quote(other)),
            ))
        }
    };
    let function_path = format!("{path}.{key}");
    let function = match object.get(key) {
        None | Some(Value::Null) => return Err(ParseError::invalid(function_path, "missing")),
        Some(function) => expect_object(function, &function_path)?,
    };
    Ok(ToolCall {
        id,
        name: required_name(function, "name", &function_path)?,
        arguments: arguments(function, arguments_key, &function_path)?,
    })
}

/// Tool-call arguments as raw JSON text.
fn arguments(object: &Object, key: &str, path: &str) -> Result<String, ParseError> {
    match object.get(key) {
        // No arguments means an empty argument object, which is what the tool will be run with.
        None | Some(Value::Null) => Ok("{}".to_owned()),
        Some(Value::String(text)) => Ok(text.clone()),
        // Some exporters decode the arguments; re-encode them so every call has the same representation.
        Some(value @ Value::Object(_)) => Ok(value.to_string()),
        Some(other) => Err(ParseError::invalid(
            format!("{path}.{key}"),
            format!("expected a string or an object, got {}", type_name(other)),
        )),
    }
}

/// The text of a system, assistant or tool message: a string, or text parts joined with `"\n"`.
fn text_content(object: &Object, path: &str, message: &str) -> Result<String, ParseError> {
    match object.get("content") {
        None => Err(ParseError::invalid(path, r#"missing "content""#)),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (index, part) in parts.iter().enumerate() {
                let part_path = format!("{path}.content[{index}]");
                match parse_part(part, &part_path)? {
                    Content::Text(text) => texts.push(text),
                    other => {
                        return Err(ParseError::invalid(
                            format!("{part_path}.type"),
                            format!(
                                "{} content is not allowed in {message} message",
                                other.kind()
                            ),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(other) => Err(content_type_error(other, path)),
    }
}

fn content_type_error(value: &Value, path: &str) -> ParseError {
    ParseError::invalid(
        format!("{path}.content"),
        format!(
            "expected a string or an array of parts, got {}",
            type_name(value)
        ),
    )
}

fn parse_part(value: &Value, path: &str) -> Result<Content, ParseError> {
    // Some clients write bare strings for text parts; the meaning is unambiguous.
    if let Value::String(text) = value {
        return Ok(Content::Text(text.clone()));
    }
    let object = expect_object(value, path)?;
    let kind = match object.get("type") {
        None | Some(Value::Null) => return Err(ParseError::invalid(path, r#"missing "type""#)),
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => {
            return Err(ParseError::invalid(
                format!("{path}.type"),
                format!("expected a string, got {}", type_name(other)),
            ))
        }
    };
    match kind {
        "text" | "input_text" | "output_text" => {
            required_string(object, "text", path).map(Content::Text)
        }
        "refusal" => required_string(object, "refusal", path).map(Content::Text),
        "image_url" => {
            let (url, detail) = url_field(object, "image_url", path)?;
            Ok(Content::Image {
                url,
                detail: detail.or(optional_string(object, "detail", path)?),
            })
        }
        // The Responses API puts the URL and the detail directly on the part.
        "input_image" => Ok(Content::Image {
            url: required_string(object, "image_url", path)?,
            detail: optional_string(object, "detail", path)?,
        }),
        "input_audio" => {
            let audio_path = format!("{path}.input_audio");
            let audio = match object.get("input_audio") {
                None | Some(Value::Null) => return Err(ParseError::invalid(audio_path, "missing")),
                Some(audio) => expect_object(audio, &audio_path)?,
            };
            Ok(Content::Audio {
                data: required_string(audio, "data", &audio_path)?,
                format: optional_string(audio, "format", &audio_path)?,
            })
        }
        "video_url" => Ok(Content::Video {
            url: url_field(object, "video_url", path)?.0,
        }),
        "file" => {
            let file_path = format!("{path}.file");
            let file = match object.get("file") {
                None | Some(Value::Null) => return Err(ParseError::invalid(file_path, "missing")),
                Some(file) => expect_object(file, &file_path)?,
            };
            file_ref(file, &file_path).map(Content::file)
        }
        "input_file" => file_ref(object, path).map(Content::file),
        other => Err(ParseError::invalid(
            format!("{path}.type"),
            format!("unknown content type {}", quote(other)),
        )),
    }
}

/// A `{"url": .., "detail": ..}` object, or a bare URL string, which some clients write.
fn url_field(
    object: &Object,
    key: &str,
    path: &str,
) -> Result<(String, Option<String>), ParseError> {
    let field_path = format!("{path}.{key}");
    match object.get(key) {
        None | Some(Value::Null) => Err(ParseError::invalid(field_path, "missing")),
        Some(Value::String(url)) => Ok((url.clone(), None)),
        Some(value) => {
            let inner = expect_object(value, &field_path)?;
            Ok((
                required_string(inner, "url", &field_path)?,
                optional_string(inner, "detail", &field_path)?,
            ))
        }
    }
}

fn file_ref(object: &Object, path: &str) -> Result<FileRef, ParseError> {
    Ok(FileRef {
        filename: optional_string(object, "filename", path)?,
        file_data: optional_string(object, "file_data", path)?,
        file_id: optional_string(object, "file_id", path)?,
        file_url: optional_string(object, "file_url", path)?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn error(value: Value) -> String {
        parse_messages(&value).unwrap_err().to_string()
    }

    fn user_contents(value: Value) -> Vec<Content> {
        match parse_messages(&json!([{"role": "user", "content": value}])).unwrap()[0].clone() {
            ChatMessage::User(user) => user.contents,
            other => panic!("not a user message: {other:?}"),
        }
    }

    #[test]
    fn array_and_object_forms() {
        let expected = vec![ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
        let array = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}
        ]);
        assert_eq!(parse_messages(&array).unwrap(), expected);
        let request = json!({"model": "gpt-4o", "messages": array, "tools": []});
        assert_eq!(parse_messages(&request).unwrap(), expected);
        assert_eq!(parse_messages_str(&request.to_string()).unwrap(), expected);
    }

    #[test]
    fn full_tool_conversation() {
        let messages = parse_messages_str(
            r#"{"messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": "Weather in Paris?", "name": "ann"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "get_time", "arguments": {"tz": "CET", "fmt": 24}}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "name": "get_time",
                 "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "CET"}]},
                {"role": "assistant", "content": "Sunny, noon.", "refusal": null}
            ]}"#,
        )
        .unwrap();
        assert_eq!(
            messages,
            vec![
                ChatMessage::system("Use tools."),
                ChatMessage::User(UserMessage::new("Weather in Paris?").with_name("ann")),
                ChatMessage::tool_calls(vec![
                    ToolCall::new(Some("call_1"), "get_weather", r#"{"city":"Paris"}"#),
                    ToolCall::new(Some("call_2"), "get_time", r#"{"tz":"CET","fmt":24}"#),
                ]),
                ChatMessage::tool_result(Some("call_1"), None, "sunny"),
                ChatMessage::tool_result(Some("call_2"), Some("get_time"), "12:00\nCET"),
                ChatMessage::assistant("Sunny, noon."),
            ]
        );
    }

    #[test]
    fn assistant_variants() {
        let messages = parse_messages(&json!([
            {"role": "assistant"},
            {"role": "assistant", "content": "", "tool_calls": null},
            {"role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": null, "function_call": {"name": "legacy", "arguments": "{}"}},
            {"role": "assistant", "tool_calls": [{"function": {"name": "no_type_no_id"}}]},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}]}
        ]))
        .unwrap();
        let assistant = |text: Option<&str>, calls: Vec<ToolCall>| {
            ChatMessage::Assistant(AssistantMessage {
                text: text.map(str::to_owned),
                tool_calls: calls,
            })
        };
        assert_eq!(
            messages,
            vec![
                assistant(None, vec![]),
                assistant(Some(""), vec![]),
                assistant(Some("a\nno"), vec![]),
                assistant(None, vec![ToolCall::new(None, "legacy", "{}")]),
                assistant(None, vec![ToolCall::new(None, "no_type_no_id", "{}")]),
                assistant(None, vec![ToolCall::new(Some("c"), "sql", "SELECT 1")]),
            ]
        );
    }

    #[test]
    fn legacy_function_role() {
        let messages = parse_messages(&json!([
            {"role": "function", "name": "get_weather", "content": "sunny"}
        ]))
        .unwrap();
        assert_eq!(
            messages,
            vec![ChatMessage::tool_result(None, Some("get_weather"), "sunny")]
        );
    }

    #[test]
    fn user_parts() {
        let contents = user_contents(json!([
            {"type": "text", "text": "Look"},
            "bare string",
            {"type": "input_text", "text": "responses text"},
            {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "high"}},
            {"type": "image_url", "image_url": "https://x/dog.png"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBOR", "detail": "low"},
            {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
            {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBER"}},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBER"}},
            {"type": "file", "file": {"file_id": "file-123", "filename": "data.csv"}},
            {"type": "input_file", "file_url": "https://x/paper.pdf"},
            {"type": "input_file", "file_id": "file-9"}
        ]));
        let kinds: Vec<_> = contents.iter().map(Content::kind).collect();
        assert_eq!(
            kinds,
            [
                "text", "text", "text", "image", "image", "image", "audio", "video", "pdf", "pdf",
                "file", "pdf", "file"
            ]
        );
        assert_eq!(
            contents[3],
            Content::Image {
                url: "https://x/cat.png".into(),
                detail: Some("high".into())
            }
        );
        assert_eq!(
            contents[5],
            Content::Image {
                url: "data:image/png;base64,iVBOR".into(),
                detail: Some("low".into())
            }
        );
        assert_eq!(
            contents[6],
            Content::Audio {
                data: "UklGR".into(),
                format: Some("wav".into())
            }
        );
        assert_eq!(
            contents[10],
            Content::File(FileRef {
                filename: Some("data.csv".into()),
                file_id: Some("file-123".into()),
                ..FileRef::default()
            })
        );
    }

    #[test]
    fn user_text_with_attachment_round_trips() {
        let text = r#"[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"https://x/cat.png"}}]}]"#;
        let messages = parse_messages_str(text).unwrap();
        assert_eq!(messages[0].text(), "What is this?\n[attached image]");
        assert_eq!(
            messages[0].to_openai_json(),
            serde_json::from_str::<Value>(text).unwrap()[0]
        );
    }

    #[test]
    fn top_level_errors() {
        assert_eq!(
            error(json!("hello")),
            r#"messages: expected an array of messages or an object with "messages", got a string"#
        );
        assert_eq!(
            error(json!({"model": "x"})),
            r#"messages: expected an array of messages or an object with "messages", got an object without "messages""#
        );
        assert_eq!(
            error(json!({"role": "user", "content": "hi"})),
            r#"messages: expected an array of messages or an object with "messages", got a single message (wrap it in [ ])"#
        );
        assert_eq!(
            error(json!({"messages": {}})),
            "messages: expected an array, got an object"
        );
        assert_eq!(error(json!([])), "messages: empty conversation");
        assert_eq!(
            error(json!({"messages": []})),
            "messages: empty conversation"
        );
    }

    #[test]
    fn syntax_error() {
        assert_eq!(
            parse_messages_str("[{\"role\": \"user\",}]")
                .unwrap_err()
                .to_string(),
            "invalid JSON at line 1, column 18: trailing comma"
        );
    }

    #[test]
    fn message_errors() {
        let cases = [
            (
                json!(["hi"]),
                "messages[0]: expected an object, got a string",
            ),
            (json!([{"content": "hi"}]), r#"messages[0]: missing "role""#),
            (
                json!([{"role": 1, "content": "hi"}]),
                "messages[0].role: expected a string, got a number",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "robot", "content": "beep"}]),
                r#"messages[2].role: unknown role "robot""#,
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "user"}]),
                r#"messages[1]: missing "content""#,
            ),
            (
                json!([{"role": "user", "content": null}]),
                "messages[0].content: expected a string or an array of parts, got null",
            ),
            (
                json!([{"role": "user", "content": []}]),
                "messages[0].content: empty",
            ),
            (
                json!([{"role": "user", "content": "a", "name": 5}]),
                "messages[0].name: expected a string, got a number",
            ),
            (
                json!([{"role": "system"}]),
                r#"messages[0]: missing "content""#,
            ),
            (
                json!([{"role": "system", "content": 3}]),
                "messages[0].content: expected a string or an array of parts, got a number",
            ),
            (
                json!([{"role": "system", "content": [{"type": "image_url", "image_url": "u"}]}]),
                "messages[0].content[0].type: image content is not allowed in a system message",
            ),
            (
                json!([{"role": "tool", "tool_call_id": "c"}]),
                r#"messages[0]: missing "content""#,
            ),
            (
                json!([{"role": "tool", "tool_call_id": 7, "content": "x"}]),
                "messages[0].tool_call_id: expected a string, got a number",
            ),
            (
                json!([{"role": "tool", "content": [{"type": "file", "file": {"file_id": "f"}}]}]),
                "messages[0].content[0].type: file content is not allowed in a tool message",
            ),
            (
                json!([{"role": "assistant", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]),
                "messages[0].content[0].type: audio content is not allowed in an assistant message",
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(error(value), expected);
        }
    }

    #[test]
    fn part_errors() {
        let user = |part: Value| {
            error(json!([{"role": "user", "content": "hi"}, {"role": "user", "content": [part]}]))
        };
        assert_eq!(
            user(json!({"type": "foo"})),
            r#"messages[1].content[0].type: unknown content type "foo""#
        );
        assert_eq!(
            user(json!({"text": "x"})),
            r#"messages[1].content[0]: missing "type""#
        );
        assert_eq!(
            user(json!({"type": 1})),
            "messages[1].content[0].type: expected a string, got a number"
        );
        assert_eq!(
            user(json!(3)),
            "messages[1].content[0]: expected an object, got a number"
        );
        assert_eq!(
            user(json!({"type": "text"})),
            "messages[1].content[0].text: missing"
        );
        assert_eq!(
            user(json!({"type": "text", "text": ["x"]})),
            "messages[1].content[0].text: expected a string, got an array"
        );
        assert_eq!(
            user(json!({"type": "image_url"})),
            "messages[1].content[0].image_url: missing"
        );
        assert_eq!(
            user(json!({"type": "image_url", "image_url": {}})),
            "messages[1].content[0].image_url.url: missing"
        );
        assert_eq!(
            user(json!({"type": "image_url", "image_url": 4})),
            "messages[1].content[0].image_url: expected an object, got a number"
        );
        assert_eq!(
            user(json!({"type": "input_image", "file_id": "f"})),
            "messages[1].content[0].image_url: missing"
        );
        assert_eq!(
            user(json!({"type": "input_audio"})),
            "messages[1].content[0].input_audio: missing"
        );
        assert_eq!(
            user(json!({"type": "input_audio", "input_audio": {"format": "wav"}})),
            "messages[1].content[0].input_audio.data: missing"
        );
        assert_eq!(
            user(json!({"type": "file", "file": "x"})),
            "messages[1].content[0].file: expected an object, got a string"
        );
        assert_eq!(
            user(json!({"type": "file"})),
            "messages[1].content[0].file: missing"
        );
        assert_eq!(
            user(json!({"type": "file", "file": {"filename": 1}})),
            "messages[1].content[0].file.filename: expected a string, got a number"
        );
        assert_eq!(
            user(json!({"type": "video_url", "video_url": {"url": null}})),
            "messages[1].content[0].video_url.url: missing"
        );
        // Quoting keeps the message on one line whatever the type holds.
        assert_eq!(
            user(json!({"type": "a\nb"})),
            r#"messages[1].content[0].type: unknown content type "a\nb""#
        );
    }

    #[test]
    fn tool_call_errors() {
        let call = |call: Value| {
            error(json!([{"role": "assistant", "content": null, "tool_calls": [call]}]))
        };
        assert_eq!(
            call(json!({"id": "c", "type": "function"})),
            "messages[0].tool_calls[0].function: missing"
        );
        assert_eq!(
            call(json!({"id": "c", "type": "function", "function": {"arguments": "{}"}})),
            "messages[0].tool_calls[0].function.name: missing"
        );
        assert_eq!(
            call(json!({"id": "c", "function": {"name": "  "}})),
            "messages[0].tool_calls[0].function.name: blank"
        );
        assert_eq!(
            call(json!({"id": "c", "function": {"name": "f", "arguments": [1]}})),
            "messages[0].tool_calls[0].function.arguments: expected a string or an object, got an array"
        );
        assert_eq!(
            call(json!({"id": 1, "function": {"name": "f"}})),
            "messages[0].tool_calls[0].id: expected a string, got a number"
        );
        assert_eq!(
            call(json!({"type": "web_search", "function": {"name": "f"}})),
            r#"messages[0].tool_calls[0].type: unknown tool call type "web_search""#
        );
        assert_eq!(
            call(json!({"function": "f"})),
            "messages[0].tool_calls[0].function: expected an object, got a string"
        );
        assert_eq!(
            call(json!("f")),
            "messages[0].tool_calls[0]: expected an object, got a string"
        );
        assert_eq!(
            error(json!([{"role": "assistant", "tool_calls": {}}])),
            "messages[0].tool_calls: expected an array, got an object"
        );
        assert_eq!(
            error(json!([{"role": "assistant", "function_call": {"arguments": "{}"}}])),
            "messages[0].function_call.name: missing"
        );
    }
}
