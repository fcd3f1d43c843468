//! The checks around every request, whatever its route: the `Host` (DNS rebinding), the web
//! origin (cross-site requests) and CORS, the JSON content type of a POST, the API key; and the
//! metrics. The host and origin rules are [`decide_http::guard`]'s, which `decide mcp --http`
//! applies too.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use decide_http::guard::Origin;

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

/// The `Authorization` header's value, when it is text.
fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()
}

/// The answer to a CORS preflight from an allowed origin.
fn preflight(origin: HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .extend(decide_http::guard::preflight_headers(
            origin,
            "GET, POST",
            "authorization, content-type",
        ));
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
    let config = state.config();
    if let Err(message) =
        decide_http::guard::check_host(headers, &config.allowed_hosts, state.bound())
    {
        return refuse(ApiError::Forbidden(message));
    }
    let cors = match decide_http::guard::origin(headers, &config.allowed_origins) {
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
    if request.method() == Method::POST && !decide_http::guard::is_json(headers) {
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
                for (name, value) in decide_http::guard::cors_headers(origin) {
                    headers.insert(name, value);
                }
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
