//! `decide calibrate`: fits the Platt scaling that turns a model's raw scores into
//! probabilities, from labelled cases, and writes it to the model's manifest.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use decide_chat::ToolSpecification;
use decide_engine::{sigmoid, Calibration};
use decide_eval::Reliability;

use crate::args::{CalibrateArgs, CasesArgs, FilterArgs, Global};
use crate::decider::Decider;
use crate::input::{Case, Cases};
use crate::score::progress;
use crate::select::{build_filter, provider_request};

/// The (data, catalogue) pairs the arguments name.
fn inputs(args: &CalibrateArgs) -> anyhow::Result<Vec<CasesArgs>> {
    let tools: Vec<Option<PathBuf>> = match args.tools.len() {
        0 => vec![None; args.data.len()],
        1 => vec![Some(args.tools[0].clone()); args.data.len()],
        n if n == args.data.len() => args.tools.iter().cloned().map(Some).collect(),
        n => bail!(
            "--tools: give one catalogue for all --data or one per --data ({} data files, {n} catalogues)",
            args.data.len()
        ),
    };
    Ok(args
        .data
        .iter()
        .cloned()
        .zip(tools)
        .map(|(data, tools)| CasesArgs { data, tools })
        .collect())
}

/// The raw score of every tool of `case` and whether it is in `expected`, in catalogue order,
/// from the requests the filter would send, so a fit sees exactly the scores decisions are made
/// on. `at` names the case in errors.
pub fn case_pairs(
    model: &Decider,
    case: &Case,
    expected: &[String],
    filter: &FilterArgs,
    at: &str,
) -> anyhow::Result<Vec<(f64, bool)>> {
    let provider = build_filter(model, case.tools.clone(), filter)?;
    let request = provider_request(&case.messages).with_context(|| at.to_string())?;
    let Some(input) = provider.decision_input(&request) else {
        bail!("{at}: the user message has no text");
    };
    let tools: Vec<&ToolSpecification> = case.tools.iter().collect();
    let mut raw = Vec::with_capacity(tools.len());
    for decision in provider.decision_requests(&input, &tools)? {
        raw.extend(model.yes_no_scores(&decision)?.into_iter().map(|(_, s)| s));
    }
    Ok(case
        .tools
        .iter()
        .zip(raw)
        .map(|(tool, s)| (s, expected.contains(&tool.name)))
        .collect())
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

pub fn run(global: &Global, args: CalibrateArgs) -> anyhow::Result<()> {
    let inputs = inputs(&args)?;
    // Every file is read (and its errors reported) before the model loads.
    let readers = inputs
        .iter()
        .map(Cases::open)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let model = global.decider(true)?;
    let bar = progress(readers.iter().map(|r| r.total).sum(), "scoring");
    let mut scores = Vec::new();
    let mut labels = Vec::new();
    let mut cases = 0;
    for reader in readers {
        for next in reader {
            let (at, case) = next?;
            let Some(expected) = &case.expected else {
                bail!("{at}: expected: missing (calibration needs labels)");
            };
            for (s, label) in case_pairs(&model, &case, expected, &args.filter, &at)? {
                scores.push(s);
                labels.push(label);
            }
            cases += 1;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let files = args
        .data
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(fit) = Calibration::fit(&scores, &labels) else {
        bail!("{files}: calibration needs both needed and unneeded tools");
    };
    let positives = labels.iter().filter(|l| **l).count();
    let before = model.calibration();
    let after = reliability(&scores, &labels, fit);
    let before_rel = before.map(|c| reliability(&scores, &labels, c));
    let loss_after = log_loss(&scores, &labels, fit);
    let loss_before = before.map(|c| log_loss(&scores, &labels, c));

    if let Some(path) = &args.plot {
        let title = format!("{}: reliability on {cases} cases", model.name());
        let mut curves = Vec::new();
        if let Some(r) = &before_rel {
            curves.push(("before", r));
        }
        curves.push(("after", &after));
        crate::plot::reliability_png(path, &title, &curves)?;
    }

    let written = if args.dry_run {
        None
    } else {
        write_manifest(&model, fit)?
    };

    let mut out = std::io::stdout().lock();
    if args.json {
        let line = serde_json::json!({
            "model": model.name(), "a": fit.a, "b": fit.b,
            "lexical_weight": lexical_weight(&model),
            "cases": cases, "pairs": scores.len(), "positives": positives,
            "log_loss": loss_after, "ece": after.ece,
            "log_loss_before": loss_before, "ece_before": before_rel.as_ref().map(|r| r.ece),
            "written": written.as_ref().map(|p| p.display().to_string()),
        });
        writeln!(out, "{line}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{} on {files}: {cases} cases, {} pairs ({positives} needed)",
        model.name(),
        scores.len()
    )?;
    match (before, loss_before, &before_rel) {
        (Some(c), Some(loss), Some(r)) => writeln!(
            out,
            "  before: a = {:.4}, b = {:.4}   log loss {loss:.4}   ECE {:.4}",
            c.a, c.b, r.ece
        )?,
        _ => writeln!(out, "  before: uncalibrated")?,
    }
    writeln!(
        out,
        "  after:  a = {:.4}, b = {:.4}   log loss {loss_after:.4}   ECE {:.4}",
        fit.a, fit.b, after.ece
    )?;
    match written {
        Some(path) => writeln!(out, "written to {}", path.display())?,
        None => writeln!(
            out,
            "[calibration]\na = {:.4}\nb = {:.4}",
            round4(fit.a),
            round4(fit.b)
        )?,
    }
    if let Some(path) = &args.plot {
        writeln!(out, "reliability plot: {}", path.display())?;
    }
    Ok(())
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn lexical_weight(model: &Decider) -> f64 {
    match model {
        Decider::Engine(e) => e.lexical_weight(),
        Decider::Bm25(_) | Decider::Cascade { .. } => 0.0,
    }
}

/// Writes the fit (and the lexical weight it was fitted with) into the model's manifest,
/// keeping everything else of the file as it was. Returns the path, or `None` (after saying
/// why on stderr) when the model has no manifest to write to.
fn write_manifest(model: &Decider, fit: Calibration) -> anyhow::Result<Option<PathBuf>> {
    let Decider::Engine(engine) = model else {
        eprintln!(
            "note: {} has no manifest: the fit is printed below",
            model.name()
        );
        return Ok(None);
    };
    let path = engine.info().dir.join("manifest.toml");
    if !path.is_file() {
        eprintln!(
            "note: {} has no manifest.toml: the fit is printed below",
            engine.info().dir.display()
        );
        return Ok(None);
    }
    update_manifest(&path, fit, engine.lexical_weight())?;
    Ok(Some(path))
}

fn update_manifest(path: &Path, fit: Calibration, lexical_weight: f64) -> anyhow::Result<()> {
    let text = crate::input::read_text(path)?;
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        anyhow::anyhow!("{}: {}", path.display(), e.message())
    })?;
    doc["calibration"]["a"] = toml_edit::value(round4(fit.a));
    doc["calibration"]["b"] = toml_edit::value(round4(fit.b));
    if lexical_weight != 0.0 || doc.contains_key("scoring") {
        if !doc.contains_key("scoring") {
            doc["scoring"] = toml_edit::table();
        }
        doc["scoring"]["lexical_weight"] = toml_edit::value(round4(lexical_weight));
    }
    // Through a temporary file, so an interrupted write never leaves half a manifest.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, doc.to_string()).with_context(|| tmp.display().to_string())?;
    std::fs::rename(&tmp, path).with_context(|| path.display().to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_keeps_its_comments_and_gets_the_fit() {
        let dir = std::env::temp_dir().join(format!("decide-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("manifest.toml");
        std::fs::write(
            &path,
            "# a comment\nname = \"m\"\n\n# Platt\n[calibration]\na = 1.0\nb = 0.0\n\n[files]\n\"x\" = \"y\"\n",
        )
        .unwrap();
        update_manifest(
            &path,
            Calibration {
                a: 9.87654,
                b: -4.32101,
            },
            0.6,
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("# a comment") && text.contains("# Platt"),
            "{text}"
        );
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(manifest["calibration"]["a"].as_float(), Some(9.8765));
        assert_eq!(manifest["calibration"]["b"].as_float(), Some(-4.321));
        assert_eq!(manifest["scoring"]["lexical_weight"].as_float(), Some(0.6));
        assert_eq!(manifest["files"]["x"].as_str(), Some("y"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_manifest_is_named() {
        let dir = std::env::temp_dir().join(format!("decide-cal-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("manifest.toml");
        std::fs::write(&path, "[calibration\n").unwrap();
        let err = update_manifest(&path, Calibration { a: 1.0, b: 0.0 }, 0.0).unwrap_err();
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
