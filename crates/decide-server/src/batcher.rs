//! The cross-request batching queue and the decision model that goes through it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use decide_contract::{
    DecisionError, DecisionFuture, DecisionModel, DecisionRequest, DecisionRequestParameters,
    DecisionResponse,
};
use decide_engine::{EncodedRow, Engine};
use tokio::sync::oneshot;

use crate::error::ServerError;
use crate::metrics::Metrics;

/// How the queue forms batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The padded token budget of one forward call (rows × longest row); a request larger than
    /// the budget runs alone (the engine splits it further).
    pub max_batch_tokens: usize,
    /// Requests per forward call; 1 turns cross-request batching off.
    pub max_batch_requests: usize,
    /// Requests that may wait; past it, [`Overloaded`].
    pub queue_capacity: usize,
}

/// The queue is full: answer 503 and let the client retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server is at its limit of queued decisions; retry later")]
pub struct Overloaded;

/// One output vector per row, or the forward pass's error.
type Outputs = Result<Vec<Vec<f32>>, String>;
type Reply = oneshot::Sender<Outputs>;

/// Where a queued request's outputs arrive.
pub type Pending = oneshot::Receiver<Outputs>;

struct Job {
    rows: Vec<EncodedRow>,
    longest: usize,
    reply: Reply,
}

/// A bounded FIFO of requests' rows and the one thread that runs them through the model.
///
/// The thread takes the oldest request, then as many of the following ones as fit the token
/// budget (counted as a padded batch: rows × longest row, as text-embeddings-inference's queue
/// counts padded models) and `max_batch_requests`, runs all their rows in one
/// [`Engine::forward_rows`] call and sends each request its own outputs. A request whose
/// caller is gone (deadline passed, client disconnected) is skipped before it costs anything.
pub struct Batcher {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the inference thread; it ends when the batcher is dropped.
    pub fn start(
        engine: Engine,
        config: BatchConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        let (tx, rx) = mpsc::sync_channel(config.queue_capacity.max(1));
        let worker_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("decide-batcher".into())
            .spawn(move || run(engine, config, rx, worker_metrics))
            .map_err(ServerError::Thread)?;
        Ok(Self { tx, metrics })
    }

    /// Queues one request's rows; the receiver gets one output per row, in order.
    pub fn submit(&self, rows: Vec<EncodedRow>) -> Result<Pending, Overloaded> {
        let (reply, rx) = oneshot::channel();
        if rows.is_empty() {
            // Nothing to run (every embedding was cached): answer without queueing.
            let _ = reply.send(Ok(Vec::new()));
            return Ok(rx);
        }
        let longest = rows.iter().map(EncodedRow::len).max().unwrap_or(0);
        let depth = self.metrics.queue_depth();
        depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Job {
            rows,
            longest,
            reply,
        }) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                depth.fetch_sub(1, Ordering::Relaxed);
                self.metrics.observe_rejected();
                Err(Overloaded)
            }
        }
    }
}

fn run(engine: Engine, config: BatchConfig, rx: Receiver<Job>, metrics: Arc<Metrics>) {
    let depth = metrics.queue_depth();
    let max_requests = config.max_batch_requests.max(1);
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => {
                    depth.fetch_sub(1, Ordering::Relaxed);
                    job
                }
                Err(_) => return,
            },
        };
        if first.reply.is_closed() {
            continue;
        }
        let mut rows = first.rows.len();
        let mut longest = first.longest;
        let mut jobs = vec![first];
        while jobs.len() < max_requests {
            let Ok(job) = rx.try_recv() else { break };
            depth.fetch_sub(1, Ordering::Relaxed);
            if job.reply.is_closed() {
                continue;
            }
            let new_longest = longest.max(job.longest);
            if (rows + job.rows.len()) * new_longest > config.max_batch_tokens {
                carried = Some(job);
                break;
            }
            rows += job.rows.len();
            longest = new_longest;
            jobs.push(job);
        }
        run_batch(&engine, jobs, &metrics);
    }
}

/// Runs the rows of `jobs` in one forward call, each distinct row once, and answers each job.
fn run_batch(engine: &Engine, jobs: Vec<Job>, metrics: &Metrics) {
    let mut unique: Vec<EncodedRow> = Vec::new();
    let mut slots: HashMap<EncodedRow, usize> = HashMap::new();
    let mut index: Vec<Vec<usize>> = Vec::with_capacity(jobs.len());
    let mut total = 0;
    for job in &jobs {
        total += job.rows.len();
        index.push(
            job.rows
                .iter()
                .map(|row| {
                    *slots.entry(row.clone()).or_insert_with(|| {
                        unique.push(row.clone());
                        unique.len() - 1
                    })
                })
                .collect(),
        );
    }
    metrics.observe_batch(jobs.len(), unique.len(), total - unique.len());
    match engine.forward_rows(&unique) {
        Ok(outputs) => {
            for (job, idx) in jobs.into_iter().zip(index) {
                let mine = idx.iter().map(|&i| outputs[i].clone()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            let message = e.to_string();
            for job in jobs {
                let _ = job.reply.send(Err(message.clone()));
            }
        }
    }
}

/// The engine behind the queue, as a [`DecisionModel`]: a request is staged (tokenized) on
/// the caller's thread, its rows wait in the [`Batcher`] with other requests' rows, and the
/// outputs are turned into answers on the caller's side again. Answers equal the engine's own.
///
/// Both paths work: [`decide`](DecisionModel::decide) blocks its thread on the queue (the
/// filter and the router of `/v1/select` and `/v1/route` run on tokio's blocking pool), and
/// [`decide_async`](DecisionModel::decide_async) awaits it. A full queue fails the call with a
/// [`DecisionError::Model`] wrapping [`Overloaded`].
#[derive(Clone)]
pub struct BatchedEngine {
    engine: Engine,
    batcher: Arc<Batcher>,
}

impl std::fmt::Debug for BatchedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedEngine")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

fn queue_error(message: String) -> DecisionError {
    DecisionError::model(message)
}

impl BatchedEngine {
    /// The engine behind `batcher`.
    pub fn new(engine: Engine, batcher: Arc<Batcher>) -> Self {
        Self { engine, batcher }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs `rows` through the model in the queue, with other requests' rows: one output per
    /// row, in order. A full queue fails with a [`DecisionError::Model`] wrapping [`Overloaded`].
    pub async fn forward(&self, rows: Vec<EncodedRow>) -> Result<Vec<Vec<f32>>, DecisionError> {
        let rx = self
            .batcher
            .submit(rows)
            .map_err(DecisionError::from_model_error)?;
        rx.await
            .map_err(|_| queue_error("the inference thread stopped".into()))?
            .map_err(queue_error)
    }

    /// Whether `error` says the queue was full.
    pub fn is_overloaded(error: &DecisionError) -> bool {
        matches!(error, DecisionError::Model(e) if e.downcast_ref::<Overloaded>().is_some())
    }
}

impl DecisionModel for BatchedEngine {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        let mut staged = self.engine.stage_decision(request)?;
        let rx = self
            .batcher
            .submit(staged.take_rows())
            .map_err(DecisionError::from_model_error)?;
        let outputs = rx
            .blocking_recv()
            .map_err(|_| queue_error("the inference thread stopped".into()))?
            .map_err(queue_error)?;
        staged.finish(outputs)
    }

    /// Tokenizes on tokio's blocking pool, then awaits the queue: no runtime worker runs the
    /// tokenizer or waits on the model.
    fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
        let this = self.clone();
        Box::pin(async move {
            let engine = this.engine.clone();
            let mut staged = tokio::task::spawn_blocking(move || engine.stage_decision(&request))
                .await
                .map_err(|e| queue_error(e.to_string()))??;
            let outputs = this.forward(staged.take_rows()).await?;
            staged.finish(outputs)
        })
    }

    fn default_request_parameters(&self) -> DecisionRequestParameters {
        self.engine.default_request_parameters()
    }
}
