//! The checks around every request, whatever its route: the `Host` (DNS rebinding), the web
//! origin (cross-site requests) and CORS, the JSON content type of a POST, the API key; and the
//! metrics.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

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

/// The host name of a `Host` header or an origin's authority, lower case, without the port.
fn host_name(authority: &str) -> Option<String> {
    let authority: axum::http::uri::Authority = authority.parse().ok()?;
    Some(authority.host().to_ascii_lowercase())
}

/// Whether the request's `Host` names this server: a configured name, a loopback name or the
/// bound IP. A request without one does not come from a browser (browsers always send it).
fn host_allowed(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Some(name) = host.to_str().ok().and_then(host_name) else {
        return false;
    };
    let config = state.config();
    if config
        .allowed_hosts
        .iter()
        .any(|h| h == "*" || h.eq_ignore_ascii_case(&name))
    {
        return true;
    }
    // A rebinding page uses its own name, never these: they are safe whatever the bind.
    if matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]") {
        return true;
    }
    state.bound().is_some_and(|addr| {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        };
        !addr.ip().is_unspecified() && ip == name
    })
}

/// What a request's `Origin` (sent by browsers on cross-site and POST requests) allows.
enum Origin {
    /// No origin (not a browser), or the server's own origin.
    Same,
    /// An origin configured with `allowed_origins`: answered with CORS headers.
    Allowed(HeaderValue),
    /// Any other web page.
    Refused(String),
}

fn origin(state: &AppState, headers: &HeaderMap) -> Origin {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Origin::Same;
    };
    let text = value.to_str().unwrap_or_default();
    let allowed = &state.config().allowed_origins;
    if allowed
        .iter()
        .any(|o| o == "*" || o.trim_end_matches('/').eq_ignore_ascii_case(text))
    {
        return Origin::Allowed(value.clone());
    }
    let own = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let theirs = text.split_once("://").map(|(_, authority)| authority);
    match (own, theirs) {
        (Some(own), Some(theirs)) if own.eq_ignore_ascii_case(theirs) => Origin::Same,
        _ => Origin::Refused(format!(
            "requests from the web origin {text:?} are not allowed (see --allowed-origins)"
        )),
    }
}

/// Whether a body is declared as JSON (`application/json`, parameters allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The `Authorization` header's value, when it is text.
fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()
}

/// The answer to a CORS preflight from an allowed origin.
fn preflight(origin: HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    response
}

/// Why [`check`] answers a request itself.
enum Stop {
    /// A refusal.
    Refused(ApiError),
    /// A CORS preflight of an allowed origin.
    Preflight(HeaderValue),
}

/// The checks every request passes, in order: `Host`, origin (and CORS preflights), content
/// type, API key; `Ok` carries the origin to answer with CORS headers.
fn check(state: &AppState, request: &Request) -> Result<Option<HeaderValue>, Stop> {
    let refuse = |e: ApiError| Err(Stop::Refused(e));
    let headers = request.headers();
    if !host_allowed(state, headers) {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        return refuse(ApiError::Forbidden(format!(
            "the host {host:?} is not this server's (see --allowed-hosts)"
        )));
    }
    let cors = match origin(state, headers) {
        Origin::Same => None,
        Origin::Allowed(origin) => Some(origin),
        Origin::Refused(message) => return refuse(ApiError::Forbidden(message)),
    };
    if request.method() == Method::OPTIONS {
        return match cors {
            Some(origin) if headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) => {
                Err(Stop::Preflight(origin))
            }
            _ => refuse(ApiError::Forbidden("no CORS for this origin".into())),
        };
    }
    // A web page can send a text/plain or form body to any address without a preflight;
    // only JSON, which needs one, is accepted.
    if request.method() == Method::POST && !is_json(headers) {
        return refuse(ApiError::NotJson);
    }
    let open = request.uri().path() == "/health" || playground::is_public(request.uri().path());
    if !open && !state.key_accepted(authorization(headers)) {
        return refuse(ApiError::Unauthorized);
    }
    Ok(cors)
}

/// Runs [`check`] (host, origin, content type, API key; `/health` needs no key) and records the
/// endpoint, status and latency: never the body.
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
    let path = path.to_owned();
    let response = match check(&state, &request) {
        Ok(cors) => {
            let mut response = next.run(request).await;
            if let Some(origin) = cors {
                let headers = response.headers_mut();
                headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                headers.insert(header::VARY, HeaderValue::from_static("Origin"));
            }
            response
        }
        Err(Stop::Preflight(origin)) => preflight(origin),
        Err(Stop::Refused(e)) => e.into_response_as(Format::of_path(&path)),
    };
    let status = response.status().as_u16();
    state
        .metrics()
        .observe_request(endpoint, status, started.elapsed());
    tracing::debug!(
        endpoint,
        status,
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
