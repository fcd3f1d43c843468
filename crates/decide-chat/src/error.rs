//! The error the parsers return.

use serde_json::Value;

/// Why a tool list or a conversation could not be parsed.
///
/// The message is always a single line, because the command line prints it after the file name and users grep logs
/// for it. Structural problems name the JSON path of the offending value (`tools[3].function.name: missing`), so a
/// user with a 200-tool MCP dump can go straight to the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The text is not JSON at all.
    #[error("invalid JSON at line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line of the error, as serde_json reports it.
        line: usize,
        /// 1-based column of the error, as serde_json reports it.
        column: usize,
        /// What serde_json found wrong, without its own position suffix.
        message: String,
    },
    /// The JSON is well formed but is not the expected shape.
    #[error("{}{message}", prefix(.path))]
    Invalid {
        /// Where the problem is, e.g. `messages[2].content[0].type`; empty for the input as a whole.
        path: String,
        /// What is wrong there, e.g. `unknown content type "foo"`.
        message: String,
    },
}

impl ParseError {
    /// The JSON path of the problem, or `None` for a syntax error.
    pub fn path(&self) -> Option<&str> {
        match self {
            ParseError::Syntax { .. } => None,
            ParseError::Invalid { path, .. } => Some(path),
        }
    }

    /// A value that is not the expected shape: `path` (empty for the input as a whole) and what is wrong there.
    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ParseError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl From<serde_json::Error> for ParseError {
    fn from(error: serde_json::Error) -> Self {
        // serde_json appends " at line L column C" to its message; the variant carries the position itself, so strip
        // it rather than print it twice.
        let full = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full);
        ParseError::Syntax {
            line: error.line(),
            column: error.column(),
            message: one_line(message),
        }
    }
}

/// `path: `, or nothing for the input as a whole.
fn prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// The JSON type of a value with its article (`a number`, `an array`, `null`), for "expected X, got Y" messages.
///
/// Every crate that reads JSON by hand words these messages alike through this one function; it is public for them,
/// not as part of the crate's API.
#[doc(hidden)]
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Quotes a user-supplied string for an error message.
///
/// Debug formatting escapes newlines and quotes, which keeps the message on one line whatever the input holds; long
/// values are cut because a pasted paragraph in a `role` field would otherwise drown the message.
pub(crate) fn quote(value: &str) -> String {
    const MAX_CHARS: usize = 60;
    if value.chars().count() <= MAX_CHARS {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(MAX_CHARS).collect();
        format!("{head:?}…")
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_error_carries_position_once() {
        let error: ParseError = serde_json::from_str::<Value>("[1,\n  2,,]")
            .unwrap_err()
            .into();
        assert_eq!(
            error.to_string(),
            "invalid JSON at line 2, column 5: expected value"
        );
        assert_eq!(error.path(), None);
    }

    #[test]
    fn empty_input_is_a_syntax_error() {
        let error: ParseError = serde_json::from_str::<Value>("").unwrap_err().into();
        assert_eq!(
            error.to_string(),
            "invalid JSON at line 1, column 0: EOF while parsing a value"
        );
    }

    #[test]
    fn invalid_names_its_path() {
        let error = ParseError::invalid("tools[3].function.name", "missing");
        assert_eq!(error.to_string(), "tools[3].function.name: missing");
        assert_eq!(error.path(), Some("tools[3].function.name"));
    }

    #[test]
    fn quote_escapes_and_cuts() {
        assert_eq!(quote("a\"b\nc"), r#""a\"b\nc""#);
        let long = "x".repeat(100);
        assert_eq!(quote(&long), format!("\"{}\"…", "x".repeat(60)));
    }

    #[test]
    fn type_names() {
        let values = [
            Value::Null,
            Value::Bool(true),
            serde_json::json!(1),
            serde_json::json!("s"),
            serde_json::json!([]),
            serde_json::json!({}),
        ];
        let names: Vec<_> = values.iter().map(type_name).collect();
        assert_eq!(
            names,
            [
                "null",
                "a boolean",
                "a number",
                "a string",
                "an array",
                "an object"
            ]
        );
    }
}
