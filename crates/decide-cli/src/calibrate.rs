//! `decide calibrate`: fits the Platt scaling that turns a model's raw scores into
//! probabilities, from labelled cases.

use std::io::Write;

use anyhow::{bail, Context};
use decide_chat::ToolSpecification;
use decide_engine::{sigmoid, Calibration};

use crate::args::{CalibrateArgs, Global};
use crate::input::Cases;
use crate::score::progress;
use crate::select::{build_filter, provider_request};

pub fn run(global: &Global, args: CalibrateArgs) -> anyhow::Result<()> {
    let reader = Cases::open(&args.cases)?;
    let engine = global.engine(true)?;
    let bar = progress(reader.total, "scoring");
    let mut scores = Vec::new();
    let mut labels = Vec::new();
    let mut cases = 0;
    for next in reader {
        let (at, case) = next?;
        let Some(expected) = case.expected else {
            bail!("{at}: expected: missing (calibration needs labels)");
        };
        // The requests the filter would send, so the fit sees the scores decisions are made on.
        let filter = build_filter(&engine, case.tools.clone(), &args.filter)?;
        let request = provider_request(&case.messages).with_context(|| at.clone())?;
        let Some(input) = filter.decision_input(&request) else {
            bail!("{at}: the user message has no text");
        };
        let tools: Vec<&ToolSpecification> = case.tools.iter().collect();
        let mut raw = Vec::with_capacity(tools.len());
        for decision in filter.decision_requests(&input, &tools)? {
            raw.extend(engine.yes_no_scores(&decision)?.into_iter().map(|(_, s)| s));
        }
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
            args.cases.data.display()
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
            args.cases.data.display(),
            scores.len()
        )?;
        writeln!(out, "[calibration]\na = {:.4}\nb = {:.4}", fit.a, fit.b)?;
    }
    Ok(())
}
