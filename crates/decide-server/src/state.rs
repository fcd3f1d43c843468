//! What every handler shares: the loaded model behind its queue, the reranker, the settings,
//! the metrics and the admission slots ([`AppState`]).
//!
//! Handlers ask it through methods, never through its fields, so that what is shared and how
//! (one `Arc`, a key kept only as its digest) can change without touching them.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use decide_engine::Engine;
use decide_http::{ApiKey, Limits};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api_error::ApiError;
use crate::batcher::{BatchConfig, BatchedEngine, Batcher};
use crate::{Metrics, ServerConfig, ServerError};

/// How long one forward call of bulk rows may take: a decision that arrives meanwhile waits
/// about this long for its turn.
const BULK_PASS: Duration = Duration::from_millis(50);

/// The bulk rows of one forward call and the bulk tokens the queue admits at once, from the
/// tokens a second this engine runs on this machine (one probe pass, timed at start): passes of
/// about [`BULK_PASS`], and at most what runs in half the request timeout, the other half left
/// to the decisions that go first. A probe that fails leaves the engine's own budget, unbounded.
fn bulk_budget(engine: &Engine, timeout: Duration) -> (usize, usize) {
    let texts: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "probe {i}: {}",
                "the quick brown fox jumps over the lazy dog ".repeat(6)
            )
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let rows = match engine.stage_embeddings(&refs) {
        Ok(staged) => staged.into_iter().map(|e| e.row).collect::<Vec<_>>(),
        Err(_) => match engine.stage_scores("probe", &refs) {
            Ok(mut staged) => staged.take_rows(),
            Err(_) => Vec::new(),
        },
    };
    let tokens: usize = rows.iter().map(|r| r.len()).sum();
    let started = Instant::now();
    let ran = !rows.is_empty() && engine.forward_rows(&rows).is_ok();
    let elapsed = started.elapsed().as_secs_f64();
    if !ran || elapsed <= 0.0 {
        return (engine.max_batch_tokens(), usize::MAX);
    }
    let per_second = tokens as f64 / elapsed;
    let pass = (per_second * BULK_PASS.as_secs_f64()) as usize;
    let admitted = per_second * timeout.as_secs_f64() / 2.0;
    (
        pass.clamp(
            256.min(engine.max_batch_tokens()),
            engine.max_batch_tokens(),
        ),
        admitted.min(usize::MAX as f64) as usize,
    )
}

/// The loaded model, its queue and the settings, shared by every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    model: BatchedEngine,
    /// The cross-encoder `/rerank` and `/v1/rerank` use, behind a queue of its own, when one
    /// is loaded; otherwise they take the model's cosines.
    reranker: Option<BatchedEngine>,
    metrics: Arc<Metrics>,
    config: ServerConfig,
    model_name: String,
    key: Option<ApiKey>,
    /// One per decision in flight: admission ([`limits::admit`](crate::limits::admit)) takes
    /// one or answers 503.
    permits: Arc<Semaphore>,
    /// The address [`serve`](crate::serve) listens on: its IP is an accepted `Host`.
    bound: OnceLock<SocketAddr>,
}

impl AppState {
    /// Starts the batching queue over `engine`.
    pub fn new(engine: Engine, config: ServerConfig) -> Result<Self, ServerError> {
        Self::with_reranker(engine, None, config)
    }

    /// Starts the batching queue over `engine`, and one over `reranker` (a cross-encoder for
    /// the rerank endpoints) when there is one.
    pub fn with_reranker(
        engine: Engine,
        reranker: Option<Engine>,
        config: ServerConfig,
    ) -> Result<Self, ServerError> {
        if config
            .api_key
            .as_deref()
            .is_some_and(|k| k.trim().is_empty())
        {
            // An empty key must not quietly mean "no authentication".
            return Err(ServerError::Config("the API key is empty".into()));
        }
        let metrics = Arc::new(Metrics::new());
        let queue = |engine: Engine| -> Result<BatchedEngine, ServerError> {
            let batcher = Batcher::start(
                engine.clone(),
                {
                    let (bulk_pass_tokens, max_bulk_tokens) =
                        bulk_budget(&engine, config.request_timeout);
                    BatchConfig {
                        max_batch_tokens: engine.max_batch_tokens(),
                        max_batch_requests: config.max_batch_requests,
                        queue_capacity: config.max_concurrent_requests,
                        bulk_pass_tokens,
                        max_bulk_tokens,
                    }
                },
                metrics.clone(),
            )?;
            Ok(BatchedEngine::new(engine, Arc::new(batcher)))
        };
        let reranker = reranker.map(&queue).transpose()?;
        Ok(Self {
            inner: Arc::new(Shared {
                model_name: engine.info().name.clone(),
                model: queue(engine)?,
                reranker,
                metrics,
                key: config.api_key.as_deref().map(ApiKey::new),
                permits: Arc::new(Semaphore::new(config.max_concurrent_requests.max(1))),
                bound: OnceLock::new(),
                config,
            }),
        })
    }

    /// The decision model every endpoint uses: the engine behind the queue.
    pub fn model(&self) -> &BatchedEngine {
        &self.inner.model
    }

    /// The metrics the server records.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The queue of the model that reranks: the cross-encoder when one is loaded, else the
    /// model.
    pub(crate) fn reranker(&self) -> &BatchedEngine {
        self.inner.reranker.as_ref().unwrap_or(&self.inner.model)
    }

    /// The settings the server was started with.
    pub(crate) fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Questions and options per request.
    pub(crate) fn limits(&self) -> Limits {
        self.inner.config.limits
    }

    /// The loaded model's name, as the answers report it.
    pub(crate) fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// The `Retry-After` of a 503, in seconds.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        self.inner.config.retry_after_secs
    }

    /// `error` as this server answers it: an overload gets the configured `Retry-After`, which
    /// the conversions into [`ApiError`] cannot know.
    pub(crate) fn error(&self, error: impl Into<ApiError>) -> ApiError {
        error.into().retry_after(self.retry_after_secs())
    }

    /// A slot for one decision, or `None` when every slot is taken.
    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.permits.clone().try_acquire_owned().ok()
    }

    /// Whether a request whose `Authorization` header is `authorization` may pass: always
    /// without a configured key.
    pub(crate) fn key_accepted(&self, authorization: Option<&str>) -> bool {
        self.inner
            .key
            .as_ref()
            .is_none_or(|key| key.accepts(authorization))
    }

    /// The address the server listens on, once [`serve`](crate::serve) has bound it.
    pub(crate) fn bound(&self) -> Option<SocketAddr> {
        self.inner.bound.get().copied()
    }

    /// Records the address the server listens on; the first one set stays.
    pub(crate) fn set_bound(&self, address: SocketAddr) {
        let _ = self.inner.bound.set(address);
    }
}
