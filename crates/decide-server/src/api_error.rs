//! The HTTP error answers, in the shape of each wire format.
//!
//! Handlers return `Result<_, ApiError>` (OpenAI's shape, which our own endpoints share) or
//! `Result<_, SystemOneError>`; `?` turns a parse, model or limit error into the answer, so no
//! handler spells out status codes or bodies.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use decide_chat::ParseError;
use decide_contract::DecisionError;
use decide_http::{openai, systemone, WireError};

use crate::batcher::BatchedEngine;

/// The error shape an answer takes: each format has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `{"error": {"message", "type", "param", "code"}}`: OpenAI and our own endpoints.
    OpenAi,
    /// `{"error": {"type", "message", "field"}}`.
    SystemOne,
}

impl Format {
    /// The format of the endpoint at `path`, for answers given before a handler runs.
    pub(crate) fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/systemone") {
            Self::SystemOne
        } else {
            Self::OpenAi
        }
    }
}

/// An HTTP error answer; as a response, in OpenAI's shape.
#[derive(Debug)]
pub(crate) enum ApiError {
    BadRequest(WireError),
    Unauthorized,
    /// A request from a host name or web origin the server does not accept.
    Forbidden(String),
    /// A POST whose body is not declared as JSON.
    NotJson,
    /// The body did not arrive within the read timeout.
    SlowBody(u64),
    TooLarge(usize),
    Overloaded(u64),
    Timeout(f64),
    Unprocessable(String),
    Internal(String),
}

impl ApiError {
    /// A 400 about `field`.
    pub(crate) fn bad(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadRequest(WireError::new(field, message))
    }

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

    /// The answer in `format`'s shape.
    pub(crate) fn into_response_as(self, format: Format) -> Response {
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
            Self::Forbidden(m) => (StatusCode::FORBIDDEN, "permission_error", m.clone(), None),
            Self::NotJson => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "the body must be sent as Content-Type: application/json".to_string(),
                Some("Content-Type".to_string()),
            ),
            Self::SlowBody(secs) => (
                StatusCode::REQUEST_TIMEOUT,
                "timeout_error",
                format!("the request body did not arrive within {secs} s"),
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

impl From<WireError> for ApiError {
    fn from(error: WireError) -> Self {
        Self::BadRequest(error)
    }
}

/// A typed body that does not read: a 400 naming its JSON path (empty for the body as a whole).
impl From<ParseError> for ApiError {
    fn from(error: ParseError) -> Self {
        match error {
            ParseError::Invalid { path, message } => Self::bad(path, message),
            other => Self::bad("", other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_as(Format::OpenAi)
    }
}

/// An [`ApiError`] answered in System One's shape.
#[derive(Debug)]
pub(crate) struct SystemOneError(ApiError);

impl<E: Into<ApiError>> From<E> for SystemOneError {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl IntoResponse for SystemOneError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Format::SystemOne)
    }
}
