//! One upstream server: connected at start, its tools remembered, restarted with backoff when it dies or hangs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use decide_chat::InvocationContext;
use rmcp::model::{CallToolResult, ErrorData, Tool};
use serde_json::{Map, Value};

use super::config::ServerSpec;
use crate::{McpError, McpOptions, McpToolProvider};

/// The first restart waits this long after a failure; each failure in a row doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why a forwarded call has no result from the server.
pub(crate) enum CallError {
    /// The server is down, died during the call or did not answer in time: a message naming it.
    Down(String),
    /// The server refused the request with a JSON-RPC error, passed back as it came.
    Refused(ErrorData),
}

struct State {
    provider: Option<Arc<McpToolProvider>>,
    /// The tools of the last successful listing, kept while the server is down so that the catalogue (and the
    /// names a client was given) do not change under it.
    tools: Vec<Tool>,
    failures: u32,
    retry_at: Instant,
    last_error: String,
}

pub(crate) struct Upstream {
    /// The name clashes are prefixed with: the key of the configuration file, or the server's own name.
    pub(crate) name: String,
    spec: ServerSpec,
    options: McpOptions,
    state: tokio::sync::Mutex<State>,
}

async fn connect(spec: &ServerSpec, options: &McpOptions) -> Result<McpToolProvider, McpError> {
    match spec {
        ServerSpec::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut process = tokio::process::Command::new(command);
            process.args(args).envs(env);
            if let Some(cwd) = cwd {
                process.current_dir(cwd);
            }
            McpToolProvider::stdio_command(process, &spec.describe(), options.clone()).await
        }
        ServerSpec::Http { url } => McpToolProvider::http(url, options.clone()).await,
    }
}

/// Letters, digits, `_` and `-` only, so that a prefixed name stays a valid tool name for every LLM provider.
pub(crate) fn sanitize(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "server".into()
    } else {
        clean
    }
}

impl Upstream {
    /// Starts or connects to the server and lists its tools; `name` is the configuration's, or `None` for the
    /// server's own.
    pub(crate) async fn start(
        name: Option<String>,
        spec: ServerSpec,
        options: McpOptions,
    ) -> Result<Self, McpError> {
        let provider = connect(&spec, &options).await?;
        let name = sanitize(&name.unwrap_or_else(|| provider.server_name().to_owned()));
        Ok(Self {
            name,
            spec,
            options,
            state: tokio::sync::Mutex::new(State {
                tools: provider.listed_tools(),
                provider: Some(Arc::new(provider)),
                failures: 0,
                retry_at: Instant::now(),
                last_error: String::new(),
            }),
        })
    }

    /// The server's tools as last listed, restarting it first when it is down and its backoff has passed.
    pub(crate) async fn tools(&self) -> Vec<Tool> {
        let mut state = self.state.lock().await;
        // A failed restart only moves the backoff on: the last listing still stands.
        let _ = self.ensure(&mut state).await;
        state.tools.clone()
    }

    /// The live session, restarted when due; a message naming the server when it is down.
    async fn ensure(&self, state: &mut State) -> Result<Arc<McpToolProvider>, String> {
        if let Some(provider) = &state.provider {
            if !provider.is_closed() {
                return Ok(Arc::clone(provider));
            }
            self.failed(state, "the server exited".into());
        }
        let now = Instant::now();
        if now < state.retry_at {
            return Err(format!(
                "upstream {} is down ({}); restarting it in {:.1} s",
                self.name,
                state.last_error,
                (state.retry_at - now).as_secs_f64()
            ));
        }
        match connect(&self.spec, &self.options).await {
            Ok(provider) => {
                tracing::info!(server = %self.name, "restarted the MCP server");
                let provider = Arc::new(provider);
                state.tools = provider.listed_tools();
                state.provider = Some(Arc::clone(&provider));
                Ok(provider)
            }
            Err(error) => {
                self.failed(state, error.to_string());
                Err(format!(
                    "upstream {} could not be restarted: {}",
                    self.name, state.last_error
                ))
            }
        }
    }

    /// Drops the session (a stdio server is stopped with it) and schedules the next restart.
    fn failed(&self, state: &mut State, error: String) {
        state.provider = None;
        state.failures += 1;
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << (state.failures - 1).min(16))
            .min(MAX_BACKOFF);
        state.retry_at = Instant::now() + backoff;
        tracing::warn!(server = %self.name, %error, ?backoff, "MCP server down");
        state.last_error = error;
    }

    /// Forwards `tools/call` of the server's own tool `tool`; its result comes back unchanged.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        context: &InvocationContext,
    ) -> Result<CallToolResult, CallError> {
        let provider = {
            let mut state = self.state.lock().await;
            self.ensure(&mut state).await.map_err(CallError::Down)?
        };
        // The lock is not held during the call: other calls to the same server run alongside.
        match provider.call_result(tool, arguments, context).await {
            Ok(result) => {
                self.state.lock().await.failures = 0;
                Ok(result)
            }
            Err(McpError::Refused { error, .. }) => Err(CallError::Refused(error)),
            Err(error) => {
                let mut state = self.state.lock().await;
                // Only the session this call used is dropped; a restart that happened meanwhile stays.
                if state
                    .provider
                    .as_ref()
                    .is_some_and(|p| Arc::ptr_eq(p, &provider))
                {
                    self.failed(&mut state, error.to_string());
                }
                Err(CallError::Down(format!("upstream {}: {error}", self.name)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hanging_upstream_fails_the_call_naming_it_and_is_restarted_after_the_backoff() {
        let spec = ServerSpec::Stdio {
            // The small server of the end-to-end tests, whose `hang` tool never answers.
            command: "python3".into(),
            args: vec![
                concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mcp_client.py").into(),
                "upstream".into(),
            ],
            env: Default::default(),
            cwd: None,
        };
        let options = McpOptions::default().with_timeout(Duration::from_secs(2));
        let upstream = Upstream::start(None, spec, options).await.unwrap();
        assert_eq!(upstream.name, "tiny");
        let context = InvocationContext::new();
        let Err(CallError::Down(message)) = upstream.call("hang", None, &context).await else {
            panic!("a hanging call returned");
        };
        assert!(
            message.starts_with(
                "upstream tiny: MCP server tiny: no answer to tools/call hang within 2s"
            ),
            "{message}"
        );
        // Down until the backoff has passed: the error says so, and the tools stay listed.
        let Err(CallError::Down(message)) = upstream.call("echo", None, &context).await else {
            panic!("called a dropped session");
        };
        assert!(message.starts_with("upstream tiny is down"), "{message}");
        assert_eq!(upstream.tools().await.len(), 2);
        tokio::time::sleep(FIRST_BACKOFF).await;
        let word = serde_json::json!({"word": "stressed"});
        let Ok(result) = upstream
            .call("echo", word.as_object().cloned(), &context)
            .await
        else {
            panic!("not restarted");
        };
        assert_eq!(crate::result_text(&result), "desserts");
    }

    #[test]
    fn names_keep_only_what_every_provider_accepts() {
        assert_eq!(sanitize("mcp-servers/everything"), "mcp-servers_everything");
        assert_eq!(sanitize(""), "server");
    }
}
