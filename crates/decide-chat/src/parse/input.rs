//! Typed request bodies: serde types read with the JSON path of the first problem named, and the conversation
//! fields that requests share (`messages` or `text`, `tools`).
//!
//! The filter's and the router's inputs are serde types with `#[serde(deny_unknown_fields)]`, so that a misspelt
//! key is an error rather than a silently missing option; these functions give their errors the same
//! `path: message` shape as the hand-written parsers.

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use serde_json::Value;

use super::{parse_messages, parse_tools};
use crate::error::{type_name, ParseError};
use crate::message::ChatMessage;
use crate::tool::ToolSpecification;

/// [`from_value`] of JSON text. A syntax error names the line and column; any other problem is a
/// [`ParseError::Invalid`] at its JSON path, with an empty path for the text as a whole.
pub fn from_slice<T: DeserializeOwned>(json: &[u8]) -> Result<T, ParseError> {
    from_value(serde_json::from_slice(json)?)
}

/// Reads `T`, a type read from a JSON object (a request body, a file), naming the path of the first problem:
/// `routes[2].name: missing`, `routes[0].descripton: unknown field (expected name, description, descriptions)`, or
/// `expected a string, got a number` for a value of the wrong type.
pub fn from_value<T: DeserializeOwned>(json: Value) -> Result<T, ParseError> {
    if !json.is_object() {
        return Err(ParseError::invalid(
            "",
            format!("expected an object, got {}", type_name(&json)),
        ));
    }
    serde_path_to_error::deserialize(json).map_err(|error| {
        let path = match error.path().to_string() {
            root if root == "." => String::new(),
            path => path,
        };
        let message = error.into_inner().to_string();
        if let Some(field) = between(&message, "missing field `", "`") {
            return ParseError::invalid(join(&path, field), "missing");
        }
        if let Some(field) = between(&message, "unknown field `", "`") {
            // serde lists the known fields as "expected one of `a`, `b`" (or "expected `a`"); the path may already
            // end with the unknown key, depending on where the deserializer failed.
            let known: Vec<&str> = message
                .split_once(", expected ")
                .map(|(_, rest)| rest.split('`').skip(1).step_by(2).collect())
                .unwrap_or_default();
            let at = if path == field || path.ends_with(&format!(".{field}")) {
                path
            } else {
                join(&path, field)
            };
            return ParseError::invalid(
                at,
                format!("unknown field (expected {})", known.join(", ")),
            );
        }
        ParseError::invalid(path, plain_words(&message).unwrap_or(message))
    })
}

/// serde's "invalid type: integer `3`, expected a string" in the words of the hand-written parsers: "expected a
/// string, got a number".
fn plain_words(message: &str) -> Option<String> {
    let (found, expected) = message
        .strip_prefix("invalid type: ")?
        .split_once(", expected ")?;
    let found = [
        ("boolean", "a boolean"),
        ("integer", "a number"),
        ("floating point", "a number"),
        ("string", "a string"),
        ("null", "null"),
        ("sequence", "an array"),
        ("map", "an object"),
    ]
    .iter()
    .find(|(serde, _)| found.starts_with(serde))?
    .1;
    let expected = match expected {
        "a sequence" => "an array",
        "a map" => "an object",
        other => other,
    };
    Some(format!("expected {expected}, got {found}"))
}

/// The text between `start` (at the beginning of `text`) and the next `end`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = text.strip_prefix(start)?;
    rest.split_once(end).map(|(inside, _)| inside)
}

/// `at.key`, or `key` at the top.
fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

/// For `#[serde(default, deserialize_with = "decide_chat::messages_field")]`: a conversation in any shape
/// [`parse_messages`] reads; null is no conversation.
pub fn messages_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<ChatMessage>>, D::Error> {
    parsed_field(deserializer, parse_messages)
}

/// For `#[serde(default, deserialize_with = "decide_chat::tools_field")]`: a tool list in any shape
/// [`parse_tools`] reads; null is no list.
pub fn tools_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<ToolSpecification>>, D::Error> {
    parsed_field(deserializer, parse_tools)
}

/// A field read by one of the hand-written parsers, whose error (with its own path) becomes the field's.
fn parsed_field<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: fn(&Value) -> Result<T, ParseError>,
) -> Result<Option<T>, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::Null => Ok(None),
        value => parse(&value).map(Some).map_err(D::Error::custom),
    }
}

/// The conversation of a request that gives either `messages` (read by [`messages_field`]) or `text`, one user
/// message; errors name the field.
pub fn conversation(
    messages: Option<Vec<ChatMessage>>,
    text: Option<String>,
) -> Result<Vec<ChatMessage>, ParseError> {
    match (messages, text) {
        (Some(_), Some(_)) => Err(ParseError::invalid(
            "text",
            "give messages or text, not both",
        )),
        (Some(messages), None) => Ok(messages),
        (None, Some(text)) if text.trim().is_empty() => {
            Err(ParseError::invalid("text", "empty message"))
        }
        (None, Some(text)) => Ok(vec![ChatMessage::user(text)]),
        (None, None) => Err(ParseError::invalid(
            "messages",
            "missing (give messages or text)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        size: Option<usize>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        items: Vec<Item>,
        #[serde(default, deserialize_with = "messages_field")]
        messages: Option<Vec<ChatMessage>>,
    }

    fn error(json: Value) -> String {
        from_value::<Body>(json).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_path() {
        assert_eq!(
            error(json!({"items": [{"name": "a"}, {"size": 1}]})),
            "items[1].name: missing"
        );
        assert_eq!(
            error(json!({"items": [{"name": "a", "sise": 1}]})),
            "items[0].sise: unknown field (expected name, size)"
        );
        assert_eq!(
            error(json!({"items": [], "extra": 1})),
            "extra: unknown field (expected items, messages)"
        );
        assert_eq!(
            error(json!({"items": [{"name": "a", "size": -1}]})),
            "items[0].size: invalid value: integer `-1`, expected usize"
        );
        assert_eq!(
            error(json!({"items": [{"name": 3}]})),
            "items[0].name: expected a string, got a number"
        );
        assert_eq!(
            error(json!({"items": {}})),
            "items: expected an array, got an object"
        );
        assert_eq!(
            error(json!({"items": [{"name": null}]})),
            "items[0].name: expected a string, got null"
        );
        assert_eq!(
            error(json!({"items": [], "messages": [{"role": 3}]})),
            "messages: messages[0].role: expected a string, got a number"
        );
        assert_eq!(
            from_slice::<Body>(b"{\"items\": ").unwrap_err().path(),
            None
        );
        assert_eq!(error(json!([])), "expected an object, got an array");
        let body: Body = from_value(json!({"items": [], "messages": null})).unwrap();
        assert!(body.messages.is_none());
    }

    #[test]
    fn a_conversation_is_messages_or_text() {
        let hi = || vec![ChatMessage::user("hi")];
        assert_eq!(conversation(Some(hi()), None), Ok(hi()));
        assert_eq!(conversation(None, Some("hi".into())), Ok(hi()));
        let error = |m, t| conversation(m, t).unwrap_err().to_string();
        assert_eq!(
            error(Some(hi()), Some("hi".into())),
            "text: give messages or text, not both"
        );
        assert_eq!(error(None, Some(" ".into())), "text: empty message");
        assert_eq!(
            error(None, None),
            "messages: missing (give messages or text)"
        );
    }
}
