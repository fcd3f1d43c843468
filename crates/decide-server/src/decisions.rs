//! The two wire formats of hosted decision APIs: `POST /v1/decisions` (OpenAI) and
//! `POST /v1/systemone` (System One), each answered in its own error shape.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use decide_contract::{DecisionModel, DecisionRequest, DecisionResponse};
use decide_http::{openai, systemone};

use crate::api_error::{ApiError, SystemOneError};
use crate::limits::{blocking, off_runtime, Body};
use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/decisions", post(decisions))
        .route("/v1/systemone", post(system_one))
}

/// One decision through the batching queue, under the request deadline and one admission slot.
///
/// It runs as the filter's and the router's do ([`blocking`]): tokenizing and waiting on the
/// queue happen on the blocking pool, holding the slot until they really end, and rows still
/// queued when the deadline passes or the client leaves are dropped. Awaiting
/// `decide_async` instead would free the slot with the answer while its tokenizing went on.
async fn decide(
    state: &AppState,
    request: DecisionRequest,
) -> Result<(DecisionRequest, DecisionResponse), ApiError> {
    let model = state.model().clone();
    blocking(state, move || {
        model.decide(&request).map(|response| (request, response))
    })
    .await
}

async fn decisions(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<openai::DecisionsResponse>, ApiError> {
    let limits = state.limits();
    let mut parsed = off_runtime(move || Ok(openai::parse_request(&raw, &limits)?)).await?;
    let response = match parsed.request.take() {
        Some(request) => {
            let (request, response) = decide(&state, request).await?;
            parsed.request = Some(request);
            Some(response)
        }
        None => None,
    };
    Ok(Json(openai::render_response(
        &parsed,
        response.as_ref(),
        state.model_name(),
    )))
}

async fn system_one(
    State(state): State<AppState>,
    body: Result<Body, ApiError>,
) -> Result<Json<systemone::SystemOneResponse>, SystemOneError> {
    let Body(raw) = body?;
    let limits = state.limits();
    let parsed = off_runtime(move || Ok(systemone::parse_request(&raw, &limits)?))
        .await
        .map_err(SystemOneError::from)?;
    let (request, response) = decide(&state, parsed.request).await?;
    Ok(Json(systemone::render_response(
        &request,
        &response,
        state.model_name(),
    )))
}
