//! The two wire formats of hosted decision APIs: `POST /v1/decisions` (OpenAI) and
//! `POST /v1/systemone` (System One), each answered in its own error shape.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use decide_contract::{DecisionModel, DecisionRequest, DecisionResponse};
use decide_http::{openai, systemone};

use crate::api_error::{ApiError, SystemOneError};
use crate::limits::{admit, deadline, off_runtime, Body};
use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/decisions", post(decisions))
        .route("/v1/systemone", post(system_one))
}

/// One decision through the batching queue, under the request deadline.
async fn decide(state: &AppState, request: &DecisionRequest) -> Result<DecisionResponse, ApiError> {
    let retry = state.inner.config.retry_after_secs;
    deadline(state, async {
        state
            .inner
            .model
            .decide_async(request)
            .await
            .map_err(|e| ApiError::from_decision(e, retry))
    })
    .await
}

async fn decisions(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<openai::DecisionsResponse>, ApiError> {
    let limits = state.inner.config.limits;
    let parsed = off_runtime(move || Ok(openai::parse_request(&raw, &limits)?)).await?;
    let _permit = admit(&state)?;
    let response = match &parsed.request {
        Some(request) => Some(decide(&state, request).await?),
        None => None,
    };
    Ok(Json(openai::render_response(
        &parsed,
        response.as_ref(),
        &state.inner.model_name,
    )))
}

async fn system_one(
    State(state): State<AppState>,
    body: Result<Body, ApiError>,
) -> Result<Json<systemone::SystemOneResponse>, SystemOneError> {
    let Body(raw) = body?;
    let limits = state.inner.config.limits;
    let parsed = off_runtime(move || Ok(systemone::parse_request(&raw, &limits)?))
        .await
        .map_err(SystemOneError::from)?;
    let _permit = admit(&state)?;
    let response = decide(&state, &parsed.request).await?;
    Ok(Json(systemone::render_response(
        &parsed.request,
        &response,
        &state.inner.model_name,
    )))
}
