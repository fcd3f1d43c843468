//! MCP for decide, with the `rmcp` crate: a [`ToolProvider`] backed by an MCP server, over stdio (a command the
//! provider starts) or streamable HTTP, and a [`Gateway`]: an MCP server of its own that offers the tools of many
//! upstream servers through a search the decision model answers (`decide mcp`).
//!
//! [`McpToolProvider::stdio`] and [`McpToolProvider::http`] connect, initialise the session and list the server's
//! tools (`tools/list`, every page). Each becomes a [`ToolSpecification`] with its name, description and input
//! schema, and with the server's metadata under [`METADATA_MCP`]: the server's name, the tool's title, annotations
//! and `_meta`, so a filter or a log can tell where a tool comes from. Its executor sends `tools/call` and returns the
//! text of the result; a result the server marks as an error (`isError`) is a failed call, which the agent shows to
//! the LLM.
//!
//! # Design
//!
//! * **Listed once, refreshed on demand.** `provide_tools` hands out the tools listed at connection (or at the last
//!   [`refresh`](McpToolProvider::refresh)) without I/O, so it is cheap and safe to call from anywhere, and a
//!   filtering provider around it decides on a stable list.
//! * **Nothing hangs.** Connecting, listing and every call are bounded by [`McpOptions::timeout`]; a server that dies
//!   makes the pending and later calls fail with an error naming the server, never a hang.
//! * **Synchronous executors, asynchronous client.** Provider executors are synchronous (the agent runs them on the
//!   blocking pool), the MCP session is asynchronous: a call runs on a scoped thread that drives it on the session's
//!   runtime, which works from the blocking pool and from plain threads alike.
//! * **The child is the provider's.** A stdio server runs in a process group of its own, and the whole group is
//!   stopped when the provider is dropped, so a server behind a launcher (`npx`, `uvx`, `sh -c`) goes with it.
//! * **A server sees only what it needs.** [`McpToolProvider::stdio`] and the gateway start a server with
//!   [`inherited_environment`] (the variables the official MCP SDKs pass: `HOME`, `LOGNAME`, `PATH`, `SHELL`,
//!   `TERM`, `USER`) plus the ones configured for it, never the caller's whole environment, which holds API keys.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), decide_mcp::McpError> {
//! use decide_mcp::{McpOptions, McpToolProvider};
//! let provider = McpToolProvider::stdio("npx", ["-y", "@modelcontextprotocol/server-everything"], McpOptions::default()).await?;
//! println!("{} tools from {}", provider.tool_names().len(), provider.server_name());
//! # Ok(()) }
//! ```
//!
//! [`ToolProvider`]: decide_chat::ToolProvider
#![deny(missing_docs)]

mod gateway;
mod stdio;

/// The read timeout, connection cap and shutdown deadline of [`HttpOptions::connections`].
pub use decide_http::server::ConnectionLimits;
pub use gateway::{
    serve_http, serve_stdio, Expose, Gateway, GatewayOptions, HttpOptions, ServerSpec,
    ServersConfig, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_TIMEOUT, SEARCH_TOOLS,
};
pub use stdio::MAX_MESSAGE_BYTES;

use std::borrow::Cow;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use decide_chat::{
    InvocationContext, ProvidedTool, ToolExecutionError, ToolExecutor, ToolProvider,
    ToolProviderError, ToolProviderRequest, ToolProviderResult, ToolSpecification,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, MetaObject, RequestMetaObject, Tool,
};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Map, Value};

/// The metadata key of a tool specification holding what the MCP server said about the tool:
/// `{"server": name, "title", "annotations", "meta"}` (the parts the server gave).
pub const METADATA_MCP: &str = "mcp";

/// The default timeout of connecting, listing and each call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an MCP server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started or connected to, or the session could not be initialised.
    #[error("MCP server {server}: cannot connect: {message}")]
    Connect {
        /// The command or URL.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// The server did not answer in time.
    #[error("MCP server {server}: no answer to {what} within {timeout:?}")]
    Timeout {
        /// The server's name, or its command or URL.
        server: String,
        /// The request.
        what: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an error, or the session ended (the server died).
    #[error("MCP server {server}: {what} failed: {message}")]
    Request {
        /// The server's name, or its command or URL.
        server: String,
        /// The request.
        what: String,
        /// The server's error, or why the session ended.
        message: String,
    },
    /// The server's answer was over [`MAX_MESSAGE_BYTES`], the transport's limit on one message, and was dropped
    /// unread; the server is still up.
    #[error("MCP server {server}: the answer to {what} is {bytes} bytes, over the limit of {} MiB on one message", limit >> 20)]
    TooLarge {
        /// The server's name, or its command or URL.
        server: String,
        /// The request.
        what: String,
        /// The size of the answer, its newline included.
        bytes: usize,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The server refused the request with a JSON-RPC error (an unknown tool, invalid arguments): the server is
    /// up, the request was wrong.
    #[error("MCP server {server}: {what} failed: {}", error.message)]
    Refused {
        /// The server's name, or its command or URL.
        server: String,
        /// The request.
        what: String,
        /// The server's error, as it sent it.
        error: rmcp::model::ErrorData,
    },
}

/// How to talk to a server.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The timeout of connecting, listing and each call (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl McpOptions {
    /// These options with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

struct Session {
    service: RunningService<RoleClient, ()>,
    runtime: tokio::runtime::Handle,
    server: String,
    timeout: Duration,
    /// Dropped after `service` (fields drop in order): the session's end first closes the server's input, then
    /// the server goes, then whatever is left of its process group.
    _child: Option<stdio::Child>,
    _process_group: Option<ProcessGroup>,
}

/// A stdio server's process group, killed when dropped: a launcher (`npx`, `uvx`, `sh -c`) may exit on its
/// own when its input closes and leave the real server running, which nothing else would stop.
struct ProcessGroup(u32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Ok(id) = i32::try_from(self.0) {
            // The group outlives its leader while any member lives, so its id is not reused before then; once
            // it is empty the signal finds nobody (ESRCH), which is fine.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(id),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Session {
    fn peer(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }

    async fn call(
        &self,
        name: &str,
        arguments: &str,
        context: &InvocationContext,
    ) -> Result<CallToolResult, ToolExecutionError> {
        let arguments = parse_arguments(arguments)?;
        self.call_raw(name, arguments, context)
            .await
            .map_err(|error| ToolExecutionError::Failed(Box::new(error)))
    }

    async fn call_raw(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        context: &InvocationContext,
    ) -> Result<CallToolResult, McpError> {
        let mut params = CallToolRequestParams::new(Cow::Owned(name.to_owned()));
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        if let Some(context) = context_meta(context) {
            let mut meta = Map::new();
            meta.insert(META_CONTEXT.into(), context);
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        let what = format!("tools/call {name}");
        match tokio::time::timeout(self.timeout, self.peer().call_tool(params)).await {
            Err(_) => Err(McpError::Timeout {
                server: self.server.clone(),
                what,
                timeout: self.timeout,
            }),
            Ok(Err(rmcp::ServiceError::McpError(error))) => match stdio::too_large_answer(&error) {
                Some((bytes, limit)) => Err(McpError::TooLarge {
                    server: self.server.clone(),
                    what,
                    bytes,
                    limit,
                }),
                None => Err(McpError::Refused {
                    server: self.server.clone(),
                    what,
                    error,
                }),
            },
            Ok(Err(error)) => Err(McpError::Request {
                server: self.server.clone(),
                what,
                message: error.to_string(),
            }),
            Ok(Ok(result)) => Ok(result),
        }
    }
}

/// The `_meta` key of a `tools/call` request under which the caller's [`InvocationContext`] travels to the server:
/// `{"chatMemoryId"?, "attributes"?}`, sent only when the context has something.
pub const META_CONTEXT: &str = "decide/context";

fn context_meta(context: &InvocationContext) -> Option<Value> {
    let mut object = Map::new();
    if let Some(id) = &context.chat_memory_id {
        object.insert("chatMemoryId".into(), json!(id));
    }
    if !context.attributes.is_empty() {
        object.insert(
            "attributes".into(),
            Value::Object(context.attributes.clone()),
        );
    }
    (!object.is_empty()).then_some(Value::Object(object))
}

/// Blank text or `null` is no arguments; anything but an object is refused before it reaches the server.
fn parse_arguments(arguments: &str) -> Result<Option<Map<String, Value>>, ToolExecutionError> {
    if arguments.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(Value::Null) => Ok(None),
        Ok(other) => Err(ToolExecutionError::InvalidArguments(format!(
            "expected a JSON object, got {other}"
        ))),
        Err(error) => Err(ToolExecutionError::InvalidArguments(format!(
            "not JSON: {error}"
        ))),
    }
}

/// The text of a call's result: the text blocks joined with newlines, other blocks as their JSON, the structured
/// content when there is nothing else.
pub fn result_text(result: &CallToolResult) -> String {
    let mut parts = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            other => parts.push(serde_json::to_string(other).unwrap_or_default()),
        }
    }
    if parts.is_empty() {
        if let Some(structured) = &result.structured_content {
            return structured.to_string();
        }
    }
    parts.join("\n")
}

/// Runs `tools/call` for one tool of a session.
struct McpExecutor {
    session: Arc<Session>,
    name: String,
}

impl ToolExecutor for McpExecutor {
    fn execute(
        &self,
        arguments: &str,
        context: &InvocationContext,
    ) -> Result<String, ToolExecutionError> {
        let session = Arc::clone(&self.session);
        // A thread of its own drives the call on the session's runtime: `Handle::block_on` must not run on a
        // runtime thread, and this executor may be called from one.
        let result = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    session
                        .runtime
                        .block_on(session.call(&self.name, arguments, context))
                })
                .join()
                .map_err(|_| ToolExecutionError::failed("the MCP call panicked"))?
        })?;
        let text = result_text(&result);
        if result.is_error == Some(true) {
            return Err(ToolExecutionError::failed(text));
        }
        Ok(text)
    }
}

impl McpError {
    /// The same error naming the server `server`.
    pub(crate) fn renamed(mut self, name: &str) -> Self {
        match &mut self {
            Self::Connect { server, .. }
            | Self::Timeout { server, .. }
            | Self::Request { server, .. }
            | Self::TooLarge { server, .. }
            | Self::Refused { server, .. } => *server = name.to_owned(),
        }
        self
    }
}

/// The variables of this process a stdio MCP server inherits: those the official MCP SDKs pass
/// (`HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM` and `USER`; on Windows the system folders, `PATH`,
/// `TEMP` and the user's profile), where set, and none whose value starts with `()` (a shell
/// function). Everything else, API keys above all, stays out unless the server's configuration
/// names it under `env`.
pub fn inherited_environment() -> Vec<(String, String)> {
    allowed_environment(std::env::vars_os())
}

#[cfg(windows)]
const INHERITED: &[&str] = &[
    "APPDATA",
    "HOMEDRIVE",
    "HOMEPATH",
    "LOCALAPPDATA",
    "PATH",
    "PATHEXT",
    "PROCESSOR_ARCHITECTURE",
    "SYSTEMDRIVE",
    "SYSTEMROOT",
    "TEMP",
    "USERNAME",
    "USERPROFILE",
];
#[cfg(not(windows))]
const INHERITED: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

fn allowed_environment(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(String, String)> {
    vars.filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, value)| {
            INHERITED
                .iter()
                .any(|allowed| name.eq_ignore_ascii_case(allowed))
                && !value.starts_with("()")
        })
        .collect()
}

/// A [`ToolProvider`] handing out the tools of one MCP server.
pub struct McpToolProvider {
    session: Arc<Session>,
    tools: RwLock<Vec<ProvidedTool>>,
    listed: RwLock<Vec<Tool>>,
}

impl McpToolProvider {
    /// Starts `command` with `args`, connects to it over its standard input and output, and lists its tools.
    ///
    /// Must be called within a Tokio runtime, which then runs the session; the server is stopped when the provider
    /// is dropped.
    pub async fn stdio<I, S>(command: &str, args: I, options: McpOptions) -> Result<Self, McpError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut process = tokio::process::Command::new(command);
        process.args(args).env_clear().envs(inherited_environment());
        Self::stdio_command(process, command, options).await
    }

    /// Like [`stdio`](Self::stdio), with the command set up by the caller (its environment, its working
    /// folder); `name` names the server in errors until it gives its own. The command inherits the
    /// caller's environment unless it was cleared: see [`inherited_environment`].
    pub async fn stdio_command(
        mut process: tokio::process::Command,
        name: &str,
        options: McpOptions,
    ) -> Result<Self, McpError> {
        // A server that never answers must not outlive the provider that gave up on it.
        process.kill_on_drop(true);
        let server = name.to_owned();
        let connect_error = |message: String| McpError::Connect {
            server: server.clone(),
            message,
        };
        let mut process = process_wrap::tokio::CommandWrap::from(process);
        // The group's leader is the command; killing the group at drop reaches the server a launcher started.
        #[cfg(unix)]
        process.wrap(process_wrap::tokio::ProcessGroup::leader());
        // Not rmcp's own child transport: the relay between the server's output and rmcp answers a request whose
        // answer is over the limit on one message, which rmcp would drop and leave waiting (see `stdio`).
        let (child, transport) = stdio::spawn(process)
            .map_err(|error| connect_error(format!("cannot start it: {error}")))?;
        // On Unix the child leads its own group, so its pid is the group's id.
        let group = child.id().filter(|_| cfg!(unix)).map(ProcessGroup);
        let child = Some(child);
        let service = tokio::time::timeout(options.timeout, ().serve(transport))
            .await
            .map_err(|_| McpError::Timeout {
                server: server.clone(),
                what: "initialize".into(),
                timeout: options.timeout,
            })?
            .map_err(|error| connect_error(error.to_string()))?;
        Self::connected(service, server, options, child, group).await
    }

    /// Connects to the streamable HTTP MCP endpoint at `url` (e.g. `http://localhost:3001/mcp`) and lists its
    /// tools. Must be called within a Tokio runtime, which then runs the session.
    pub async fn http(url: &str, options: McpOptions) -> Result<Self, McpError> {
        let transport = StreamableHttpClientTransport::from_uri(url.to_owned());
        let service = tokio::time::timeout(options.timeout, ().serve(transport))
            .await
            .map_err(|_| McpError::Timeout {
                server: url.to_owned(),
                what: "initialize".into(),
                timeout: options.timeout,
            })?
            .map_err(|error| McpError::Connect {
                server: url.to_owned(),
                message: error.to_string(),
            })?;
        Self::connected(service, url.to_owned(), options, None, None).await
    }

    async fn connected(
        service: RunningService<RoleClient, ()>,
        address: String,
        options: McpOptions,
        child: Option<stdio::Child>,
        process_group: Option<ProcessGroup>,
    ) -> Result<Self, McpError> {
        let server = service
            .peer_info()
            .and_then(|info| info.server_info.as_ref().map(|i| i.name.clone()))
            .filter(|name| !name.trim().is_empty())
            .unwrap_or(address);
        let session = Arc::new(Session {
            service,
            runtime: tokio::runtime::Handle::current(),
            server,
            timeout: options.timeout,
            _child: child,
            _process_group: process_group,
        });
        let provider = Self {
            session,
            tools: RwLock::new(Vec::new()),
            listed: RwLock::new(Vec::new()),
        };
        provider.refresh().await?;
        Ok(provider)
    }

    /// Lists the server's tools again (`tools/list`, every page) and hands out the new list from now on.
    pub async fn refresh(&self) -> Result<(), McpError> {
        let session = &self.session;
        let listed = tokio::time::timeout(session.timeout, session.peer().list_all_tools())
            .await
            .map_err(|_| McpError::Timeout {
                server: session.server.clone(),
                what: "tools/list".into(),
                timeout: session.timeout,
            })?
            .map_err(|error| McpError::Request {
                server: session.server.clone(),
                what: "tools/list".into(),
                message: error.to_string(),
            })?;
        let tools = listed
            .iter()
            .map(|tool| {
                let mut metadata = Map::new();
                metadata.insert("server".into(), json!(session.server));
                if let Some(title) = &tool.title {
                    metadata.insert("title".into(), json!(title));
                }
                if let Some(annotations) = &tool.annotations {
                    metadata.insert(
                        "annotations".into(),
                        serde_json::to_value(annotations).unwrap_or(Value::Null),
                    );
                }
                if let Some(meta) = &tool.meta {
                    metadata.insert(
                        "meta".into(),
                        serde_json::to_value(meta).unwrap_or(Value::Null),
                    );
                }
                let mut specification = ToolSpecification::new(tool.name.to_string())
                    .with_parameters(Value::Object((*tool.input_schema).clone()));
                if let Some(description) = &tool.description {
                    specification = specification.with_description(description.to_string());
                }
                specification
                    .metadata
                    .insert(METADATA_MCP.into(), Value::Object(metadata));
                let executor = McpExecutor {
                    session: Arc::clone(session),
                    name: tool.name.to_string(),
                };
                ProvidedTool::new(specification).with_executor(Arc::new(executor))
            })
            .collect();
        *self.tools.write().unwrap_or_else(|e| e.into_inner()) = tools;
        *self.listed.write().unwrap_or_else(|e| e.into_inner()) = listed;
        Ok(())
    }

    /// The tools as the server listed them (every field of its `tools/list`), in its order.
    pub fn listed_tools(&self) -> Vec<Tool> {
        self.listed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Calls a tool (`tools/call`), bounded by the timeout, and returns the server's result unchanged: its content,
    /// structured content and `isError`. An `Err` is a call that got no result (the server died, hung or refused the
    /// request), not a tool that reported an error.
    pub async fn call_result(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
        context: &InvocationContext,
    ) -> Result<CallToolResult, McpError> {
        self.session.call_raw(name, arguments, context).await
    }

    /// Whether the session has ended (the server exited or closed the connection).
    pub fn is_closed(&self) -> bool {
        self.session.service.is_closed()
    }

    /// The server's name (from its `serverInfo`), or its command or URL if it gave none.
    pub fn server_name(&self) -> &str {
        &self.session.server
    }

    /// The names of the listed tools, in the server's order.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|t| t.name().to_owned())
            .collect()
    }

    /// Calls a tool directly (`tools/call`), bounded by the timeout, with the caller's context in the request's
    /// `_meta` under [`META_CONTEXT`]; the text of the result, or the server's error.
    pub async fn call(
        &self,
        name: &str,
        arguments: &str,
        context: &InvocationContext,
    ) -> Result<String, ToolExecutionError> {
        let result = self.session.call(name, arguments, context).await?;
        let text = result_text(&result);
        if result.is_error == Some(true) {
            return Err(ToolExecutionError::failed(text));
        }
        Ok(text)
    }
}

impl ToolProvider for McpToolProvider {
    fn provide_tools(
        &self,
        _request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError> {
        Ok(ToolProviderResult::new(
            self.tools.read().unwrap_or_else(|e| e.into_inner()).clone(),
        ))
    }
}

impl std::fmt::Debug for McpToolProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpToolProvider")
            .field("server", &self.session.server)
            .field("tools", &self.tool_names())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stdio_server_inherits_only_the_allowed_variables() {
        let parent = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/a"),
            ("DECIDE_API_KEY", "k1"),
            ("OPENAI_API_KEY", "k2"),
            ("TERM", "() { :; }"),
            ("LANG", "C.UTF-8"),
        ];
        let kept = allowed_environment(parent.iter().map(|(k, v)| (k.into(), v.into())));
        let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
        #[cfg(not(windows))]
        assert_eq!(names, ["PATH", "HOME"]);
        #[cfg(windows)]
        assert_eq!(names, ["PATH"]);
    }
}
