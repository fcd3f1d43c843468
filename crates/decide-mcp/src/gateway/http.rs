//! `decide mcp --http`: the gateway over the MCP Streamable HTTP transport at `/mcp`, one session per client
//! (`Mcp-Session-Id`), behind the checks `decide serve` makes and the ones the transport's specification asks for.
//!
//! rmcp's service speaks the transport; in front of it, every request passes, in order:
//!
//! 1. **Host and Origin** ([`decide_http::guard`], as `decide serve`): a web page must not reach a server on this
//!    machine by a name of its own that resolves here (DNS rebinding), nor call it from its own origin, `null`
//!    included: `403`. Allowed origins get CORS headers.
//! 2. **The API key**, when one is set: `401`.
//! 3. **The message** of a POST: `Accept` naming JSON and event streams (`406`), a JSON body (`415`), at most
//!    [`MAX_MESSAGE_BYTES`] (`413`) sent within the read timeout (`408`), valid JSON naming each key once (`400`,
//!    parse error `-32700`), one JSON-RPC message with a string or integer `id` (`400`, invalid request `-32600`;
//!    batches are not supported).
//! 4. **The session**: an unknown `Mcp-Session-Id` is `404` (POST, GET and DELETE alike); an `initialize` past
//!    [`HttpOptions::max_sessions`] is `503`. A session that has had no message for
//!    [`HttpOptions::session_idle_timeout`] ends, and its state goes with it.
//!
//! Every refusal is a JSON-RPC error object, with the request's `id` once it is known. The connections are
//! [`decide_http::server::serve`]'s: read timeouts, a connection cap and a shutdown deadline; at the shutdown signal
//! open event streams (`GET`) end, so that they do not hold the shutdown until its deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use decide_http::guard::Origin;
use decide_http::server::ConnectionLimits;
use decide_http::ApiKey;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};

use super::Gateway;
use crate::MAX_MESSAGE_BYTES;

/// How `decide mcp --http` serves; every field has a default.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// When set, every request needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Host names (without port) accepted in the `Host` header besides the bound address and the loopback names;
    /// `*` accepts any. On loopback the `Host` is always checked; on another address only when this names some,
    /// since the names other machines reach it by are not known here (the API key guards it there).
    pub allowed_hosts: Vec<String>,
    /// Web origins (`https://app.example`) whose pages may call the gateway (CORS); `*` allows any. A request
    /// from any other page's origin gets `403`.
    pub allowed_origins: Vec<String>,
    /// Client sessions held at once; an `initialize` past it gets `503` (default 1,000).
    pub max_sessions: usize,
    /// A session with no message for this long ends and its state is dropped (default 5 minutes).
    pub session_idle_timeout: Duration,
    /// Read timeout, connection cap and shutdown deadline (the defaults of `decide serve`).
    pub connections: ConnectionLimits,
}

/// The default of [`HttpOptions::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// The default of [`HttpOptions::session_idle_timeout`].
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            api_key: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
            connections: ConnectionLimits::default(),
        }
    }
}

/// JSON-RPC's code of a body that is not JSON.
const PARSE_ERROR: i32 = -32700;
/// JSON-RPC's code of JSON that is not a valid request.
const INVALID_REQUEST: i32 = -32600;
/// The code the reference SDKs answer a refusal of the transport with (a wrong header, too many sessions).
const SERVER_ERROR: i32 = -32000;
/// The code the reference SDKs answer an unknown session with.
const SESSION_NOT_FOUND: i32 = -32001;

const SESSION_ID: &str = "mcp-session-id";

/// Serves the gateway over streamable HTTP at `/mcp` on `listener` until `shutdown` completes; then open event
/// streams end, the requests in flight get up to the shutdown deadline, and every session ends.
pub async fn serve_http(
    gateway: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    options: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(options.session_idle_timeout);
    let sessions = Arc::new(sessions);
    // The Host and Origin checks are the front's, so that `--allowed-hosts` means what it means for `decide serve`.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_MESSAGE_BYTES);
    let end_sessions = config.cancellation_token.clone();
    let service =
        StreamableHttpService::new(move || Ok(gateway.session()), Arc::clone(&sessions), config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let front = Arc::new(Front {
        key: options.api_key.as_deref().map(ApiKey::new),
        check_host: bound.ip().is_loopback() || !options.allowed_hosts.is_empty(),
        allowed_hosts: options.allowed_hosts,
        allowed_origins: options.allowed_origins,
        bound,
        sessions,
        max_sessions: options.max_sessions,
        initializing: tokio::sync::Mutex::new(()),
        read_timeout: options.connections.read_timeout,
        stop: stop_rx,
    });
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(front, front_door));
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let served = decide_http::server::serve(listener, router, options.connections, shutdown).await;
    // The session workers stop, and each session's state is dropped with its worker.
    end_sessions.cancel();
    served.map_err(|e| e.to_string())
}

/// What the checks in front of the transport need.
struct Front {
    key: Option<ApiKey>,
    /// Whether the `Host` is checked: always on loopback, elsewhere only against names given.
    check_host: bool,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    bound: SocketAddr,
    sessions: Arc<LocalSessionManager>,
    max_sessions: usize,
    /// Held from the count of the sessions until the new one is in it, so that concurrent `initialize`s cannot
    /// pass the cap together.
    initializing: tokio::sync::Mutex<()>,
    read_timeout: Duration,
    /// Becomes true at the shutdown signal.
    stop: tokio::sync::watch::Receiver<bool>,
}

/// A JSON-RPC error object as the answer, with `status`.
fn refusal(
    status: StatusCode,
    id: Option<&Value>,
    code: i32,
    message: impl Into<String>,
) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": code, "message": message.into()},
    });
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// Whether `Accept` names `media` (parameters and weights aside).
fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|entry| entry.split(';').next())
        .any(|essence| essence.trim().eq_ignore_ascii_case(media))
}

/// A JSON value's kind, for errors.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number with a fraction or out of range",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks that a body is one JSON-RPC message as the transport reads it; its `id` (when it has a valid one), or
/// the refusal with the `id` when it is known.
fn envelope(value: &Value) -> Result<Option<&Value>, (Option<&Value>, String)> {
    let message = match value {
        Value::Object(message) => message,
        Value::Array(_) => {
            return Err((
                None,
                "Invalid Request: batches (JSON arrays) are not supported; send one message per request".into(),
            ))
        }
        other => {
            return Err((
                None,
                format!("Invalid Request: expected a JSON-RPC message (an object), got {}", kind(other)),
            ))
        }
    };
    let id = match message.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id),
        Some(id @ Value::Number(n)) if n.is_i64() => Some(id),
        Some(other) => {
            return Err((
                None,
                format!(
                    "Invalid Request: id: expected a string or an integer, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, "Invalid Request: jsonrpc: expected \"2.0\"".into()));
    }
    if message.get("method").is_some_and(|m| !m.is_string()) {
        return Err((id, "Invalid Request: method: expected a string".into()));
    }
    Ok(id)
}

/// The checks before the transport (see the module's documentation), then the transport.
async fn front_door(State(front): State<Arc<Front>>, request: Request, next: Next) -> Response {
    let cors = match front.check(&request) {
        Ok(cors) => cors,
        Err(refused) => return *refused,
    };
    let mut response = match *request.method() {
        Method::POST => front.post(request, next).await,
        Method::GET => front.get(request, next).await,
        Method::DELETE => front.delete(request, next).await,
        _ => next.run(request).await,
    };
    if let Some(origin) = cors {
        let headers = response.headers_mut();
        for (name, value) in decide_http::guard::cors_headers(origin) {
            headers.insert(name, value);
        }
        // A page's script reads the session's id from the answer to `initialize`.
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(SESSION_ID),
        );
    }
    response
}

impl Front {
    /// Host, origin (and CORS preflights), API key; `Ok` carries the origin to answer with CORS headers, `Err` the
    /// answer that stops the request (boxed: a response is large, and most requests pass).
    fn check(&self, request: &Request) -> Result<Option<HeaderValue>, Box<Response>> {
        let headers = request.headers();
        let forbidden =
            |message: String| Box::new(refusal(StatusCode::FORBIDDEN, None, SERVER_ERROR, message));
        if self.check_host {
            decide_http::guard::check_host(headers, &self.allowed_hosts, Some(self.bound))
                .map_err(forbidden)?;
        }
        let cors = match decide_http::guard::origin(headers, &self.allowed_origins) {
            Origin::Same => None,
            Origin::Allowed(origin) => Some(origin),
            Origin::Refused(message) => return Err(forbidden(message)),
        };
        if request.method() == Method::OPTIONS {
            return Err(match cors {
                Some(origin) if headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) => {
                    let mut response = StatusCode::NO_CONTENT.into_response();
                    response
                        .headers_mut()
                        .extend(decide_http::guard::preflight_headers(
                            origin,
                            "GET, POST, DELETE",
                            "authorization, content-type, accept, last-event-id, mcp-session-id, \
                         mcp-protocol-version, mcp-method, mcp-name",
                        ));
                    Box::new(response)
                }
                _ => forbidden("no CORS for this origin".into()),
            });
        }
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if self
            .key
            .as_ref()
            .is_some_and(|key| !key.accepts(authorization))
        {
            let mut response = refusal(
                StatusCode::UNAUTHORIZED,
                None,
                SERVER_ERROR,
                "missing or wrong API key (Authorization: Bearer KEY)",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Err(Box::new(response));
        }
        Ok(cors)
    }

    /// Whether the request names a session, and whether that session is held: `Some(false)` for one unknown,
    /// ended or forged.
    async fn session_known(&self, headers: &HeaderMap) -> Option<bool> {
        let id = headers.get(SESSION_ID)?;
        let Ok(id) = id.to_str() else {
            return Some(false);
        };
        Some(self.sessions.sessions.read().await.contains_key(id))
    }

    fn session_not_found(id: Option<&Value>) -> Response {
        refusal(
            StatusCode::NOT_FOUND,
            id,
            SESSION_NOT_FOUND,
            "Session not found: it ended (deleted, idle too long, or the server restarted) or never was; \
             initialize a new one",
        )
    }

    async fn post(&self, request: Request, next: Next) -> Response {
        let (parts, body) = request.into_parts();
        if !(accepts(&parts.headers, "application/json")
            && accepts(&parts.headers, "text/event-stream"))
        {
            return refusal(
                StatusCode::NOT_ACCEPTABLE,
                None,
                SERVER_ERROR,
                "Not Acceptable: the client must accept both application/json and text/event-stream",
            );
        }
        if !decide_http::guard::is_json(&parts.headers) {
            return refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                None,
                SERVER_ERROR,
                "Unsupported Media Type: the body must be application/json",
            );
        }
        let too_large = || {
            refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                SERVER_ERROR,
                format!(
                    "the message is over the limit of {} MiB ({MAX_MESSAGE_BYTES} bytes)",
                    MAX_MESSAGE_BYTES >> 20
                ),
            )
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_MESSAGE_BYTES as u64) {
            return too_large();
        }
        let bytes = match tokio::time::timeout(
            self.read_timeout,
            axum::body::to_bytes(body, MAX_MESSAGE_BYTES),
        )
        .await
        {
            Err(_) => {
                return refusal(
                    StatusCode::REQUEST_TIMEOUT,
                    None,
                    SERVER_ERROR,
                    format!(
                        "the request body did not arrive within {} s",
                        self.read_timeout.as_secs_f64()
                    ),
                )
            }
            Ok(Err(error)) => {
                if error.into_inner().is::<http_body_util::LengthLimitError>() {
                    return too_large();
                }
                return refusal(
                    StatusCode::BAD_REQUEST,
                    None,
                    SERVER_ERROR,
                    "the request body could not be read",
                );
            }
            Ok(Ok(bytes)) => bytes,
        };
        let value: Value = match decide_http::unique_keys::from_slice(&bytes) {
            Ok(value) => value,
            Err(error) => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    None,
                    PARSE_ERROR,
                    format!("Parse error: {error}"),
                )
            }
        };
        let id = match envelope(&value) {
            Ok(id) => id,
            Err((id, message)) => {
                return refusal(StatusCode::BAD_REQUEST, id, INVALID_REQUEST, message)
            }
        };
        // What passes here the transport reads the same way: it would answer anything else with 415.
        if let Err(error) = serde_json::from_slice::<ClientJsonRpcMessage>(&bytes) {
            return refusal(
                StatusCode::BAD_REQUEST,
                id,
                INVALID_REQUEST,
                format!("Invalid Request: {error}"),
            );
        }
        let initialize =
            id.is_some() && value.get("method").and_then(Value::as_str) == Some("initialize");
        match self.session_known(&parts.headers).await {
            Some(false) => return Self::session_not_found(id),
            Some(true) => {}
            None if initialize => {
                let _one_at_a_time = self.initializing.lock().await;
                if self.sessions.sessions.read().await.len() >= self.max_sessions {
                    let mut response = refusal(
                        StatusCode::SERVICE_UNAVAILABLE,
                        id,
                        SERVER_ERROR,
                        format!(
                            "too many sessions: {} are open (see --max-sessions); try again once one has ended",
                            self.max_sessions
                        ),
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return response;
                }
                return next
                    .run(Request::from_parts(parts, Body::from(bytes)))
                    .await;
            }
            None => {}
        }
        next.run(Request::from_parts(parts, Body::from(bytes)))
            .await
    }

    async fn get(&self, request: Request, next: Next) -> Response {
        if !accepts(request.headers(), "text/event-stream") {
            return refusal(
                StatusCode::NOT_ACCEPTABLE,
                None,
                SERVER_ERROR,
                "Not Acceptable: the client must accept text/event-stream",
            );
        }
        if self.session_known(request.headers()).await == Some(false) {
            return Self::session_not_found(None);
        }
        let response = next.run(request).await;
        let mut stop = self.stop.clone();
        let stop: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        });
        response.map(|body| Body::new(UntilStop { body, stop }))
    }

    async fn delete(&self, request: Request, next: Next) -> Response {
        // The transport answers 202 to any id: a client must learn that its session is not there.
        if self.session_known(request.headers()).await == Some(false) {
            return Self::session_not_found(None);
        }
        next.run(request).await
    }
}

/// An event stream that ends at the shutdown signal: a client's open stream would otherwise hold the shutdown
/// until its deadline.
struct UntilStop {
    body: Body,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl HttpBody for UntilStop {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if self.stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_json_rpc_object_with_a_string_or_integer_id() {
        let refused = |text: &str| {
            let value: Value = serde_json::from_str(text).unwrap();
            envelope(&value).map(|id| id.cloned()).unwrap_err().1
        };
        assert!(refused(r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#).contains("batches"));
        assert!(refused(r#""ping""#).contains("got a string"));
        for id in ["1.5", "null", "true", "{}", "18446744073709551615"] {
            let text = format!(r#"{{"jsonrpc": "2.0", "id": {id}, "method": "ping"}}"#);
            assert!(
                refused(&text).starts_with("Invalid Request: id: expected a string or an integer"),
                "{id}"
            );
        }
        assert!(refused(r#"{"jsonrpc": "1.0", "id": 1, "method": "ping"}"#).contains("jsonrpc"));
        assert!(refused(r#"{"jsonrpc": "2.0", "id": 1, "method": 7}"#).contains("method"));
        let fine: Value =
            serde_json::from_str(r#"{"jsonrpc": "2.0", "id": "a", "method": "ping"}"#).unwrap();
        assert_eq!(envelope(&fine).unwrap(), Some(&json!("a")));
        let notification: Value =
            serde_json::from_str(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#)
                .unwrap();
        assert_eq!(envelope(&notification).unwrap(), None);
    }

    #[test]
    fn accept_is_read_by_media_type() {
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
            headers
        };
        let both = headers("application/json;q=0.9, Text/Event-Stream");
        assert!(accepts(&both, "application/json") && accepts(&both, "text/event-stream"));
        assert!(!accepts(&headers("text/html"), "application/json"));
        assert!(!accepts(&HeaderMap::new(), "application/json"));
    }
}
