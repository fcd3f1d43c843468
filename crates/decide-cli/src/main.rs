//! `decide`: select the tools a conversation needs, choose the model that should answer it, score data sets and
//! manage models, offline.

mod args;
mod bench;
mod calibrate;
mod chat;
mod decider;
mod eval;
mod filtering;
mod input;
mod mcp;
mod models;
mod plot;
mod route;
mod score;
mod select;
mod serve;
mod train;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    // Training reaches its peak anyway; a server must give a burst's memory back.
    match cli.command {
        args::Command::Train(_) => keep_freed_memory(),
        args::Command::Serve(_) => few_arenas(),
        args::Command::Mcp(ref a) if a.http.is_some() => few_arenas(),
        _ => {}
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(log_filter())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`decide select ... | head`) is the reader's choice, not an error.
        Err(err)
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            // One line: the outermost context names the file or option, the cause says what.
            let mut line = err.to_string();
            for cause in err.chain().skip(1) {
                line.push_str(": ");
                line.push_str(&cause.to_string());
            }
            eprintln!("error: {}", line.replace('\n', " "));
            // Stopped by Ctrl-C: the shell's code for SIGINT, so a script can tell it from a failure.
            if err.downcast_ref::<train::Interrupted>().is_some() {
                ExitCode::from(130)
            } else {
                ExitCode::from(2)
            }
        }
    }
}

/// `DECIDE_LOG` (default `warn`), with the tokenizer's events capped at `info`: at `debug` and
/// `trace` it logs the text it normalizes character by character, and request texts must never
/// reach a log.
fn log_filter() -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DECIDE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    match "tokenizers=info".parse() {
        Ok(cap) => filter.add_directive(cap),
        Err(_) => filter,
    }
}

fn run(cli: args::Cli) -> anyhow::Result<()> {
    match cli.command {
        args::Command::Select(a) => select::run(&cli.global, a),
        args::Command::Score(a) => score::run(&cli.global, a),
        args::Command::Calibrate(a) => calibrate::run(&cli.global, a),
        args::Command::Eval(a) => eval::run(&cli.global, a),
        args::Command::Route(a) => route::run(&cli.global, a),
        args::Command::Models(a) => models::run(&cli.global, a),
        args::Command::Bench(a) => bench::run(&cli.global, a),
        args::Command::Serve(a) => serve::run(&cli.global, a),
        args::Command::Chat(a) => chat::run(&cli.global, a),
        args::Command::Train(a) => train::run(&cli.global, a),
        args::Command::Mcp(a) => mcp::run(&cli.global, a),
    }
}

/// glibc's malloc serves blocks above a (dynamic) threshold with fresh `mmap`s and hands them
/// back to the kernel on free; candle allocates every activation anew, so each forward and
/// backward pass page-faulted its memory in again. Training one epoch spent 39 of its 111
/// CPU-seconds in the kernel. Serving large blocks from the heap and never trimming it brought
/// that to 15 s and the wall time down a fifth; the memory stays at its peak, which a run
/// reaches anyway.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // glibc caps M_MMAP_THRESHOLD at 32 MiB on 64-bit targets; larger values are ignored.
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts
    // (parsing the command line starts none).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

/// glibc gives each thread that allocates while the others' arenas are busy an arena of its own,
/// up to eight per core, and an arena keeps some of what a burst freed even after
/// `malloc_trim`. Measured with the release build on the 2-core machine, after a burst of twelve
/// 1.9 MB tool descriptions (idle 111-115 MB): the resident set settled 58-62 MB above idle with
/// glibc's default, 13-43 MB with four arenas, 9-21 MB with two and 8 MB with one; 32 load-test
/// clients got 293 decisions/s with the default and 300 with one arena (two runs each, medians):
/// the forward passes, not the allocator's lock, bound a server's throughput. `MALLOC_ARENA_MAX`
/// in the environment still decides, for a machine where that lock does matter.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn few_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn few_arenas() {}
