//! `decide train`: fine-tunes the decision model on labelled cases and writes a model folder.
//!
//! Everything that can be wrong with the data (unreadable or empty files, unknown tools,
//! duplicate ids, cases shared by the training and evaluation files) is reported before the
//! model loads. After each epoch the weights are written to a scratch folder next to `--out`,
//! calibrated (Platt, on `--eval` when given, else on the training cases), measured on `--eval`
//! with `decide eval`'s own code, and moved into `--out` when they are the best so far: `--out`
//! always holds a complete, loadable model, also after Ctrl-C.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use decide_engine::{candidate_text, registry, Calibration};
use decide_train::{file_sha256, write_manifest, Example, Hyper, ModelMeta, TrainData, Trainer};

use crate::args::{CasesArgs, FilterArgs, Global, TrainArgs};
use crate::decider::Decider;
use crate::input::{Case, Cases};
use crate::select::{build_filter, provider_request};

/// A labelled case with where it came from.
struct Labelled {
    at: String,
    case: Case,
    expected: Vec<String>,
}

/// Reads every case of a file, checking each (the reader checks JSON, tools, unknown expected
/// tools and duplicate ids); cases without `expected` are errors.
fn read_cases(data: &Path, tools: Option<&PathBuf>) -> anyhow::Result<Vec<Labelled>> {
    let reader = Cases::open(&CasesArgs {
        data: data.to_path_buf(),
        tools: tools.cloned(),
    })?;
    let mut out = Vec::new();
    for next in reader {
        let (at, case) = next?;
        let Some(expected) = case.expected.clone() else {
            bail!(
                "{at}: expected: missing (training needs labels; [] for a case that needs no tool)"
            );
        };
        out.push(Labelled { at, case, expected });
    }
    Ok(out)
}

/// A conversation's identity for the overlap check: its parsed messages.
fn conversation_key(case: &Case) -> String {
    format!("{:?}", case.messages)
}

/// A case of the evaluation file that is also in the training file (same id or same
/// conversation) would measure memory, not generalisation.
fn check_overlap(train: &[Labelled], eval: &[Labelled]) -> anyhow::Result<()> {
    let ids: HashMap<String, &str> = train
        .iter()
        .map(|l| (l.case.id.to_string(), l.at.as_str()))
        .collect();
    let convs: HashMap<String, &str> = train
        .iter()
        .map(|l| (conversation_key(&l.case), l.at.as_str()))
        .collect();
    for l in eval {
        if let Some(at) = ids.get(&l.case.id.to_string()) {
            bail!(
                "{}: id: {} is also a training case ({at}); the evaluation cases must not overlap the training cases",
                l.at,
                l.case.id
            );
        }
        if let Some(at) = convs.get(&conversation_key(&l.case)) {
            bail!(
                "{}: messages: the same conversation is a training case ({at}); the evaluation cases must not overlap the training cases",
                l.at
            );
        }
    }
    Ok(())
}

/// The raw scores and labels of every (case, tool) pair, as `decide calibrate` forms them.
fn raw_scores(
    model: &Decider,
    cases: &[Labelled],
    filter: &FilterArgs,
) -> anyhow::Result<(Vec<f64>, Vec<bool>)> {
    let mut scores = Vec::new();
    let mut labels = Vec::new();
    for l in cases {
        for (s, label) in crate::calibrate::case_pairs(model, &l.case, &l.expected, filter, &l.at)?
        {
            scores.push(s);
            labels.push(label);
        }
    }
    Ok((scores, labels))
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

/// Moves the checkpoint in `scratch` to `out`, replacing what was there.
fn publish(scratch: &Path, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| out.display().to_string())?;
    }
    std::fs::rename(scratch, out).with_context(|| out.display().to_string())
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
    let trained = std::fs::read_to_string(out.join("manifest.toml"))
        .map(|m| m.starts_with("# Written by `decide train`"))
        .unwrap_or(false);
    if !empty && !trained {
        bail!(
            "--out {}: exists and is not a model written by decide train; give a new folder",
            out.display()
        );
    }
    Ok(())
}

pub fn run(global: &Global, args: TrainArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // The data first: every error before any model loads.
    let train = read_cases(&args.data, args.tools.as_ref())?;
    let eval = match &args.eval {
        Some(p) => {
            let e = read_cases(p, args.tools.as_ref())?;
            check_overlap(&train, &e)?;
            Some(e)
        }
        None => None,
    };
    check_out(&args.out)?;
    let hyper = Hyper {
        epochs: args.epochs,
        learning_rate: args.lr,
        batch_size: args.batch_size,
        max_length: args.max_length,
        seed: args.seed,
        hard_negative_pool: args.hard_negatives,
        ..Hyper::default()
    };
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
    // conversation, and each tool's candidate text.
    let mut documents: Vec<String> = Vec::new();
    let mut doc_index: HashMap<String, usize> = HashMap::new();
    let mut examples = Vec::new();
    let mut no_tool = 0;
    for l in &train {
        let provider = build_filter(&base_model, l.case.tools.clone(), &args.filter)?;
        let request = provider_request(&l.case.messages).with_context(|| l.at.clone())?;
        let Some(input) = provider.decision_input(&request) else {
            bail!("{}: the user message has no text", l.at);
        };
        let mut positives = Vec::new();
        for tool in &l.case.tools {
            let text = candidate_text(&tool.name, tool.description.as_deref().unwrap_or(""));
            let next = documents.len();
            let idx = *doc_index.entry(text.clone()).or_insert(next);
            if idx == next {
                documents.push(text);
            }
            if l.expected.contains(&tool.name) && !positives.contains(&idx) {
                positives.push(idx);
            }
        }
        if positives.is_empty() {
            // A case that needs no tool has no positive to pull towards; its tools still serve
            // as negatives for the others.
            no_tool += 1;
            continue;
        }
        examples.push(Example {
            query: input.render(),
            positives,
        });
    }
    let device = global.device.open()?;
    let mut trainer = Trainer::new(
        &location.dir,
        TrainData {
            documents,
            examples,
        },
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
    training.insert("cases".into(), (train.len() as i64).into());
    training.insert("no_tool_cases_skipped".into(), (no_tool as i64).into());
    training.insert("pairs".into(), (trainer.pairs_per_epoch() as i64).into());
    training.insert(
        "calibrated_on".into(),
        (if args.eval.is_some() { "eval" } else { "data" }).into(),
    );
    let mut meta = ModelMeta {
        name,
        base_hf_id: base_manifest
            .as_ref()
            .map(|m| m.hf_id.clone())
            .unwrap_or_else(|| base_spec.clone()),
        base: base_spec.clone(),
        max_length: base_manifest
            .as_ref()
            .map(|m| m.max_length)
            .unwrap_or(args.max_length),
        license: base_manifest.as_ref().and_then(|m| m.license.clone()),
        lexical_weight: base_manifest
            .as_ref()
            .and_then(|m| m.scoring)
            .map(|s| s.lexical_weight),
        calibration: None,
        training,
    };

    eprintln!(
        "training {base_spec} on {} ({} cases, {} pairs, {no_tool} no-tool cases skipped) for {} epochs, {} steps, on {}",
        args.data.display(),
        train.len(),
        trainer.pairs_per_epoch(),
        args.epochs,
        trainer.total_steps(),
        global.device
    );
    let stop = interrupt_flag();
    let per_epoch = trainer.pairs_per_epoch() as u64;
    let bar = crate::score::progress(per_epoch * args.epochs as u64, "training");
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {pos}/{len} pairs ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let scratch = args.out.with_extension("partial");
    let _ = std::fs::remove_dir_all(&scratch);
    let mut best: Option<(usize, f64)> = None;
    let mut since_best = 0;
    let mut saved_epoch = None;
    for epoch in 1..=args.epochs {
        let mut loss_sum = 0.0;
        let mut steps = 0;
        let complete = trainer.run_epoch(&mut |r| {
            loss_sum += r.loss as f64;
            steps += 1;
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
            match saved_epoch {
                Some(e) => bail!(
                    "interrupted in epoch {epoch}: {} holds epoch {e}, the last complete checkpoint, and loads with --model",
                    args.out.display()
                ),
                None => bail!("interrupted in epoch {epoch}, before any epoch completed: nothing was written"),
            }
        }
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
        let held_out = eval.as_deref().unwrap_or(&train);
        let (scores, labels) = raw_scores(&uncalibrated, held_out, &args.filter)?;
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
            let model = with_model(scratch_spec).decider(false)?;
            let reader = Cases::open(&CasesArgs {
                data: path.clone(),
                tools: args.tools.clone(),
            })?;
            let report = crate::eval::evaluate_cases(&model, reader, &args.filter, path)?;
            let r = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
            line.push_str(&format!(
                "; eval recall@5 {} recall@10 {} MRR {}",
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
    println!(
        "wrote {} (epoch {} of {}) in {minutes:.1} min; use it with --model {}",
        args.out.display(),
        saved_epoch.unwrap_or(0),
        args.epochs,
        args.out.display()
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
        let t = read_cases(&train, Some(&tools)).unwrap();
        let e = read_cases(&same_id, Some(&tools)).unwrap();
        let err = check_overlap(&t, &e).unwrap_err().to_string();
        assert!(
            err.contains("e1.jsonl:1: id: \"2\" is also a training case"),
            "{err}"
        );
        let e = read_cases(&same_text, Some(&tools)).unwrap();
        let err = check_overlap(&t, &e).unwrap_err().to_string();
        assert!(
            err.contains("e2.jsonl:1: messages: the same conversation"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
