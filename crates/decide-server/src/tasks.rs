//! Our own endpoints for the two jobs: `/v1/select` (the tool filter) and `/v1/route` (the
//! router), answering as `decide select --json` and `decide route --json` do. Both ask the
//! batched engine, so their decisions share the queue with the wire-format endpoints.
//!
//! Their bodies are decide-filter's [`SelectRequest`] and decide-router's [`RouteRequest`], the
//! same typed inputs the command line reads, so both refuse the same mistakes in the same words.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use decide_chat::StaticToolProvider;
use decide_filter::{FilteringToolProvider, SelectRequest, SelectResponse};
use decide_router::{RouteRequest, RouteResponse};
use serde_json::Value;

use crate::api_error::ApiError;
use crate::limits::{blocking, off_runtime, Body};
use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/select", post(select))
        .route("/v1/route", post(route))
}

/// Reads a body as JSON and refuses more options (tools or routes, the array `field`) than a
/// request may carry, before any per-option validation runs: the limit bounds that work too.
fn parse_bounded(raw: &[u8], field: &str, most: usize) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(raw).map_err(decide_chat::ParseError::from)?;
    let count = value
        .get(field)
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if count > most {
        return Err(ApiError::bad(
            field,
            format!("{count} {field}, at most {most} allowed"),
        ));
    }
    Ok(value)
}

/// `POST /v1/select`: a [`SelectRequest`] → a [`SelectResponse`], `{"selected": [...], "scores": [...],
/// "needs_tool"?, "fallback"?}`, `needs_tool` saying what the needs-tool gate decided on when it is on.
/// `target_recall` takes its threshold from the model's conformal table.
async fn select(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<SelectResponse>, ApiError> {
    let most = state.limits().max_options;
    let request = off_runtime(move || {
        Ok(SelectRequest::from_value(parse_bounded(
            &raw, "tools", most,
        )?)?)
    })
    .await?;
    let builder = FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(
            request.tools,
        )))
        .decision_model(Arc::new(state.model().clone()));
    let filter = request.options.apply(builder)?.build()?;
    let conversation = request.request;
    let selection = blocking(&state, move || filter.select(&conversation)).await?;
    Ok(Json(SelectResponse::from(&selection)))
}

/// `POST /v1/route`: a [`RouteRequest`] → a [`RouteResponse`], `{"route", "probabilities"}`.
async fn route(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<RouteResponse>, ApiError> {
    let most = state.limits().max_options;
    let request = off_runtime(move || {
        Ok(RouteRequest::from_value(parse_bounded(
            &raw, "routes", most,
        )?)?)
    })
    .await?;
    let router = request.router(Arc::new(state.model().clone()))?;
    let (request, decision) = blocking(&state, move || {
        router
            .decide(&request.routing_request())
            .map(|decision| (request, decision))
    })
    .await?;
    Ok(Json(request.response(&decision)))
}
