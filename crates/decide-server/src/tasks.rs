//! Our own endpoints for the two jobs: `/v1/select` (the tool filter) and `/v1/route` (the
//! router), answering as `decide select --json` and `decide route --json` do. Both ask the
//! batched engine, so their decisions share the queue with the wire-format endpoints.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use decide_chat::{
    parse_messages, parse_tools, ChatMessage, ChatRequest, StaticToolProvider, ToolProviderRequest,
};
use decide_contract::DecisionError;
use decide_filter::{FilterError, FilteringToolProvider};
use decide_http::WireError;
use decide_router::{
    validate_option_names, ChatModelRoute, ChatModelRoutingRequest, DecisionModelChatModelRouter,
    Fallback, RouterError,
};
use serde_json::{json, Map, Value};

use crate::api::{admit, body, deadline, ApiError, Format};
use crate::AppState;

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(WireError::new(field, message))
}

fn parse_object(raw: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(raw) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(other) => Err(bad(
            "",
            format!("expected a JSON object, got {}", type_name(&other)),
        )),
        Err(e) => Err(bad(
            "",
            format!(
                "invalid JSON at line {} column {}: {}",
                e.line(),
                e.column(),
                e
            ),
        )),
    }
}

fn refuse_unknown(body: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match body.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(bad(
            key,
            format!("unknown field (expected {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// `messages` (the OpenAI chat format) or `text` (one user message).
fn conversation(body: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    match (body.get("messages"), body.get("text")) {
        (Some(_), Some(_)) => Err(bad("text", "give messages or text, not both")),
        (Some(m), None) => {
            let messages = parse_messages(m).map_err(|e| bad("messages", e.to_string()))?;
            if messages.is_empty() {
                return Err(bad("messages", "empty"));
            }
            Ok(messages)
        }
        (None, Some(Value::String(t))) if !t.trim().is_empty() => {
            Ok(vec![ChatMessage::user(t.clone())])
        }
        (None, Some(Value::String(_))) => Err(bad("text", "must not be blank")),
        (None, Some(other)) => Err(bad(
            "text",
            format!("expected a string, got {}", type_name(other)),
        )),
        (None, None) => Err(bad("messages", "missing (give messages or text)")),
    }
}

fn number(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(bad(
            key,
            format!("expected a number, got {}", type_name(other)),
        )),
    }
}

fn count(body: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => Ok(Some(v as usize)),
            None => Err(bad(key, format!("expected a whole number, got {n}"))),
        },
        Some(other) => Err(bad(
            key,
            format!("expected a whole number, got {}", type_name(other)),
        )),
    }
}

/// Runs blocking work (the filter or the router, which call the batched engine's blocking
/// path) on tokio's blocking pool, under the request's deadline and one admission slot.
async fn blocking<T: Send + 'static>(
    state: &AppState,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _permit = admit(state)?;
    deadline(state, async {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
    })
    .await
}

fn decision_error(state: &AppState, e: DecisionError) -> ApiError {
    ApiError::from_decision(e, state.inner.config.retry_after_secs)
}

const SELECT_FIELDS: &[&str] = &[
    "messages",
    "text",
    "tools",
    "min_probability",
    "target_recall",
    "max_results",
    "max_messages",
    "max_message_length",
    "always_include",
    "fallback",
];

/// `POST /v1/select`: `{"messages" | "text", "tools", "min_probability"? | "target_recall"?,
/// "max_results"?, "max_messages"?, "max_message_length"?, "always_include"?, "fallback"?}` →
/// `{"selected": [...], "scores": [...], "fallback"?}`. `target_recall` takes its threshold
/// from the model's conformal table.
pub(crate) async fn select(
    State(state): State<AppState>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let raw = body(&state, raw)?;
        let body = parse_object(&raw)?;
        refuse_unknown(&body, SELECT_FIELDS)?;
        let messages = conversation(&body)?;
        let tools = match body.get("tools") {
            None | Some(Value::Null) => return Err(bad("tools", "missing")),
            Some(t) => parse_tools(t).map_err(|e| bad("tools", e.to_string()))?,
        };
        if tools.is_empty() {
            return Err(bad("tools", "empty"));
        }
        let max_tools = state.inner.config.limits.max_options;
        if tools.len() > max_tools {
            return Err(bad(
                "tools",
                format!("{} tools, at most {max_tools} allowed", tools.len()),
            ));
        }
        let Some(user) = messages.iter().rev().find_map(|m| match m {
            ChatMessage::User(u) => Some(u.clone()),
            _ => None,
        }) else {
            return Err(bad("messages", "the conversation has no user message"));
        };
        let request = ToolProviderRequest::builder(user)
            .messages(messages.clone())
            .build();
        let mut builder = FilteringToolProvider::builder()
            .tool_provider(Arc::new(StaticToolProvider::from_specifications(tools)))
            .decision_model(Arc::new(state.inner.model.clone()));
        if let Some(p) = number(&body, "min_probability")? {
            builder = builder.min_probability(p);
        }
        if let Some(r) = number(&body, "target_recall")? {
            let engine = state.inner.model.engine();
            let conformal = engine
                .require_conformal()
                .map_err(|e| bad("target_recall", e.to_string()))?;
            builder = builder.target_recall(r, conformal);
        }
        if let Some(k) = count(&body, "max_results")? {
            builder = builder.max_results(k);
        }
        if let Some(n) = count(&body, "max_messages")? {
            builder = builder.max_messages(n);
        }
        if let Some(n) = count(&body, "max_message_length")? {
            builder = builder.max_message_length(n);
        }
        match body.get("always_include") {
            None | Some(Value::Null) => {}
            Some(Value::Array(names)) => {
                let names = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        n.as_str().map(str::to_string).ok_or_else(|| {
                            bad(&format!("always_include[{i}]"), "expected a tool name")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                builder = builder.always_include(names);
            }
            Some(other) => {
                return Err(bad(
                    "always_include",
                    format!("expected an array of tool names, got {}", type_name(other)),
                ))
            }
        }
        match body.get("fallback") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                builder = builder.fallback(s.parse().map_err(|e: FilterError| {
                    bad("fallback", e.to_string().trim_start_matches("fallback: "))
                })?);
            }
            Some(other) => {
                return Err(bad(
                    "fallback",
                    format!("expected a string, got {}", type_name(other)),
                ))
            }
        }
        let filter = builder.build().map_err(|e| match e {
            FilterError::InvalidConfig { option, message } => bad(option, message),
            other => bad("", other.to_string()),
        })?;
        let retry = state.inner.config.retry_after_secs;
        let selection = blocking(&state, move || {
            filter.select(&request).map_err(|e| match e {
                FilterError::Decision(d) => ApiError::from_decision(d, retry),
                other => ApiError::Internal(other.to_string()),
            })
        })
        .await?;
        let scores: Vec<Value> = selection
            .decisions
            .iter()
            .map(|d| json!({"name": d.name, "probability": d.probability, "reason": d.reason}))
            .collect();
        let selected: Vec<Value> = selection
            .decisions
            .iter()
            .zip(&scores)
            .filter(|(d, _)| d.passed)
            .map(|(_, s)| s.clone())
            .collect();
        let mut out = json!({"selected": selected, "scores": scores});
        if let Some(f) = &selection.fallback {
            out["fallback"] = json!({"strategy": f.strategy, "reason": f.reason});
        }
        Ok(out)
    }
    .await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(Format::OpenAi),
    }
}

const ROUTE_FIELDS: &[&str] = &[
    "messages",
    "text",
    "routes",
    "default",
    "max_messages",
    "min_probability",
];

/// `routes: [{"name", "description"?, "descriptions"?}]`.
fn parse_routes(value: Option<&Value>) -> Result<Vec<ChatModelRoute>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => return Err(bad("routes", "missing")),
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("routes", "empty")),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(bad(
                "routes",
                format!("expected an array, got {}", type_name(other)),
            ))
        }
    };
    let mut routes: Vec<ChatModelRoute> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("routes[{i}]");
        let Value::Object(r) = item else {
            return Err(bad(
                &at,
                format!("expected an object, got {}", type_name(item)),
            ));
        };
        let name = match r.get("name") {
            Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
            Some(Value::String(_)) => return Err(bad(&format!("{at}.name"), "blank")),
            None | Some(Value::Null) => return Err(bad(&format!("{at}.name"), "missing")),
            Some(other) => {
                return Err(bad(
                    &format!("{at}.name"),
                    format!("expected a string, got {}", type_name(other)),
                ))
            }
        };
        if routes.iter().any(|x| x.name() == name) {
            return Err(bad(
                &format!("{at}.name"),
                format!("duplicate route name {name:?}"),
            ));
        }
        let text = |key: &str, v: &Value| -> Result<String, ApiError> {
            v.as_str()
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .ok_or_else(|| bad(&format!("{at}.{key}"), "expected a non-blank string"))
        };
        routes.push(match (r.get("description"), r.get("descriptions")) {
            (Some(_), Some(_)) => {
                return Err(bad(&at, "give description or descriptions, not both"))
            }
            (Some(d), None) => ChatModelRoute::new(name, text("description", d)?),
            (None, Some(Value::Array(ds))) => ChatModelRoute::with_descriptions(
                name,
                ds.iter()
                    .map(|d| text("descriptions", d))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            (None, Some(other)) => {
                return Err(bad(
                    &format!("{at}.descriptions"),
                    format!("expected an array of strings, got {}", type_name(other)),
                ))
            }
            (None, None) => ChatModelRoute::without_description(name),
        });
    }
    Ok(routes)
}

/// `POST /v1/route`: `{"messages" | "text", "routes", "default", "max_messages"?,
/// "min_probability"?}` → `{"route", "probabilities"}`.
pub(crate) async fn route(
    State(state): State<AppState>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let raw = body(&state, raw)?;
        let body = parse_object(&raw)?;
        refuse_unknown(&body, ROUTE_FIELDS)?;
        let messages = conversation(&body)?;
        let routes = parse_routes(body.get("routes"))?;
        let max_routes = state.inner.config.limits.max_options;
        if routes.len() > max_routes {
            return Err(bad(
                "routes",
                format!("{} routes, at most {max_routes} allowed", routes.len()),
            ));
        }
        validate_option_names(&routes).map_err(|e| bad("routes", e.to_string()))?;
        let default = match body.get("default") {
            Some(Value::String(d)) => d.clone(),
            None | Some(Value::Null) => return Err(bad("default", "missing")),
            Some(other) => {
                return Err(bad(
                    "default",
                    format!("expected a route name, got {}", type_name(other)),
                ))
            }
        };
        if !routes.iter().any(|r| r.name() == default) {
            return Err(bad(
                "default",
                format!("{default:?} is not one of the routes"),
            ));
        }
        let chat =
            ChatRequest::from_messages(messages).map_err(|e| bad("messages", e.to_string()))?;
        let mut builder = DecisionModelChatModelRouter::builder()
            .decision_model(Arc::new(state.inner.model.clone()))
            // A failed decision is the client's to see (503 when the queue is full), not a
            // silent default route.
            .fallback(Fallback::Fail);
        if let Some(n) = count(&body, "max_messages")? {
            builder = builder.max_messages(n);
        }
        if let Some(p) = number(&body, "min_probability")? {
            builder = builder.min_probability(p);
        }
        let router = builder.build().map_err(|e| match e {
            RouterError::InvalidConfig { option, message } => bad(option, message),
            other => bad("", other.to_string()),
        })?;
        let st = state.clone();
        let decision = blocking(&state, move || {
            router
                .decide(&ChatModelRoutingRequest::new(&chat, routes))
                .map_err(|e| match e {
                    RouterError::Decision(d) => decision_error(&st, d),
                    other => ApiError::Internal(other.to_string()),
                })
        })
        .await?;
        let chosen = decision
            .result
            .route_name()
            .map(str::to_string)
            .unwrap_or(default);
        let probabilities: Map<String, Value> = decision
            .probabilities
            .iter()
            .map(|(n, p)| (n.clone(), Value::from(*p)))
            .collect();
        Ok(json!({"route": chosen, "probabilities": probabilities}))
    }
    .await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(Format::OpenAi),
    }
}
