//! `decide bench`: raw scoring throughput over a grid of batch sizes × sequence lengths, and
//! the latency of whole decisions, on any device; what users run to size batches.
//!
//! Each cell runs whole forward passes of `batch` rows of exactly `tokens` tokens (one batch,
//! never split): a warm-up call, then timed calls until both `--reps` calls and `--min-time-s`
//! seconds are reached (at most `--max-reps`). Reported per cell: median and p95 latency,
//! pairs/s and tokens/s at the median, the achieved GFLOP/s of the encoder's matrix products and
//! its share of the device's matmul rate measured at the start. Decision latency: a 10-message
//! conversation against N tools through the engine's `DecisionModel`, after one call that
//! fills the candidate-embedding cache (a bi-encoder then embeds only the conversation).
//! With `--catalogue`, the time to score a real tool catalogue from scratch: texts of mixed
//! lengths, where padding (or its absence) shows.

use std::time::{Duration, Instant};

use anyhow::Context;
use decide_contract::DecisionModel;
use decide_engine::{bench, Engine};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::args::{BenchArgs, Global};

#[derive(Serialize)]
struct Cell {
    batch: usize,
    tokens: usize,
    reps: usize,
    median_ms: f64,
    p95_ms: f64,
    min_ms: f64,
    pairs_per_s: f64,
    tokens_per_s: f64,
    gflops: f64,
    peak_share: f64,
}

#[derive(Serialize)]
struct Decision {
    messages: usize,
    tools: usize,
    reps: usize,
    median_ms: f64,
    p95_ms: f64,
    min_ms: f64,
}

#[derive(Serialize)]
struct CatalogueRun {
    file: String,
    texts: usize,
    /// Tokens of all texts, special tokens included (before any trimming to the model's length).
    tokens: usize,
    reps: usize,
    median_ms: f64,
    p95_ms: f64,
    min_ms: f64,
    texts_per_s: f64,
    tokens_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    dtype: String,
    kernels: String,
    threads: usize,
    matmul_peak_gflops: f64,
    cells: Vec<Cell>,
    #[serde(skip_serializing_if = "Option::is_none")]
    catalogue: Option<CatalogueRun>,
    decisions: Vec<Decision>,
}

/// The q-quantile of sorted seconds (nearest rank), in milliseconds.
fn quantile_ms(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] * 1e3
}

fn median_ms(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    let mid = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    mid * 1e3
}

/// Times `f`: one warm-up call, then until `reps` calls and `min_time` are both reached.
fn time_calls(
    args: &BenchArgs,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    f()?;
    let min_time = Duration::from_secs_f64(args.min_time_s);
    let started = Instant::now();
    let mut times = Vec::new();
    while times.len() < args.max_reps && (times.len() < args.reps || started.elapsed() < min_time) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

pub fn run(global: &Global, args: BenchArgs) -> anyhow::Result<()> {
    let decision_tools = check_options(&args)?;
    // Read before the model loads and the measuring starts: a bad file fails at once.
    let catalogue_texts = match &args.catalogue {
        Some(path) => Some((path.clone(), catalogue_texts(path)?)),
        None => None,
    };
    let engine = load_engine(global, &args)?;
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let peak = bench::matmul_peak_gflops(&engine).context("measuring the matmul peak")?;
    let steps = args.batch_sizes.len() * args.seq_lens.len()
        + decision_tools.len()
        + usize::from(catalogue_texts.is_some());
    let progress = progress_bar(&args, steps);
    let cells = time_cells(&engine, &args, peak, &progress)?;
    let catalogue = match &catalogue_texts {
        Some((path, texts)) => {
            progress.set_message(format!("the {} tools of {}", texts.len(), path.display()));
            let run = time_catalogue(&engine, &args, path, texts)?;
            progress.inc(1);
            Some(run)
        }
        None => None,
    };
    let decisions = time_decisions(&engine, &args, &decision_tools, &progress)?;
    progress.finish_and_clear();
    let report = Report {
        model: engine.info().name.clone(),
        device: engine.info().device.clone(),
        dtype: engine.info().dtype.clone(),
        kernels: bench::kernels(&engine),
        threads,
        matmul_peak_gflops: peak,
        cells,
        catalogue,
        decisions,
    };
    if let Some(path) = &args.plot {
        plot(path, &report, &args)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Checks the options before anything loads; returns the tool counts of the decisions to time
/// (none with `--no-decisions`).
fn check_options(args: &BenchArgs) -> anyhow::Result<Vec<usize>> {
    anyhow::ensure!(
        !args.batch_sizes.is_empty() && args.batch_sizes.iter().all(|&b| b > 0),
        "--batch-sizes: expected positive numbers, as in 1,8,32"
    );
    anyhow::ensure!(
        !args.seq_lens.is_empty() && args.seq_lens.iter().all(|&l| l >= 2),
        "--seq-lens: expected numbers of at least 2 (the special tokens), as in 64,128"
    );
    // Before the measuring, which takes minutes, rather than after it.
    if let Some(dir) = args.plot.as_deref().and_then(|p| p.parent()) {
        anyhow::ensure!(
            dir.as_os_str().is_empty() || dir.is_dir(),
            "--plot {}: no such folder {}",
            args.plot.as_deref().unwrap_or(dir).display(),
            dir.display()
        );
    }
    anyhow::ensure!(
        args.decision_tools.iter().all(|&t| t > 0),
        "--decision-tools: expected positive numbers, as in 100,1000 (--no-decisions skips them)"
    );
    let decision_tools = if args.no_decisions {
        Vec::new()
    } else {
        args.decision_tools.clone()
    };
    anyhow::ensure!(
        args.reps > 0 && args.max_reps >= args.reps,
        "--reps must be at least 1 and at most --max-reps"
    );
    Ok(decision_tools)
}

/// The candidate texts of the tools of `--catalogue`.
fn catalogue_texts(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    Ok(crate::input::read_tools(path)?
        .iter()
        .map(|t| decide_engine::candidate_text(&t.name, t.description.as_deref().unwrap_or("")))
        .collect())
}

/// The engine, able to run the largest cell in one forward pass; every `--seq-lens` must fit
/// the model.
fn load_engine(global: &Global, args: &BenchArgs) -> anyhow::Result<Engine> {
    let longest = args.batch_sizes.iter().max().copied().unwrap_or(1)
        * args.seq_lens.iter().max().copied().unwrap_or(1);
    let engine = Engine::builder()
        .model(&global.model)
        .device(global.device)
        .precision(global.dtype)
        .cpu_kernels(global.kernels)
        // The whole batch in one forward pass: the batch size is what is measured.
        .max_batch_tokens(longest.max(global.max_batch_tokens))
        .build()?;
    let max_len = engine.info().max_length;
    if let Some(&l) = args.seq_lens.iter().find(|&&l| l > max_len) {
        anyhow::bail!(
            "--seq-lens: {l} is longer than the model's {max_len} tokens ({})",
            engine.info().name
        );
    }
    Ok(engine)
}

fn progress_bar(args: &BenchArgs, steps: usize) -> ProgressBar {
    let progress = if args.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(steps as u64)
    };
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress
}

/// Times every cell of the grid, sequence lengths outermost.
fn time_cells(
    engine: &Engine,
    args: &BenchArgs,
    peak: f64,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for &tokens in &args.seq_lens {
        for &batch in &args.batch_sizes {
            progress.set_message(format!("batch {batch} × {tokens} tokens"));
            let times = time_calls(args, || {
                Ok(bench::forward_synthetic(engine, batch, tokens)?)
            })?;
            let median = median_ms(&times);
            let gflops = bench::forward_flops(engine, batch, tokens) / (median / 1e3) / 1e9;
            cells.push(Cell {
                batch,
                tokens,
                reps: times.len(),
                median_ms: median,
                p95_ms: quantile_ms(&times, 0.95),
                min_ms: times[0] * 1e3,
                pairs_per_s: batch as f64 / (median / 1e3),
                tokens_per_s: (batch * tokens) as f64 / (median / 1e3),
                gflops,
                peak_share: gflops / peak,
            });
            progress.inc(1);
        }
    }
    Ok(cells)
}

/// Times a whole decision over each number of tools, for a 10-message conversation.
fn time_decisions(
    engine: &Engine,
    args: &BenchArgs,
    tool_counts: &[usize],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Decision>> {
    let mut decisions = Vec::new();
    let input = bench::conversation(10);
    for &tools in tool_counts {
        progress.set_message(format!("decision over {tools} tools"));
        let request = bench::tool_request(tools, &input)?;
        let times = time_calls(args, || {
            engine.decide(&request)?;
            Ok(())
        })?;
        decisions.push(Decision {
            messages: 10,
            tools,
            reps: times.len(),
            median_ms: median_ms(&times),
            p95_ms: quantile_ms(&times, 0.95),
            min_ms: times[0] * 1e3,
        });
        progress.inc(1);
    }
    Ok(decisions)
}

/// `--plot`: pairs/s against the batch size, one line per sequence length.
fn plot(path: &std::path::Path, report: &Report, args: &BenchArgs) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<(usize, f64)>)> = args
        .seq_lens
        .iter()
        .map(|&tokens| {
            let points = report
                .cells
                .iter()
                .filter(|c| c.tokens == tokens)
                .map(|c| (c.batch, c.pairs_per_s))
                .collect();
            (format!("{tokens} tokens"), points)
        })
        .collect();
    let title = format!(
        "{} on {} ({}, {})",
        report.model, report.device, report.dtype, report.kernels
    );
    crate::plot::throughput_png(path, &title, &series)
}

/// Times scoring every text of a catalogue with nothing cached: embeddings for a bi-encoder,
/// (request, tool) pairs for a cross-encoder.
fn time_catalogue(
    engine: &Engine,
    args: &BenchArgs,
    path: &std::path::Path,
    texts: &[String],
) -> anyhow::Result<CatalogueRun> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let query = "what is the weather in Lisbon this weekend";
    let cross = engine.info().head == decide_engine::HeadName::CrossEncoder;
    let mut tokens = 0;
    for t in &refs {
        tokens += if cross {
            engine.pair_token_ids(query, t)?.len()
        } else {
            engine.count_tokens(t)? + 2
        };
    }
    let times = time_calls(args, || {
        if cross {
            let pairs: Vec<(&str, &str)> = refs.iter().map(|t| (query, *t)).collect();
            engine.classify_pairs(&pairs)?;
        } else {
            engine.embed(&refs)?;
        }
        Ok(())
    })?;
    let median = median_ms(&times);
    Ok(CatalogueRun {
        file: path.display().to_string(),
        texts: texts.len(),
        tokens,
        reps: times.len(),
        median_ms: median,
        p95_ms: quantile_ms(&times, 0.95),
        min_ms: times[0] * 1e3,
        texts_per_s: texts.len() as f64 / (median / 1e3),
        tokens_per_s: tokens as f64 / (median / 1e3),
    })
}

fn print_table(r: &Report) {
    println!(
        "{} on {} ({}, kernels {}, {} threads); measured matmul peak {:.0} GFLOP/s",
        r.model, r.device, r.dtype, r.kernels, r.threads, r.matmul_peak_gflops
    );
    println!(
        "{:>6} {:>7} {:>5} {:>11} {:>11} {:>10} {:>11} {:>9} {:>6}",
        "batch", "tokens", "reps", "median ms", "p95 ms", "pairs/s", "tokens/s", "GFLOP/s", "peak"
    );
    for c in &r.cells {
        println!(
            "{:>6} {:>7} {:>5} {:>11.2} {:>11.2} {:>10.1} {:>11.0} {:>9.1} {:>5.0}%",
            c.batch,
            c.tokens,
            c.reps,
            c.median_ms,
            c.p95_ms,
            c.pairs_per_s,
            c.tokens_per_s,
            c.gflops,
            c.peak_share * 100.0
        );
    }
    if let Some(c) = &r.catalogue {
        println!();
        println!(
            "catalogue {}: {} tools, {} tokens; median {:.1} ms (p95 {:.1}, {} reps): \
             {:.0} tools/s, {:.0} tokens/s",
            c.file, c.texts, c.tokens, c.median_ms, c.p95_ms, c.reps, c.texts_per_s, c.tokens_per_s
        );
    }
    if !r.decisions.is_empty() {
        println!();
        println!(
            "{:>9} {:>6} {:>5} {:>11} {:>11}",
            "messages", "tools", "reps", "median ms", "p95 ms"
        );
        for d in &r.decisions {
            println!(
                "{:>9} {:>6} {:>5} {:>11.2} {:>11.2}",
                d.messages, d.tools, d.reps, d.median_ms, d.p95_ms
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let t = [0.001, 0.002, 0.003, 0.004];
        assert_eq!(median_ms(&t), 2.5);
        assert_eq!(quantile_ms(&t, 0.95), 4.0);
        assert_eq!(quantile_ms(&t[..1], 0.95), 1.0);
        assert_eq!(median_ms(&t[..3]), 2.0);
    }
}
