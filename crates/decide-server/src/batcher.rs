//! The cross-request batching queue and the decision model that goes through it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// The padded token budget of the [`Lane::Bulk`] rows of one forward call. A decision that
    /// arrives while a pass runs waits for that pass: bulk rows in small passes keep that wait
    /// short, where one pass of the whole budget takes seconds on a few CPU cores.
    pub bulk_pass_tokens: usize,
    /// The tokens of [`Lane::Bulk`] rows that may wait or run at once; a bulk request that
    /// would go past it gets [`Overloaded`], so that the queue admits only the bulk work it can
    /// run within the request timeout. `usize::MAX` admits any.
    pub max_bulk_tokens: usize,
}

/// Which line a request's rows wait in. Every forward call serves the decisions waiting
/// before any bulk row, so a 27-tool selection is not queued behind thousands of texts to
/// embed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Decisions (select, route, the decision formats): few rows, a caller waiting on each.
    Decision,
    /// Embeddings and reranking: many rows a request, throughput over latency.
    Bulk,
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
    lane: Lane,
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
    /// Tokens of bulk rows queued or running, against [`BatchConfig::max_bulk_tokens`].
    bulk_tokens: Arc<AtomicUsize>,
    max_bulk_tokens: usize,
    max_batch_tokens: usize,
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
        let bulk_tokens = Arc::new(AtomicUsize::new(0));
        let worker_bulk = bulk_tokens.clone();
        std::thread::Builder::new()
            .name("decide-batcher".into())
            .spawn(move || run(engine, config, rx, worker_metrics, worker_bulk))
            .map_err(ServerError::Thread)?;
        Ok(Self {
            tx,
            metrics,
            bulk_tokens,
            max_bulk_tokens: config.max_bulk_tokens,
            max_batch_tokens: config.max_batch_tokens,
        })
    }

    /// The lane of a decision's rows: [`Lane::Decision`], unless they need more than one forward
    /// call of the whole budget (64 questions of 255 options, say). Such a request waits in the
    /// bulk lane under its admission limit, so that it cannot hold up the small decisions that
    /// arrive while it runs.
    pub fn decision_lane(&self, rows: &[EncodedRow]) -> Lane {
        let longest = rows.iter().map(EncodedRow::len).max().unwrap_or(0);
        if rows.len().saturating_mul(longest) > self.max_batch_tokens {
            Lane::Bulk
        } else {
            Lane::Decision
        }
    }

    /// Queues one request's rows; the receiver gets one output per row, in order. Dropping
    /// the receiver drops the rows not yet run.
    pub fn submit(&self, rows: Vec<EncodedRow>, lane: Lane) -> Result<Pending, Overloaded> {
        self.submit_cancellable(rows, None, lane)
    }

    fn submit_cancellable(
        &self,
        rows: Vec<EncodedRow>,
        cancel: Option<Arc<AtomicBool>>,
        lane: Lane,
    ) -> Result<Pending, Overloaded> {
        let (reply, rx) = oneshot::channel();
        if rows.is_empty() {
            // Nothing to run (every embedding was cached): answer without queueing.
            let _ = reply.send(Ok(Vec::new()));
            return Ok(rx);
        }
        let tokens = if lane == Lane::Bulk {
            let tokens = rows.iter().map(EncodedRow::len).sum::<usize>();
            let admitted =
                self.bulk_tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                        // One request alone is always admitted: its own size is bounded by the
                        // request limits, and refusing it would refuse it for ever.
                        (queued == 0 || queued.saturating_add(tokens) <= self.max_bulk_tokens)
                            .then_some(queued + tokens)
                    });
            if admitted.is_err() {
                self.metrics.observe_rejected();
                return Err(Overloaded);
            }
            tokens
        } else {
            0
        };
        let depth = self.metrics.queue_depth();
        depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Job {
            lane,
            outputs: Vec::with_capacity(rows.len()),
            rows,
            done: 0,
            reply,
            cancel,
        }) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                depth.fetch_sub(1, Ordering::Relaxed);
                self.bulk_tokens.fetch_sub(tokens, Ordering::AcqRel);
                self.metrics.observe_rejected();
                Err(Overloaded)
            }
        }
    }
}

/// The tokens of a job's rows from `from` on: what its bulk rows still hold of the queue's
/// bulk budget.
fn bulk_tokens_left(job: &Job, from: usize) -> usize {
    match job.lane {
        Lane::Bulk if from < job.rows.len() => job.rows[from..].iter().map(EncodedRow::len).sum(),
        _ => 0,
    }
}

/// The rows of one forward call: each decision's rows from the oldest on, then bulk rows,
/// within the padded budget (bulk rows within their smaller one too): `(job, end)` for each
/// job that runs rows up to `end`.
fn pick(waiting: &VecDeque<Job>, config: &BatchConfig, max_requests: usize) -> Vec<(usize, usize)> {
    let mut picks: Vec<(usize, usize)> = Vec::new();
    let (mut rows, mut longest) = (0usize, 0usize);
    let (mut bulk_rows, mut bulk_longest) = (0usize, 0usize);
    let order = waiting
        .iter()
        .enumerate()
        .filter(|(_, j)| j.lane == Lane::Decision)
        .chain(
            waiting
                .iter()
                .enumerate()
                .filter(|(_, j)| j.lane == Lane::Bulk),
        );
    for (i, job) in order {
        if picks.len() == max_requests {
            break;
        }
        let bulk = job.lane == Lane::Bulk;
        let mut end = job.done;
        while end < job.rows.len() {
            let len = job.rows[end].len();
            let l = longest.max(len);
            if rows > 0 && (rows + 1) * l > config.max_batch_tokens {
                break;
            }
            if bulk {
                let bl = bulk_longest.max(len);
                if bulk_rows > 0 && (bulk_rows + 1) * bl > config.bulk_pass_tokens {
                    break;
                }
                bulk_rows += 1;
                bulk_longest = bl;
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
    picks
}

fn run(
    engine: Engine,
    config: BatchConfig,
    rx: Receiver<Job>,
    metrics: Arc<Metrics>,
    bulk_tokens: Arc<AtomicUsize>,
) {
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
        // A bulk job does not count, so that decisions behind it reach the front.
        while waiting.iter().filter(|j| j.lane == Lane::Decision).count() < max_requests {
            let Ok(job) = rx.try_recv() else { break };
            depth.fetch_sub(1, Ordering::Relaxed);
            waiting.push_back(job);
        }
        waiting.retain(|job| {
            let gone = job.abandoned();
            if gone {
                metrics.observe_cancelled(job.rows.len() - job.done);
                bulk_tokens.fetch_sub(bulk_tokens_left(job, job.done), Ordering::AcqRel);
            }
            !gone
        });
        if waiting.is_empty() {
            continue;
        }
        let picks = pick(&waiting, &config, max_requests);
        let before: Vec<usize> = picks.iter().map(|&(i, _)| waiting[i].done).collect();
        run_batch(&engine, &mut waiting, &picks, &metrics);
        for (&(i, end), from) in picks.iter().zip(before) {
            let job = &waiting[i];
            let ran = if job.done == usize::MAX {
                bulk_tokens_left(job, from)
            } else {
                bulk_tokens_left(job, from) - bulk_tokens_left(job, end)
            };
            bulk_tokens.fetch_sub(ran, Ordering::AcqRel);
        }
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
    pub async fn forward(
        &self,
        rows: Vec<EncodedRow>,
        lane: Lane,
    ) -> Result<Vec<Vec<f32>>, DecisionError> {
        let rx = self
            .batcher
            .submit(rows, lane)
            .map_err(DecisionError::from_model_error)?;
        received(rx.await)
    }

    /// [`forward`](Self::forward) for blocking code: waits on its thread, and when run under
    /// [`with_cancel`] the rows still queued are dropped once the flag is set (the work's
    /// deadline passed or its caller left), so the call ends within one forward pass.
    pub(crate) fn forward_blocking(
        &self,
        rows: Vec<EncodedRow>,
        lane: Lane,
    ) -> Result<Vec<Vec<f32>>, DecisionError> {
        let cancel = CANCEL.with(|c| c.borrow().clone());
        let rx = self
            .batcher
            .submit_cancellable(rows, cancel, lane)
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
        let rows = staged.take_rows();
        let lane = self.batcher.decision_lane(&rows);
        let outputs = self.forward_blocking(rows, lane)?;
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
            let rows = staged.take_rows();
            let lane = this.batcher.decision_lane(&rows);
            let outputs = this.forward(rows, lane).await?;
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
