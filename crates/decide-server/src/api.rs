//! The HTTP surface: router, admission, authentication, the two wire formats and the errors.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use decide_contract::{DecisionError, DecisionModel, DecisionRequest, DecisionResponse};
use decide_engine::Engine;
use decide_http::{openai, systemone, WireError};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::batcher::{BatchedEngine, Batcher};
use crate::metrics::Metrics;
use crate::{AppState, ServerConfig};

pub(crate) struct Shared {
    pub(crate) model: BatchedEngine,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: ServerConfig,
    model_name: String,
    key_digest: Option<[u8; 32]>,
    permits: Arc<Semaphore>,
}

impl Shared {
    pub(crate) fn new(
        engine: Engine,
        batcher: Batcher,
        metrics: Arc<Metrics>,
        config: ServerConfig,
    ) -> Self {
        Self {
            model_name: engine.info().name.clone(),
            model: BatchedEngine::new(engine, Arc::new(batcher)),
            metrics,
            key_digest: config.api_key.as_deref().map(digest),
            permits: Arc::new(Semaphore::new(config.max_concurrent_requests.max(1))),
            config,
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The error shape an answer takes: each format has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `{"error": {"message", "type", "param", "code"}}`: OpenAI and our own endpoints.
    OpenAi,
    /// `{"error": {"type", "message", "field"}}`.
    SystemOne,
}

impl Format {
    fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/systemone") {
            Self::SystemOne
        } else {
            Self::OpenAi
        }
    }
}

/// An HTTP error answer.
#[derive(Debug)]
pub(crate) enum ApiError {
    BadRequest(WireError),
    Unauthorized,
    TooLarge(usize),
    Overloaded(u64),
    Timeout(u64),
    Unprocessable(String),
    Internal(String),
}

impl ApiError {
    /// A model error: the caller's mistake is a 400, a full queue a 503, anything else a 500.
    pub(crate) fn from_decision(error: DecisionError, retry_after: u64) -> Self {
        if BatchedEngine::is_overloaded(&error) {
            return Self::Overloaded(retry_after);
        }
        match error {
            DecisionError::InvalidRequest(m) => Self::BadRequest(WireError::body(m)),
            DecisionError::UnsupportedFeature(m) => Self::Unprocessable(m),
            other => Self::Internal(other.to_string()),
        }
    }

    pub(crate) fn into_response(self, format: Format) -> Response {
        let (status, kind, message, field) = match &self {
            Self::BadRequest(e) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e.to_string(),
                Some(e.field.clone()).filter(|f| !f.is_empty()),
            ),
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (send Authorization: Bearer KEY)".to_string(),
                None,
            ),
            Self::TooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {limit} bytes"),
                None,
            ),
            Self::Overloaded(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "the server is at its limit of decisions in flight; retry later".to_string(),
                None,
            ),
            Self::Timeout(secs) => (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_error",
                format!("the decision took longer than the server's deadline of {secs} s"),
                None,
            ),
            Self::Unprocessable(m) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                m.clone(),
                None,
            ),
            Self::Internal(m) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                m.clone(),
                None,
            ),
        };
        let body = match format {
            Format::OpenAi => openai::error_body(kind, &message, field.as_deref(), None),
            Format::SystemOne => systemone::error_body(kind, &message, field.as_deref()),
        };
        let mut response = (status, Json(body)).into_response();
        if let Self::Overloaded(secs) = self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).unwrap_or(HeaderValue::from_static("1")),
            );
        }
        response
    }
}

const ENDPOINTS: [&str; 7] = [
    "/v1/decisions",
    "/v1/systemone",
    "/v1/select",
    "/v1/route",
    "/v1/models",
    "/health",
    "/metrics",
];

pub(crate) fn router(state: AppState) -> Router {
    let limit = state.inner.config.max_body_bytes;
    Router::new()
        .route("/v1/decisions", post(decisions))
        .route("/v1/systemone", post(system_one))
        .route("/v1/select", post(crate::tasks::select))
        .route("/v1/route", post(crate::tasks::route))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Authentication and metrics around every request. Only the endpoint, status and latency are
/// recorded: never the body.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // Known paths only, so that a scan of random URLs cannot grow the metrics without bound.
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == request.uri().path())
        .copied()
        .unwrap_or("other");
    let format = Format::of_path(request.uri().path());
    let authorized = match &state.inner.key_digest {
        None => true,
        Some(_) if request.uri().path() == "/health" => true,
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
        ApiError::Unauthorized.into_response(format)
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

/// The body, or 413 when it is over the limit.
pub(crate) fn body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(state.inner.config.max_body_bytes)
        } else {
            ApiError::BadRequest(WireError::body(e.body_text()))
        }
    })
}

/// A slot for one decision, or 503 at once when every slot is taken.
pub(crate) fn admit(state: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    state
        .inner
        .permits
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            state.inner.metrics.observe_rejected();
            ApiError::Overloaded(state.inner.config.retry_after_secs)
        })
}

/// Runs `future` under the request deadline.
pub(crate) async fn deadline<T>(
    state: &AppState,
    future: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let limit = state.inner.config.request_timeout;
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or(Err(ApiError::Timeout(limit.as_secs())))
}

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

async fn decisions(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let raw = body(&state, raw)?;
        let parsed = openai::parse_request(&raw, &state.inner.config.limits)
            .map_err(ApiError::BadRequest)?;
        let _permit = admit(&state)?;
        let response = match &parsed.request {
            Some(request) => Some(decide(&state, request).await?),
            None => None,
        };
        Ok::<_, ApiError>(openai::render_response(
            &parsed,
            response.as_ref(),
            &state.inner.model_name,
        ))
    }
    .await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(Format::OpenAi),
    }
}

async fn system_one(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let raw = body(&state, raw)?;
        let parsed = systemone::parse_request(&raw, &state.inner.config.limits)
            .map_err(ApiError::BadRequest)?;
        let _permit = admit(&state)?;
        let response = decide(&state, &parsed.request).await?;
        Ok::<_, ApiError>(systemone::render_response(
            &parsed.request,
            &response,
            &state.inner.model_name,
        ))
    }
    .await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(Format::SystemOne),
    }
}

async fn models(State(state): State<AppState>) -> Json<Value> {
    let info = state.inner.model.engine().info();
    Json(json!({
        "object": "list",
        "data": [{
            "id": info.name,
            "object": "model",
            "created": 0,
            "owned_by": "decide",
            "hf_id": info.hf_id,
            "head": info.head.as_str(),
            "device": info.device,
            "max_length": info.max_length,
        }]
    }))
}

async fn health(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "model": state.inner.model_name}))
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.inner.metrics.render(),
    )
        .into_response()
}
