//! One upstream server: connected at start, its tools remembered, restarted with backoff when it dies or hangs.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use decide_chat::InvocationContext;
use rmcp::model::{CallToolResult, ErrorData, Tool};
use serde_json::{Map, Value};

use super::config::ServerSpec;
use crate::{McpError, McpOptions, McpToolProvider};

/// The first restart waits this long after a failure; each failure in a row doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often the background restarter looks at a server that is up, to notice one that exited while idle.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

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
    /// What errors call it before it gives its own name.
    label: String,
    spec: ServerSpec,
    options: McpOptions,
    /// Held only briefly: a search reads the tools of a server being restarted without waiting for the restart.
    state: tokio::sync::Mutex<State>,
    /// Held for a whole restart, so that the background restarter and a call do not start the server twice.
    restarting: tokio::sync::Mutex<()>,
}

/// Starts or connects to the server; `label` names it in errors (the configuration's key, never a command line
/// whose arguments may hold secrets).
async fn connect(
    spec: &ServerSpec,
    label: &str,
    options: &McpOptions,
) -> Result<McpToolProvider, McpError> {
    match spec {
        ServerSpec::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut process = tokio::process::Command::new(command);
            // The gateway's own environment holds its API key and the LLM's: a server gets only the
            // allow-listed variables and what its configuration gives it.
            process
                .args(args)
                .env_clear()
                .envs(crate::inherited_environment())
                .envs(env);
            if let Some(cwd) = cwd {
                process.current_dir(cwd);
            }
            McpToolProvider::stdio_command(process, label, options.clone()).await
        }
        ServerSpec::Http { url } => McpToolProvider::http(url, options.clone())
            .await
            .map_err(|error| error.renamed(label)),
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
    /// server's own. A server that fails to start is kept, down, with no tools and its error, and is tried again
    /// after the backoff (by [`watch`](Self::watch), or at its next call): one broken server does not stop the
    /// others. The error is the start's, when it failed.
    pub(crate) async fn start(
        name: Option<String>,
        spec: ServerSpec,
        options: McpOptions,
    ) -> (Self, Option<McpError>) {
        let label = name.clone().unwrap_or_else(|| spec.describe());
        let (provider, error) = match connect(&spec, &label, &options).await {
            Ok(provider) => (Some(provider), None),
            Err(error) => (None, Some(error)),
        };
        let last_error = error.as_ref().map(ToString::to_string).unwrap_or_default();
        let name = sanitize(&match (&name, &provider) {
            (Some(name), _) => name.clone(),
            (None, Some(provider)) => provider.server_name().to_owned(),
            (None, None) => label.clone(),
        });
        let failures = u32::from(provider.is_none());
        let upstream = Self {
            name,
            label,
            spec,
            options,
            state: tokio::sync::Mutex::new(State {
                tools: provider
                    .as_ref()
                    .map(McpToolProvider::listed_tools)
                    .unwrap_or_default(),
                provider: provider.map(Arc::new),
                failures,
                retry_at: Instant::now()
                    + if failures > 0 {
                        FIRST_BACKOFF
                    } else {
                        Duration::ZERO
                    },
                last_error,
            }),
            restarting: tokio::sync::Mutex::new(()),
        };
        (upstream, error)
    }

    /// Restarts the server in the background whenever it is down and its backoff has passed, whether it failed at
    /// start, died or hung, so that a search finds its tools again without a call having to revive it first. The
    /// task ends once the upstream is dropped.
    pub(crate) fn watch(self: &Arc<Self>) {
        let upstream = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(wait) = Self::next_check(&upstream).await else {
                    return;
                };
                tokio::time::sleep(wait).await;
                let Some(this) = upstream.upgrade() else {
                    return;
                };
                // Not due, or failed again: the backoff moved on, and the next check waits for it.
                let _ = this.ensure().await;
            }
        });
    }

    /// How long the restarter waits before it looks again; `None` once the upstream is gone.
    async fn next_check(upstream: &Weak<Self>) -> Option<Duration> {
        let this = upstream.upgrade()?;
        let state = this.state.lock().await;
        let up = state.provider.as_ref().is_some_and(|p| !p.is_closed());
        Some(if up {
            WATCH_INTERVAL
        } else {
            state.retry_at.saturating_duration_since(Instant::now())
        })
    }

    /// Why the server is down, when it is.
    pub(crate) async fn down(&self) -> Option<String> {
        let state = self.state.lock().await;
        match &state.provider {
            Some(provider) if !provider.is_closed() => None,
            _ => Some(state.last_error.clone()),
        }
    }

    /// The server's tools as last listed (kept while it is down); never waits for a restart.
    pub(crate) async fn tools(&self) -> Vec<Tool> {
        self.state.lock().await.tools.clone()
    }

    /// The live session, restarted first when it is down and its backoff has passed; a message naming the server
    /// when it is down. A restart under way is waited for rather than started again.
    async fn ensure(&self) -> Result<Arc<McpToolProvider>, String> {
        let _one_restart = self.restarting.lock().await;
        {
            let mut state = self.state.lock().await;
            if let Some(provider) = &state.provider {
                if !provider.is_closed() {
                    return Ok(Arc::clone(provider));
                }
                self.failed(&mut state, "the server exited".into());
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
        }
        // Without the state's lock: a server that takes its whole timeout to start must not hold up searches.
        let connected = connect(&self.spec, &self.label, &self.options).await;
        let mut state = self.state.lock().await;
        match connected {
            Ok(provider) => {
                tracing::info!(server = %self.name, "restarted the MCP server");
                let provider = Arc::new(provider);
                state.tools = provider.listed_tools();
                state.provider = Some(Arc::clone(&provider));
                Ok(provider)
            }
            Err(error) => {
                self.failed(&mut state, error.to_string());
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
        let provider = self.ensure().await.map_err(CallError::Down)?;
        // The lock is not held during the call: other calls to the same server run alongside.
        match provider.call_result(tool, arguments, context).await {
            Ok(result) => {
                self.state.lock().await.failures = 0;
                Ok(result)
            }
            Err(McpError::Refused { error, .. }) => Err(CallError::Refused(error)),
            // The answer was dropped unread, and the session is fine: the client is told why, the server stays.
            Err(McpError::TooLarge {
                server,
                what,
                bytes,
                limit,
            }) => {
                let data =
                    serde_json::json!({"server": self.name, "bytes": bytes, "limitBytes": limit});
                let error = McpError::TooLarge {
                    server,
                    what,
                    bytes,
                    limit,
                };
                Err(CallError::Refused(ErrorData::internal_error(
                    format!("upstream {}: {error}", self.name),
                    Some(data),
                )))
            }
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
        let (upstream, error) = Upstream::start(None, spec, options).await;
        assert!(error.is_none(), "{error:?}");
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

    /// The tiny server behind `sh`, which first writes its environment to `env` and starts a `sleep` in the
    /// background whose pid goes to `pid`: a launcher's child, as `npx` or `uvx` leave.
    fn tiny_behind_a_launcher(dir: &std::path::Path, env: &[(&str, &str)]) -> ServerSpec {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mcp_client.py");
        let line = format!(
            "env > {dir}/env; sleep 600 & echo $! > {dir}/pid; exec python3 {script} upstream",
            dir = dir.display()
        );
        ServerSpec::Stdio {
            command: "sh".into(),
            args: vec!["-c".into(), line],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("decide-mcp-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upstream_sees_only_the_allowed_variables_and_its_own() {
        // Cargo runs tests with CARGO_MANIFEST_DIR set: a variable of the gateway's that no server needs.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let dir = scratch("env");
        let spec = tiny_behind_a_launcher(&dir, &[("MEMORY_FILE_PATH", "/tmp/m.json")]);
        let (upstream, error) =
            Upstream::start(Some("tiny".into()), spec, McpOptions::default()).await;
        assert!(error.is_none(), "{error:?}");
        let env = std::fs::read_to_string(dir.join("env")).unwrap();
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, _)| k)
            .collect();
        assert!(names.contains(&"MEMORY_FILE_PATH"), "{names:?}");
        assert!(names.contains(&"PATH"), "{names:?}");
        // sh adds PWD, SHLVL and `_` of its own; everything else must be on the list.
        for name in names {
            assert!(
                crate::INHERITED.contains(&name)
                    || ["MEMORY_FILE_PATH", "PWD", "SHLVL", "_"].contains(&name),
                "the upstream saw {name}"
            );
        }
        drop(upstream);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn alive(pid: &str) -> bool {
        // A zombie has exited; only its parent has not read its status yet.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    }

    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_an_upstream_stops_what_its_launcher_started() {
        let dir = scratch("group");
        let spec = tiny_behind_a_launcher(&dir, &[]);
        let (upstream, error) =
            Upstream::start(Some("tiny".into()), spec, McpOptions::default()).await;
        assert!(error.is_none(), "{error:?}");
        let pid = std::fs::read_to_string(dir.join("pid"))
            .unwrap()
            .trim()
            .to_owned();
        assert!(alive(&pid));
        drop(upstream);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(&pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !alive(&pid),
            "the launcher's child {pid} outlived the upstream"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upstream_that_fails_to_start_is_named_by_its_key_and_kept_down() {
        let spec = ServerSpec::Stdio {
            command: "/nonexistent/server".into(),
            args: vec!["--api-key".into(), "sk-secret".into()],
            env: Default::default(),
            cwd: None,
        };
        let (upstream, error) =
            Upstream::start(Some("github".into()), spec, McpOptions::default()).await;
        let error = error.expect("a missing program started").to_string();
        assert!(
            error.starts_with("MCP server github: cannot connect"),
            "{error}"
        );
        assert!(!error.contains("sk-secret"), "{error}");
        assert_eq!(upstream.name, "github");
        assert!(upstream.down().await.is_some());
        assert!(upstream.tools().await.is_empty());
    }

    #[test]
    fn names_keep_only_what_every_provider_accepts() {
        assert_eq!(sanitize("mcp-servers/everything"), "mcp-servers_everything");
        assert_eq!(sanitize(""), "server");
    }
}
