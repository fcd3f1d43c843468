//! `decide calibrate`: fits the Platt scaling that turns a model's raw scores into
//! probabilities, from labelled cases.

use std::io::Write;

use anyhow::{bail, Context};
use decide_engine::{candidate_text, sigmoid, Calibration};

use crate::args::{CalibrateArgs, Global};
use crate::input::{jsonl_lines, parse_case, read_tools};
use crate::score::{count_cases, progress};
use crate::select::{build_filter, provider_request};

pub fn run(global: &Global, args: CalibrateArgs) -> anyhow::Result<()> {
    let catalogue = args.tools.as_deref().map(read_tools).transpose()?;
    let total = count_cases(&args.data)?;
    let engine = global.engine(true)?;
    let bar = progress(total, "scoring");
    let mut scores = Vec::new();
    let mut labels = Vec::new();
    let mut cases = 0;
    for line in jsonl_lines(&args.data)? {
        let (line_no, text) = line?;
        let case = parse_case(&args.data, line_no, &text, catalogue.as_deref())?;
        let Some(expected) = case.expected else {
            bail!(
                "{}:{line_no}: expected: missing (calibration needs labels)",
                args.data.display()
            );
        };
        let at = || format!("{}:{line_no}", args.data.display());
        // The input the filter would send, so the fit sees the scores decisions are made on.
        let filter = build_filter(&engine, case.tools.clone(), &args.filter)?;
        let request = provider_request(&case.messages).with_context(at)?;
        let Some(input) = filter.decision_input(&request) else {
            bail!("{}: the user message has no text", at());
        };
        let docs: Vec<String> = case
            .tools
            .iter()
            .map(|t| candidate_text(&t.name, t.description.as_deref().unwrap_or("")))
            .collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let raw = engine.score_input(&input, &refs)?.raw;
        for (tool, s) in case.tools.iter().zip(raw) {
            scores.push(s);
            labels.push(expected.contains(&tool.name));
        }
        cases += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let Some(fit) = Calibration::fit(&scores, &labels) else {
        bail!(
            "{}: calibration needs both needed and unneeded tools",
            args.data.display()
        );
    };
    let positives = labels.iter().filter(|l| **l).count();
    let log_loss = scores
        .iter()
        .zip(&labels)
        .map(|(s, l)| {
            let p = sigmoid(fit.logit(*s)).clamp(1e-12, 1.0 - 1e-12);
            if *l {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / scores.len() as f64;
    let mut out = std::io::stdout().lock();
    if args.json {
        let line = serde_json::json!({
            "model": engine.info().name, "a": fit.a, "b": fit.b,
            "cases": cases, "pairs": scores.len(), "positives": positives, "log_loss": log_loss,
        });
        writeln!(out, "{line}")?;
    } else {
        writeln!(
            out,
            "# {} on {}: {cases} cases, {} pairs ({positives} needed), log loss {log_loss:.4}",
            engine.info().name,
            args.data.display(),
            scores.len()
        )?;
        writeln!(out, "[calibration]\na = {:.4}\nb = {:.4}", fit.a, fit.b)?;
    }
    Ok(())
}
