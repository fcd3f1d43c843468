//! `POST /v1/tool_search`: the providers' client-executed tool search, answered by the local model. An application
//! that defers its tools (OpenAI Responses `tool_search` with `execution: "client"`, Anthropic's custom tool search)
//! posts the model's search call and the deferred tools, and gets back the item to append to its next request:
//! OpenAI's `tool_search_output` (the matching tool definitions) or Anthropic's `tool_result` of `tool_reference`
//! blocks. The body is decide-filter's [`ToolSearchCall`].

use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use decide_filter::ToolSearchCall;
use serde_json::Value;

use crate::api_error::ApiError;
use crate::limits::{blocking, Body};
use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/v1/tool_search", post(tool_search))
}

async fn tool_search(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<Value>, ApiError> {
    let json: Value = decide_chat::from_slice(&raw)?;
    let call = ToolSearchCall::from_value(json)?;
    let most = state.limits().max_options;
    if call.specifications.len() > most {
        return Err(ApiError::bad(
            "tools",
            format!(
                "{} tools, at most {most} allowed",
                call.specifications.len()
            ),
        ));
    }
    // Tools named by path are loaded as asked; the model ranks only for a query.
    let requested = call.requested();
    if !requested.is_empty() {
        return Ok(Json(call.answer(&requested)));
    }
    let model = Arc::new(state.model().clone());
    let conformal = state.model().engine().conformal().cloned();
    let searched = call.clone();
    let found = blocking(&state, move || searched.search(model, conformal.as_ref())).await?;
    let names: Vec<String> = found.into_iter().map(|(name, _)| name).collect();
    Ok(Json(call.answer(&names)))
}
