//! The wire formats of hosted decision APIs, mapped to and from decide's
//! [`DecisionRequest`](decide_contract::DecisionRequest) /
//! [`DecisionResponse`](decide_contract::DecisionResponse), and an [`HttpDecisionModel`] that
//! speaks them.
//!
//! Two formats, as their clients (pydecide, LangChain, LangChain4j, Spring AI) send them:
//!
//! * [`openai`]: the OpenAI Decisions API (`POST /v1/decisions`): a list of questions of type
//!   `predicate`, `choice` (`choices: [{value, description}]`) or `score`
//!   (`levels: [{label, description}]`), answers in question order.
//! * [`systemone`]: TypeSafe's System One API (`POST /v1/systemone`): questions keyed by name,
//!   of type `noul`, `choice` or `score`, with `instructions` and `criteria`; answers keyed by
//!   name.
//!
//! **Why its own crate.** The server (`decide-server`) parses requests and renders responses
//! in these formats; a Rust agent that only calls a decision API needs the opposite direction
//! and none of the model. Keeping the formats and the client here means an agent depends on
//! this small crate (serde and a blocking HTTP client) rather than on candle, axum and the
//! engine. The client is the default `client` feature; the server turns it off.
//!
//! **Parsing names the field.** Request bodies are read from untyped JSON by hand, so every
//! error is a [`WireError`] naming the field (`questions[2].choices[0].value: expected a string
//! or a boolean, got a number`, `questions.route.criteria: a choice needs at least 2 options,
//! got 1`), which the server returns as a 400 in the format's own error shape. Limits on
//! questions and options per request ([`Limits`]) are checked the same way.
//!
//! **What maps exactly.** System One carries yes/no criteria (`noul` `criteria.true` /
//! `criteria.false`), so a yes/no question with `yes_when`, `no_when` or a candidate round-trips
//! to the same documents and the same probabilities as the embedded engine. The OpenAI format
//! has no slot for them, so, as clients do, they are appended to the instructions
//! (`If true: ...`), and the server answers that text as the question; plain yes/no, choice and
//! scale questions round-trip in both formats. (With the engine's hybrid lexical scoring the
//! documents of one request share term statistics, so a question sent differently can move the
//! other answers of its request slightly too.)
//! The wire `model` is returned beside the request, not inside it: what a model name means
//! (an alias of the one loaded model, or an error) is the server's decision.
//!
//! **What the servers share.** `decide serve` and `decide mcp --http` guard and serve HTTP the
//! same way: the API key ([`ApiKey`]), the `Host` and `Origin` checks ([`guard`]), and, with the
//! `server` feature, the connection loop with its timeouts, connection cap and shutdown deadline
//! ([`server`]). [`unique_keys`] reads JSON that names each key once, as the gateway reads its
//! requests and `mcpServers` files.
#![deny(missing_docs)]

mod auth;
#[cfg(feature = "client")]
mod client;
pub mod guard;
mod json;
pub mod openai;
#[cfg(feature = "server")]
pub mod server;
pub mod systemone;
#[cfg(test)]
mod tests;
pub mod unique_keys;

use std::fmt;

pub use auth::ApiKey;
#[cfg(feature = "client")]
pub use client::{ClientError, HttpDecisionModel, HttpDecisionModelBuilder, WireFormat};
use decide_contract::{DecisionInput, Question};
use serde_json::{Map, Value};

/// A request body that does not have the shape of its format: the field (a JSON path such as
/// `questions[1].choices`, empty for the body as a whole) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct WireError {
    /// The JSON path of the field; empty when the body itself is wrong.
    pub field: String,
    /// What is wrong, in one line.
    pub message: String,
}

impl WireError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An error about the body as a whole.
    pub fn body(message: impl Into<String>) -> Self {
        Self::new("", message)
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Bounds on one request, so that a single body cannot hold the model for long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Questions per request.
    pub max_questions: usize,
    /// Options of a choice (System One allows 255).
    pub max_options: usize,
    /// Levels of a score question (System One allows 10).
    pub max_levels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_questions: 64,
            max_options: 255,
            max_levels: 10,
        }
    }
}

impl Limits {
    fn questions(&self, count: usize, at: &str) -> Result<(), WireError> {
        if count == 0 {
            return Err(WireError::new(at, "needs at least one question"));
        }
        if count > self.max_questions {
            return Err(WireError::new(
                at,
                format!("{count} questions, at most {} allowed", self.max_questions),
            ));
        }
        Ok(())
    }

    fn options(&self, count: usize, at: &str) -> Result<(), WireError> {
        if count < 2 {
            return Err(WireError::new(
                at,
                format!("a choice needs at least 2 options, got {count}"),
            ));
        }
        if count > self.max_options {
            return Err(WireError::new(
                at,
                format!("{count} options, at most {} allowed", self.max_options),
            ));
        }
        Ok(())
    }

    fn levels(&self, count: usize, at: &str) -> Result<(), WireError> {
        if count < 2 || count > self.max_levels {
            return Err(WireError::new(
                at,
                format!("a score needs 2 to {} levels, got {count}", self.max_levels),
            ));
        }
        Ok(())
    }
}

/// Why every question of a request is refused instead of answered: the input has nothing this
/// engine can read (images only).
pub const NO_TEXT_REFUSAL: &str = "the input has no text, and this model reads text only";

/// A conversation as a decision input: one message as its text, several as
/// `{"messages": [{role, text}]}`, which the engine reads as a transcript.
fn conversation_input(messages: Vec<(String, String)>) -> Option<DecisionInput> {
    match messages.len() {
        0 => None,
        1 => messages
            .into_iter()
            .next()
            .map(|(_, text)| DecisionInput::Text(text)),
        _ => {
            let list = messages
                .into_iter()
                .map(|(role, text)| {
                    let mut m = Map::new();
                    m.insert("role".into(), Value::String(role));
                    m.insert("text".into(), Value::String(text));
                    Value::Object(m)
                })
                .collect();
            let mut fields = Map::new();
            fields.insert("messages".into(), Value::Array(list));
            Some(DecisionInput::Fields(fields))
        }
    }
}

/// The `(role, text)` messages of an input that is exactly `{"messages": [{role, text}]}`.
fn input_messages(input: &DecisionInput) -> Option<Vec<(String, String)>> {
    let DecisionInput::Fields(fields) = input else {
        return None;
    };
    if fields.len() != 1 {
        return None;
    }
    fields
        .get("messages")?
        .as_array()?
        .iter()
        .map(|m| {
            let m = m.as_object()?;
            if m.len() != 2 {
                return None;
            }
            Some((
                m.get("role")?.as_str()?.to_string(),
                m.get("text")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The text the engine scores a candidate as (the same rule as decide-engine's
/// `candidate_text`), so that a candidate sent as a criterion is read the same way. Its
/// parameter names stay out: neither wire format has a place for them, and a criterion is
/// scored as it is written whatever the remote model's `tool_parameters`.
fn candidate_text(name: &str, description: &str) -> String {
    let description = description.trim();
    if description.is_empty() || description == name {
        name.to_string()
    } else {
        format!("{name}: {description}")
    }
}

/// The document a yes/no question is judged against when it has criteria: its yes-when text,
/// else its candidate, else (when only a no-when is given) its own text.
fn yes_no_criteria(question: &Question) -> Option<(String, Option<String>)> {
    let q = question.as_yes_no()?;
    if q.yes_when().is_none() && q.no_when().is_none() && q.candidate().is_none() {
        return None;
    }
    let yes = match (q.yes_when(), q.candidate()) {
        (Some(when), _) => when.to_string(),
        (None, Some(c)) => candidate_text(&c.name, &c.description),
        (None, None) => q.text().to_string(),
    };
    Some((yes, q.no_when().map(str::to_string)))
}
