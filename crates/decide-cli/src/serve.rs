//! `decide serve`: the OpenAI Decisions and System One APIs, `/v1/select` and `/v1/route`,
//! embeddings, reranking and the playground over the local engine, until SIGTERM or Ctrl-C;
//! requests in flight are finished first.

use std::time::Duration;

use anyhow::Context;
use decide_server::{AppState, Limits, ServerConfig};

use crate::args::{Global, ServeArgs};

pub fn run(global: &Global, args: ServeArgs) -> anyhow::Result<()> {
    if args.timeout <= 0.0 || !args.timeout.is_finite() {
        anyhow::bail!(
            "--timeout: {} is not a positive number of seconds",
            args.timeout
        );
    }
    if args.max_concurrent_requests == 0 {
        anyhow::bail!("--max-concurrent-requests: must be at least 1");
    }
    let config = ServerConfig {
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: args.payload_limit,
        max_concurrent_requests: args.max_concurrent_requests,
        request_timeout: Duration::from_secs_f64(args.timeout),
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
    };
    let engine = global.engine(false)?;
    // With --rerank, the rerank endpoints score with that model (a cross-encoder) instead of the
    // model's cosines.
    let reranker = match &global.rerank {
        Some(name) => {
            let mut other = global.clone();
            other.model = name.clone();
            other.lexical_weight = None;
            Some(
                other
                    .engine(true)
                    .map_err(|e| anyhow::anyhow!("--rerank {name}: {e}"))?,
            )
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.addr)
            .await
            .with_context(|| format!("--addr {}", args.addr))?;
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
        // The address goes to stderr, with the model, so a script (or a test) that binds
        // port 0 can read where the server is.
        eprintln!(
            "decide serve: {name} on {device}, {batching}{reranking}, listening on http://{local}"
        );
        decide_server::serve(listener, state, shutdown()).await?;
        eprintln!("decide serve: stopped");
        Ok(())
    })
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
