//! `decide eval`: how good the tool selection is on labelled cases, as a table or one JSON object.
//!
//! Every case goes through the same filter as `decide select` and `decide score`; the metrics themselves live in
//! `decide-eval`, where they are tested on hand-computed numbers.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use decide_eval::{
    evaluate_with, ranking, split_by_seen, Candidate, NeededRanks, Report, Rule, ScoredCase,
    SeenSplit,
};
use serde_json::{json, Value};

use crate::args::{CasesArgs, EvalArgs, FilterArgs, Global};
use crate::decider::Decider;
use crate::filtering::{build_filter_scoring, progress, select};
use crate::input::Cases;

pub fn run(global: &Global, args: EvalArgs) -> anyhow::Result<()> {
    // The selected set is measured at the threshold alone; recall@k already says what keeping only the k most
    // probable tools would find, so a cut by --max-results would only blur precision and recall.
    if args.filter.max_results.is_some() {
        bail!("--max-results: not used by eval, which measures the selection at its threshold (see recall@k for the top k)");
    }
    let reader = Cases::open(&args.cases)?;
    // Read before the model loads, so that a bad file fails at once.
    let seen = (!args.seen_in.is_empty())
        .then(|| seen_tools(&args.seen_in, args.cases.tools.as_deref()))
        .transpose()?;
    // Created before the model loads, so that a bad path fails at once.
    let mut cases_out = args
        .cases_out
        .as_deref()
        .map(CasesOut::create)
        .transpose()?;
    let engine = global.decider(false)?;
    let (report, cases) = evaluate_cases_to(
        &engine,
        reader,
        &args.filter,
        &args.cases.data,
        cases_out.as_mut(),
    )?;
    if let Some(c) = cases_out {
        c.finish()?;
    }
    let split = match &seen {
        Some(tools) => Some(SeenIn {
            files: args
                .seen_in
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            tools: tools.len(),
            split: split_by_seen(&cases, tools)
                .with_context(|| args.cases.data.display().to_string())?,
        }),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        return print_json(&mut out, &report, &engine, &args, split.as_ref());
    }
    print_text(&mut out, &report, &engine, &args, split.as_ref())
}

/// `--seen-in`'s files, how many tools they name, and the needed pairs split by them.
struct SeenIn {
    files: Vec<String>,
    tools: usize,
    split: SeenSplit,
}

/// The report as one JSON object, with the model, the target recall and the `--seen-in` split.
fn print_json(
    out: &mut impl Write,
    report: &Report,
    engine: &Decider,
    args: &EvalArgs,
    seen: Option<&SeenIn>,
) -> anyhow::Result<()> {
    let mut json = serde_json::to_value(report)?;
    if let Some(map) = json.as_object_mut() {
        map.insert("model".into(), engine.about().name.into());
        map.insert("target_recall".into(), args.filter.target_recall.into());
        if let Some(s) = seen {
            map.insert(
                "seen_in".into(),
                json!({"files": s.files, "tools": s.tools, "seen": s.split.seen, "unseen": s.split.unseen}),
            );
        }
    }
    writeln!(out, "{json}")?;
    Ok(())
}

/// The report as a table: what was measured, at which threshold, the metrics, and the
/// `--seen-in` split.
fn print_text(
    out: &mut impl Write,
    report: &Report,
    engine: &Decider,
    args: &EvalArgs,
    seen: Option<&SeenIn>,
) -> anyhow::Result<()> {
    let about = engine.about();
    writeln!(
        out,
        "{} cases from {} ({} with one tool, {} with any, {} with none), {} pairs, {} on {}",
        report.cases,
        args.cases.data.display(),
        report.single_tool_cases,
        report.tool_cases,
        report.no_tool_cases,
        report.pairs,
        about.name,
        about.device
    )?;
    print_threshold(out, report, engine, args.filter.target_recall)?;
    for (metric, value) in table(report) {
        writeln!(out, "  {metric:<44}{value:>10}")?;
    }
    if let Some(s) = seen {
        writeln!(
            out,
            "needed (case, tool) pairs split by --seen-in {} ({} tools named there):",
            s.files.join(", "),
            s.tools
        )?;
        for (metric, value) in seen_table(&s.split) {
            writeln!(out, "  {metric:<44}{value:>10}")?;
        }
    }
    Ok(())
}

/// Where the selection's threshold came from: `--target-recall` and the conformal table, or
/// `--min-probability` (with the needs-tool gate's companion threshold when there is one).
fn print_threshold(
    out: &mut impl Write,
    report: &Report,
    engine: &Decider,
    target_recall: Option<f64>,
) -> anyhow::Result<()> {
    match (target_recall, engine.about().conformal) {
        (Some(r), Some(c)) => writeln!(
            out,
            "threshold {} from --target-recall {r} (conformal: {} needed tools of {} cases from {})",
            report.threshold,
            c.len(),
            c.cases(),
            match c.source() {
                s if s.is_empty() => "unknown data".to_string(),
                s if c.sources().len() > 1 => format!("{s}, the lowest of their thresholds"),
                s => s,
            }
        )?,
        _ => match report.companion_min_probability {
            Some(companion) => writeln!(
                out,
                "needs-tool gate at {} (--min-probability), then tools from {companion} (the model's) or {} of the best among the first {}",
                report.threshold,
                decide_contract::COMPANION_SHARE,
                decide_contract::COMPANION_RANKS
            )?,
            None => writeln!(out, "threshold {} (--min-probability)", report.threshold)?,
        },
    }
    Ok(())
}

/// `--seen-in`: the tool names in any `expected` of the files, each read as `eval` reads its `--data` (with the
/// same `--tools`), so a bad file is named with its line. A line without `expected` names no tool.
fn seen_tools(files: &[PathBuf], tools: Option<&Path>) -> anyhow::Result<HashSet<String>> {
    let mut seen = HashSet::new();
    for file in files {
        let reader = Cases::open(&CasesArgs {
            data: file.clone(),
            tools: tools.map(Path::to_path_buf),
        })
        .context("--seen-in")?;
        for next in reader {
            let (_, case) = next.context("--seen-in")?;
            seen.extend(case.expected.into_iter().flatten());
        }
    }
    Ok(seen)
}

/// Runs every case of `reader` through the filter over `engine` and measures the selection:
/// what `decide eval` prints, and what `decide train` checks after each epoch.
pub fn evaluate_cases(
    engine: &Decider,
    reader: Cases,
    filter: &FilterArgs,
    data: &Path,
) -> anyhow::Result<Report> {
    Ok(evaluate_cases_to(engine, reader, filter, data, None)?.0)
}

/// [`evaluate_cases`], also writing each case's ranking to `cases_out` (`--cases-out`) when given, and returning
/// the scored cases with the report.
fn evaluate_cases_to(
    engine: &Decider,
    reader: Cases,
    filter: &FilterArgs,
    data: &Path,
    mut cases_out: Option<&mut CasesOut>,
) -> anyhow::Result<(Report, Vec<ScoredCase>)> {
    let bar = progress(reader.total, "evaluating");
    let mut cases = Vec::new();
    // The threshold the filter itself selects at: --min-probability, or --target-recall's from the
    // model's conformal table, so that the metrics at the threshold measure what select passes on.
    let mut rule = Rule::Threshold(
        filter
            .min_probability
            .unwrap_or(decide_filter::DEFAULT_MIN_PROBABILITY),
    );
    for next in reader {
        let (at, case) = next?;
        let at = || at.clone();
        let Some(expected) = case.expected else {
            bail!(
                "{}: expected: missing (evaluation needs labels; [] for a case that needs no tool)",
                at()
            );
        };
        let started = Instant::now();
        // Called tools are scored too: they pass either way, but ranked at 1.0 they would measure
        // the conversation's history rather than the model.
        let provider = build_filter_scoring(engine, case.tools, filter, true)?;
        rule = match provider.companion_min_probability() {
            Some(companion_min_probability) => Rule::Gate {
                min_probability: provider.min_probability(),
                companion_min_probability,
            },
            None => Rule::Threshold(provider.min_probability()),
        };
        let selection = select(&provider, &case.messages).with_context(at)?;
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        // A fallback passes tools without probabilities: measuring it would score the fallback, not the model.
        if let Some(f) = &selection.fallback {
            bail!("{}: the decision model failed: {}", at(), f.reason);
        }
        let mut candidates = Vec::with_capacity(selection.decisions.len());
        let mut pairs = 0;
        for s in &selection.decisions {
            let passed = s.reason.is_without_asking();
            let probability = match (s.probability, passed) {
                (Some(p), _) => {
                    pairs += 1;
                    p
                }
                // Passed without asking and not scored: certain, as far as the selection goes.
                (None, true) => 1.0,
                (None, false) => bail!("{}: tool \"{}\": no probability", at(), s.name),
            };
            candidates.push(if passed {
                Candidate::passed(s.name.clone(), probability)
            } else {
                Candidate::new(s.name.clone(), probability)
            });
        }
        let scored = ScoredCase::new(expected, candidates, latency_ms, pairs)
            .with_needs_tool(selection.gate.and_then(|g| g.answer));
        // Checked here, where the line number is known, rather than by `evaluate` at the end.
        scored
            .check()
            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        if let Some(out) = cases_out.as_deref_mut() {
            out.write(&case.id, &scored, rule)?;
        }
        cases.push(scored);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let report = evaluate_with(&cases, rule).with_context(|| data.display().to_string())?;
    Ok((report, cases))
}

/// `--cases-out`: one JSON line per case, `{"id", "expected", "passed": [names], "ranking": [{"tool", "probability"},
/// ...]}`: what the selection rule passes on, and the candidates in the rank order the metrics use ([`ranking`]:
/// probability descending, ties in catalogue order).
struct CasesOut {
    path: PathBuf,
    out: BufWriter<File>,
}

impl CasesOut {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("--cases-out {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    fn write(&mut self, id: &Value, case: &ScoredCase, rule: Rule) -> anyhow::Result<()> {
        let ranked: Vec<Value> = ranking(&case.candidates)
            .into_iter()
            .map(|i| {
                let c = &case.candidates[i];
                json!({"tool": c.name, "probability": c.probability})
            })
            .collect();
        let mut line = json!({
            "id": id,
            "expected": case.expected,
            "passed": case.passed(rule),
            "ranking": ranked,
        });
        if let Some(p) = case.needs_tool {
            line["needs_tool"] = json!(p);
        }
        writeln!(self.out, "{line}").with_context(|| format!("--cases-out {}", self.path.display()))
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("--cases-out {}", self.path.display()))
    }
}

/// The report as (metric, value) rows; a metric with nothing to average over reads "n/a".
fn table(r: &Report) -> Vec<(String, String)> {
    let ratio = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}"));
    let t = r.threshold;
    vec![
        (
            "top-1 accuracy (single-tool cases)".into(),
            ratio(r.top1_accuracy),
        ),
        ("recall@1".into(), ratio(r.recall_at_1)),
        ("recall@3".into(), ratio(r.recall_at_3)),
        ("recall@5".into(), ratio(r.recall_at_5)),
        ("recall@10".into(), ratio(r.recall_at_10)),
        ("MRR".into(), ratio(r.mrr)),
        (format!("precision at {t}"), ratio(r.precision)),
        (format!("recall at {t}"), ratio(r.recall)),
        (
            format!("cases with every needed tool at {t}"),
            ratio(r.all_needed_selected),
        ),
        (
            format!("no-tool cases, nothing selected at {t}"),
            ratio(r.no_tool_none_selected),
        ),
        (
            format!("tools selected per case at {t}"),
            format!("{:.2}", r.mean_selected),
        ),
        (
            "calibration error (ECE, 10 bins)".into(),
            format!("{:.3}", r.ece),
        ),
        (
            "latency p50 (ms)".into(),
            format!("{:.1}", r.latency_p50_ms),
        ),
        (
            "latency p95 (ms)".into(),
            format!("{:.1}", r.latency_p95_ms),
        ),
        (
            "pairs per second".into(),
            r.pairs_per_second
                .map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}")),
        ),
    ]
}

/// `--seen-in`'s rows: each group's needed pairs, recall@5/10 and MRR over them ("n/a" for an empty group).
fn seen_table(split: &SeenSplit) -> Vec<(String, String)> {
    let ratio = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}"));
    let group = |label: &str, g: &NeededRanks| {
        vec![
            (
                format!("{label}: needed (case, tool) pairs"),
                g.needed.to_string(),
            ),
            (format!("{label}: recall@5"), ratio(g.recall_at_5)),
            (format!("{label}: recall@10"), ratio(g.recall_at_10)),
            (format!("{label}: MRR (every needed tool)"), ratio(g.mrr)),
        ]
    };
    let mut rows = group("seen", &split.seen);
    rows.extend(group("unseen", &split.unseen));
    rows
}
