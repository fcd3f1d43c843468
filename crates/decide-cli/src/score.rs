//! `decide score`: every tool of every case of a JSONL file, streamed as JSON lines.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use decide_filter::SelectResponse;

use crate::args::{Global, ScoreArgs};
use crate::filtering::{build_filter, progress, select};
use crate::input::Cases;

pub fn run(global: &Global, args: ScoreArgs) -> anyhow::Result<()> {
    let reader = Cases::open(&args.cases)?;
    let engine = global.decider(false)?;
    let bar = progress(reader.total, "scoring");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for next in reader {
        let (at, case) = next?;
        let started = Instant::now();
        let filter = build_filter(&engine, case.tools, &args.filter)?;
        let selection = select(&filter, &case.messages).with_context(|| at.clone())?;
        let scores = SelectResponse::from(&selection).scores;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let line = serde_json::json!({ "id": case.id, "scores": scores, "ms": (ms * 1000.0).round() / 1000.0 });
        // Streamed: each line is written as soon as its case is scored.
        writeln!(out, "{line}")?;
        out.flush()?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
