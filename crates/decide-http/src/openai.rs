//! The OpenAI Decisions API (`POST /v1/decisions`).
//!
//! Request: `{"model", "input": <string | [{"type": "message", "role", "content": <string |
//! [{"type": "input_text", "text"} | {"type": "input_image", "image_url", "detail"}]>}]>,
//! "questions": [{"type": "predicate" | "choice" | "score", "name", "instructions",
//! "choices": [{"value", "description"}], "levels": [{"label", "description"}]}],
//! "safety_identifier"?}`.
//!
//! Response: `{"model", "answers": [...in question order...], "usage"}` with answers
//! `{"type": "predicate", "name", "probability"}`, `{"type": "choice", "name", "choice",
//! "probabilities": [{"value", "probability"}], "confidence"}`, `{"type": "score", "name",
//! "score", "probabilities": [{"value": <level index>, "label", "probability"}], "confidence"}`
//! or `{"type": "refusal", "name"}`.
//!
//! Errors: `{"error": {"message", "type", "param", "code"}}`.

use decide_contract::{
    Answer, ChoiceAnswer, ChoiceQuestion, DecisionError, DecisionInput, DecisionRequest,
    DecisionResponse, Question, ScaleAnswer, ScaleQuestion, TokenUsage, YesNoQuestion,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::json::{
    index, join, object, optional_str, optional_text, parse_body, required, required_str,
    required_text, type_name,
};
use crate::{conversation_input, input_messages, yes_no_criteria, Limits, WireError};

/// A choice's value: the API allows strings and booleans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChoiceValue {
    /// `true` or `false`.
    Bool(bool),
    /// Any other option.
    Text(String),
}

impl ChoiceValue {
    /// The option name decide uses for it: booleans become `"true"` / `"false"`.
    pub fn as_name(&self) -> String {
        match self {
            Self::Bool(b) => b.to_string(),
            Self::Text(s) => s.clone(),
        }
    }
}

/// One option's probability in a choice answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceProbability {
    /// The option.
    pub value: ChoiceValue,
    /// Its probability.
    pub probability: f64,
}

/// One level's probability in a score answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelProbability {
    /// The level's index, lowest first.
    pub value: usize,
    /// The level's label.
    pub label: String,
    /// Its probability.
    pub probability: f64,
}

/// One answer, in question order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DecisionsAnswer {
    /// A yes/no answer.
    Predicate {
        /// The question's name.
        name: String,
        /// The probability of yes.
        probability: f64,
    },
    /// A choice answer.
    Choice {
        /// The question's name.
        name: String,
        /// The most probable option.
        choice: ChoiceValue,
        /// Every option's probability, in the question's order.
        probabilities: Vec<ChoiceProbability>,
        /// The chosen option's probability.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confidence: Option<f64>,
    },
    /// A score answer.
    Score {
        /// The question's name.
        name: String,
        /// The expected level index, in [0, levels - 1].
        score: f64,
        /// Every level's probability, lowest first.
        probabilities: Vec<LevelProbability>,
        /// The most probable level's probability.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confidence: Option<f64>,
    },
    /// The model declined this question.
    Refusal {
        /// The question's name.
        name: String,
        /// Why, when the model says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refusal: Option<String>,
    },
}

impl DecisionsAnswer {
    /// The question's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Predicate { name, .. }
            | Self::Choice { name, .. }
            | Self::Score { name, .. }
            | Self::Refusal { name, .. } => name,
        }
    }
}

/// Cached-input counts; a local engine caches candidate embeddings, not prompts, so these are 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Input tokens read from a prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Input tokens written to a prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

/// Reasoning tokens; a decision model generates none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    /// Tokens spent reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// Token usage of one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionsUsage {
    /// Tokens the model read.
    #[serde(default)]
    pub input_tokens: u64,
    /// Cache details.
    #[serde(default)]
    pub input_tokens_details: InputTokensDetails,
    /// Tokens generated: 0.
    #[serde(default)]
    pub output_tokens: u64,
    /// Reasoning details.
    #[serde(default)]
    pub output_tokens_details: OutputTokensDetails,
    /// Input plus output.
    #[serde(default)]
    pub total_tokens: u64,
}

impl DecisionsUsage {
    /// Usage of `input_tokens` read and nothing generated.
    pub fn input(input_tokens: u64) -> Self {
        Self {
            input_tokens,
            total_tokens: input_tokens,
            ..Self::default()
        }
    }
}

/// A response body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionsResponse {
    /// The model that answered.
    pub model: String,
    /// One answer per question, in question order.
    pub answers: Vec<DecisionsAnswer>,
    /// Token usage.
    #[serde(default)]
    pub usage: DecisionsUsage,
}

/// What the response needs to remember of each question.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    Predicate,
    Choice { bool_values: bool },
    Score { labels: Vec<String> },
}

/// A parsed request body.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    /// The wire `model`, if given.
    pub model: Option<String>,
    /// The decision request; `None` when the input has no text, in which case every question
    /// is answered with a refusal ([`NO_TEXT_REFUSAL`](crate::NO_TEXT_REFUSAL)).
    pub request: Option<DecisionRequest>,
    questions: Vec<(String, Shape)>,
}

impl ParsedRequest {
    /// How many questions the request asks.
    pub fn question_count(&self) -> usize {
        self.questions.len()
    }
}

/// Parses a request body; errors name the field.
pub fn parse_request(body: &[u8], limits: &Limits) -> Result<ParsedRequest, WireError> {
    let value = parse_body(body)?;
    let top = object(&value, "").map_err(|_| {
        WireError::body(format!("expected a JSON object, got {}", type_name(&value)))
    })?;
    let model = optional_str(top, "model", "")?.map(str::to_string);
    optional_str(top, "safety_identifier", "")?;
    let input = parse_input(required(top, "input", "")?)?;

    let items = match required(top, "questions", "")? {
        Value::Array(items) => items,
        other => {
            return Err(WireError::new(
                "questions",
                format!("expected an array, got {}", type_name(other)),
            ))
        }
    };
    limits.questions(items.len(), "questions")?;
    let mut builder = DecisionRequest::builder();
    let mut shapes: Vec<(String, Shape)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = index("questions", i);
        let q = object(item, &at)?;
        let name = required_str(q, "name", &at)?;
        if name.trim().is_empty() {
            return Err(WireError::new(join(&at, "name"), "must not be blank"));
        }
        if shapes.iter().any(|(n, _)| n == name) {
            return Err(WireError::new(
                join(&at, "name"),
                format!("duplicate question name {name:?}"),
            ));
        }
        let kind = required_str(q, "type", &at)?;
        let instructions = required_text(q, "instructions", &at)?;
        let (question, shape): (Question, Shape) = match kind {
            "predicate" => (
                YesNoQuestion::new(instructions)
                    .map_err(|e| contract_error(&join(&at, "instructions"), e))?
                    .into(),
                Shape::Predicate,
            ),
            "choice" => {
                let field = join(&at, "choices");
                let choices = match required(q, "choices", &at)? {
                    Value::Array(c) => c,
                    other => {
                        return Err(WireError::new(
                            field,
                            format!("expected an array, got {}", type_name(other)),
                        ))
                    }
                };
                limits.options(choices.len(), &field)?;
                let mut b = ChoiceQuestion::builder(instructions);
                let mut bools = 0;
                for (j, choice) in choices.iter().enumerate() {
                    let cat = index(&field, j);
                    let c = object(choice, &cat)?;
                    let value = match required(c, "value", &cat)? {
                        Value::String(s) => s.clone(),
                        Value::Bool(v) => {
                            bools += 1;
                            v.to_string()
                        }
                        other => {
                            return Err(WireError::new(
                                join(&cat, "value"),
                                format!("expected a string or a boolean, got {}", type_name(other)),
                            ))
                        }
                    };
                    b = match optional_text(c, "description") {
                        Some(d) => b.option_with_description(value, d),
                        None => b.option(value),
                    };
                }
                let question = b.build().map_err(|e| contract_error(&field, e))?;
                (
                    question.into(),
                    Shape::Choice {
                        bool_values: bools == choices.len(),
                    },
                )
            }
            "score" => {
                let field = join(&at, "levels");
                let levels = match required(q, "levels", &at)? {
                    Value::Array(l) => l,
                    other => {
                        return Err(WireError::new(
                            field,
                            format!("expected an array, got {}", type_name(other)),
                        ))
                    }
                };
                limits.levels(levels.len(), &field)?;
                let mut b = ScaleQuestion::builder(instructions);
                for (j, level) in levels.iter().enumerate() {
                    let lat = index(&field, j);
                    let (label, description) = match level {
                        Value::String(s) => (s.clone(), None),
                        Value::Object(l) => (
                            required_text(l, "label", &lat)?,
                            optional_text(l, "description"),
                        ),
                        other => {
                            return Err(WireError::new(
                                lat,
                                format!("expected an object or a string, got {}", type_name(other)),
                            ))
                        }
                    };
                    b = match description {
                        Some(d) => b.level_with_description(label, d),
                        None => b.level(label),
                    };
                }
                let question = b.build().map_err(|e| contract_error(&field, e))?;
                let labels = question.level_labels().map(str::to_string).collect();
                (question.into(), Shape::Score { labels })
            }
            other => {
                return Err(WireError::new(
                    join(&at, "type"),
                    format!(
                        "unknown question type {other:?} (expected predicate, choice or score)"
                    ),
                ))
            }
        };
        builder = builder.question(name, question);
        shapes.push((name.to_string(), shape));
    }
    let request = match input {
        Some(input) => Some(
            builder
                .input(input)
                .build()
                .map_err(|e| contract_error("", e))?,
        ),
        None => None,
    };
    Ok(ParsedRequest {
        model,
        request,
        questions: shapes,
    })
}

/// A contract error (already checked by the builders) as a wire error about `field`.
fn contract_error(field: &str, e: DecisionError) -> WireError {
    let message = e.to_string();
    let message = message
        .strip_prefix("invalid request: ")
        .unwrap_or(&message)
        .to_string();
    WireError::new(field, message)
}

/// The input as a decision input; `None` when it holds no text (images only).
fn parse_input(value: &Value) -> Result<Option<DecisionInput>, WireError> {
    match value {
        Value::String(s) if s.trim().is_empty() => {
            Err(WireError::new("input", "must not be blank"))
        }
        Value::String(s) => Ok(Some(DecisionInput::Text(s.clone()))),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(WireError::new("input", "must not be empty"));
            }
            let mut messages = Vec::new();
            let mut has_text = false;
            for (i, item) in items.iter().enumerate() {
                let at = index("input", i);
                let m = object(item, &at)?;
                if let Some(kind) = optional_str(m, "type", &at)? {
                    if kind != "message" {
                        return Err(WireError::new(
                            join(&at, "type"),
                            format!("unknown input item type {kind:?} (expected message)"),
                        ));
                    }
                }
                let role = required_str(m, "role", &at)?;
                let (text, text_parts) =
                    message_text(required(m, "content", &at)?, &join(&at, "content"))?;
                match role {
                    // The decision is about the conversation; instructions to the chat model
                    // are not part of it (as LangChain4j's decision input leaves them out).
                    "system" | "developer" => {}
                    "user" | "assistant" => {
                        has_text |= text_parts > 0;
                        if !text.trim().is_empty() {
                            messages.push((role.to_string(), text));
                        }
                    }
                    other => {
                        return Err(WireError::new(
                            join(&at, "role"),
                            format!(
                                "unknown role {other:?} (expected user, assistant, system or developer)"
                            ),
                        ))
                    }
                }
            }
            if !has_text {
                return Ok(None);
            }
            Ok(conversation_input(messages))
        }
        other => Err(WireError::new(
            "input",
            format!(
                "expected a string or an array of messages, got {}",
                type_name(other)
            ),
        )),
    }
}

/// A message's content as text, and how many text parts it had. Images become the
/// `[attached image]` marker LangChain4j uses, so the transcript says one was there.
fn message_text(content: &Value, at: &str) -> Result<(String, usize), WireError> {
    match content {
        Value::String(s) => Ok((s.clone(), usize::from(!s.trim().is_empty()))),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            let mut text_parts = 0;
            for (i, part) in parts.iter().enumerate() {
                let pat = index(at, i);
                let p = object(part, &pat)?;
                match required_str(p, "type", &pat)? {
                    "input_text" | "output_text" | "text" => {
                        let text = required_str(p, "text", &pat)?;
                        if !text.trim().is_empty() {
                            text_parts += 1;
                            texts.push(text.to_string());
                        }
                    }
                    "input_image" => texts.push("[attached image]".to_string()),
                    "input_file" => texts.push("[attached file]".to_string()),
                    other => {
                        return Err(WireError::new(
                            join(&pat, "type"),
                            format!(
                            "unknown content type {other:?} (expected input_text or input_image)"
                        ),
                        ))
                    }
                }
            }
            Ok((texts.join("\n"), text_parts))
        }
        other => Err(WireError::new(
            at,
            format!(
                "expected a string or an array of content parts, got {}",
                type_name(other)
            ),
        )),
    }
}

/// The response body for a parsed request: `response` answers it, or, when the request had
/// no text, every question is refused.
pub fn render_response(
    parsed: &ParsedRequest,
    response: Option<&DecisionResponse>,
    model: &str,
) -> DecisionsResponse {
    let tokens = response
        .and_then(DecisionResponse::token_usage)
        .map(|u| u.input_tokens)
        .unwrap_or(0);
    let answers = parsed
        .questions
        .iter()
        .map(|(name, shape)| {
            let refusal = |reason: Option<String>| DecisionsAnswer::Refusal {
                name: name.clone(),
                refusal: reason,
            };
            let Some(response) = response else {
                return refusal(Some(crate::NO_TEXT_REFUSAL.to_string()));
            };
            match (response.answers().get(name), shape) {
                (Some(Answer::YesNo(a)), _) => DecisionsAnswer::Predicate {
                    name: name.clone(),
                    probability: a.probability(),
                },
                (Some(Answer::Choice(a)), Shape::Choice { bool_values }) => {
                    let value = |option: &str| match (*bool_values, option) {
                        (true, "true") => ChoiceValue::Bool(true),
                        (true, "false") => ChoiceValue::Bool(false),
                        _ => ChoiceValue::Text(option.to_string()),
                    };
                    DecisionsAnswer::Choice {
                        name: name.clone(),
                        choice: value(a.value()),
                        probabilities: a
                            .probabilities()
                            .iter()
                            .map(|(o, p)| ChoiceProbability {
                                value: value(o),
                                probability: *p,
                            })
                            .collect(),
                        confidence: a.confidence(),
                    }
                }
                (Some(Answer::Scale(a)), Shape::Score { labels }) => DecisionsAnswer::Score {
                    name: name.clone(),
                    score: a.mean(),
                    probabilities: a
                        .probabilities()
                        .iter()
                        .zip(labels)
                        .enumerate()
                        .map(|(i, (p, label))| LevelProbability {
                            value: i,
                            label: label.clone(),
                            probability: *p,
                        })
                        .collect(),
                    confidence: a.confidence(),
                },
                (Some(Answer::Refusal { reason }), _) => refusal(reason.clone()),
                // A validated response answers every question with its own type.
                _ => refusal(Some("the model gave no answer of this type".to_string())),
            }
        })
        .collect();
    DecisionsResponse {
        model: model.to_string(),
        answers,
        usage: DecisionsUsage::input(tokens),
    }
}

/// The error body: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(kind: &str, message: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// The request body for a decision request (the client side). Yes/no criteria, which the
/// format has no slot for, are appended to the instructions as `If true: ...` / `If false:
/// ...` lines, as pydecide does.
pub fn request_body(request: &DecisionRequest, model: Option<&str>) -> Value {
    let input = match input_messages(request.input()) {
        Some(messages) => Value::Array(
            messages
                .into_iter()
                .map(|(role, text)| {
                    json!({"type": "message", "role": role,
                           "content": [{"type": "input_text", "text": text}]})
                })
                .collect(),
        ),
        None => Value::String(request.input().render()),
    };
    let questions: Vec<Value> = request
        .questions()
        .iter()
        .map(|(name, question)| match question {
            Question::YesNo(q) => {
                let mut instructions = q.text().to_string();
                if let Some((yes, no)) = yes_no_criteria(question) {
                    instructions.push_str("\n\nIf true: ");
                    instructions.push_str(&yes);
                    if let Some(no) = no {
                        instructions.push_str("\nIf false: ");
                        instructions.push_str(&no);
                    }
                }
                json!({"type": "predicate", "name": name, "instructions": instructions})
            }
            Question::Choice(q) => json!({
                "type": "choice", "name": name, "instructions": q.text(),
                "choices": q.options().iter().map(|o| {
                    if o.description == o.name {
                        json!({"value": o.name})
                    } else {
                        json!({"value": o.name, "description": o.description})
                    }
                }).collect::<Vec<_>>(),
            }),
            Question::Scale(q) => json!({
                "type": "score", "name": name, "instructions": q.text(),
                "levels": q.levels().iter().map(|l| match &l.description {
                    Some(d) => json!({"label": l.label, "description": d}),
                    None => json!({"label": l.label}),
                }).collect::<Vec<_>>(),
            }),
        })
        .collect();
    let mut body = Map::new();
    if let Some(model) = model {
        body.insert("model".into(), Value::String(model.to_string()));
    }
    body.insert("input".into(), input);
    body.insert("questions".into(), Value::Array(questions));
    Value::Object(body)
}

/// A response body as a decision response (the client side); errors name the field.
pub fn parse_response(body: &[u8]) -> Result<DecisionResponse, WireError> {
    let value = parse_body(body)?;
    let wire: DecisionsResponse =
        serde_json::from_value(value).map_err(|e| WireError::body(e.to_string()))?;
    let mut builder = DecisionResponse::builder()
        .model_name(wire.model.clone())
        .token_usage(TokenUsage::new(wire.usage.input_tokens));
    for (i, answer) in wire.answers.into_iter().enumerate() {
        let at = index("answers", i);
        let name = answer.name().to_string();
        let bad = |e: DecisionError| WireError::new(at.clone(), e.to_string());
        let answer: Answer = match answer {
            DecisionsAnswer::Predicate { probability, .. } => {
                Answer::yes_no(probability).map_err(bad)?
            }
            DecisionsAnswer::Choice {
                choice,
                probabilities,
                confidence,
                ..
            } => {
                let mut a = ChoiceAnswer::new(choice.as_name())
                    .with_probabilities(
                        probabilities
                            .iter()
                            .map(|p| (p.value.as_name(), p.probability)),
                    )
                    .map_err(bad)?;
                if let Some(c) = confidence {
                    a = a.with_confidence(c).map_err(bad)?;
                }
                a.into()
            }
            DecisionsAnswer::Score {
                score,
                mut probabilities,
                confidence,
                ..
            } => {
                probabilities.sort_by_key(|p| p.value);
                let mut a = ScaleAnswer::new(score)
                    .and_then(|a| {
                        a.with_probabilities(probabilities.iter().map(|p| p.probability).collect())
                    })
                    .map_err(bad)?;
                if let Some(c) = confidence {
                    a = a.with_confidence(c).map_err(bad)?;
                }
                a.into()
            }
            DecisionsAnswer::Refusal { refusal, .. } => match refusal {
                Some(reason) => Answer::refusal_because(reason),
                None => Answer::refusal(),
            },
        };
        builder = builder.answer(name, answer);
    }
    builder
        .build()
        .map_err(|e| WireError::new("answers", e.to_string()))
}
