//! `decide serve`: the OpenAI Decisions and System One APIs, `/v1/select` and `/v1/route`,
//! embeddings, reranking and the playground over the local engine, until SIGTERM or Ctrl-C;
//! requests in flight are finished first.

use std::time::Duration;

use anyhow::Context;
use decide_engine::Engine;
use decide_server::{AppState, Limits, ServerConfig};

use crate::args::{Global, ServeArgs};

/// A positive number of seconds that a `Duration` holds; `option` names it in the error.
fn seconds(option: &str, value: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => anyhow::bail!("{option}: {value} is not a positive number of seconds"),
    }
}

pub fn run(global: &Global, args: ServeArgs) -> anyhow::Result<()> {
    let config = server_config(&args)?;
    let cache_bytes = args.cache_mb.saturating_mul(1 << 20);
    let engine = global.engine_with(false, |b| b.cache_bytes(cache_bytes))?;
    let reranker = reranker(global)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(serve(&args.addr, engine, reranker, config));
    // Work still running on the blocking pool past the shutdown deadline is not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// The server's settings from the options, each checked.
fn server_config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    let request_timeout = seconds("--timeout", args.timeout)?;
    let read_timeout = seconds("--read-timeout", args.read_timeout)?;
    let shutdown_timeout = seconds("--shutdown-timeout", args.shutdown_timeout)?;
    if args.max_concurrent_requests == 0 {
        anyhow::bail!("--max-concurrent-requests: must be at least 1");
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections: must be at least 1");
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!(
            "--api-key (or DECIDE_API_KEY): empty; leave it out to serve without a key on loopback"
        );
    }
    Ok(ServerConfig {
        api_key: args.api_key.clone(),
        max_body_bytes: args.payload_limit,
        max_concurrent_requests: args.max_concurrent_requests,
        request_timeout,
        retry_after_secs: 1,
        limits: Limits {
            max_questions: args.max_questions,
            max_options: args.max_options,
            ..Limits::default()
        },
        max_batch_requests: if args.no_batching {
            1
        } else {
            args.max_batch_requests.max(1)
        },
        allowed_hosts: args.allowed_hosts.clone(),
        allowed_origins: args.allowed_origins.clone(),
        read_timeout,
        max_connections: args.max_connections,
        shutdown_timeout,
    })
}

/// With `--rerank`, the model the rerank endpoints score with (a cross-encoder) instead of the
/// model's cosines.
fn reranker(global: &Global) -> anyhow::Result<Option<Engine>> {
    let Some(name) = &global.rerank else {
        return Ok(None);
    };
    let mut other = global.clone();
    other.model = name.clone();
    other.lexical_weight = None;
    other.tool_parameters = None;
    other.tool_server = None;
    let engine = other
        .engine(true)
        .map_err(|e| anyhow::anyhow!("--rerank {name}: {e}"))?;
    Ok(Some(engine))
}

/// Binds `addr` and serves until SIGTERM or Ctrl-C.
async fn serve(
    addr: &str,
    engine: Engine,
    reranker: Option<Engine>,
    config: ServerConfig,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--addr {addr}"))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && config.api_key.is_none() {
        eprintln!(
            "warning: listening on {local} without --api-key: anyone who can reach it can use it"
        );
    }
    let batching = if config.max_batch_requests > 1 {
        format!("batching up to {} requests", config.max_batch_requests)
    } else {
        "batching off".to_string()
    };
    let name = engine.info().name.clone();
    let device = engine.info().device.clone();
    let reranking = match &reranker {
        Some(r) => format!(", reranking with {}", r.info().name),
        None => String::new(),
    };
    let state = AppState::with_reranker(engine, reranker, config)?;
    tokio::spawn(return_freed_memory());
    // The address goes to stderr, with the model, so a script (or a test) that binds
    // port 0 can read where the server is.
    eprintln!(
        "decide serve: {name} on {device}, {batching}{reranking}, listening on http://{local}"
    );
    decide_server::serve(listener, state, shutdown()).await?;
    eprintln!("decide serve: stopped");
    Ok(())
}

/// A burst of large requests, or sessions opened and dropped by the thousand in `decide mcp
/// --http`, grows the allocator's arenas; glibc keeps freed memory in them. Trimming them every
/// few seconds brings the resident set back near its idle size once the burst is over.
pub(crate) async fn return_freed_memory() {
    let mut every = tokio::time::interval(Duration::from_secs(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory to the kernel; it is thread-safe.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub(crate) async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
