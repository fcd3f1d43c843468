//! Parsers for the JSON formats users have: OpenAI chat conversations and tool lists in OpenAI, bare and MCP shape.
//!
//! Every parser reports the first problem it meets as a [`ParseError`] naming the JSON path, because the files come
//! from logs and scripts and a bare "invalid input" sends the user bisecting by hand.

mod input;
mod messages;
mod tools;

pub use input::{conversation, from_slice, from_value, messages_field, tools_field};
pub use messages::{parse_messages, parse_messages_str};
pub use tools::{parse_tools, parse_tools_str, parse_tools_where};

use serde_json::{Map, Value};

use crate::error::{type_name, ParseError};

type Object = Map<String, Value>;

/// The value as an object, or "expected an object" at `path`.
fn expect_object<'a>(value: &'a Value, path: &str) -> Result<&'a Object, ParseError> {
    value.as_object().ok_or_else(|| {
        ParseError::invalid(
            path,
            format!("expected an object, got {}", type_name(value)),
        )
    })
}

/// `object[key]` as a string; `None` when absent or null, since exporters write null for "not set".
fn optional_string(object: &Object, key: &str, path: &str) -> Result<Option<String>, ParseError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(ParseError::invalid(
            format!("{path}.{key}"),
            format!("expected a string, got {}", type_name(other)),
        )),
    }
}

/// `object[key]` as a string, reported as `path.key: missing` when absent or null.
fn required_string(object: &Object, key: &str, path: &str) -> Result<String, ParseError> {
    optional_string(object, key, path)?
        .ok_or_else(|| ParseError::invalid(format!("{path}.{key}"), "missing"))
}

/// `object[key]` as a string that is not blank, as names must be.
fn required_name(object: &Object, key: &str, path: &str) -> Result<String, ParseError> {
    let name = required_string(object, key, path)?;
    if name.trim().is_empty() {
        return Err(ParseError::invalid(format!("{path}.{key}"), "blank"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn helpers() {
        let value = json!({"a": "x", "b": null, "c": 1, "d": " "});
        let object = expect_object(&value, "p").unwrap();
        assert_eq!(optional_string(object, "a", "p"), Ok(Some("x".into())));
        assert_eq!(optional_string(object, "b", "p"), Ok(None));
        assert_eq!(optional_string(object, "z", "p"), Ok(None));
        assert_eq!(
            optional_string(object, "c", "p").unwrap_err().to_string(),
            "p.c: expected a string, got a number"
        );
        assert_eq!(
            required_string(object, "b", "p").unwrap_err().to_string(),
            "p.b: missing"
        );
        assert_eq!(
            required_name(object, "d", "p").unwrap_err().to_string(),
            "p.d: blank"
        );
        assert_eq!(
            expect_object(&json!([]), "q").unwrap_err().to_string(),
            "q: expected an object, got an array"
        );
    }
}
