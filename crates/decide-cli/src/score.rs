//! `decide score`: every tool of every case of a JSONL file, streamed as JSON lines.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::Context;

use crate::args::{Global, ScoreArgs};
use crate::input::Cases;
use crate::select::{build_filter, select};

/// A progress bar on stderr when it is a terminal, hidden otherwise.
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

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
        let (_, scores) = select(&filter, &case.messages).with_context(|| at.clone())?;
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
