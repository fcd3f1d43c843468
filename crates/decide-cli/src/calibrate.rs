//! `decide calibrate`: fits the Platt scaling that turns a model's raw scores into
//! probabilities, from labelled cases, and writes it to the model's manifest, with the conformal
//! table (the new probabilities of the needed tools of the same cases) that `--target-recall`
//! reads. The table's guarantee needs cases the model was not trained on.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use decide_contract::ConformalSource;
use decide_engine::{
    conformal_toml, sigmoid, Calibration, Conformal, Manifest, NeedsTool, Scoring,
};
use decide_eval::Reliability;

use crate::args::{CalibrateArgs, CasesArgs, FilterArgs, Global};
use crate::decider::Decider;
use crate::filtering::{build_filter, case_pairs, progress, provider_request};
use crate::input::Cases;

/// The (data, catalogue) pairs of `data` and `tools`: no catalogue, one for all files, or one
/// per file; catalogues without data are an error. `flags` names the two options in errors.
fn pairs(
    data: &[PathBuf],
    tools: &[PathBuf],
    flags: (&str, &str),
) -> anyhow::Result<Vec<CasesArgs>> {
    if data.is_empty() && !tools.is_empty() {
        bail!("{}: given without {}", flags.1, flags.0);
    }
    let tools: Vec<Option<PathBuf>> = match tools.len() {
        0 => vec![None; data.len()],
        1 => vec![Some(tools[0].clone()); data.len()],
        n if n == data.len() => tools.iter().cloned().map(Some).collect(),
        n => bail!(
            "{}: give one catalogue for all {} or one per {} ({} data files, {n} catalogues)",
            flags.1,
            flags.0,
            flags.0,
            data.len()
        ),
    };
    Ok(data
        .iter()
        .cloned()
        .zip(tools)
        .map(|(data, tools)| CasesArgs { data, tools })
        .collect())
}

/// `data with tools`, or `data` alone: how a manifest names where a table came from.
fn describe(input: &CasesArgs) -> String {
    match &input.tools {
        Some(t) => format!("{} with {}", input.data.display(), t.display()),
        None => input.data.display().to_string(),
    }
}

fn log_loss(scores: &[f64], labels: &[bool], cal: Calibration) -> f64 {
    scores
        .iter()
        .zip(labels)
        .map(|(s, l)| {
            let p = cal.probability(*s).clamp(1e-12, 1.0 - 1e-12);
            if *l {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / scores.len() as f64
}

fn reliability(scores: &[f64], labels: &[bool], cal: Calibration) -> Reliability {
    Reliability::new(
        scores
            .iter()
            .zip(labels)
            .map(|(s, l)| (sigmoid(cal.logit(*s)), *l)),
    )
}

/// Every (raw score, needed) pair of the cases `reader` yields, in order, and how many cases it
/// held; a case without labels is an error naming its line.
fn score_cases(
    model: &Decider,
    reader: Cases,
    filter: &FilterArgs,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(Vec<(f64, bool)>, usize)> {
    let (mut pairs, mut cases) = (Vec::new(), 0);
    for next in reader {
        let (at, case) = next?;
        let Some(expected) = &case.expected else {
            bail!("{at}: expected: missing (calibration needs labels)");
        };
        pairs.extend(case_pairs(model, &case, expected, filter, &at)?);
        cases += 1;
        bar.inc(1);
    }
    Ok((pairs, cases))
}

/// The target recalls whose thresholds `decide calibrate` prints.
const SHOWN_RECALLS: [f64; 3] = [0.9, 0.95, 0.99];

/// The files of a run, opened (and so checked) before the model loads.
struct Inputs {
    /// `--data` with its catalogues.
    data: Vec<CasesArgs>,
    /// `--conformal-data` with its catalogues.
    more: Vec<CasesArgs>,
    readers: Vec<Cases>,
    more_readers: Vec<Cases>,
    /// `--needs-tool-data`, read without catalogues.
    head_readers: Vec<Cases>,
}

impl Inputs {
    fn open(args: &CalibrateArgs) -> anyhow::Result<Self> {
        if args.filter.target_recall.is_some() {
            bail!("--target-recall: not used by calibrate, which writes the table it reads");
        }
        let data = pairs(&args.data, &args.tools, ("--data", "--tools"))?;
        let more = pairs(
            &args.conformal_data,
            &args.conformal_tools,
            ("--conformal-data", "--conformal-tools"),
        )?;
        let open = |inputs: &[CasesArgs]| {
            inputs
                .iter()
                .map(Cases::open)
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let (readers, more_readers) = (open(&data)?, open(&more)?);
        if !(0.0..=1.0).contains(&args.companion_min_probability) {
            bail!(
                "--companion-min-probability: must be between 0 and 1, but was {}",
                args.companion_min_probability
            );
        }
        let head_readers = args
            .needs_tool_data
            .iter()
            .map(|data| {
                Cases::open(&CasesArgs {
                    data: data.clone(),
                    tools: None,
                })
                .map(Cases::without_tools)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            data,
            more,
            readers,
            more_readers,
            head_readers,
        })
    }
}

/// The raw scores of the model on the cases.
struct Scored {
    /// Every (case, tool) pair of `--data`: its raw score and whether it was needed.
    scores: Vec<f64>,
    labels: Vec<bool>,
    /// `--data`'s cases.
    cases: usize,
    /// The raw scores of the needed tools of each `--conformal-data` file, and its case count.
    more_needed: Vec<(Vec<f64>, usize)>,
}

fn score_all(
    model: &Decider,
    readers: Vec<Cases>,
    more_readers: Vec<Cases>,
    filter: &FilterArgs,
) -> anyhow::Result<Scored> {
    let total = readers.iter().chain(&more_readers).map(|r| r.total).sum();
    let bar = progress(total, "scoring");
    let mut scored = Vec::new();
    let mut cases = 0;
    for reader in readers {
        let (pairs, read) = score_cases(model, reader, filter, &bar)?;
        scored.extend(pairs);
        cases += read;
    }
    let (scores, labels): (Vec<f64>, Vec<bool>) = scored.into_iter().unzip();
    let mut more_needed: Vec<(Vec<f64>, usize)> = Vec::new();
    for reader in more_readers {
        let (pairs, read) = score_cases(model, reader, filter, &bar)?;
        let needed = pairs.into_iter().filter(|(_, l)| *l).map(|(s, _)| s);
        more_needed.push((needed.collect(), read));
    }
    bar.finish_and_clear();
    Ok(Scored {
        scores,
        labels,
        cases,
        more_needed,
    })
}

/// The conformal table of the needed tools' probabilities under `stored`: one source for
/// `--data`'s cases, then one per `--conformal-data` file. `files` names `--data` in errors.
fn conformal_table(
    scored: &Scored,
    stored: Calibration,
    data: &[CasesArgs],
    more: &[CasesArgs],
    files: &str,
) -> anyhow::Result<Conformal> {
    let source = data.iter().map(describe).collect::<Vec<_>>().join(", ");
    let Some(first) = ConformalSource::from_needed(
        scored
            .scores
            .iter()
            .zip(&scored.labels)
            .filter(|(_, needed)| **needed)
            .map(|(s, _)| stored.probability(*s)),
    ) else {
        bail!("{files}: a needed tool's probability is not a number");
    };
    let mut sources = vec![first.with_cases(scored.cases).with_source(source)];
    for ((needed, read), input) in scored.more_needed.iter().zip(more) {
        let at = input.data.display();
        if needed.is_empty() {
            bail!("{at}: no case needs a tool, so it has nothing for --target-recall to cover");
        }
        let Some(table) =
            ConformalSource::from_needed(needed.iter().map(|s| stored.probability(*s)))
        else {
            bail!("{at}: a needed tool's probability is not a number");
        };
        sources.push(table.with_cases(*read).with_source(describe(input)));
    }
    let Some(conformal) = Conformal::from_sources(sources) else {
        bail!("{files}: no conformal source");
    };
    Ok(conformal)
}

/// How well a calibration fits the scored pairs.
struct Quality {
    calibration: Calibration,
    log_loss: f64,
    reliability: Reliability,
}

impl Quality {
    fn of(scored: &Scored, calibration: Calibration) -> Self {
        Self {
            calibration,
            log_loss: log_loss(&scored.scores, &scored.labels, calibration),
            reliability: reliability(&scored.scores, &scored.labels, calibration),
        }
    }
}

/// What a run found and wrote, for the printing.
struct Outcome {
    /// `--data`'s files, as the first line names them.
    files: String,
    cases: usize,
    pairs: usize,
    positives: usize,
    /// The model's calibration before, if it had one, and the new fit.
    before: Option<Quality>,
    after: Quality,
    conformal: Conformal,
    /// The whole table's thresholds at [`SHOWN_RECALLS`].
    thresholds: Vec<(f64, f64)>,
    head: Option<(NeedsTool, Fitted)>,
    /// The manifest written, if the model has one and `--dry-run` is not given.
    written: Option<PathBuf>,
}

pub fn run(global: &Global, args: CalibrateArgs) -> anyhow::Result<()> {
    // Every file is read (and its errors reported) before the model loads.
    let Inputs {
        data,
        more,
        readers,
        more_readers,
        head_readers,
    } = Inputs::open(&args)?;
    let model = global.decider(true)?;
    let scored = score_all(&model, readers, more_readers, &args.filter)?;
    let files = args
        .data
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(fit) = Calibration::fit(&scored.scores, &scored.labels) else {
        bail!("{files}: calibration needs both needed and unneeded tools");
    };
    // The probabilities decisions will give: the fit as the manifest stores it, rounded.
    let stored = Calibration {
        a: round4(fit.a),
        b: round4(fit.b),
    };
    let conformal = conformal_table(&scored, stored, &data, &more, &files)?;
    let thresholds = shown_thresholds(|r| conformal.threshold(r))?;
    let about = model.about();
    let before = about.calibration.map(|c| Quality::of(&scored, c));
    let after = Quality::of(&scored, fit);
    if let Some(path) = &args.plot {
        let title = format!("{}: reliability on {} cases", about.name, scored.cases);
        let mut curves = Vec::new();
        if let Some(b) = &before {
            curves.push(("before", &b.reliability));
        }
        curves.push(("after", &after.reliability));
        crate::plot::reliability_png(path, &title, &curves)?;
    }
    let head = match head_readers.is_empty() {
        true => None,
        false => Some(fit_needs_tool(&model, head_readers, &args)?),
    };
    let written = if args.dry_run {
        None
    } else {
        write_manifest(&model, fit, &conformal, head.as_ref().map(|(h, _)| h))?
    };
    let outcome = Outcome {
        files,
        cases: scored.cases,
        pairs: scored.scores.len(),
        positives: scored.labels.iter().filter(|l| **l).count(),
        before,
        after,
        conformal,
        thresholds,
        head,
        written,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        return print_json(&mut out, &model, &outcome);
    }
    print_text(&mut out, &model, &outcome, &args)
}

/// The outcome as one JSON object on one line.
fn print_json(out: &mut impl Write, model: &Decider, o: &Outcome) -> anyhow::Result<()> {
    let (fit, conformal) = (o.after.calibration, &o.conformal);
    let about = model.about();
    let line = serde_json::json!({
        "model": about.name, "a": fit.a, "b": fit.b,
        "lexical_weight": about.lexical_weight,
        "tool_parameters": about.tool_parameters,
        "tool_server": about.tool_server,
        "cases": o.cases, "pairs": o.pairs, "positives": o.positives,
        "log_loss": o.after.log_loss, "ece": o.after.reliability.ece,
        "log_loss_before": o.before.as_ref().map(|b| b.log_loss),
        "ece_before": o.before.as_ref().map(|b| b.reliability.ece),
        "conformal": {
            "needed": conformal.len(), "cases": conformal.cases(),
            "thresholds": recall_map(&o.thresholds),
            "sources": conformal.sources().iter().map(|s| Ok(serde_json::json!({
                "source": s.source(), "needed": s.len(), "cases": s.cases(),
                "thresholds": recall_map(&shown_thresholds(|r| s.threshold(r))?),
            }))).collect::<anyhow::Result<Vec<_>>>()?,
        },
        "needs_tool": o.head.as_ref().map(|(h, fitted)| serde_json::json!({
            "cases": h.cases, "no_tool_cases": fitted.no_tool,
            "companion_min_probability": h.companion_min_probability,
            "tool_cases_at_half": fitted.tool_at_half, "no_tool_cases_at_half": fitted.no_tool_at_half,
        })),
        "written": o.written.as_ref().map(|p| p.display().to_string()),
    });
    writeln!(out, "{line}")?;
    Ok(())
}

/// The outcome as lines for a person: the fits before and after, the conformal thresholds,
/// the needs-tool head, and where it all went.
fn print_text(
    out: &mut impl Write,
    model: &Decider,
    o: &Outcome,
    args: &CalibrateArgs,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "{} on {}: {} cases, {} pairs ({} needed)",
        model.about().name,
        o.files,
        o.cases,
        o.pairs,
        o.positives
    )?;
    match &o.before {
        Some(b) => writeln!(
            out,
            "  before: a = {:.4}, b = {:.4}   log loss {:.4}   ECE {:.4}",
            b.calibration.a, b.calibration.b, b.log_loss, b.reliability.ece
        )?,
        None => writeln!(out, "  before: uncalibrated")?,
    }
    let fit = o.after.calibration;
    writeln!(
        out,
        "  after:  a = {:.4}, b = {:.4}   log loss {:.4}   ECE {:.4}",
        fit.a, fit.b, o.after.log_loss, o.after.reliability.ece
    )?;
    print_conformal(out, &o.conformal, &o.thresholds)?;
    if let Some((h, fitted)) = &o.head {
        writeln!(
            out,
            "  needs-tool head: {} conversations ({} needing no tool) from {}; on them, {:.3} of those \
             needing a tool and {:.3} of the others on the right side of 0.5; further tools from {}",
            h.cases,
            fitted.no_tool,
            h.source,
            fitted.tool_at_half,
            fitted.no_tool_at_half,
            h.companion_min_probability
        )?;
    }
    match &o.written {
        Some(path) => writeln!(out, "written to {}", path.display())?,
        None => writeln!(
            out,
            "[calibration]\na = {:.4}\nb = {:.4}\n\n{}",
            round4(fit.a),
            round4(fit.b),
            conformal_toml(&o.conformal)
        )?,
    }
    if let Some(path) = &args.plot {
        writeln!(out, "reliability plot: {}", path.display())?;
    }
    Ok(())
}

/// The conformal thresholds: of each source and the lowest, or of the one source.
fn print_conformal(
    out: &mut impl Write,
    conformal: &Conformal,
    thresholds: &[(f64, f64)],
) -> anyhow::Result<()> {
    if let [_, _, ..] = conformal.sources() {
        for s in conformal.sources() {
            writeln!(
                out,
                "  conformal source {}: {} needed tools of {} cases: threshold {}",
                s.source(),
                s.len(),
                s.cases(),
                shown(&shown_thresholds(|r| s.threshold(r))?)
            )?;
        }
        writeln!(
            out,
            "  conformal, the lowest of the {} sources: threshold {}",
            conformal.sources().len(),
            shown(thresholds)
        )?;
    } else {
        writeln!(
            out,
            "  conformal: {} needed tools: threshold {}",
            conformal.len(),
            shown(thresholds)
        )?;
    }
    Ok(())
}

/// `(R, threshold)` for each of [`SHOWN_RECALLS`], by `threshold`: a table's or one source's.
fn shown_thresholds(
    threshold: impl Fn(f64) -> Result<f64, decide_contract::InvalidTargetRecall>,
) -> anyhow::Result<Vec<(f64, f64)>> {
    Ok(SHOWN_RECALLS
        .iter()
        .map(|&r| Ok((r, threshold(r)?)))
        .collect::<Result<_, decide_contract::InvalidTargetRecall>>()?)
}

fn recall_map(thresholds: &[(f64, f64)]) -> serde_json::Map<String, serde_json::Value> {
    thresholds
        .iter()
        .map(|(r, t)| (r.to_string(), serde_json::json!(t)))
        .collect()
}

fn shown(thresholds: &[(f64, f64)]) -> String {
    thresholds
        .iter()
        .map(|(r, t)| format!("{t:.4} for recall {r}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Writes the fit (and the lexical weight it was fitted with) and the conformal table into the
/// model's manifest, keeping everything else of the file as it was. Returns the path, or `None`
/// (after saying why on stderr) when the model has no manifest to write to.
fn write_manifest(
    model: &Decider,
    fit: Calibration,
    conformal: &Conformal,
    head: Option<&NeedsTool>,
) -> anyhow::Result<Option<PathBuf>> {
    let about = model.about();
    let Some(dir) = about.model_dir else {
        eprintln!(
            "note: {} has no manifest: the fit is printed below",
            about.name
        );
        return Ok(None);
    };
    let path = dir.join("manifest.toml");
    if !path.is_file() {
        eprintln!(
            "note: {} has no manifest.toml: the fit is printed below",
            dir.display()
        );
        return Ok(None);
    }
    let scoring = Scoring {
        lexical_weight: about.lexical_weight,
        tool_parameters: about.tool_parameters,
        tool_server: about.tool_server,
    };
    Manifest::update_calibration(&path, fit, scoring, conformal)?;
    if let Some(head) = head {
        Manifest::update_needs_tool(&path, head)?;
    }
    Ok(Some(path))
}

/// How the needs-tool head does on the conversations it was fitted on.
struct Fitted {
    no_tool: usize,
    tool_at_half: f64,
    no_tool_at_half: f64,
}

/// Fits the needs-tool head on the distinct conversations of `readers`, each seen as a decision
/// sees it (the filter's input), the first label of a conversation written twice kept.
fn fit_needs_tool(
    model: &Decider,
    readers: Vec<Cases>,
    args: &CalibrateArgs,
) -> anyhow::Result<(NeedsTool, Fitted)> {
    let filter = build_filter(model, Vec::new(), &args.filter)?;
    let mut inputs = Vec::new();
    let mut labels = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for reader in readers {
        for next in reader {
            let (at, case) = next?;
            let Some(expected) = &case.expected else {
                bail!("{at}: expected: missing (the needs-tool head needs labels; [] for a conversation that needs no tool)");
            };
            let request = provider_request(&case.messages).with_context(|| at.clone())?;
            let Some(input) = filter.decision_input(&request) else {
                bail!("{at}: the user message has no text");
            };
            if seen.insert(input.render()) {
                inputs.push(input);
                labels.push(!expected.is_empty());
            }
        }
    }
    const CHUNK: usize = 256;
    let bar = progress(inputs.len() as u64, "embedding conversations");
    let mut embeddings = Vec::with_capacity(inputs.len());
    for chunk in inputs.chunks(CHUNK) {
        embeddings.extend(model.conversation_embeddings(chunk)?);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let source = args
        .needs_tool_data
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(head) = NeedsTool::fit(
        &embeddings,
        &labels,
        args.companion_min_probability,
        source.clone(),
    ) else {
        bail!("--needs-tool-data {source}: the head needs conversations that need a tool and conversations that need none");
    };
    // The head as the manifest stores it, rounded, is the one measured.
    let stored = head.rounded();
    let share = |want: bool| {
        let (mut hit, mut n) = (0usize, 0usize);
        for (e, &l) in embeddings.iter().zip(&labels) {
            if l == want {
                n += 1;
                let p = stored.probability_of(e).unwrap_or(0.5);
                hit += usize::from((p >= 0.5) == want);
            }
        }
        hit as f64 / n.max(1) as f64
    };
    let fitted = Fitted {
        no_tool: labels.iter().filter(|l| !**l).count(),
        tool_at_half: share(true),
        no_tool_at_half: share(false),
    };
    Ok((head, fitted))
}
