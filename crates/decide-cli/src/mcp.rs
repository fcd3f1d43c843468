//! `decide mcp`: an MCP server that offers the tools of many upstream MCP servers through a search the local
//! decision model answers, over stdio (for clients that start it) or streamable HTTP (`--http`).
//!
//! Standard output carries the MCP session over stdio, so everything else (the servers started, the address
//! listened on, errors) goes to standard error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use decide_contract::DecisionModel;
use decide_mcp::{
    ConnectionLimits, Gateway, GatewayOptions, HttpOptions, McpOptions, ServerSpec, ServersConfig,
};

use crate::args::{Global, McpArgs};

/// A positive number of seconds that a `Duration` holds; `option` names it in the error (as `decide serve` reads
/// its timeouts).
fn seconds(option: &str, value: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => bail!("{option}: {value} is not a positive number of seconds"),
    }
}

/// How `--http` serves, from the options; each wrong one named in a one-line error.
fn http_options(args: &McpArgs) -> anyhow::Result<HttpOptions> {
    // As `decide serve` reads it: an empty key is a mistake, not a wish for no auth.
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!(
            "--api-key (or DECIDE_API_KEY): empty; leave it out to serve without a key on loopback"
        );
    }
    if args.max_sessions == 0 {
        bail!("--max-sessions: must be at least 1");
    }
    if args.max_connections == 0 {
        bail!("--max-connections: must be at least 1");
    }
    Ok(HttpOptions {
        api_key: args.api_key.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
        allowed_origins: args.allowed_origins.clone(),
        max_sessions: args.max_sessions,
        session_idle_timeout: seconds("--session-idle-timeout", args.session_idle_timeout)?,
        connections: ConnectionLimits {
            read_timeout: seconds("--read-timeout", args.read_timeout)?,
            max_connections: args.max_connections,
            shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout)?,
        },
    })
}

/// The upstream servers of `--config`, `--mcp` and `--mcp-url`, in that order, each with its configured name.
fn upstreams(args: &McpArgs) -> anyhow::Result<Vec<(Option<String>, ServerSpec)>> {
    let mut servers: Vec<(Option<String>, ServerSpec)> = Vec::new();
    if let Some(path) = &args.config {
        let config = ServersConfig::read(path).map_err(anyhow::Error::msg)?;
        servers.extend(config.servers.into_iter().map(|(n, s)| (Some(n), s)));
    }
    for line in &args.mcp {
        let spec = ServerSpec::command_line(line).map_err(|e| anyhow::anyhow!("--mcp: {e}"))?;
        servers.push((None, spec));
    }
    for url in &args.mcp_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--mcp-url {url}: expected an http:// or https:// URL");
        }
        servers.push((None, ServerSpec::Http { url: url.clone() }));
    }
    if servers.is_empty() {
        bail!("--mcp: no upstream server; give --mcp COMMAND, --mcp-url URL or --config FILE");
    }
    Ok(servers)
}

/// Serves the gateway over streamable HTTP at `addr` until SIGTERM or Ctrl-C.
async fn serve_http(
    gateway: Arc<Gateway>,
    addr: &str,
    options: HttpOptions,
    started: &str,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--http {addr}"))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && options.api_key.is_none() {
        eprintln!(
            "warning: listening on {local} without --api-key: anyone who can reach it can call every upstream tool"
        );
    }
    // The address goes to stderr, so a script (or a test) that binds port 0 can read it.
    eprintln!("decide mcp: {started}; listening on http://{local}/mcp");
    // Each session's state is freed when it ends; glibc keeps it unless asked to give it back.
    tokio::spawn(crate::serve::return_freed_memory());
    decide_mcp::serve_http(gateway, listener, options, crate::serve::shutdown())
        .await
        .map_err(anyhow::Error::msg)?;
    eprintln!("decide mcp: stopped");
    Ok(())
}

pub fn run(global: &Global, args: McpArgs) -> anyhow::Result<()> {
    let http = args
        .http
        .as_ref()
        .map(|_| http_options(&args))
        .transpose()?;
    let servers = upstreams(&args)?;
    if let Some(r) = args.target_recall {
        if !(r > 0.0 && r < 1.0) {
            bail!("--target-recall: {r} is not between 0 and 1 (exclusive)");
        }
    }
    if args.max_results == 0 {
        bail!("--max-results: must be at least 1");
    }
    if args.timeout == 0 {
        bail!("--timeout: must be at least 1 second");
    }
    let engine = global.engine(false)?;
    let conformal = engine.conformal().cloned();
    if args.target_recall.is_some() && conformal.is_none() {
        engine.require_conformal().context("--target-recall")?;
    }
    let model = engine.info().name.clone();
    let options = GatewayOptions {
        decision_model: Arc::new(engine) as Arc<dyn DecisionModel>,
        conformal,
        expose: args.expose,
        always_include: args.always_include.clone(),
        max_results: args.max_results,
        target_recall: args.target_recall,
        mcp: McpOptions::default().with_timeout(Duration::from_secs(args.timeout)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(async move {
        let gateway = Arc::new(Gateway::start(servers, options).await?);
        let tools = gateway.tool_count().await;
        let names = gateway.upstream_names().join(", ");
        for name in &args.always_include {
            if !gateway.offers(name).await {
                bail!("--always-include {name}: no upstream offers a tool of that name");
            }
        }
        let started = format!("{tools} tools of {names}, searched with {model}");
        match &args.http {
            None => {
                eprintln!("decide mcp: {started}; serving MCP on stdio");
                // SIGTERM or Ctrl-C ends the session as a closed input does, so that the upstreams' process groups
                // are stopped with the runtime instead of outliving a gateway the signal would have killed.
                tokio::select! {
                    served = decide_mcp::serve_stdio(gateway) => served.map_err(anyhow::Error::msg)?,
                    () = crate::serve::shutdown() => {}
                }
            }
            Some(addr) => serve_http(gateway, addr, http.unwrap_or_default(), &started).await?,
        }
        Ok(())
    });
    // A stdio read cannot be cancelled (the runtime would wait for one more line): the session is over, so exit.
    // Every task goes with the runtime, the gateway's upstreams (and their process groups) with them, error or not.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}
