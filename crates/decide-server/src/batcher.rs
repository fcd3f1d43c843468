//! The cross-request batching queue and the decision model that goes through it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// the budget runs in pieces, other requests' rows in between.
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
    /// Rows already run: a request larger than one forward call runs in pieces.
    done: usize,
    outputs: Vec<Vec<f32>>,
    reply: Reply,
    cancel: Option<Arc<AtomicBool>>,
}

impl Job {
    /// Whether nobody waits for this job any more: the receiver is gone (deadline passed,
    /// client disconnected) or the caller cancelled it.
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
            || self
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

thread_local! {
    /// The cancellation flag of the work running on this thread (see [`with_cancel`]).
    static CANCEL: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `work` (blocking code that calls [`BatchedEngine::decide`], such as the filter) so that
/// the rows it queues are dropped once `flag` is set: the filter's and the router's calls have
/// no receiver the caller could drop, so their deadline reaches the queue through this flag.
pub(crate) fn with_cancel<T>(flag: Arc<AtomicBool>, work: impl FnOnce() -> T) -> T {
    CANCEL.with(|c| *c.borrow_mut() = Some(flag));
    let out = work();
    CANCEL.with(|c| *c.borrow_mut() = None);
    out
}

/// A bounded FIFO of requests' rows and the one thread that runs them through the model.
///
/// Each forward call takes rows from the waiting requests, oldest first, as long as they fit the
/// token budget (counted as a padded batch: rows × longest row, as text-embeddings-inference's
/// queue counts padded models) and `max_batch_requests`, and sends each request its outputs once
/// all its rows have run. A request larger than the budget runs a piece per call and goes to the
/// back of the line after each piece, so other requests interleave with it; a request whose
/// caller is gone (deadline passed, client disconnected, cancelled) is dropped before its next
/// piece costs anything.
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

    /// Queues one request's rows; the receiver gets one output per row, in order. Dropping
    /// the receiver drops the rows not yet run.
    pub fn submit(&self, rows: Vec<EncodedRow>) -> Result<Pending, Overloaded> {
        self.submit_cancellable(rows, None)
    }

    fn submit_cancellable(
        &self,
        rows: Vec<EncodedRow>,
        cancel: Option<Arc<AtomicBool>>,
    ) -> Result<Pending, Overloaded> {
        let (reply, rx) = oneshot::channel();
        if rows.is_empty() {
            // Nothing to run (every embedding was cached): answer without queueing.
            let _ = reply.send(Ok(Vec::new()));
            return Ok(rx);
        }
        let depth = self.metrics.queue_depth();
        depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Job {
            outputs: Vec::with_capacity(rows.len()),
            rows,
            done: 0,
            reply,
            cancel,
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
    let mut waiting: VecDeque<Job> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match rx.recv() {
                Ok(job) => {
                    depth.fetch_sub(1, Ordering::Relaxed);
                    waiting.push_back(job);
                }
                Err(_) => return,
            }
        }
        // Only as many as one call can serve leave the channel: the rest stay bounded by it.
        while waiting.len() < max_requests {
            let Ok(job) = rx.try_recv() else { break };
            depth.fetch_sub(1, Ordering::Relaxed);
            waiting.push_back(job);
        }
        waiting.retain(|job| {
            let gone = job.abandoned();
            if gone {
                metrics.observe_cancelled(job.rows.len() - job.done);
            }
            !gone
        });
        if waiting.is_empty() {
            continue;
        }
        // Rows from the oldest requests on, as many as the padded budget holds (at least one).
        let mut picks: Vec<(usize, usize)> = Vec::new();
        let (mut rows, mut longest) = (0usize, 0usize);
        for (i, job) in waiting.iter().enumerate().take(max_requests) {
            let mut end = job.done;
            while end < job.rows.len() {
                let l = longest.max(job.rows[end].len());
                if rows > 0 && (rows + 1) * l > config.max_batch_tokens {
                    break;
                }
                rows += 1;
                longest = l;
                end += 1;
            }
            if end > job.done {
                picks.push((i, end));
            }
            if end < job.rows.len() {
                break;
            }
        }
        run_batch(&engine, &mut waiting, &picks, &metrics);
        // Finished requests leave; one that ran only a piece goes to the back of the line.
        let mut rest = VecDeque::with_capacity(waiting.len());
        let mut unfinished = Vec::new();
        for (i, job) in waiting.drain(..).enumerate() {
            let picked = picks.iter().any(|&(p, _)| p == i);
            if job.done == job.rows.len() {
                let _ = job.reply.send(Ok(job.outputs));
            } else if job.done == usize::MAX {
                // Failed: its error was sent.
            } else if picked {
                unfinished.push(job);
            } else {
                rest.push_back(job);
            }
        }
        rest.extend(unfinished);
        waiting = rest;
    }
}

/// Runs the picked rows (`(job, end)`: the job's rows up to `end`) in one forward call, each
/// distinct row once, and stores each job's outputs; a failed call answers the jobs with the
/// error (and marks them done with `usize::MAX`).
fn run_batch(
    engine: &Engine,
    jobs: &mut VecDeque<Job>,
    picks: &[(usize, usize)],
    metrics: &Metrics,
) {
    let mut unique: Vec<EncodedRow> = Vec::new();
    let mut slots: HashMap<&EncodedRow, usize> = HashMap::new();
    let mut index: Vec<Vec<usize>> = Vec::with_capacity(picks.len());
    let mut total = 0;
    for &(i, end) in picks {
        let job = &jobs[i];
        total += end - job.done;
        index.push(
            job.rows[job.done..end]
                .iter()
                .map(|row| {
                    *slots.entry(row).or_insert_with(|| {
                        unique.push(row.clone());
                        unique.len() - 1
                    })
                })
                .collect(),
        );
    }
    drop(slots);
    metrics.observe_batch(picks.len(), unique.len(), total - unique.len());
    match engine.forward_rows(&unique) {
        Ok(outputs) => {
            for (&(i, end), idx) in picks.iter().zip(index) {
                let job = &mut jobs[i];
                job.outputs.extend(idx.iter().map(|&u| outputs[u].clone()));
                job.done = end;
            }
        }
        Err(e) => {
            let message = e.to_string();
            for &(i, _) in picks {
                let job = &mut jobs[i];
                let (reply, _) = oneshot::channel();
                let _ = std::mem::replace(&mut job.reply, reply).send(Err(message.clone()));
                job.done = usize::MAX;
            }
        }
    }
}

/// The engine behind the queue, as a [`DecisionModel`]: a request is staged (tokenized) on
/// the caller's thread, its rows wait in the [`Batcher`] with other requests' rows, and the
/// outputs are turned into answers on the caller's side again. Answers equal the engine's own.
///
/// Both paths work: [`decide`](DecisionModel::decide) blocks its thread on the queue (every
/// decision endpoint calls it on tokio's blocking pool, so that its admission slot is held until
/// the work ends), and [`decide_async`](DecisionModel::decide_async) awaits it. A full queue
/// fails the call with a [`DecisionError::Model`] wrapping [`Overloaded`].
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

/// A queued request's outputs, or why it has none.
fn received(
    reply: Result<Outputs, oneshot::error::RecvError>,
) -> Result<Vec<Vec<f32>>, DecisionError> {
    reply
        .map_err(|_| queue_error("the inference thread stopped".into()))?
        .map_err(queue_error)
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
        received(rx.await)
    }

    /// [`forward`](Self::forward) for blocking code: waits on its thread, and when run under
    /// [`with_cancel`] the rows still queued are dropped once the flag is set (the work's
    /// deadline passed or its caller left), so the call ends within one forward pass.
    pub(crate) fn forward_blocking(
        &self,
        rows: Vec<EncodedRow>,
    ) -> Result<Vec<Vec<f32>>, DecisionError> {
        let cancel = CANCEL.with(|c| c.borrow().clone());
        let rx = self
            .batcher
            .submit_cancellable(rows, cancel)
            .map_err(DecisionError::from_model_error)?;
        received(rx.blocking_recv())
    }

    /// Whether `error` says the queue was full.
    pub fn is_overloaded(error: &DecisionError) -> bool {
        matches!(error, DecisionError::Model(e) if e.downcast_ref::<Overloaded>().is_some())
    }
}

impl DecisionModel for BatchedEngine {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        let mut staged = self.engine.stage_decision(request)?;
        let outputs = self.forward_blocking(staged.take_rows())?;
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

    fn selection_hints(&self) -> decide_contract::SelectionHints {
        self.engine.selection_hints()
    }
}
