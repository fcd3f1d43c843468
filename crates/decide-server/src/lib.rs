//! `decide serve`: a local decision server that existing clients use unchanged.
//!
//! LangChain4j, Spring AI, pydecide and LangChain already talk to decision models over HTTP,
//! in the OpenAI Decisions format or TypeSafe's System One format. This crate serves both over
//! the local engine, so those clients decide locally by changing one base URL, and many agents
//! on one machine share one loaded model:
//!
//! | endpoint | what |
//! |---|---|
//! | `POST /v1/decisions` | the OpenAI Decisions API ([`decide_http::openai`]) |
//! | `POST /v1/systemone` | the System One API ([`decide_http::systemone`]) |
//! | `POST /v1/select` | which tools a conversation needs (`decide select --json`) |
//! | `POST /v1/route` | which route a conversation takes (`decide route --json`) |
//! | `POST /v1/embeddings` | OpenAI embeddings of the loaded bi-encoder |
//! | `POST /embed` | text-embeddings-inference's embeddings |
//! | `POST /rerank` | text-embeddings-inference's rerank |
//! | `POST /v1/rerank`, `/v2/rerank` | Cohere's (and Jina's) rerank |
//! | `GET /` | the playground page |
//! | `POST /v1/tool_search` | the providers' client-executed tool search, answered in their shape |
//! | `GET /v1/models` | the loaded model |
//! | `GET /health` | liveness, open without an API key |
//! | `GET /metrics` | Prometheus text: requests, latency, batch sizes, queue depth |
//!
//! ## Batching across requests
//!
//! Every decision goes through one queue ([`Batcher`]), the design of
//! text-embeddings-inference's: a request is tokenized on the caller's side
//! ([`Engine::stage_decision`](decide_engine::Engine::stage_decision)), its rows join a
//! bounded FIFO, and one inference thread pops as many requests as fit the engine's token
//! budget (padded cost: rows × longest row) into one
//! [`forward_rows`](decide_engine::Engine::forward_rows) call, then hands every request its own
//! outputs back. Identical rows in one batch (many agents sending the same tool list) run
//! once. Throughput grows with concurrency instead of latency; with batching off
//! (`max_batch_requests = 1`) the same queue runs one request per call, which is what the
//! load test compares against. Because the engine's own one-request path is the same three
//! steps, a batched answer equals the embedded engine's.
//!
//! The filter and the router of `/v1/select` and `/v1/route` ask the same queue: the model
//! they see is a [`BatchedEngine`], a [`DecisionModel`](decide_contract::DecisionModel) whose
//! calls go through the batcher.
//!
//! ## Limits
//!
//! * Admission: at most `max_concurrent_requests` decisions in flight; past that, `503` with
//!   `Retry-After` at once, never an unbounded pile-up.
//! * A body larger than `max_body_bytes` gets `413`; questions per request and options per
//!   question are bounded ([`Limits`]).
//! * Each request has a deadline (`504` past it); a request whose client gave up is dropped
//!   from the queue before it costs a forward pass.
//! * Every malformed body gets a `400` naming the field, in the error shape of the format it
//!   came in (`{"error": {"message", "type", "param", "code"}}` for OpenAI and our own
//!   endpoints, `{"error": {"type", "message", "field"}}` for System One, `{"error",
//!   "error_type"}` for text-embeddings-inference's `/embed` and `/rerank`). An object that
//!   names a key twice is a `400` too, naming the key and its line and column.
//! * With an API key, every endpoint but `/health` and the playground page needs
//!   `Authorization: Bearer KEY`; keys are compared in constant time (over their SHA-256, so
//!   the length does not leak either).
//! * The request input is never logged: only endpoint, status and latency are.
//!
//! [`serve`] runs the router until a shutdown future completes, then finishes the requests in
//! flight (graceful shutdown); `decide serve` passes SIGTERM and Ctrl-C.
#![deny(missing_docs)]

mod api_error;
mod batcher;
mod decisions;
mod embeddings;
mod error;
mod guard;
mod limits;
mod metrics;
mod playground;
mod rerank;
mod state;
mod status;
mod tasks;
mod tool_search;

use std::future::Future;
use std::time::Duration;

pub use batcher::{BatchConfig, BatchedEngine, Batcher, Lane, Overloaded, Pending};
pub use decide_http::Limits;
pub use error::ServerError;
pub use metrics::Metrics;
pub use state::AppState;
use tokio::net::TcpListener;

/// How the server behaves; every field has a default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// When set, requests need `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// The largest request body, in bytes (default 2 MiB, as text-embeddings-inference).
    pub max_body_bytes: usize,
    /// Decisions in flight at once, queued ones included; past it, 503 (default 512).
    pub max_concurrent_requests: usize,
    /// How long a request may take before it is answered with 504 (default 30 s).
    pub request_timeout: Duration,
    /// The `Retry-After` of a 503, in seconds (default 1).
    pub retry_after_secs: u64,
    /// Questions and options per request.
    pub limits: Limits,
    /// Requests per forward pass; 1 turns cross-request batching off (default 64).
    pub max_batch_requests: usize,
    /// Host names (without port) accepted in the `Host` header besides the bound address and
    /// the loopback names; `*` accepts any. Refusing other names stops DNS rebinding: a web
    /// page whose name resolves to this machine cannot reach the server.
    pub allowed_hosts: Vec<String>,
    /// Web origins (`https://app.example`) whose pages may call the server (CORS); `*`
    /// allows any. A request from any other page's origin gets `403`.
    pub allowed_origins: Vec<String>,
    /// How long a client may take to send a request's headers, and then its body; an idle
    /// keep-alive connection is closed after it too (default 10 s).
    pub read_timeout: Duration,
    /// Open connections at once; past it, new ones wait in the kernel's backlog (default 1024).
    pub max_connections: usize,
    /// After the shutdown signal, how long requests in flight may take before their
    /// connections are dropped (default 10 s).
    pub shutdown_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 2 * 1024 * 1024,
            max_concurrent_requests: 512,
            request_timeout: Duration::from_secs(30),
            retry_after_secs: 1,
            limits: Limits::default(),
            max_batch_requests: 64,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// The router of every endpoint, with the body limit and the checks of the `guard` module (host,
/// origin and CORS, content type, API key) around every route.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .merge(decisions::router())
        .merge(tasks::router())
        .merge(tool_search::router())
        .merge(status::router())
        .merge(embeddings::router())
        .merge(rerank::router())
        .merge(playground::router())
        .layer(limits::body_limit(&state))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` completes, then lets the requests in
/// flight finish for up to `shutdown_timeout` and drops the connections still open.
///
/// Each connection must send a request's headers within `read_timeout` (an idle keep-alive
/// connection is closed after it too), and at most `max_connections` are served at once: idle
/// or half-sent connections cannot exhaust the server or hold its shutdown. While it drains,
/// every answer carries `Connection: close`. The loop is [`decide_http::server::serve`], which
/// `decide mcp --http` runs too.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    state.set_bound(listener.local_addr().map_err(ServerError::Io)?);
    let config = state.config().clone();
    let limits = decide_http::server::ConnectionLimits {
        read_timeout: config.read_timeout,
        max_connections: config.max_connections,
        shutdown_timeout: config.shutdown_timeout,
    };
    decide_http::server::serve(listener, router(state), limits, shutdown)
        .await
        .map_err(ServerError::Io)
}
