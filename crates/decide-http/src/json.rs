//! Reading untyped JSON with errors that name the field (`questions[2].choices[0].value`).

use serde_json::{Map, Value};

use crate::WireError;

pub(crate) use decide_chat::type_name;

/// `at.key`, or `key` at the top.
pub(crate) fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// `at[i]`.
pub(crate) fn index(at: &str, i: usize) -> String {
    format!("{at}[{i}]")
}

/// Parses a request body; a syntax error names the line and column.
pub(crate) fn parse_body(body: &[u8]) -> Result<Value, WireError> {
    serde_json::from_slice(body).map_err(|e| {
        let message = e.to_string();
        // serde_json appends " at line L column C"; say it once, in front.
        let message = match message.rfind(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        WireError::body(format!(
            "invalid JSON at line {} column {}: {message}",
            e.line(),
            e.column()
        ))
    })
}

pub(crate) fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, WireError> {
    value
        .as_object()
        .ok_or_else(|| WireError::new(at, format!("expected an object, got {}", type_name(value))))
}

/// A present, non-null field.
pub(crate) fn required<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a Value, WireError> {
    match obj.get(key) {
        None | Some(Value::Null) => Err(WireError::new(join(at, key), "missing")),
        Some(v) => Ok(v),
    }
}

/// A string field; `None` when absent or null.
pub(crate) fn optional_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<&'a str>, WireError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(WireError::new(
            join(at, key),
            format!("expected a string, got {}", type_name(other)),
        )),
    }
}

pub(crate) fn required_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a str, WireError> {
    optional_str(obj, key, at)?.ok_or_else(|| WireError::new(join(at, key), "missing"))
}

/// Text a client may send as a string or as structured content: strings as they are, other
/// values as compact JSON with sorted keys, the way pydecide renders content.
pub(crate) fn content_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => sorted(other).to_string(),
    }
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Content that must be present and not blank.
pub(crate) fn required_text(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<String, WireError> {
    let text = content_text(required(obj, key, at)?);
    if text.trim().is_empty() {
        return Err(WireError::new(join(at, key), "must not be blank"));
    }
    Ok(text)
}

/// Optional content; blank counts as absent.
pub(crate) fn optional_text(obj: &Map<String, Value>, key: &str) -> Option<String> {
    match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => Some(content_text(v)).filter(|t| !t.trim().is_empty()),
    }
}
