//! TypeSafe's System One API (`POST /v1/systemone`).
//!
//! Request: `{"model", "state": <string | JSON>, "questions": {"<name>": {"type": "noul" |
//! "choice" | "score", "instructions", "criteria"}}}` with criteria `{"true", "false"}` (or
//! `[true, false]`) for noul, `{"<option>": <description | null>}` (or a list of names) for
//! choice, and an ordered list of 2-10 levels (strings or `{label, description}`) for score.
//!
//! Response: `{"model", "answers": {"<name>": ...}, "usage": {"input_tokens",
//! "output_tokens"}}` with answers `{"type": "noul", "noul": p}`, `{"type": "choice",
//! "choice", "probabilities": {"<option>": p}, "confidence"}` and `{"type": "score", "score",
//! "legend": {"0": label}, "probabilities": {"0": p}, "confidence"}`; a refused question is
//! `{"type": "refusal", "reason"}`.
//!
//! Errors: the reference we work from does not show TypeSafe's error body, so ours is
//! `{"error": {"type", "message", "field"}}`, with `field` the JSON path of the bad value.

use decide_contract::indexmap::IndexMap;
use decide_contract::{
    Answer, ChoiceAnswer, ChoiceQuestion, DecisionError, DecisionInput, DecisionRequest,
    DecisionResponse, Question, ScaleAnswer, ScaleQuestion, TokenUsage, YesNoQuestion,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::json::{
    content_text, join, object, optional_str, parse_body, required, required_text, type_name,
};
use crate::{conversation_input, yes_no_criteria, Limits, WireError};

/// One answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SystemOneAnswer {
    /// A yes/no answer.
    Noul {
        /// The probability of true.
        noul: f64,
    },
    /// A choice answer.
    Choice {
        /// The most probable option.
        choice: String,
        /// Every option's probability, in the question's order.
        probabilities: IndexMap<String, f64>,
        /// The chosen option's probability.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confidence: Option<f64>,
    },
    /// A score answer.
    Score {
        /// The expected level index.
        score: f64,
        /// Level labels by index (`"0"`, `"1"`, ...).
        #[serde(default)]
        legend: IndexMap<String, String>,
        /// Level probabilities by index.
        probabilities: IndexMap<String, f64>,
        /// The most probable level's probability.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confidence: Option<f64>,
    },
    /// The model declined this question.
    Refusal {
        /// Why, when the model says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// Token usage of one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemOneUsage {
    /// Tokens the model read.
    #[serde(default)]
    pub input_tokens: u64,
    /// Tokens generated: 0.
    #[serde(default)]
    pub output_tokens: u64,
}

/// A response body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemOneResponse {
    /// The model that answered.
    pub model: String,
    /// The answers, by question name, in the request's order.
    pub answers: IndexMap<String, SystemOneAnswer>,
    /// Token usage.
    #[serde(default)]
    pub usage: SystemOneUsage,
}

/// A parsed request body.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    /// The wire `model`, if given.
    pub model: Option<String>,
    /// The decision request.
    pub request: DecisionRequest,
}

/// Parses a request body; errors name the field (`questions.<name>.criteria`).
pub fn parse_request(body: &[u8], limits: &Limits) -> Result<ParsedRequest, WireError> {
    let value = parse_body(body)?;
    let top = object(&value, "").map_err(|_| {
        WireError::body(format!("expected a JSON object, got {}", type_name(&value)))
    })?;
    let model = optional_str(top, "model", "")?.map(str::to_string);
    let input = parse_state(required(top, "state", "")?)?;
    let questions = match required(top, "questions", "")? {
        Value::Object(q) => q,
        other => {
            return Err(WireError::new(
                "questions",
                format!(
                    "expected an object of questions by name, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    limits.questions(questions.len(), "questions")?;
    let mut builder = DecisionRequest::builder().input(input);
    for (name, item) in questions {
        let at = join("questions", name);
        if name.trim().is_empty() {
            return Err(WireError::new(at, "a question name must not be blank"));
        }
        builder = builder.question(name.clone(), parse_question(item, &at, limits)?);
    }
    let request = builder.build().map_err(|e| contract_error("", e))?;
    Ok(ParsedRequest { model, request })
}

fn contract_error(field: &str, e: DecisionError) -> WireError {
    let message = e.to_string();
    let message = message
        .strip_prefix("invalid request: ")
        .unwrap_or(&message)
        .to_string();
    WireError::new(field, message)
}

fn parse_question(item: &Value, at: &str, limits: &Limits) -> Result<Question, WireError> {
    let q = object(item, at)?;
    let kind =
        optional_str(q, "type", at)?.ok_or_else(|| WireError::new(join(at, "type"), "missing"))?;
    let instructions = required_text(q, "instructions", at)?;
    let field = join(at, "criteria");
    match kind {
        "noul" => {
            if let Some(labels) = q.get("labels").filter(|l| !l.is_null()) {
                object(labels, &join(at, "labels"))?;
            }
            let mut b = YesNoQuestion::builder(instructions);
            match q.get("criteria") {
                None | Some(Value::Null) => {}
                Some(Value::Object(c)) => {
                    for key in c.keys() {
                        if key != "true" && key != "false" {
                            return Err(WireError::new(
                                join(&field, key),
                                "unknown criterion (expected \"true\" and \"false\")",
                            ));
                        }
                    }
                    if let Some(t) = c.get("true").filter(|v| !v.is_null()) {
                        b = b.yes_when(content_text(t));
                    }
                    if let Some(f) = c.get("false").filter(|v| !v.is_null()) {
                        b = b.no_when(content_text(f));
                    }
                }
                Some(Value::Array(c)) if (1..=2).contains(&c.len()) => {
                    b = b.yes_when(content_text(&c[0]));
                    if let Some(f) = c.get(1) {
                        b = b.no_when(content_text(f));
                    }
                }
                Some(other) => {
                    return Err(WireError::new(
                        field,
                        format!(
                            "expected {{\"true\", \"false\"}} or a list of 1 or 2 strings, got {}",
                            type_name(other)
                        ),
                    ))
                }
            }
            Ok(b.build().map_err(|e| contract_error(&field, e))?.into())
        }
        "choice" => {
            let options: Vec<(String, Option<String>)> = match required(q, "criteria", at)? {
                Value::Object(c) => c
                    .iter()
                    .map(|(k, v)| {
                        let d = match v {
                            Value::Null => None,
                            v => Some(content_text(v)),
                        };
                        (k.clone(), d)
                    })
                    .collect(),
                Value::Array(c) => c
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => Ok((s.clone(), None)),
                        other => Err(WireError::new(
                            format!("{field}[{i}]"),
                            format!("expected an option name, got {}", type_name(other)),
                        )),
                    })
                    .collect::<Result<_, _>>()?,
                other => {
                    return Err(WireError::new(
                        field,
                        format!(
                            "expected an object of options (name to description) or a list of names, got {}",
                            type_name(other)
                        ),
                    ))
                }
            };
            limits.options(options.len(), &field)?;
            let mut b = ChoiceQuestion::builder(instructions);
            for (name, description) in options {
                b = match description {
                    Some(d) => b.option_with_description(name, d),
                    None => b.option(name),
                };
            }
            Ok(b.build().map_err(|e| contract_error(&field, e))?.into())
        }
        "score" => {
            let levels = match required(q, "criteria", at)? {
                Value::Array(l) => l,
                other => {
                    return Err(WireError::new(
                        field,
                        format!(
                            "expected an ordered list of levels, got {}",
                            type_name(other)
                        ),
                    ))
                }
            };
            limits.levels(levels.len(), &field)?;
            let mut b = ScaleQuestion::builder(instructions);
            for (i, level) in levels.iter().enumerate() {
                let lat = format!("{field}[{i}]");
                b = match level {
                    Value::Object(l) if l.contains_key("label") => {
                        let label = required_text(l, "label", &lat)?;
                        match l.get("description").filter(|d| !d.is_null()) {
                            Some(d) => b.level_with_description(label, content_text(d)),
                            None => b.level(label),
                        }
                    }
                    Value::Null => {
                        return Err(WireError::new(lat, "expected a level, got null"));
                    }
                    other => b.level(content_text(other)),
                };
            }
            Ok(b.build().map_err(|e| contract_error(&field, e))?.into())
        }
        other => Err(WireError::new(
            join(at, "type"),
            format!("unknown question type {other:?} (expected noul, choice or score)"),
        )),
    }
}

/// The state as a decision input: text as it is, an object as ordered fields, a list of
/// `{role, content}` messages as a conversation, any other list as the field `state`.
fn parse_state(value: &Value) -> Result<DecisionInput, WireError> {
    match value {
        Value::String(s) if s.trim().is_empty() => {
            Err(WireError::new("state", "must not be blank"))
        }
        Value::String(s) => Ok(DecisionInput::Text(s.clone())),
        Value::Object(fields) if fields.is_empty() => {
            Err(WireError::new("state", "must not be empty"))
        }
        Value::Object(fields) => Ok(DecisionInput::Fields(fields.clone())),
        Value::Array(items) if items.is_empty() => {
            Err(WireError::new("state", "must not be empty"))
        }
        Value::Array(items) => {
            let messages: Option<Vec<(String, String)>> = items
                .iter()
                .map(|m| {
                    let m = m.as_object()?;
                    let role = m.get("role")?.as_str()?;
                    let text = m.get("content").or_else(|| m.get("text"))?.as_str()?;
                    Some((role.to_string(), text.to_string()))
                })
                .collect();
            match messages.and_then(conversation_input) {
                Some(input) => Ok(input),
                None => {
                    let mut fields = Map::new();
                    fields.insert("state".into(), value.clone());
                    Ok(DecisionInput::Fields(fields))
                }
            }
        }
        other => Err(WireError::new(
            "state",
            format!(
                "expected a string, an object or an array, got {}",
                type_name(other)
            ),
        )),
    }
}

/// The response body for a decision response.
pub fn render_response(
    request: &DecisionRequest,
    response: &DecisionResponse,
    model: &str,
) -> SystemOneResponse {
    let answers = request
        .questions()
        .iter()
        .map(|(name, question)| {
            let answer = match (response.answers().get(name), question) {
                (Some(Answer::YesNo(a)), _) => SystemOneAnswer::Noul {
                    noul: a.probability(),
                },
                (Some(Answer::Choice(a)), _) => SystemOneAnswer::Choice {
                    choice: a.value().to_string(),
                    probabilities: a.probabilities().clone(),
                    confidence: a.confidence(),
                },
                (Some(Answer::Scale(a)), Question::Scale(q)) => SystemOneAnswer::Score {
                    score: a.mean(),
                    legend: q
                        .level_labels()
                        .enumerate()
                        .map(|(i, l)| (i.to_string(), l.to_string()))
                        .collect(),
                    probabilities: a
                        .probabilities()
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (i.to_string(), *p))
                        .collect(),
                    confidence: a.confidence(),
                },
                (Some(Answer::Refusal { reason }), _) => SystemOneAnswer::Refusal {
                    reason: reason.clone(),
                },
                _ => SystemOneAnswer::Refusal {
                    reason: Some("the model gave no answer of this type".to_string()),
                },
            };
            (name.clone(), answer)
        })
        .collect();
    SystemOneResponse {
        model: model.to_string(),
        answers,
        usage: SystemOneUsage {
            input_tokens: response.token_usage().map(|u| u.input_tokens).unwrap_or(0),
            output_tokens: 0,
        },
    }
}

/// The error body: `{"error": {"type", "message", "field"}}`.
pub fn error_body(kind: &str, message: &str, field: Option<&str>) -> Value {
    json!({"error": {"type": kind, "message": message, "field": field}})
}

/// The request body for a decision request (the client side). Yes/no criteria (yes-when,
/// no-when, or the candidate a question is about) travel as `criteria.true` / `criteria.false`,
/// the documents the engine scores, so a local server answers exactly as the embedded engine.
pub fn request_body(request: &DecisionRequest, model: Option<&str>) -> Value {
    let state = match request.input() {
        DecisionInput::Text(t) => Value::String(t.clone()),
        DecisionInput::Fields(f) => Value::Object(f.clone()),
    };
    let mut questions = Map::new();
    for (name, question) in request.questions() {
        let q = match question {
            Question::YesNo(q) => {
                let mut q = json!({"type": "noul", "instructions": q.text()});
                if let Some((yes, no)) = yes_no_criteria(question) {
                    let mut c = Map::new();
                    c.insert("true".into(), Value::String(yes));
                    if let Some(no) = no {
                        c.insert("false".into(), Value::String(no));
                    }
                    q["criteria"] = Value::Object(c);
                }
                q
            }
            Question::Choice(q) => json!({
                "type": "choice", "instructions": q.text(),
                "criteria": q.options().iter().map(|o| {
                    let d = if o.description == o.name { Value::Null } else { Value::String(o.description.clone()) };
                    (o.name.clone(), d)
                }).collect::<Map<String, Value>>(),
            }),
            Question::Scale(q) => json!({
                "type": "score", "instructions": q.text(),
                "criteria": q.levels().iter().map(|l| match &l.description {
                    Some(d) => json!({"label": l.label, "description": d}),
                    None => Value::String(l.label.clone()),
                }).collect::<Vec<_>>(),
            }),
        };
        questions.insert(name.clone(), q);
    }
    let mut body = Map::new();
    if let Some(model) = model {
        body.insert("model".into(), Value::String(model.to_string()));
    }
    body.insert("state".into(), state);
    body.insert("questions".into(), Value::Object(questions));
    Value::Object(body)
}

/// A response body as a decision response (the client side).
pub fn parse_response(body: &[u8]) -> Result<DecisionResponse, WireError> {
    let value = parse_body(body)?;
    let wire: SystemOneResponse =
        serde_json::from_value(value).map_err(|e| WireError::body(e.to_string()))?;
    let mut builder = DecisionResponse::builder()
        .model_name(wire.model.clone())
        .token_usage(TokenUsage::new(wire.usage.input_tokens));
    for (name, answer) in wire.answers {
        let at = join("answers", &name);
        let bad = |e: DecisionError| WireError::new(at.clone(), e.to_string());
        let answer: Answer = match answer {
            SystemOneAnswer::Noul { noul } => Answer::yes_no(noul).map_err(bad)?,
            SystemOneAnswer::Choice {
                choice,
                probabilities,
                confidence,
            } => {
                let mut a = ChoiceAnswer::new(choice)
                    .with_probabilities(probabilities)
                    .map_err(bad)?;
                if let Some(c) = confidence {
                    a = a.with_confidence(c).map_err(bad)?;
                }
                a.into()
            }
            SystemOneAnswer::Score {
                score,
                probabilities,
                confidence,
                ..
            } => {
                let mut levels: Vec<(usize, f64)> = Vec::with_capacity(probabilities.len());
                for (k, p) in probabilities {
                    let i = k.parse::<usize>().map_err(|_| {
                        WireError::new(
                            join(&join(&at, "probabilities"), &k),
                            "expected a level index",
                        )
                    })?;
                    levels.push((i, p));
                }
                levels.sort_by_key(|(i, _)| *i);
                let mut a = ScaleAnswer::new(score)
                    .and_then(|a| {
                        a.with_probabilities(levels.into_iter().map(|(_, p)| p).collect())
                    })
                    .map_err(bad)?;
                if let Some(c) = confidence {
                    a = a.with_confidence(c).map_err(bad)?;
                }
                a.into()
            }
            SystemOneAnswer::Refusal { reason } => match reason {
                Some(r) => Answer::refusal_because(r),
                None => Answer::refusal(),
            },
        };
        builder = builder.answer(name, answer);
    }
    builder
        .build()
        .map_err(|e| WireError::new("answers", e.to_string()))
}
