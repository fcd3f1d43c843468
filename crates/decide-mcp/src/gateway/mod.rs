//! The gateway: an MCP server that offers the tools of many upstream MCP servers through a search the decision model
//! answers, so that a client's requests carry the few tools a task needs instead of every server's list.
//!
//! To its client it offers `search_tools` (the upstream tools that fit a query, ranked by the decision model over
//! the query and the calls the session forwarded lately) and `call_tool` (a call forwarded to the upstream that owns
//! the tool, its result passed back unchanged). With [`Expose::Found`], `tools/list` also holds every tool found so
//! far in the session, announced with `notifications/tools/list_changed`, for clients that only call listed tools;
//! tools are only ever added within a session, so the client's prompt cache stays valid.
//!
//! Names that several upstreams share are offered as `SERVER__NAME`. An upstream that dies or hangs gives an error
//! naming it (within the timeout), and is restarted with backoff at its next use.

mod config;
mod session;
mod upstream;

use std::collections::HashMap;
use std::sync::Arc;

use decide_chat::{ChatMessage, ToolSpecification, UserMessage};
use decide_contract::{Conformal, DecisionModel};
use decide_filter::{provider_request, ranked, search_filter, FilterError};
use rmcp::model::Tool;
use rmcp::ServiceExt;
use serde_json::{json, Value};

pub use config::{ServerSpec, ServersConfig};
pub use session::SEARCH_TOOLS;

use crate::{McpError, McpOptions};
use session::GatewaySession;
use upstream::Upstream;

/// Which tools `tools/list` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Expose {
    /// `search_tools` and `call_tool` (and the `always_include` tools): the client calls what it found through
    /// `call_tool`.
    #[default]
    Search,
    /// `search_tools`, the `always_include` tools and every tool found so far in the session, announced with
    /// `notifications/tools/list_changed` as searches find them.
    Found,
}

impl std::str::FromStr for Expose {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "search" => Ok(Self::Search),
            "found" => Ok(Self::Found),
            other => Err(format!("{other:?} (expected search or found)")),
        }
    }
}

/// How the gateway searches and what it lists.
#[derive(Clone)]
pub struct GatewayOptions {
    /// Decides which tools fit a search.
    pub decision_model: Arc<dyn DecisionModel>,
    /// The decision model's conformal table, which a search's `target_recall` needs.
    pub conformal: Option<Conformal>,
    /// What `tools/list` holds.
    pub expose: Expose,
    /// Tools always listed, by their offered name.
    pub always_include: Vec<String>,
    /// The most tools a search returns when it does not say (default 5).
    pub max_results: usize,
    /// The target recall of a search that gives none; `None` for the best `max_results` whatever their probability.
    pub target_recall: Option<f64>,
    /// The timeout of starting each upstream, listing its tools and each call.
    pub mcp: McpOptions,
}

/// The tools forwarded calls are remembered for, so that the next search is read in their light.
const RECENT_CALLS: usize = 5;
/// The longest result text a remembered call keeps, in characters.
const RECENT_RESULT_CHARS: usize = 500;

/// One offered tool: its name as offered and where it comes from.
#[derive(Clone)]
struct Entry {
    /// The tool as the upstream listed it, under its offered name.
    tool: Tool,
    upstream: usize,
    /// The name the upstream knows it by.
    original: String,
}

/// The upstream servers and how to search them; one per process, shared by every client session.
pub struct Gateway {
    upstreams: Vec<Upstream>,
    options: GatewayOptions,
}

/// A forwarded call the next search is read with.
#[derive(Clone)]
struct RecentCall {
    name: String,
    arguments: String,
    result: String,
}

/// A search's answer: each tool with its probability.
struct Found {
    tools: Vec<(Tool, f64)>,
}

impl Gateway {
    /// Starts (or connects to) every upstream and lists its tools. One that fails is named in a warning and
    /// tried again at its next use, while the others serve; the start fails, naming the first error, only
    /// when none of them started.
    pub async fn start(
        servers: Vec<(Option<String>, ServerSpec)>,
        options: GatewayOptions,
    ) -> Result<Self, McpError> {
        let mut upstreams: Vec<Upstream> = Vec::new();
        // Each failed start with its upstream's name; what to do with them depends on whether any started.
        let mut failed = Vec::new();
        for (name, spec) in servers {
            let (mut upstream, error) = Upstream::start(name, spec, options.mcp.clone()).await;
            // Two servers of one name still need distinct prefixes.
            let base = upstream.name.clone();
            let mut n = 1;
            while upstreams.iter().any(|u| u.name == upstream.name) {
                n += 1;
                upstream.name = format!("{base}_{n}");
            }
            if let Some(error) = error {
                failed.push((upstream.name.clone(), error));
            }
            upstreams.push(upstream);
        }
        if !failed.is_empty() && failed.len() == upstreams.len() {
            return Err(failed.swap_remove(0).1);
        }
        for (server, error) in &failed {
            tracing::warn!(%server, %error, "MCP server did not start; trying again at its next use");
        }
        Ok(Self { upstreams, options })
    }

    /// The upstreams that are down, each with why, for a search's answer to name.
    async fn unavailable(&self) -> Vec<Value> {
        let mut down = Vec::new();
        for upstream in &self.upstreams {
            if let Some(error) = upstream.down().await {
                down.push(json!({"server": upstream.name, "error": error}));
            }
        }
        down
    }

    /// The upstreams' names, in order.
    pub fn upstream_names(&self) -> Vec<String> {
        self.upstreams.iter().map(|u| u.name.clone()).collect()
    }

    /// Every upstream tool under its offered name: its own, or `SERVER__NAME` when several servers have it.
    async fn catalogue(&self) -> Vec<Entry> {
        let mut listed = Vec::new();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            listed.push((i, upstream.tools().await));
        }
        let mut count: HashMap<String, usize> = HashMap::new();
        for (_, tools) in &listed {
            for tool in tools {
                *count.entry(tool.name.to_string()).or_default() += 1;
            }
        }
        let mut entries = Vec::new();
        for (i, tools) in listed {
            for mut tool in tools {
                let original = tool.name.to_string();
                if count[&original] > 1 {
                    tool.name = format!("{}__{original}", self.upstreams[i].name).into();
                }
                entries.push(Entry {
                    tool,
                    upstream: i,
                    original,
                });
            }
        }
        entries
    }

    /// The number of upstream tools offered.
    pub async fn tool_count(&self) -> usize {
        self.catalogue().await.len()
    }

    /// Whether an upstream offers a tool of this (offered) name.
    pub async fn offers(&self, name: &str) -> bool {
        self.entry(name).await.is_some()
    }

    async fn entry(&self, name: &str) -> Option<Entry> {
        self.catalogue()
            .await
            .into_iter()
            .find(|e| e.tool.name == name)
    }

    /// The tools that fit `query`, best first, read with the session's recent calls. Tools the session already
    /// called are not returned again: the filter passes them without asking, and the client has them.
    async fn search(
        &self,
        query: &str,
        max_results: Option<usize>,
        target_recall: Option<f64>,
        recent: &[RecentCall],
    ) -> Result<Found, String> {
        let catalogue = self.catalogue().await;
        if catalogue.is_empty() {
            return Ok(Found { tools: Vec::new() });
        }
        let specifications: Vec<ToolSpecification> = catalogue
            .iter()
            .map(|e| {
                let mut spec = ToolSpecification::new(e.tool.name.to_string())
                    .with_parameters(Value::Object((*e.tool.input_schema).clone()));
                if let Some(description) = &e.tool.description {
                    spec = spec.with_description(description.to_string());
                }
                spec
            })
            .collect();
        let recall = match target_recall.or(self.options.target_recall) {
            None => None,
            Some(r) => Some((
                r,
                self.options.conformal.as_ref().ok_or_else(|| {
                    "target_recall: the decision model has no conformal table".to_owned()
                })?,
            )),
        };
        let filter = search_filter(
            specifications,
            Arc::clone(&self.options.decision_model),
            max_results.unwrap_or(self.options.max_results),
            recall,
        )
        .map_err(|e| match e {
            FilterError::InvalidConfig { option, message } => format!("{option}: {message}"),
            other => other.to_string(),
        })?;
        let request = provider_request(&conversation(query, recent))
            .ok_or_else(|| "query: empty".to_owned())?;
        let selection = tokio::task::spawn_blocking(move || filter.select(&request))
            .await
            .map_err(|e| format!("the search failed: {e}"))?
            .map_err(|e| format!("the decision model failed: {e}"))?;
        let tools: Vec<(Tool, f64)> = ranked(&selection)
            .into_iter()
            .filter_map(|(name, probability)| {
                let entry = catalogue.iter().find(|e| e.tool.name == name)?;
                Some((entry.tool.clone(), probability))
            })
            .collect();
        Ok(Found { tools })
    }

    /// A new client session over this gateway.
    fn session(self: &Arc<Self>) -> GatewaySession {
        GatewaySession::new(Arc::clone(self))
    }
}

/// The search as a conversation: the recent calls (each an assistant tool call and its result), then the query as
/// the user's message, which is what the decision model was trained to read.
fn conversation(query: &str, recent: &[RecentCall]) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    for (i, call) in recent.iter().enumerate() {
        let id = format!("call_{i}");
        messages.push(ChatMessage::Assistant(decide_chat::AssistantMessage {
            text: None,
            tool_calls: vec![decide_chat::ToolCall::new(
                Some(id.as_str()),
                &call.name,
                &call.arguments,
            )],
        }));
        messages.push(ChatMessage::ToolResult(decide_chat::ToolResultMessage {
            tool_call_id: Some(id),
            tool_name: Some(call.name.clone()),
            text: call.result.clone(),
        }));
    }
    messages.push(ChatMessage::User(UserMessage::new(query)));
    messages
}

/// A search result as `search_tools` returns it.
fn found_json(tool: &Tool, probability: f64, server: &str) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "probability": (probability * 1000.0).round() / 1000.0,
        "server": server,
    })
}

/// Serves the gateway to one client over standard input and output until the client closes them.
pub async fn serve_stdio(gateway: Arc<Gateway>) -> Result<(), String> {
    let service = gateway
        .session()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP session over stdio: {e}"))?;
    service
        .waiting()
        .await
        .map_err(|e| format!("the MCP session over stdio: {e}"))?;
    Ok(())
}

/// Serves the gateway over streamable HTTP at `/mcp` on `listener`, one session per client (`Mcp-Session-Id`),
/// until `shutdown` completes. With `api_key`, every request needs `Authorization: Bearer KEY`.
pub async fn serve_http(
    gateway: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    api_key: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let mut config = StreamableHttpServerConfig::default();
    if !local.ip().is_loopback() {
        // Reached by other machines under names this process cannot know: the API key guards it instead of the
        // Host check, which protects loopback servers from DNS rebinding.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(gateway.session()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let key = api_key.as_deref().map(decide_http::ApiKey::new);
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    // As `decide serve` reads it: the bearer scheme in any case, compared over digests.
                    let authorized = key.as_ref().is_none_or(|key| {
                        key.accepts(
                            request
                                .headers()
                                .get(axum::http::header::AUTHORIZATION)
                                .and_then(|v| v.to_str().ok()),
                        )
                    });
                    async move {
                        if authorized {
                            next.run(request).await
                        } else {
                            axum::response::IntoResponse::into_response((
                                axum::http::StatusCode::UNAUTHORIZED,
                                "missing or wrong API key (Authorization: Bearer KEY)",
                            ))
                        }
                    }
                },
            ));
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| e.to_string())
}
