//! The gateway: an MCP server that offers the tools of many upstream MCP servers through a search the decision model
//! answers, so that a client's requests carry the few tools a task needs instead of every server's list.
//!
//! To its client it offers `search_tools` (the upstream tools that fit a query, ranked by the decision model over
//! the query and the calls the session forwarded lately) and `call_tool` (a call forwarded to the upstream that owns
//! the tool, its result passed back unchanged). With [`Expose::Found`], `tools/list` also holds every tool found so
//! far in the session, announced with `notifications/tools/list_changed`, for clients that only call listed tools;
//! tools are only ever added within a session, so the client's prompt cache stays valid.
//!
//! Names that several upstreams share are offered as `SERVER__NAME`. An upstream that fails to start, dies or hangs
//! gives an error naming it (within the timeout), is named in every search's answer while it is down, and is
//! restarted in the background with backoff; the others serve meanwhile.

mod config;
mod http;
mod session;
mod upstream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use decide_chat::{ChatMessage, ToolSpecification, UserMessage};
use decide_contract::{Conformal, DecisionModel};
use decide_filter::{provider_request, ranked, search_filter, FilterError};
use rmcp::model::Tool;
use rmcp::ServiceExt;
use serde_json::{json, Value};

pub use config::{ServerSpec, ServersConfig};
pub use http::{serve_http, HttpOptions, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_TIMEOUT};
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
    upstreams: Vec<Arc<Upstream>>,
    options: GatewayOptions,
    /// Client sessions whose state is held, over every transport.
    open_sessions: AtomicUsize,
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
    /// retried in the background (see [`down`](Self::down)), while the others serve; the start fails, naming the
    /// first error, only when none of them started. Must be called within a Tokio runtime, which then runs the
    /// retries.
    pub async fn start(
        servers: Vec<(Option<String>, ServerSpec)>,
        options: GatewayOptions,
    ) -> Result<Self, McpError> {
        let mut upstreams: Vec<Arc<Upstream>> = Vec::new();
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
            upstreams.push(Arc::new(upstream));
        }
        if !failed.is_empty() && failed.len() == upstreams.len() {
            return Err(failed.swap_remove(0).1);
        }
        for (server, error) in &failed {
            tracing::warn!(%server, %error, "MCP server did not start; retrying it in the background");
        }
        for upstream in &upstreams {
            upstream.watch();
        }
        Ok(Self {
            upstreams,
            options,
            open_sessions: AtomicUsize::new(0),
        })
    }

    /// The upstreams that are down now (failed to start, died or hung, and not yet restarted), each by its name
    /// with why; the reason names the server, never its command line, whose arguments may hold secrets. Looking
    /// restarts nothing: that happens in the background.
    pub async fn down(&self) -> Vec<(String, String)> {
        let mut down = Vec::new();
        for upstream in &self.upstreams {
            if let Some(error) = upstream.down().await {
                down.push((upstream.name.clone(), error));
            }
        }
        down
    }

    /// [`down`](Self::down) as a search's answer names them.
    async fn unavailable(&self) -> Vec<Value> {
        self.down()
            .await
            .into_iter()
            .map(|(server, error)| json!({"server": server, "error": error}))
            .collect()
    }

    /// The client sessions whose state (the tools each found, its recent calls) is held now: over HTTP, a session
    /// from its `initialize` until it is deleted, expires or the server stops; over stdio, the one session.
    pub fn open_sessions(&self) -> usize {
        self.open_sessions.load(Ordering::Relaxed)
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
    pub(crate) fn session(self: &Arc<Self>) -> GatewaySession {
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
