//! `decide calibrate`: fits the Platt scaling that turns a model's raw scores into
//! probabilities, from labelled cases, and writes it to the model's manifest, with the conformal
//! table (the new probabilities of the needed tools of the same cases) that `--target-recall`
//! reads. The table's guarantee needs cases the model was not trained on.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use decide_chat::ToolSpecification;
use decide_engine::{sigmoid, Calibration, Conformal};
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

/// The target recalls whose thresholds `decide calibrate` prints.
const SHOWN_RECALLS: [f64; 3] = [0.9, 0.95, 0.99];

pub fn run(global: &Global, args: CalibrateArgs) -> anyhow::Result<()> {
    if args.filter.target_recall.is_some() {
        bail!("--target-recall: not used by calibrate, which writes the table it reads");
    }
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
    // The probabilities decisions will give: the fit as the manifest stores it, rounded.
    let stored = Calibration {
        a: round4(fit.a),
        b: round4(fit.b),
    };
    let source = inputs
        .iter()
        .map(|i| match &i.tools {
            Some(t) => format!("{} with {}", i.data.display(), t.display()),
            None => i.data.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let Some(conformal) = Conformal::from_needed(
        scores
            .iter()
            .zip(&labels)
            .filter(|(_, needed)| **needed)
            .map(|(s, _)| stored.probability(*s)),
    ) else {
        bail!("{files}: a needed tool's probability is not a number");
    };
    let conformal = conformal.with_cases(cases).with_source(source);
    let thresholds = SHOWN_RECALLS
        .iter()
        .map(|&r| Ok((r, conformal.threshold(r)?)))
        .collect::<Result<Vec<(f64, f64)>, decide_contract::InvalidTargetRecall>>()?;
    let before = model.calibration_in_use();
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
        write_manifest(&model, fit, &conformal)?
    };

    let mut out = std::io::stdout().lock();
    if args.json {
        let line = serde_json::json!({
            "model": model.name(), "a": fit.a, "b": fit.b,
            "lexical_weight": model.lexical_weight(),
            "cases": cases, "pairs": scores.len(), "positives": positives,
            "log_loss": loss_after, "ece": after.ece,
            "log_loss_before": loss_before, "ece_before": before_rel.as_ref().map(|r| r.ece),
            "conformal": {
                "needed": conformal.len(), "cases": cases,
                "thresholds": thresholds.iter().map(|(r, t)| (r.to_string(), serde_json::json!(t))).collect::<serde_json::Map<_, _>>(),
            },
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
    let shown: Vec<String> = thresholds
        .iter()
        .map(|(r, t)| format!("{t:.4} for recall {r}"))
        .collect();
    writeln!(
        out,
        "  conformal: {} needed tools: threshold {}",
        conformal.len(),
        shown.join(", ")
    )?;
    match written {
        Some(path) => writeln!(out, "written to {}", path.display())?,
        None => writeln!(
            out,
            "[calibration]\na = {:.4}\nb = {:.4}\n\n[conformal]\n{}",
            round4(fit.a),
            round4(fit.b),
            conformal_table(&conformal)
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

/// Writes the fit (and the lexical weight it was fitted with) and the conformal table into the
/// model's manifest, keeping everything else of the file as it was. Returns the path, or `None`
/// (after saying why on stderr) when the model has no manifest to write to.
fn write_manifest(
    model: &Decider,
    fit: Calibration,
    conformal: &Conformal,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(dir) = model.model_dir() else {
        eprintln!(
            "note: {} has no manifest: the fit is printed below",
            model.name()
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
    update_manifest(&path, fit, model.lexical_weight(), conformal)?;
    Ok(Some(path))
}

/// The `[conformal]` table's body: `source`, `cases`, then the probabilities ten to a line, so
/// that a manifest stays readable.
fn conformal_table(conformal: &Conformal) -> toml_edit::Table {
    let mut table = toml_edit::Table::new();
    table["source"] = toml_edit::value(conformal.source());
    table["cases"] = toml_edit::value(conformal.cases() as i64);
    let mut array = toml_edit::Array::new();
    for (i, p) in conformal.needed_probabilities().iter().enumerate() {
        let mut v = toml_edit::Value::from(*p);
        v.decor_mut()
            .set_prefix(if i % 10 == 0 { "\n  " } else { " " });
        array.push_formatted(v);
    }
    array.set_trailing("\n");
    array.set_trailing_comma(true);
    table["needed_probabilities"] = toml_edit::value(array);
    table
}

fn update_manifest(
    path: &Path,
    fit: Calibration,
    lexical_weight: f64,
    conformal: &Conformal,
) -> anyhow::Result<()> {
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
    let fresh = conformal_table(conformal);
    match doc.get_mut("conformal").and_then(|t| t.as_table_mut()) {
        // Field by field, so that the table keeps its place and its comments.
        Some(table) => {
            for (key, item) in fresh.iter() {
                table[key] = item.clone();
            }
        }
        None => {
            let mut table = fresh;
            table.decor_mut().set_prefix(
                "\n# The calibrated probabilities of the needed tools of the cases above, for\n\
                 # --target-recall (split conformal prediction); written by `decide calibrate`.\n",
            );
            doc["conformal"] = toml_edit::Item::Table(table);
        }
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
        let conformal = Conformal::from_needed((0..25).map(|i| i as f64 / 25.0))
            .unwrap()
            .with_cases(20)
            .with_source("cases.jsonl with tools.json");
        update_manifest(
            &path,
            Calibration {
                a: 9.87654,
                b: -4.32101,
            },
            0.6,
            &conformal,
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
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table, conformal);
        assert!(text.contains("# The calibrated probabilities"), "{text}");
        // Ten to a line.
        assert!(
            text.contains("\n  0.8, 0.84, 0.88, 0.92, 0.96,\n]"),
            "{text}"
        );

        // Written again, the table keeps its place and comments and takes the new values.
        let edited = text.replace("# The calibrated probabilities", "# mine");
        std::fs::write(&path, edited).unwrap();
        let smaller = Conformal::from_needed([0.5, 0.25]).unwrap().with_cases(2);
        update_manifest(&path, Calibration { a: 1.0, b: 0.0 }, 0.6, &smaller).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# mine"), "{text}");
        assert_eq!(text.matches("[conformal]").count(), 1, "{text}");
        let manifest: toml::Value = toml::from_str(&text).unwrap();
        let table: Conformal = manifest["conformal"].clone().try_into().unwrap();
        assert_eq!(table.needed_probabilities(), [0.25, 0.5]);
        assert_eq!((table.cases(), table.source()), (2, ""));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broken_manifest_is_named() {
        let dir = std::env::temp_dir().join(format!("decide-cal-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("manifest.toml");
        std::fs::write(&path, "[calibration\n").unwrap();
        let conformal = Conformal::from_needed([0.5]).unwrap();
        let err =
            update_manifest(&path, Calibration { a: 1.0, b: 0.0 }, 0.0, &conformal).unwrap_err();
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
