//! The HTTP error answers, in the shape of each wire format.
//!
//! Handlers return `Result<_, ApiError>` (OpenAI's shape, which our own endpoints share) or
//! `Result<_, SystemOneError>`; `?` turns a parse, engine, model, filter, router or limit error
//! into the answer, so no handler spells out status codes or bodies. A full queue's `Retry-After`
//! is a setting the conversions cannot see: [`AppState::error`](crate::AppState::error) fills it
//! in, and [`blocking`](crate::limits::blocking), where every model call runs, applies it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use decide_chat::ParseError;
use decide_contract::DecisionError;
use decide_engine::EngineError;
use decide_filter::FilterError;
use decide_http::{openai, systemone, WireError};
use decide_router::RouterError;
use serde_json::json;

use crate::batcher::BatchedEngine;

/// The error shape an answer takes: each format has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `{"error": {"message", "type", "param", "code"}}`: OpenAI and our own endpoints.
    OpenAi,
    /// `{"error": {"type", "message", "field"}}`.
    SystemOne,
    /// text-embeddings-inference's `{"error", "error_type"}`, for `/embed` and `/rerank`.
    Tei,
}

impl Format {
    /// The format of the endpoint at `path`, for answers given before a handler runs.
    pub(crate) fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/systemone") {
            Self::SystemOne
        } else if path == "/embed" || path == "/rerank" {
            Self::Tei
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
    /// Every admission slot or the queue is full: a 503 whose `Retry-After` is these seconds,
    /// `None` until [`retry_after`](Self::retry_after) gives the server's.
    Overloaded(Option<u64>),
    Timeout(f64),
    Unprocessable(String),
    Internal(String),
}

impl ApiError {
    /// A 400 about `field`.
    pub(crate) fn bad(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadRequest(WireError::new(field, message))
    }

    /// This error with `secs` as its `Retry-After`, if it is an overload that has none yet.
    pub(crate) fn retry_after(self, secs: u64) -> Self {
        match self {
            Self::Overloaded(None) => Self::Overloaded(Some(secs)),
            other => other,
        }
    }

    /// text-embeddings-inference's name for the error (its `ErrorType`, plus `Unauthorized`,
    /// for which it has none).
    fn tei_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_) | Self::TooLarge(_) | Self::Unprocessable(_) | Self::NotJson => {
                "Validation"
            }
            Self::Unauthorized | Self::Forbidden(_) => "Unauthorized",
            Self::Overloaded(_) => "Overloaded",
            Self::Timeout(_) | Self::SlowBody(_) | Self::Internal(_) => "Backend",
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
            Format::Tei => json!({"error": message, "error_type": self.tei_type()}),
        };
        let mut response = (status, Json(body)).into_response();
        if let Self::Overloaded(secs) = self {
            // An overload that missed `retry_after` still tells the client to come back.
            let value = secs.and_then(|s| HeaderValue::from_str(&s.to_string()).ok());
            response.headers_mut().insert(
                header::RETRY_AFTER,
                value.unwrap_or(HeaderValue::from_static("1")),
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

/// A model error: the caller's mistake is a 400, a full queue a 503, anything else a 500.
impl From<DecisionError> for ApiError {
    fn from(error: DecisionError) -> Self {
        if BatchedEngine::is_overloaded(&error) {
            return Self::Overloaded(None);
        }
        match error {
            DecisionError::InvalidRequest(m) => Self::BadRequest(WireError::body(m)),
            DecisionError::UnsupportedFeature(m) => Self::Unprocessable(m),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// An engine error outside a decision: asking a model for what its head cannot do (embeddings
/// of a cross-encoder) is a 422, anything else a 500.
impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::WrongHead { .. } => Self::Unprocessable(error.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// A filter error: an option out of range is a 400 naming it, the model's error answers as
/// itself, anything else (the tools could not be listed) a 500.
impl From<FilterError> for ApiError {
    fn from(error: FilterError) -> Self {
        match error {
            FilterError::InvalidConfig { option, message } => Self::bad(option, message),
            FilterError::Decision(d) => d.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// A router error: an option out of range is a 400 naming it, the model's error answers as
/// itself, anything else (a route the routes do not have, say) a 500.
impl From<RouterError> for ApiError {
    fn from(error: RouterError) -> Self {
        match error {
            RouterError::InvalidConfig { option, message } => Self::bad(option, message),
            RouterError::Decision(d) => d.into(),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_as(Format::OpenAi)
    }
}

/// A wire format whose error shape a [`Shaped`] error takes.
pub(crate) trait Shape {
    /// The format.
    const FORMAT: Format;
}

/// System One's shape.
#[derive(Debug)]
pub(crate) struct SystemOneShape;

impl Shape for SystemOneShape {
    const FORMAT: Format = Format::SystemOne;
}

/// text-embeddings-inference's shape.
#[derive(Debug)]
pub(crate) struct TeiShape;

impl Shape for TeiShape {
    const FORMAT: Format = Format::Tei;
}

/// An [`ApiError`] answered in the shape of `S`'s format.
#[derive(Debug)]
pub(crate) struct Shaped<S>(ApiError, std::marker::PhantomData<S>);

impl<S, E: Into<ApiError>> From<E> for Shaped<S> {
    fn from(error: E) -> Self {
        Self(error.into(), std::marker::PhantomData)
    }
}

impl<S: Shape> IntoResponse for Shaped<S> {
    fn into_response(self) -> Response {
        self.0.into_response_as(S::FORMAT)
    }
}

/// An [`ApiError`] answered in System One's shape.
pub(crate) type SystemOneError = Shaped<SystemOneShape>;

/// An [`ApiError`] answered in text-embeddings-inference's shape.
pub(crate) type TeiError = Shaped<TeiShape>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Overloaded;

    fn full_queue() -> DecisionError {
        DecisionError::Model(Box::new(Overloaded))
    }

    #[test]
    fn a_full_queue_answers_503_with_the_retry_after_it_is_given() {
        for error in [
            ApiError::from(full_queue()),
            FilterError::Decision(full_queue()).into(),
            RouterError::Decision(full_queue()).into(),
        ] {
            let response = error.retry_after(7).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        }
        // Admission knows the setting itself: a later `retry_after` leaves it.
        let admitted = ApiError::Overloaded(Some(2)).retry_after(7).into_response();
        assert_eq!(admitted.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn config_errors_name_their_option_and_other_errors_are_the_servers() {
        let bad = ApiError::from(FilterError::InvalidConfig {
            option: "min_probability",
            message: "must be in [0, 1]".into(),
        });
        assert!(matches!(&bad, ApiError::BadRequest(e) if e.field == "min_probability"));
        let routed = ApiError::from(RouterError::NoProbabilities);
        assert!(matches!(routed, ApiError::Internal(_)));
        let invalid = ApiError::from(RouterError::Decision(DecisionError::InvalidRequest(
            "no messages".into(),
        )));
        assert!(matches!(invalid, ApiError::BadRequest(_)));
    }
}
