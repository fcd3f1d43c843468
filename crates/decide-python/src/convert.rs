//! Python data to JSON, so that the inputs go through the same parsers (and get the same error
//! messages, at the same JSON paths) as `decide select`'s files and `/v1/select`'s bodies.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deeper than any tool schema or conversation; past it the data is most likely cyclic (a list
/// holding itself), which would otherwise overflow the stack.
const MAX_DEPTH: usize = 128;

/// Why a value could not become JSON, and where: path segments innermost first, as the error
/// unwinds.
pub struct ConvertError {
    segments: Vec<String>,
    message: String,
}

impl ConvertError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            segments: Vec::new(),
            message: message.into(),
        }
    }

    fn at(mut self, segment: String) -> Self {
        self.segments.push(segment);
        self
    }

    /// `root[2].function.name: message`, as decide-chat's parse errors name their place.
    pub fn message(&self, root: &str) -> String {
        let mut path = root.to_string();
        for segment in self.segments.iter().rev() {
            path.push_str(segment);
        }
        format!("{path}: {}", self.message)
    }
}

/// `value` as JSON: dicts with string keys, lists and tuples, strings, finite numbers, booleans
/// and `None`. Anything else is refused with the path to it.
pub fn to_json(value: &Bound<'_, PyAny>) -> Result<Value, ConvertError> {
    to_json_at(value, 0)
}

fn to_json_at(value: &Bound<'_, PyAny>, depth: usize) -> Result<Value, ConvertError> {
    if depth > MAX_DEPTH {
        return Err(ConvertError::new(format!(
            "nested more than {MAX_DEPTH} levels deep (does it contain itself?)"
        )));
    }
    if value.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = value.cast::<PyString>() {
        return text(s).map(Value::String);
    }
    // Before int: Python's bool is an int.
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = value.cast::<PyInt>() {
        if let Ok(n) = i.extract::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = i.extract::<u64>() {
            return Ok(Value::from(n));
        }
        return Err(ConvertError::new("integer too large for JSON"));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| ConvertError::new("not a finite number"));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut object = Map::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => text(s)?,
                Err(_) => {
                    return Err(ConvertError::new(format!(
                        "keys must be strings, got {}",
                        type_name(&k)
                    )))
                }
            };
            let item = to_json_at(&v, depth + 1).map_err(|e| e.at(format!(".{key}")))?;
            object.insert(key, item);
        }
        return Ok(Value::Object(object));
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(i, v)| to_json_at(&v, depth + 1).map_err(|e| e.at(format!("[{i}]"))))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return tuple
            .iter()
            .enumerate()
            .map(|(i, v)| to_json_at(&v, depth + 1).map_err(|e| e.at(format!("[{i}]"))))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    Err(ConvertError::new(format!(
        "expected JSON data (a dict, list, str, number, bool or None), got {}",
        type_name(value)
    )))
}

fn text(s: &Bound<'_, PyString>) -> Result<String, ConvertError> {
    s.to_cow()
        .map(|c| c.into_owned())
        .map_err(|_| ConvertError::new("text that is not valid Unicode (a lone surrogate)"))
}

/// The Python type's name, for messages.
fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown type".into())
}
