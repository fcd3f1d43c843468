//! `decide train`: fine-tunes the decision model on labelled cases and writes a model folder.
//!
//! Everything that can be wrong with the data (unreadable or empty files, unknown tools,
//! duplicate ids, cases shared by the training and evaluation files) is reported before the
//! model loads. The files are streamed, never held whole: the check keeps a hash per case, and
//! the rendered cases go to a spool file that training reads back a batch at a time.
//!
//! After each epoch the weights are written to a scratch folder next to `--out`, calibrated
//! (Platt, on `--eval` when given, else on the training cases), measured on `--eval` with
//! `decide eval`'s own code, and moved into `--out` when they are the best so far: `--out`
//! always holds a complete, loadable model, also after Ctrl-C. A cross-encoder (`--head
//! cross-encoder`) is calibrated and measured as it is used: reranking the base model's
//! `--rerank-top` shortlist.
//!
//! The epochs, checkpoints and patience are decide-train's [`Trainer::run`]; this command
//! gives it the held-out scores and the evaluation through a [`RunObserver`], and shows the
//! progress.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use decide_engine::{file_sha256, resolve, served_tool_text, Bf16Tiles, ModelLocation, Precision};
use decide_train::{
    EpochEnd, Example, ExampleSpool, Hyper, ModelMeta, Outcome, RunObserver, Schedule,
    StepProgress, TrainHead, Trainer,
};

use crate::args::{CasesArgs, FilterArgs, Global, TrainArgs};
use crate::decider::Decider;
use crate::filtering::{build_filter, case_pairs, progress, provider_request};
use crate::input::{Case, Cases};

/// Reads the cases of a file one at a time (the reader checks JSON, tools, unknown expected
/// tools and duplicate ids); a case without `expected` is an error. Nothing is kept: `each`
/// sees every case with where it is (`file:line`) and its labels.
fn for_each_case(
    data: &Path,
    tools: Option<&PathBuf>,
    mut each: impl FnMut(&str, Case, Vec<String>) -> anyhow::Result<()>,
) -> anyhow::Result<usize> {
    let reader = Cases::open(&CasesArgs {
        data: data.to_path_buf(),
        tools: tools.cloned(),
    })?;
    let mut n = 0;
    for next in reader {
        let (at, case) = next?;
        let Some(expected) = case.expected.clone() else {
            bail!(
                "{at}: expected: missing (training needs labels; [] for a case that needs no tool)"
            );
        };
        each(&at, case, expected)?;
        n += 1;
    }
    Ok(n)
}

fn hash64(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A conversation's identity for the overlap check: its parsed messages.
fn conversation_key(case: &Case) -> u64 {
    hash64(&format!("{:?}", case.messages))
}

/// What the check of the training file keeps to find overlapping evaluation cases: a hash of
/// every id and conversation with the case's place. A few bytes a case, whatever its size.
#[derive(Default)]
struct Seen {
    ids: HashMap<u64, String>,
    conversations: HashMap<u64, String>,
}

impl Seen {
    fn add(&mut self, at: &str, case: &Case) {
        self.ids
            .entry(hash64(&case.id.to_string()))
            .or_insert_with(|| at.to_string());
        self.conversations
            .entry(conversation_key(case))
            .or_insert_with(|| at.to_string());
    }

    /// A case of the evaluation file that is also in the training file (same id or same
    /// conversation) would measure memory, not generalisation.
    fn check(&self, at: &str, case: &Case) -> anyhow::Result<()> {
        if let Some(train_at) = self.ids.get(&hash64(&case.id.to_string())) {
            bail!(
                "{at}: id: {} is also a training case ({train_at}); the evaluation cases must not overlap the training cases",
                case.id
            );
        }
        if let Some(train_at) = self.conversations.get(&conversation_key(case)) {
            bail!(
                "{at}: messages: the same conversation is a training case ({train_at}); the evaluation cases must not overlap the training cases"
            );
        }
        Ok(())
    }
}

/// Training stopped by Ctrl-C, with what was kept; the command exits 130 with it.
#[derive(Debug)]
pub struct Interrupted(String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// The case with only the `k` tools `base` ranks most probable: what a reranker sees.
fn shortlist(
    base: &Decider,
    case: &Case,
    expected: &[String],
    filter: &FilterArgs,
    at: &str,
    k: usize,
) -> anyhow::Result<Case> {
    let scores = case_pairs(base, case, expected, filter, at)?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].0.total_cmp(&scores[a].0).then(a.cmp(&b)));
    order.truncate(k);
    order.sort_unstable();
    Ok(Case {
        id: case.id.clone(),
        messages: case.messages.clone(),
        tools: order.iter().map(|&i| case.tools[i].clone()).collect(),
        expected: case.expected.clone(),
    })
}

/// The raw scores and labels of every (case, tool) pair of a file, as `decide calibrate`
/// forms them; with `shortlist`, only the tools the base model puts in its top k.
fn raw_scores(
    model: &Decider,
    data: &Path,
    tools: Option<&PathBuf>,
    filter: &FilterArgs,
    shortlisted: Option<(&Decider, usize)>,
) -> anyhow::Result<(Vec<f64>, Vec<bool>)> {
    let mut scores = Vec::new();
    let mut labels = Vec::new();
    for_each_case(data, tools, |at, case, expected| {
        let case = match shortlisted {
            Some((base, k)) => shortlist(base, &case, &expected, filter, at, k)?,
            None => case,
        };
        for (s, label) in case_pairs(model, &case, &expected, filter, at)? {
            scores.push(s);
            labels.push(label);
        }
        Ok(())
    })?;
    Ok((scores, labels))
}

/// The process's peak resident memory in GB, where the system says (Linux's VmHWM).
fn peak_memory() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1e6)
}

/// Stops training at the next step on the first Ctrl-C; a second one ends the process.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                set.store(true, Ordering::SeqCst);
                eprintln!("\ninterrupted: stopping after this step (Ctrl-C again to quit now)");
            }
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
    });
    flag
}

/// A path beside `--out` for this run's own files (see [`decide_train::beside`]).
fn beside(out: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    decide_train::beside(out, suffix)
        .ok_or_else(|| anyhow::anyhow!("--out {}: needs a folder name", out.display()))
}

/// `--out` is replaced by the result: only an empty folder or one written by `decide train`
/// may be there already.
fn check_out(out: &Path) -> anyhow::Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let empty = std::fs::read_dir(out)
        .with_context(|| out.display().to_string())?
        .next()
        .is_none();
    if !empty && !decide_train::written_by_train(out) {
        bail!(
            "--out {}: exists and is not a model written by decide train; give a new folder",
            out.display()
        );
    }
    Ok(())
}

/// The last epoch to run: `--stop-after`, else `--epochs`.
fn last_epoch(args: &TrainArgs) -> anyhow::Result<usize> {
    match args.stop_after {
        Some(n) if n == 0 || n > args.epochs => bail!(
            "--stop-after {n}: must be between 1 and --epochs ({})",
            args.epochs
        ),
        Some(n) => Ok(n),
        None => Ok(args.epochs),
    }
}

/// Reads both files through once, so that every error in the data comes before any model
/// loads; what stays in memory is a hash and a place per case. Returns the training cases'
/// count.
fn check_cases(args: &TrainArgs) -> anyhow::Result<usize> {
    let mut seen = Seen::default();
    let cases = for_each_case(&args.data, args.tools.as_ref(), |at, case, _| {
        seen.add(at, &case);
        Ok(())
    })?;
    if let Some(p) = &args.eval {
        for_each_case(p, args.tools.as_ref(), |at, case, _| seen.check(at, &case))?;
    }
    Ok(cases)
}

fn hyper(args: &TrainArgs) -> Hyper {
    Hyper {
        epochs: args.epochs,
        learning_rate: args.lr,
        batch_size: args.batch_size,
        max_length: args.max_length,
        seed: args.seed,
        hard_negative_pool: args.hard_negatives,
        negatives_per_pair: args.negatives_per_pair,
        head: args.head,
        frozen_layers: args.freeze_layers,
        no_tool_margin: args.no_tool_margin,
        ..Hyper::default()
    }
}

/// The global options with `model` in place of `--model`, and no reranker.
fn with_model(global: &Global, model: String) -> Global {
    let mut g = global.clone();
    g.model = model;
    g.rerank = None;
    g
}

/// The tools' texts, each once, with an index to find a text's place.
#[derive(Default)]
struct Documents {
    texts: Vec<String>,
    index: HashMap<String, usize>,
}

impl Documents {
    fn place(&mut self, text: String) -> usize {
        let next = self.texts.len();
        let idx = *self.index.entry(text.clone()).or_insert(next);
        if idx == next {
            self.texts.push(text);
        }
        idx
    }
}

/// The training cases as the trainer reads them.
struct Spooled {
    documents: Vec<String>,
    spool: ExampleSpool,
    /// Cases that need no tool, trained or skipped.
    no_tool: usize,
}

/// The texts exactly as the engine will see them: the filter's rendering of the conversation,
/// and each tool's candidate text. Cases go to a spool file next to `--out`, read back a batch
/// at a time; the tools, each once, stay in memory.
/// `texts` is whether the tools' texts carry their parameters and their servers, as the base
/// reads them.
fn spool_cases(
    base: &Decider,
    args: &TrainArgs,
    trains_no_tool: bool,
    texts: (bool, bool),
) -> anyhow::Result<Spooled> {
    let mut documents = Documents::default();
    let mut spool = ExampleSpool::create(&beside(&args.out, "spool")?)?;
    let mut no_tool = 0;
    let (tool_parameters, tool_server) = texts;
    for_each_case(&args.data, args.tools.as_ref(), |at, case, expected| {
        let provider = build_filter(base, case.tools.clone(), &args.filter)?;
        let request = provider_request(&case.messages).with_context(|| at.to_string())?;
        let Some(input) = provider.decision_input(&request) else {
            bail!("{at}: the user message has no text");
        };
        let mut positives = Vec::new();
        let mut candidates = Vec::with_capacity(case.tools.len());
        for tool in &case.tools {
            let arguments = if tool_parameters {
                tool.parameter_names()
            } else {
                Vec::new()
            };
            let description = tool.description.as_deref().unwrap_or("");
            let server = tool.server().filter(|_| tool_server);
            let idx = documents.place(served_tool_text(
                &tool.name,
                description,
                &arguments,
                server,
            ));
            if expected.contains(&tool.name) && !positives.contains(&idx) {
                positives.push(idx);
            }
            candidates.push(idx);
        }
        if positives.is_empty() {
            no_tool += 1;
            // Without a margin a case that needs no tool has nothing to pull towards; its tools
            // still serve as negatives for the others.
            if !trains_no_tool {
                return Ok(());
            }
        }
        spool.push(&Example {
            query: input.render(),
            positives,
            candidates,
        })?;
        Ok(())
    })?;
    Ok(Spooled {
        documents: documents.texts,
        spool,
        no_tool,
    })
}

/// The run's numbers: for the manifest and the first line.
struct Counts {
    cases: usize,
    no_tool: usize,
    pairs: usize,
    trains_no_tool: bool,
}

/// The trained model's manifest, as far as it is known before the first epoch.
fn model_meta(
    args: &TrainArgs,
    hyper: &Hyper,
    base: &ModelLocation,
    base_spec: &str,
    texts: (bool, bool),
) -> ModelMeta {
    let (tool_parameters, tool_server) = texts;
    let base_manifest = base.manifest.as_ref();
    let name = args.name.clone().unwrap_or_else(|| {
        args.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trained".into())
    });
    ModelMeta {
        name,
        base_hf_id: base_manifest
            .map(|m| m.hf_id.clone())
            .unwrap_or_else(|| base_spec.to_string()),
        base: base_spec.to_string(),
        head: args.head,
        max_length: base_manifest
            .map(|m| m.max_length)
            .unwrap_or(args.max_length),
        license: base_manifest.and_then(|m| m.license.clone()),
        // The lexical weight is on the scale of a cosine; a cross-encoder's logit has its own.
        lexical_weight: match args.head {
            TrainHead::BiEncoder => base_manifest
                .and_then(|m| m.scoring)
                .map(|s| s.lexical_weight),
            TrainHead::CrossEncoder => None,
        },
        tool_parameters,
        tool_server,
        calibration: None,
        training: hyper.to_toml(),
    }
}

/// The `[training]` table's account of the data: the files and their hashes, the counts, and
/// where the calibration is fitted.
fn record_data(
    meta: &mut ModelMeta,
    global: &Global,
    args: &TrainArgs,
    counts: &Counts,
) -> anyhow::Result<()> {
    let training = &mut meta.training;
    training.insert("data".into(), args.data.display().to_string().into());
    training.insert("data_sha256".into(), file_sha256(&args.data)?.into());
    if let Some(p) = &args.eval {
        training.insert("eval".into(), p.display().to_string().into());
        training.insert("eval_sha256".into(), file_sha256(p)?.into());
    }
    if let Some(p) = &args.tools {
        training.insert("tools_sha256".into(), file_sha256(p)?.into());
    }
    training.insert("cases".into(), (counts.cases as i64).into());
    let skipped = if counts.trains_no_tool {
        0
    } else {
        counts.no_tool
    };
    training.insert("no_tool_cases_skipped".into(), (skipped as i64).into());
    training.insert("pairs".into(), (counts.pairs as i64).into());
    training.insert(
        "calibrated_on".into(),
        (if args.eval.is_some() { "eval" } else { "data" }).into(),
    );
    if args.head == TrainHead::CrossEncoder {
        // Calibrated and measured as it is used: reranking the base's shortlist.
        training.insert("shortlist".into(), meta.base.clone().into());
        training.insert("shortlist_top".into(), (global.rerank_top as i64).into());
    }
    Ok(())
}

pub fn run(global: &Global, args: TrainArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // Checked before the data is read: a bad option should not wait on a large file.
    let last_epoch = last_epoch(&args)?;
    let cases = check_cases(&args)?;
    check_out(&args.out)?;
    let hyper = hyper(&args);
    let trains_no_tool = hyper.no_tool_margin.is_some();
    let base_spec = args.base.clone().unwrap_or_else(|| global.model.clone());
    let location = resolve(&base_spec)?;
    let base_model = with_model(global, base_spec.clone()).decider(true)?;
    let texts = (
        base_model.about().tool_parameters,
        base_model.about().tool_server,
    );
    let spooled = spool_cases(&base_model, &args, trains_no_tool, texts)?;
    let device = global.device.open()?;
    let mut trainer = Trainer::from_source(
        &location.dir,
        spooled.documents,
        Box::new(spooled.spool),
        hyper.clone(),
        &device,
    )
    .with_context(|| format!("--base {base_spec}"))?;
    // The base model loaded above already refused bf16 on a CPU without AMX, and `auto`
    // resolves to bf16 only where the tiles are, so bf16 here means the tiles exist.
    let bf16 = device.is_cpu() && global.dtype.resolve(&device, global.kernels) == Precision::Bf16;
    let tiles = bf16.then(Bf16Tiles::detect).flatten();
    if let Some(tiles) = tiles {
        trainer.on_tiles(tiles);
    }
    drop(base_model);
    let counts = Counts {
        cases,
        no_tool: spooled.no_tool,
        pairs: trainer.pairs_per_epoch(),
        trains_no_tool,
    };
    let mut meta = model_meta(&args, &hyper, &location, &base_spec, texts);
    record_data(&mut meta, global, &args, &counts)?;
    let products = if tiles.is_some() { "bf16-amx" } else { "f32" };
    meta.training.insert("products".into(), products.into());
    announce(
        global,
        &args,
        &base_spec,
        &counts,
        trainer.total_steps(),
        tiles.is_some(),
    );
    let mut observer = Observer::new(global, &args, &base_spec, &trainer, last_epoch, started)?;
    let schedule = Schedule {
        out: args.out.clone(),
        last_epoch,
        patience: args.patience,
    };
    let outcome = trainer.run(&schedule, &mut meta, &mut observer)?;
    observer.bar.finish_and_clear();
    if let Some(epoch) = outcome.interrupted_in {
        return Err(interrupted(&args.out, epoch, outcome.kept_epoch).into());
    }
    print_result(global, &args, &base_spec, &outcome, started);
    Ok(())
}

/// The run's first line: what trains from what, on what, for how long.
fn announce(
    global: &Global,
    args: &TrainArgs,
    base_spec: &str,
    counts: &Counts,
    steps: usize,
    on_tiles: bool,
) {
    eprintln!(
        "training a {} from {base_spec} on {} ({} cases, {} pairs, {} no-tool cases {}) for {} epochs, {steps} steps, on {}{}",
        args.head.name(),
        args.data.display(),
        counts.cases,
        counts.pairs,
        counts.no_tool,
        if counts.trains_no_tool {
            "trained against the margin"
        } else {
            "skipped"
        },
        args.epochs,
        global.device,
        if on_tiles {
            " (linear layers in bf16 on AMX tiles)"
        } else {
            ""
        },
    );
}

/// What `decide train` does for the run: the progress bar (or, without a terminal, a line
/// every 5% of the run), stopping on Ctrl-C, and each checkpoint's calibration pairs and
/// evaluation through the same code as `decide calibrate` and `decide eval`.
struct Observer<'a> {
    global: &'a Global,
    args: &'a TrainArgs,
    base_spec: &'a str,
    bar: indicatif::ProgressBar,
    stop: Arc<AtomicBool>,
    started: Instant,
    total_steps: usize,
    /// Without a terminal (a log file, CI) the bar is hidden: a line every `log_every` steps
    /// (5% of the run) says how far it is instead.
    log_lines: bool,
    log_every: usize,
    /// A cross-encoder is calibrated and measured on the base's shortlist, as --rerank uses
    /// it; loaded once, so its tool embeddings stay cached from one epoch to the next.
    shortlister: Option<Decider>,
    /// The evaluation of the current checkpoint, for its epoch's line.
    measured: String,
}

impl<'a> Observer<'a> {
    fn new(
        global: &'a Global,
        args: &'a TrainArgs,
        base_spec: &'a str,
        trainer: &Trainer,
        last_epoch: usize,
        started: Instant,
    ) -> anyhow::Result<Self> {
        let stop = interrupt_flag();
        let per_epoch = trainer.pairs_per_epoch() as u64;
        let bar = progress(per_epoch * last_epoch as u64, "training");
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} pairs ({per_sec}, eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        let log_lines = bar.is_hidden();
        let shortlister = match args.head {
            TrainHead::CrossEncoder => {
                Some(with_model(global, base_spec.to_string()).decider(false)?)
            }
            TrainHead::BiEncoder => None,
        };
        Ok(Self {
            global,
            args,
            base_spec,
            bar,
            stop,
            started,
            total_steps: trainer.total_steps(),
            log_lines,
            log_every: (trainer.total_steps() / 20).max(1),
            shortlister,
            measured: String::new(),
        })
    }

    /// The checkpoint in `dir` as a model the commands load.
    fn load(&self, dir: &Path, allow_uncalibrated: bool) -> anyhow::Result<Decider> {
        with_model(self.global, dir.display().to_string()).decider(allow_uncalibrated)
    }
}

impl RunObserver for Observer<'_> {
    type Error = anyhow::Error;

    fn on_step(&mut self, p: &StepProgress<'_>) -> ControlFlow<()> {
        let epochs = self.args.epochs;
        if self.log_lines && p.step.step.is_multiple_of(self.log_every) {
            eprintln!(
                "epoch {}/{epochs}: step {}/{}, loss {:.3}, {:.1} min",
                p.epoch,
                p.step.step,
                self.total_steps,
                p.epoch_loss,
                self.started.elapsed().as_secs_f64() / 60.0
            );
        }
        self.bar.inc(p.step.examples as u64);
        self.bar.set_message(format!(
            "epoch {}/{epochs} loss {:.3}",
            p.epoch, p.epoch_loss
        ));
        if self.stop.load(Ordering::SeqCst) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn calibration_pairs(&mut self, checkpoint: &Path) -> anyhow::Result<(Vec<f64>, Vec<bool>)> {
        let uncalibrated = self.load(checkpoint, true)?;
        let shortlisted = self
            .shortlister
            .as_ref()
            .map(|b| (b, self.global.rerank_top));
        let held_out = self.args.eval.as_deref().unwrap_or(&self.args.data);
        raw_scores(
            &uncalibrated,
            held_out,
            self.args.tools.as_ref(),
            &self.args.filter,
            shortlisted,
        )
    }

    fn measure(&mut self, checkpoint: &Path) -> anyhow::Result<Option<f64>> {
        let Some(path) = &self.args.eval else {
            return Ok(None);
        };
        let trained = self.load(checkpoint, false)?;
        let k = self.global.rerank_top;
        let model = match self.shortlister.clone() {
            Some(base) => Decider::cascade(base, trained, k)?,
            None => trained,
        };
        let reader = Cases::open(&CasesArgs {
            data: path.clone(),
            tools: self.args.tools.clone(),
        })?;
        let report = crate::eval::evaluate_cases(&model, reader, &self.args.filter, path)?;
        let r = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        self.measured = format!(
            "; eval{} recall@5 {} recall@10 {} MRR {}",
            if self.args.head == TrainHead::CrossEncoder {
                format!(" (reranking {}'s top {k})", self.base_spec)
            } else {
                String::new()
            },
            r(report.recall_at_5),
            r(report.recall_at_10),
            r(report.mrr)
        );
        Ok(Some(report.mrr.unwrap_or(0.0)))
    }

    fn on_epoch_end(&mut self, end: &EpochEnd) {
        let line = format!(
            "epoch {}/{}: loss {:.4}, calibration a {:.3} b {:.3}{}{}",
            end.epoch,
            self.args.epochs,
            end.loss,
            end.calibration.a,
            end.calibration.b,
            std::mem::take(&mut self.measured),
            if end.kept { " (kept)" } else { "" }
        );
        self.bar.suspend(|| eprintln!("{line}"));
    }

    fn on_early_stop(&mut self, patience: usize) {
        self.bar
            .suspend(|| eprintln!("no better epoch in {patience} epochs: stopping early"));
    }
}

/// Stopped by Ctrl-C in `epoch`: what `--out` holds now.
fn interrupted(out: &Path, epoch: usize, kept: Option<usize>) -> Interrupted {
    Interrupted(match kept {
        Some(e) => format!(
            "interrupted in epoch {epoch}: {} holds epoch {e}, the last complete checkpoint, and loads with --model",
            out.display()
        ),
        None => format!(
            "interrupted in epoch {epoch}, before any epoch completed: nothing was written"
        ),
    })
}

/// Where the model is and how to use it, and what the run cost.
fn print_result(
    global: &Global,
    args: &TrainArgs,
    base_spec: &str,
    outcome: &Outcome,
    started: Instant,
) {
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let usage = match args.head {
        TrainHead::BiEncoder => format!("--model {}", args.out.display()),
        TrainHead::CrossEncoder => format!(
            "--model {base_spec} --rerank {} --rerank-top {}",
            args.out.display(),
            global.rerank_top
        ),
    };
    println!(
        "wrote {} (epoch {} of {}) in {minutes:.1} min; use it with {usage}",
        args.out.display(),
        outcome.kept_epoch.unwrap_or(0),
        args.epochs,
    );
    // What the run cost, for comparing recipes and machines: the epochs themselves (hard-negative
    // mining included, checkpoints and evaluation not) and the process's peak memory.
    let seconds = outcome.training_time.as_secs_f64();
    let pairs = outcome.pairs_trained;
    println!(
        "trained {pairs} pairs in {:.1} min ({:.1} pairs/s){}",
        seconds / 60.0,
        pairs as f64 / seconds.max(1e-9),
        peak_memory()
            .map(|gb| format!(", peak memory {gb:.2} GB"))
            .unwrap_or_default()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn overlapping_cases_are_errors() {
        let dir = std::env::temp_dir().join(format!("decide-train-overlap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tools = write(
            &dir,
            "tools.json",
            r#"[{"name": "a", "description": "x"}, {"name": "b", "description": "y"}]"#,
        );
        let line = |id: &str, text: &str| {
            format!(
                r#"{{"id": "{id}", "messages": [{{"role": "user", "content": "{text}"}}], "expected": ["a"]}}"#
            )
        };
        let train = write(
            &dir,
            "train.jsonl",
            &format!("{}\n{}\n", line("1", "hi"), line("2", "ho")),
        );
        let same_id = write(&dir, "e1.jsonl", &line("2", "other"));
        let same_text = write(&dir, "e2.jsonl", &line("9", "hi"));
        let mut seen = Seen::default();
        for_each_case(&train, Some(&tools), |at, case, _| {
            seen.add(at, &case);
            Ok(())
        })
        .unwrap();
        let check = |p: &Path| {
            for_each_case(p, Some(&tools), |at, case, _| seen.check(at, &case))
                .unwrap_err()
                .to_string()
        };
        let err = check(&same_id);
        assert!(
            err.contains("e1.jsonl:1: id: \"2\" is also a training case")
                && err.contains("train.jsonl:2"),
            "{err}"
        );
        let err = check(&same_text);
        assert!(
            err.contains("e2.jsonl:1: messages: the same conversation is a training case")
                && err.contains("train.jsonl:1"),
            "{err}"
        );
        let fresh = write(&dir, "e3.jsonl", &line("3", "other"));
        for_each_case(&fresh, Some(&tools), |at, case, _| seen.check(at, &case)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
