//! One client's session with the gateway: the MCP server side (`tools/list`, `tools/call`), the tools it found and
//! the calls it made.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use decide_chat::InvocationContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

use super::upstream::CallError;
use super::{found_json, Expose, Gateway, RecentCall, RECENT_CALLS, RECENT_RESULT_CHARS};

/// The name of the search tool the gateway offers.
pub const SEARCH_TOOLS: &str = "search_tools";
/// The name of the tool that forwards a call.
const CALL_TOOL: &str = "call_tool";

pub(crate) struct GatewaySession {
    gateway: Arc<Gateway>,
    /// The offered names of the tools found so far, in the order found; only ever grows.
    found: Mutex<Vec<String>>,
    recent: Mutex<VecDeque<RecentCall>>,
}

impl Drop for GatewaySession {
    fn drop(&mut self) {
        self.gateway.open_sessions.fetch_sub(1, Ordering::Relaxed);
    }
}

fn object(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

fn search_tool() -> Tool {
    Tool::new(
        SEARCH_TOOLS,
        "Search the tools of every connected MCP server by what you need to do. Returns the best matching tools, \
         each with its name, description, input schema and the probability that it fits; call one with call_tool \
         (or by its name, once it is listed).",
        object(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the tool should do, in a few words"},
                "max_results": {"type": "integer", "minimum": 1, "description": "The most tools to return"},
                "target_recall": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                  "description": "Return enough tools that this share of the needed ones is among them"}
            },
            "required": ["query"]
        })),
    )
}

fn call_tool() -> Tool {
    Tool::new(
        CALL_TOOL,
        "Call a tool that search_tools found, by its name, with its arguments.",
        object(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The tool's name, as search_tools gave it"},
                "arguments": {"type": "object", "description": "The tool's arguments, as its input schema says"}
            },
            "required": ["name"]
        })),
    )
}

/// A result the client's model reads as a failed call.
fn failure(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

impl GatewaySession {
    pub(crate) fn new(gateway: Arc<Gateway>) -> Self {
        gateway.open_sessions.fetch_add(1, Ordering::Relaxed);
        Self {
            gateway,
            found: Mutex::new(Vec::new()),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    async fn listed(&self) -> Vec<Tool> {
        let options = &self.gateway.options;
        let mut tools = vec![search_tool()];
        if options.expose == Expose::Search {
            tools.push(call_tool());
        }
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let catalogue = self.gateway.catalogue().await;
        let mut names: Vec<&String> = options.always_include.iter().collect();
        if options.expose == Expose::Found {
            names.extend(found.iter().filter(|n| !options.always_include.contains(n)));
        }
        for name in names {
            if let Some(entry) = catalogue.iter().find(|e| e.tool.name == name.as_str()) {
                tools.push(entry.tool.clone());
            }
        }
        tools
    }

    async fn search(
        &self,
        arguments: &Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let Some(query) = arguments.get("query").and_then(Value::as_str) else {
            return failure(
                "search_tools: query: missing (a string saying what the tool should do)",
            );
        };
        let max_results = match arguments.get("max_results") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().filter(|n| *n >= 1) {
                Some(n) => Some(n as usize),
                None => {
                    return failure(format!(
                        "search_tools: max_results: {v} is not a whole number of at least 1"
                    ))
                }
            },
        };
        let target_recall = match arguments.get("target_recall") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_f64() {
                Some(r) => Some(r),
                None => {
                    return failure(format!("search_tools: target_recall: {v} is not a number"))
                }
            },
        };
        let recent: Vec<RecentCall> = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let found = match self
            .gateway
            .search(query, max_results, target_recall, &recent)
            .await
        {
            Ok(found) => found,
            Err(error) => return failure(format!("search_tools: {error}")),
        };
        let catalogue = self.gateway.catalogue().await;
        let results: Vec<Value> = found
            .tools
            .iter()
            .map(|(tool, probability)| {
                let server = catalogue
                    .iter()
                    .find(|e| e.tool.name == tool.name)
                    .map(|e| self.gateway.upstreams[e.upstream].name.as_str())
                    .unwrap_or_default();
                found_json(tool, *probability, server)
            })
            .collect();
        let added = {
            let mut known = self.found.lock().unwrap_or_else(|e| e.into_inner());
            let mut added = false;
            for (tool, _) in &found.tools {
                if !known.iter().any(|n| n.as_str() == tool.name) {
                    known.push(tool.name.to_string());
                    added = true;
                }
            }
            added
        };
        if added && self.gateway.options.expose == Expose::Found {
            if let Err(error) = context.peer.notify_tool_list_changed().await {
                tracing::warn!(%error, "could not send notifications/tools/list_changed");
            }
        }
        let mut structured = json!({ "tools": results });
        // Tools of a server that is down cannot be found; saying so keeps the client from concluding they do not exist.
        let unavailable = self.gateway.unavailable().await;
        if !unavailable.is_empty() {
            structured["unavailable"] = Value::Array(unavailable);
        }
        let mut result = CallToolResult::success(vec![ContentBlock::text(structured.to_string())]);
        result.structured_content = Some(structured);
        result
    }

    /// Forwards a call of the offered tool `name` to its upstream and remembers it for later searches.
    async fn forward(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
    ) -> Result<CallToolResult, ErrorData> {
        let Some(entry) = self.gateway.entry(name).await else {
            return Ok(failure(format!(
                "unknown tool {name:?}: search_tools finds the tools of the connected servers"
            )));
        };
        let upstream = &self.gateway.upstreams[entry.upstream];
        let arguments_text = arguments
            .as_ref()
            .map(|a| Value::Object(a.clone()).to_string())
            .unwrap_or_else(|| "{}".into());
        let outcome = upstream
            .call(&entry.original, arguments, &InvocationContext::new())
            .await;
        let (result, text) = match outcome {
            Ok(result) => {
                let text = crate::result_text(&result);
                (Ok(result), text)
            }
            Err(CallError::Down(message)) => (Ok(failure(message.clone())), message),
            Err(CallError::Refused(error)) => {
                let text = error.message.to_string();
                (Err(error), text)
            }
        };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT_CALLS {
            recent.pop_front();
        }
        recent.push_back(RecentCall {
            name: name.to_owned(),
            arguments: arguments_text,
            result: shorten(&text, RECENT_RESULT_CHARS),
        });
        result
    }
}

impl ServerHandler for GatewaySession {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("decide", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "The tools of several MCP servers, found on demand: call search_tools with what you need to do, then \
             call the tool it found.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut result = ListToolsResult::default();
        result.tools = self.listed().await;
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            SEARCH_TOOLS => self.search(&arguments, &context).await,
            CALL_TOOL => {
                let Some(name) = arguments.get("name").and_then(Value::as_str) else {
                    return Ok(failure(
                        "call_tool: name: missing (the tool's name, as search_tools gave it)",
                    )
                    .into());
                };
                let inner = match arguments.get("arguments") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(map)) => Some(map.clone()),
                    Some(other) => {
                        return Ok(failure(format!(
                            "call_tool: arguments: expected an object, got {other}"
                        ))
                        .into())
                    }
                };
                self.forward(name, inner).await?
            }
            name => self.forward(name, Some(arguments)).await?,
        };
        Ok(result.into())
    }
}
