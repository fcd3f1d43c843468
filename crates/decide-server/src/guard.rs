//! Authentication and metrics around every request.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api_error::{ApiError, Format};
use crate::playground;
use crate::AppState;

/// The paths metrics are kept for; any other is counted as `other`, but the playground's
/// examples, counted under their folder.
const ENDPOINTS: [&str; 15] = [
    "/v1/decisions",
    "/v1/tool_search",
    "/v1/systemone",
    "/v1/select",
    "/v1/route",
    "/v1/embeddings",
    "/embed",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/models",
    "/health",
    "/metrics",
    "/",
    playground::EXAMPLES_PATH,
];

/// Keys are compared over their SHA-256, so that neither their bytes nor their length leak
/// through the time a comparison takes.
pub(crate) fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Checks the API key (all but `/health` need it, when one is set) and records the endpoint,
/// status and latency: never the body.
pub(crate) async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // Known paths only, so that a scan of random URLs cannot grow the metrics without bound.
    let path = request.uri().path();
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == path)
        .copied()
        .or_else(|| {
            path.starts_with(playground::EXAMPLES_PATH)
                .then_some(playground::EXAMPLES_PATH)
        })
        .unwrap_or("other");
    let format = Format::of_path(request.uri().path());
    let authorized = match &state.inner.key_digest {
        None => true,
        Some(_)
            if request.uri().path() == "/health" || playground::is_public(request.uri().path()) =>
        {
            true
        }
        Some(expected) => request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| bool::from(digest(given.trim()).ct_eq(expected))),
    };
    let response = if authorized {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response_as(format)
    };
    let status = response.status().as_u16();
    state
        .inner
        .metrics
        .observe_request(endpoint, status, started.elapsed());
    tracing::debug!(
        endpoint,
        status,
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
