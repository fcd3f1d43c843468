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

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use decide_engine::{registry, tool_text, Calibration};
use decide_train::{
    file_sha256, write_manifest, Example, ExampleSpool, Hyper, ModelMeta, TrainHead, Trainer,
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

/// A path beside `out` named after it: `out`'s file name with `suffix` and this process's id
/// appended (never replacing an extension: `model.v2` gives `model.v2.partial-PID`, not
/// `model.partial`), so it cannot be a file of the user's, and this run may delete it.
fn beside(out: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let Some(name) = out.file_name() else {
        bail!("--out {}: needs a folder name", out.display());
    };
    let mut name = name.to_os_string();
    name.push(format!(".{suffix}-{}", std::process::id()));
    Ok(out.with_file_name(name))
}

/// Moves the checkpoint in `scratch` to `out`, replacing what was there (a folder `check_out`
/// accepted, or the previous epoch's): `out` is moved aside, the checkpoint renamed into its
/// place, and only then is the old one removed, so `out` is never half written.
fn publish(scratch: &Path, out: &Path) -> anyhow::Result<()> {
    let context = || out.display().to_string();
    if !out.exists() {
        return std::fs::rename(scratch, out).with_context(context);
    }
    let old = beside(out, "old")?;
    std::fs::rename(out, &old).with_context(context)?;
    if let Err(e) = std::fs::rename(scratch, out) {
        let _ = std::fs::rename(&old, out);
        return Err(e).with_context(context);
    }
    std::fs::remove_dir_all(&old).with_context(|| old.display().to_string())
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

pub fn run(global: &Global, args: TrainArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // Checked before the data is read: a bad option should not wait on a large file.
    let last_epoch = match args.stop_after {
        Some(n) if n == 0 || n > args.epochs => bail!(
            "--stop-after {n}: must be between 1 and --epochs ({})",
            args.epochs
        ),
        Some(n) => n,
        None => args.epochs,
    };
    // The data first: every error before any model loads. The files are streamed: what stays
    // in memory is a hash and a place per case.
    let mut seen = Seen::default();
    let cases = for_each_case(&args.data, args.tools.as_ref(), |at, case, _| {
        seen.add(at, &case);
        Ok(())
    })?;
    if let Some(p) = &args.eval {
        for_each_case(p, args.tools.as_ref(), |at, case, _| seen.check(at, &case))?;
    }
    drop(seen);
    check_out(&args.out)?;
    let head = args.head;
    let hyper = Hyper {
        epochs: args.epochs,
        learning_rate: args.lr,
        batch_size: args.batch_size,
        max_length: args.max_length,
        seed: args.seed,
        hard_negative_pool: args.hard_negatives,
        head,
        frozen_layers: args.freeze_layers,
        no_tool_margin: args.no_tool_margin,
        ..Hyper::default()
    };
    let trains_no_tool = hyper.no_tool_margin.is_some();
    let base_spec = args.base.clone().unwrap_or_else(|| global.model.clone());
    let location = registry::resolve(&base_spec)?;
    let with_model = |model: String| {
        let mut g = global.clone();
        g.model = model;
        g.rerank = None;
        g
    };
    let base_model = with_model(base_spec.clone()).decider(true)?;

    // The texts exactly as the engine will see them: the filter's rendering of the
    // conversation, and each tool's candidate text. Cases go to a spool file next to --out,
    // read back a batch at a time; the tools, each once, stay in memory.
    let mut documents: Vec<String> = Vec::new();
    let mut doc_index: HashMap<String, usize> = HashMap::new();
    let spool_path = beside(&args.out, "spool")?;
    let mut spool = ExampleSpool::create(&spool_path)?;
    let mut no_tool = 0;
    let tool_parameters = base_model.tool_parameters();
    for_each_case(&args.data, args.tools.as_ref(), |at, case, expected| {
        let provider = build_filter(&base_model, case.tools.clone(), &args.filter)?;
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
            let text = tool_text(&tool.name, description, &arguments);
            let next = documents.len();
            let idx = *doc_index.entry(text.clone()).or_insert(next);
            if idx == next {
                documents.push(text);
            }
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
    drop(doc_index);
    let device = global.device.open()?;
    let mut trainer = Trainer::from_source(
        &location.dir,
        documents,
        Box::new(spool),
        hyper.clone(),
        &device,
    )
    .with_context(|| format!("--base {base_spec}"))?;
    drop(base_model);

    let base_manifest = location.manifest.clone();
    let name = args.name.clone().unwrap_or_else(|| {
        args.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trained".into())
    });
    let mut training = hyper.to_toml();
    training.insert("data".into(), args.data.display().to_string().into());
    training.insert("data_sha256".into(), file_sha256(&args.data)?.into());
    if let Some(p) = &args.eval {
        training.insert("eval".into(), p.display().to_string().into());
        training.insert("eval_sha256".into(), file_sha256(p)?.into());
    }
    if let Some(p) = &args.tools {
        training.insert("tools_sha256".into(), file_sha256(p)?.into());
    }
    training.insert("cases".into(), (cases as i64).into());
    let skipped = if trains_no_tool { 0 } else { no_tool };
    training.insert("no_tool_cases_skipped".into(), (skipped as i64).into());
    training.insert("pairs".into(), (trainer.pairs_per_epoch() as i64).into());
    training.insert(
        "calibrated_on".into(),
        (if args.eval.is_some() { "eval" } else { "data" }).into(),
    );
    let shortlist_k = global.rerank_top;
    if head == TrainHead::CrossEncoder {
        // Calibrated and measured as it is used: reranking the base's shortlist.
        training.insert("shortlist".into(), base_spec.clone().into());
        training.insert("shortlist_top".into(), (shortlist_k as i64).into());
    }
    let mut meta = ModelMeta {
        name,
        base_hf_id: base_manifest
            .as_ref()
            .map(|m| m.hf_id.clone())
            .unwrap_or_else(|| base_spec.clone()),
        base: base_spec.clone(),
        head,
        max_length: base_manifest
            .as_ref()
            .map(|m| m.max_length)
            .unwrap_or(args.max_length),
        license: base_manifest.as_ref().and_then(|m| m.license.clone()),
        // The lexical weight is on the scale of a cosine; a cross-encoder's logit has its own.
        lexical_weight: match head {
            TrainHead::BiEncoder => base_manifest
                .as_ref()
                .and_then(|m| m.scoring)
                .map(|s| s.lexical_weight),
            TrainHead::CrossEncoder => None,
        },
        tool_parameters,
        calibration: None,
        training,
    };

    eprintln!(
        "training a {} from {base_spec} on {} ({cases} cases, {} pairs, {no_tool} no-tool cases {}) for {} epochs, {} steps, on {}",
        head.name(),
        args.data.display(),
        trainer.pairs_per_epoch(),
        if trains_no_tool {
            "trained against the margin"
        } else {
            "skipped"
        },
        args.epochs,
        trainer.total_steps(),
        global.device
    );
    let stop = interrupt_flag();
    let trainer_steps = trainer.total_steps();
    let per_epoch = trainer.pairs_per_epoch() as u64;
    let bar = progress(per_epoch * last_epoch as u64, "training");
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {pos}/{len} pairs ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    // A cross-encoder is calibrated and measured on the base's shortlist, as --rerank uses it;
    // loaded once, so its tool embeddings stay cached from one epoch to the next.
    let shortlister = match head {
        TrainHead::CrossEncoder => Some(with_model(base_spec.clone()).decider(false)?),
        TrainHead::BiEncoder => None,
    };
    // Named for this run only: whatever is at the path was made by this run, and only this
    // run deletes it.
    let scratch = beside(&args.out, "partial")?;
    let mut best: Option<(usize, f64)> = None;
    let mut since_best = 0;
    let mut saved_epoch = None;
    // Without a terminal (a log file, CI) the bar is hidden: a line every 5% of the run
    // says how far it is instead.
    let log_every = (trainer_steps / 20).max(1);
    let log_lines = bar.is_hidden();
    let mut training_time = std::time::Duration::ZERO;
    let mut pairs_trained = 0u64;
    for epoch in 1..=last_epoch {
        let mut loss_sum = 0.0;
        let mut steps = 0;
        let epoch_started = Instant::now();
        let complete = trainer.run_epoch(&mut |r| {
            loss_sum += r.loss as f64;
            steps += 1;
            pairs_trained += r.examples as u64;
            if log_lines && r.step % log_every == 0 {
                eprintln!(
                    "epoch {epoch}/{}: step {}/{}, loss {:.3}, {:.1} min",
                    args.epochs,
                    r.step,
                    trainer_steps,
                    loss_sum / steps as f64,
                    started.elapsed().as_secs_f64() / 60.0
                );
            }
            bar.inc(r.examples as u64);
            bar.set_message(format!(
                "epoch {epoch}/{} loss {:.3}",
                args.epochs,
                loss_sum / steps as f64
            ));
            if stop.load(Ordering::SeqCst) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if !complete {
            bar.finish_and_clear();
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(Interrupted(match saved_epoch {
                Some(e) => format!(
                    "interrupted in epoch {epoch}: {} holds epoch {e}, the last complete checkpoint, and loads with --model",
                    args.out.display()
                ),
                None => format!("interrupted in epoch {epoch}, before any epoch completed: nothing was written"),
            })
            .into());
        }
        training_time += epoch_started.elapsed();
        let loss = loss_sum / steps.max(1) as f64;
        // Checkpoint, calibrate, measure.
        meta.calibration = None;
        meta.training
            .insert("epochs_run".into(), (epoch as i64).into());
        meta.training.insert("epoch".into(), (epoch as i64).into());
        meta.training.insert("loss".into(), loss.into());
        trainer.save(&scratch, &meta)?;
        let scratch_spec = scratch.display().to_string();
        let uncalibrated = with_model(scratch_spec.clone()).decider(true)?;
        let shortlisted = shortlister.as_ref().map(|b| (b, shortlist_k));
        let held_out = args.eval.as_deref().unwrap_or(&args.data);
        let (scores, labels) = raw_scores(
            &uncalibrated,
            held_out,
            args.tools.as_ref(),
            &args.filter,
            shortlisted,
        )?;
        drop(uncalibrated);
        let Some(fit) = Calibration::fit(&scores, &labels) else {
            bail!("calibration needs both needed and unneeded tools among the held-out cases");
        };
        meta.calibration = Some(fit);
        write_manifest(&scratch, &meta)?;
        let mut line = format!(
            "epoch {epoch}/{}: loss {loss:.4}, calibration a {:.3} b {:.3}",
            args.epochs, fit.a, fit.b
        );
        let keep = if let Some(path) = &args.eval {
            let trained = with_model(scratch_spec).decider(false)?;
            let model = match shortlister.clone() {
                Some(base) => Decider::cascade(base, trained, shortlist_k)?,
                None => trained,
            };
            let reader = Cases::open(&CasesArgs {
                data: path.clone(),
                tools: args.tools.clone(),
            })?;
            let report = crate::eval::evaluate_cases(&model, reader, &args.filter, path)?;
            let r = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
            line.push_str(&format!(
                "; eval{} recall@5 {} recall@10 {} MRR {}",
                if head == TrainHead::CrossEncoder {
                    format!(" (reranking {base_spec}'s top {shortlist_k})")
                } else {
                    String::new()
                },
                r(report.recall_at_5),
                r(report.recall_at_10),
                r(report.mrr)
            ));
            let score = report.mrr.unwrap_or(0.0);
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((epoch, score));
                true
            } else {
                false
            }
        } else {
            best = Some((epoch, -loss));
            true
        };
        if keep {
            publish(&scratch, &args.out)?;
            saved_epoch = Some(epoch);
            since_best = 0;
            line.push_str(" (kept)");
        } else {
            let _ = std::fs::remove_dir_all(&scratch);
            since_best += 1;
        }
        bar.suspend(|| eprintln!("{line}"));
        if args.eval.is_some() && since_best >= args.patience {
            bar.suspend(|| {
                eprintln!(
                    "no better epoch in {} epochs: stopping early",
                    args.patience
                )
            });
            break;
        }
    }
    bar.finish_and_clear();
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let usage = match head {
        TrainHead::BiEncoder => format!("--model {}", args.out.display()),
        TrainHead::CrossEncoder => format!(
            "--model {base_spec} --rerank {} --rerank-top {shortlist_k}",
            args.out.display()
        ),
    };
    println!(
        "wrote {} (epoch {} of {}) in {minutes:.1} min; use it with {usage}",
        args.out.display(),
        saved_epoch.unwrap_or(0),
        args.epochs,
    );
    // What the run cost, for comparing recipes and machines: the epochs themselves (hard-negative
    // mining included, checkpoints and evaluation not) and the process's peak memory.
    let seconds = training_time.as_secs_f64();
    println!(
        "trained {pairs_trained} pairs in {:.1} min ({:.1} pairs/s){}",
        seconds / 60.0,
        pairs_trained as f64 / seconds.max(1e-9),
        peak_memory()
            .map(|gb| format!(", peak memory {gb:.2} GB"))
            .unwrap_or_default()
    );
    Ok(())
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
