//! `decide score`: every tool of every case of a JSONL file, streamed as JSON lines.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::args::{Global, ScoreArgs};
use crate::input::{jsonl_lines, parse_case, read_tools};
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

/// Counts the non-blank lines, for the progress bar.
pub fn count_cases(path: &std::path::Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for line in jsonl_lines(path)? {
        line?;
        n += 1;
    }
    Ok(n)
}

pub fn run(global: &Global, args: ScoreArgs) -> anyhow::Result<()> {
    let catalogue = args.tools.as_deref().map(read_tools).transpose()?;
    let total = count_cases(&args.data)?;
    if total == 0 {
        bail!("{}: no cases", args.data.display());
    }
    let engine = global.engine(false)?;
    let bar = progress(total, "scoring");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut ids = HashSet::new();
    for line in jsonl_lines(&args.data)? {
        let (line_no, text) = line?;
        let case = parse_case(&args.data, line_no, &text, catalogue.as_deref())?;
        if !ids.insert(case.id.to_string()) {
            bail!(
                "{}:{line_no}: id: duplicate id {}",
                args.data.display(),
                case.id
            );
        }
        let started = Instant::now();
        let at = || format!("{}:{line_no}", args.data.display());
        let filter = build_filter(&engine, case.tools, &args.filter)?;
        let (_, scores) = select(&filter, &case.messages).with_context(at)?;
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
