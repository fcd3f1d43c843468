//! The MCP provider against a real MCP server nobody here wrote (`@modelcontextprotocol/server-everything` from npm,
//! installed by `.ci/run` into `target/mcp-servers`), over stdio and streamable HTTP, plus servers that fail; and
//! the gateway's streamable HTTP server (`decide mcp --http`) spoken to byte by byte: its Host and Origin checks,
//! its status codes, its session cap and idle timeout, its connection limits and its shutdown.
//!
//! Without the npm server installed (run `.ci/run`, or `npm install --prefix target/mcp-servers
//! @modelcontextprotocol/server-everything`), the tests that need it say so on stderr and pass without running;
//! setting `DECIDE_REQUIRE_MCP=1` (as `.ci/run` does) makes them fail instead.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use decide_agent::{Agent, AgentRequest};
use decide_chat::{
    AssistantMessage, ChatModelError, ChatResponse, InvocationContext, MockChatModel, ToolCall,
    ToolProvider, ToolProviderRequest, UserMessage,
};
use decide_contract::MockDecisionModel;
use decide_filter::FilteringToolProvider;
use decide_mcp::{
    ConnectionLimits, Gateway, GatewayOptions, HttpOptions, McpError, McpOptions, McpToolProvider,
    MAX_MESSAGE_BYTES, METADATA_MCP,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The installed server's entry point, if any.
fn everything() -> Option<(String, Vec<String>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join(
        "target/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    if script.exists() {
        return Some(("node".into(), vec![script.to_string_lossy().into_owned()]));
    }
    let message = format!(
        "MCP server-everything is not installed at {}",
        script.display()
    );
    if std::env::var_os("DECIDE_REQUIRE_MCP").is_some() {
        panic!("{message}");
    }
    eprintln!("skipped: {message}");
    None
}

fn ctx() -> InvocationContext {
    InvocationContext::new()
}

fn options() -> McpOptions {
    McpOptions::default().with_timeout(Duration::from_secs(30))
}

async fn stdio_everything() -> Option<McpToolProvider> {
    let (command, mut args) = everything()?;
    args.push("stdio".into());
    Some(
        McpToolProvider::stdio(&command, &args, options())
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_everything_server_lists_its_tools_and_answers_calls_over_stdio() {
    let Some(provider) = stdio_everything().await else {
        return;
    };
    assert_eq!(provider.server_name(), "mcp-servers/everything");
    let names = provider.tool_names();
    assert!(names.contains(&"echo".to_owned()), "{names:?}");
    assert!(names.contains(&"get-sum".to_owned()), "{names:?}");

    let request = ToolProviderRequest::builder(UserMessage::new("x")).build();
    let tools = provider.provide_tools(&request).unwrap();
    let echo = tools.get("echo").unwrap();
    assert_eq!(
        echo.specification.description.as_deref(),
        Some("Echoes back the input string")
    );
    let schema = echo.specification.parameters.as_ref().unwrap();
    assert_eq!(schema["properties"]["message"]["type"], json!("string"));
    assert_eq!(schema["required"], json!(["message"]));
    let metadata = &echo.specification.metadata[METADATA_MCP];
    assert_eq!(metadata["server"], json!("mcp-servers/everything"));
    assert_eq!(metadata["title"], json!("Echo Tool"));
    assert_eq!(metadata["annotations"]["readOnlyHint"], json!(true));

    assert_eq!(
        provider
            .call("echo", r#"{"message": "hi"}"#, &ctx())
            .await
            .unwrap(),
        "Echo: hi"
    );
    let sum = provider
        .call("get-sum", r#"{"a": 2, "b": 3}"#, &ctx())
        .await
        .unwrap();
    assert!(sum.contains('5'), "{sum}");
    // The executor the agent runs, called on the blocking pool as the agent does.
    let executor = tools.get("get-sum").unwrap().executor.clone().unwrap();
    let sum = tokio::task::spawn_blocking(move || {
        executor.execute(r#"{"a": 40, "b": 2}"#, &Default::default())
    })
    .await
    .unwrap()
    .unwrap();
    assert!(sum.contains("42"), "{sum}");
    // The server refuses bad arguments; the error is the call's result, not a hang.
    let error = provider
        .call("get-sum", r#"{"a": "two"}"#, &ctx())
        .await
        .unwrap_err();
    assert!(!error.to_string().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_sends_only_the_tools_the_filter_kept_of_the_mcp_server() {
    let Some(provider) = stdio_everything().await else {
        return;
    };
    let all = provider.tool_names();
    let decisions = Arc::new(MockDecisionModel::answers_yes_no(|q| match q.candidate() {
        Some(c) if c.name == "get-sum" => 0.95,
        _ => 0.05,
    }));
    let filter = FilteringToolProvider::builder()
        .tool_provider(Arc::new(provider))
        .decision_model(decisions.clone())
        .build()
        .unwrap();
    let script = Mutex::new(
        vec![
            ChatResponse::new(AssistantMessage {
                text: None,
                tool_calls: vec![ToolCall::new(
                    Some("c1"),
                    "get-sum",
                    r#"{"a": 19, "b": 23}"#,
                )],
            }),
            ChatResponse::text("19 + 23 = 42"),
        ]
        .into_iter(),
    );
    let llm = Arc::new(MockChatModel::answers(move |_| {
        script
            .lock()
            .unwrap()
            .next()
            .ok_or_else(|| ChatModelError::model("the script has ended"))
    }));
    let agent = Agent::builder(llm.clone())
        .tool_provider(Arc::new(filter))
        .build()
        .unwrap();
    let response = agent
        .chat(AgentRequest::new("What is 19 plus 23?"))
        .await
        .unwrap();
    assert_eq!(response.text, "19 + 23 = 42");
    let result = &response.tool_executions().next().unwrap().outcome;
    assert!(!result.is_error && result.text.contains("42"), "{result:?}");
    for request in llm.requests() {
        let names: Vec<_> = request.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["get-sum"], "of {all:?}");
    }
    // Every tool of the server was a candidate of the decision.
    let questions = decisions.requests()[0].questions().len();
    assert_eq!(questions, all.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_everything_server_answers_over_streamable_http() {
    let Some((command, mut args)) = everything() else {
        return;
    };
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    args.push("streamableHttp".into());
    let mut child = tokio::process::Command::new(&command)
        .args(&args)
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    // The server takes a moment to listen.
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the HTTP server never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let provider = McpToolProvider::http(&url, options()).await.unwrap();
    assert!(provider.tool_names().contains(&"echo".to_owned()));
    assert_eq!(
        provider
            .call("echo", r#"{"message": "over http"}"#, &ctx())
            .await
            .unwrap(),
        "Echo: over http"
    );
    drop(provider);
    child.kill().await.unwrap();
}

/// A minimal MCP server in Python: answers `initialize` and `tools/list`, then exits at the first `tools/call`.
const DYING_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "dying", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "die", "description": "Exits", "inputSchema": {"type": "object"}},
                            {"name": "whoami", "description": "Returns the request's _meta", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call" and message["params"]["name"] == "whoami":
        meta = message["params"].get("_meta", {}).get("decide/context")
        result = {"content": [{"type": "text", "text": json.dumps(meta)}]}
    elif method == "tools/call":
        sys.exit(3)
    else:
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_or_never_starts_gives_a_clear_error() {
    let provider = McpToolProvider::stdio("python3", ["-c", DYING_SERVER], options())
        .await
        .unwrap();
    assert_eq!(provider.server_name(), "dying");
    assert_eq!(provider.tool_names(), ["die", "whoami"]);
    // The caller's context reaches the server with the call, through the executor the agent runs.
    let request = ToolProviderRequest::builder(UserMessage::new("x")).build();
    let whoami = provider
        .provide_tools(&request)
        .unwrap()
        .get("whoami")
        .unwrap()
        .executor
        .clone()
        .unwrap();
    let context = InvocationContext::new()
        .with_chat_memory_id("conv-1")
        .with_attribute("tenant", "acme");
    let seen = tokio::task::spawn_blocking(move || whoami.execute("{}", &context))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&seen).unwrap(),
        json!({"chatMemoryId": "conv-1", "attributes": {"tenant": "acme"}})
    );
    assert_eq!(provider.call("whoami", "{}", &ctx()).await.unwrap(), "null");
    let started = Instant::now();
    let error = provider.call("die", "{}", &ctx()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "waited for the timeout"
    );
    let text = error.to_string();
    assert!(
        text.starts_with("MCP server dying: tools/call die failed"),
        "{text}"
    );
    // Later calls fail at once too.
    assert!(provider.call("die", "{}", &ctx()).await.is_err());

    let error = McpToolProvider::stdio("/nonexistent/mcp-server", Vec::<String>::new(), options())
        .await
        .unwrap_err();
    assert!(matches!(error, McpError::Connect { .. }), "{error}");
    assert!(
        error
            .to_string()
            .starts_with("MCP server /nonexistent/mcp-server: cannot connect"),
        "{error}"
    );

    let error = McpToolProvider::stdio("sh", ["-c", "exit 1"], options())
        .await
        .unwrap_err();
    assert!(matches!(error, McpError::Connect { .. }), "{error}");

    // A server that never answers `initialize` times out.
    let error = McpToolProvider::stdio(
        "sleep",
        ["30"],
        McpOptions::default().with_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "MCP server sleep: no answer to initialize within 500ms"
    );
}

/// A stdio server whose `big` tool answers with one line over the transport's limit, written as the TypeScript SDK
/// writes it (the result first, the `id` last), and whose `echo` answers as usual.
const BIG_ANSWER_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if "id" not in message:
        continue
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "big", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "big", "description": "Answers too much", "inputSchema": {"type": "object"}},
                            {"name": "echo", "description": "Answers", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call" and message["params"]["name"] == "big":
        text = "x" * (17 * 1024 * 1024)
        sys.stdout.write(json.dumps({"result": {"content": [{"type": "text", "text": text}]},
                                     "jsonrpc": "2.0", "id": message["id"]}) + "\n")
        sys.stdout.flush()
        continue
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "still here"}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_message_limit_fails_its_call_naming_the_server_and_the_limit() {
    let provider = McpToolProvider::stdio("python3", ["-c", BIG_ANSWER_SERVER], options())
        .await
        .unwrap();
    let error = provider.call_result("big", None, &ctx()).await.unwrap_err();
    // Not the timeout that a dropped answer ends in: the answer was seen, and refused.
    assert!(matches!(error, McpError::TooLarge { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.starts_with("MCP server big: the answer to tools/call big is ")
            && text.ends_with("bytes, over the limit of 16 MiB on one message"),
        "{text}"
    );
    assert_eq!(MAX_MESSAGE_BYTES, 16 * 1024 * 1024);
    // The same session goes on: the server was not restarted, nor was the session dropped.
    assert!(!provider.is_closed());
    assert_eq!(
        provider.call("echo", "{}", &ctx()).await.unwrap(),
        "still here"
    );
}

/// A gateway with no upstream (its search finds nothing, which is all these tests need) served over HTTP on a free
/// loopback port: its address, the gateway, the trigger of its shutdown and the server's task.
async fn http_gateway(
    options: HttpOptions,
) -> (
    String,
    Arc<Gateway>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), String>>,
) {
    let decisions = Arc::new(MockDecisionModel::answers_yes_no(|_| 0.5));
    let gateway = Arc::new(
        Gateway::start(
            Vec::new(),
            GatewayOptions {
                decision_model: decisions,
                conformal: None,
                expose: decide_mcp::Expose::Search,
                always_include: Vec::new(),
                max_results: 5,
                target_recall: None,
                mcp: options_for_gateway(),
            },
        )
        .await
        .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(decide_mcp::serve_http(
        Arc::clone(&gateway),
        listener,
        options,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, gateway, stop, server)
}

fn options_for_gateway() -> McpOptions {
    McpOptions::default().with_timeout(Duration::from_secs(10))
}

/// An HTTP answer, its header names in lower case and its body de-chunked.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages of the body: the body itself, or each `data:` line of an event stream.
    fn messages(&self) -> Vec<Value> {
        if let Ok(value) = serde_json::from_str(&self.body) {
            return vec![value];
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }

    /// The JSON-RPC error code of the body.
    fn code(&self) -> Option<i64> {
        self.messages().first()?["error"]["code"].as_i64()
    }
}

fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut body = String::new();
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 || after.len() < size {
                break;
            }
            body.push_str(&after[..size]);
            rest = after[size..].trim_start_matches("\r\n");
        }
        body
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

/// Sends one request to `/mcp` on a connection of its own (`Connection: close`) and reads the whole answer. The
/// headers a streamable HTTP client sends (Host, Accept, Content-Type) are added unless `headers` names them.
async fn exchange(addr: &str, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut head = format!("{method} /mcp HTTP/1.1\r\n");
    let defaults = [
        ("Host", addr),
        ("Accept", "application/json, text/event-stream"),
        ("Content-Type", "application/json"),
    ];
    for (name, value) in defaults {
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("no answer within 30 s")
        .unwrap();
    parse_answer(&raw)
}

async fn post(addr: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    exchange(addr, "POST", headers, body).await
}

const INITIALIZE: &str = r#"{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}"#;
const SEARCH: &str = r#"{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search_tools", "arguments": {"query": "add two numbers"}}}"#;

/// Starts a session the way a client does (`initialize`, then `notifications/initialized`) and returns its id.
async fn session(addr: &str) -> String {
    let answer = exchange(addr, "POST", &[], INITIALIZE).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let id = answer
        .header("mcp-session-id")
        .unwrap_or_else(|| panic!("no session id: {answer:?}"))
        .to_owned();
    let initialized = exchange(
        addr,
        "POST",
        &[("Mcp-Session-Id", id.as_str())],
        r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#,
    )
    .await;
    assert_eq!(initialized.status, 202, "{initialized:?}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_refuses_other_web_origins_and_host_names() {
    let (addr, gateway, stop, server) = http_gateway(HttpOptions {
        allowed_origins: vec!["https://app.example".into()],
        ..HttpOptions::default()
    })
    .await;
    // A page elsewhere, or one whose origin is hidden (`null`: a sandboxed frame, a file), cannot start a session.
    for origin in ["https://evil.example", "null"] {
        let answer = exchange(&addr, "POST", &[("Origin", origin)], INITIALIZE).await;
        assert_eq!(answer.status, 403, "{origin}: {answer:?}");
        assert_eq!(answer.code(), Some(-32000), "{answer:?}");
        assert!(answer.body.contains(origin), "{answer:?}");
    }
    // Nor can a page that reached this loopback server by a name of its own (DNS rebinding).
    let answer = exchange(&addr, "POST", &[("Host", "evil.example:80")], INITIALIZE).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("evil.example"), "{answer:?}");
    assert_eq!(gateway.open_sessions(), 0);

    // A session of a client that is not a browser: its tools run, but not from another page.
    let id = session(&addr).await;
    let answer = exchange(
        &addr,
        "POST",
        &[
            ("Mcp-Session-Id", id.as_str()),
            ("Origin", "https://evil.example"),
        ],
        SEARCH,
    )
    .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    let answer = exchange(&addr, "POST", &[("Mcp-Session-Id", id.as_str())], SEARCH).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let result = &answer.messages()[0]["result"];
    assert_eq!(
        result["structuredContent"]["tools"],
        json!([]),
        "{answer:?}"
    );

    // The server's own origin, and one it was told to allow (answered with CORS headers).
    let own = format!("http://{addr}");
    let answer = exchange(&addr, "POST", &[("Origin", own.as_str())], INITIALIZE).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = exchange(
        &addr,
        "POST",
        &[("Origin", "https://app.example")],
        INITIALIZE,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        answer.header("access-control-expose-headers"),
        Some("mcp-session-id")
    );
    let preflight = exchange(
        &addr,
        "OPTIONS",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        "",
    )
    .await;
    assert_eq!(preflight.status, 204, "{preflight:?}");
    let allowed = preflight.header("access-control-allow-headers").unwrap();
    assert!(allowed.contains("mcp-session-id"), "{allowed}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_answers_each_mistake_with_its_status_and_a_json_rpc_error() {
    let (addr, _gateway, stop, server) = http_gateway(HttpOptions::default()).await;
    let answer = post(&addr, &[], "{not json").await;
    assert_eq!(
        (answer.status, answer.code()),
        (400, Some(-32700)),
        "{answer:?}"
    );
    // A key given twice is refused, naming it: readers disagree on which one counts.
    let answer = post(
        &addr,
        &[],
        r#"{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}"#,
    )
    .await;
    assert_eq!(
        (answer.status, answer.code()),
        (400, Some(-32700)),
        "{answer:?}"
    );
    assert!(
        answer.body.contains(r#"duplicate key \"id\""#),
        "{answer:?}"
    );
    let answer = post(
        &addr,
        &[],
        r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#,
    )
    .await;
    assert_eq!(
        (answer.status, answer.code()),
        (400, Some(-32600)),
        "{answer:?}"
    );
    assert!(answer.body.contains("batches"), "{answer:?}");
    for body in [
        r#"{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}"#,
        r#"{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}"#,
        r#"{"jsonrpc": "2.0", "id": null, "method": "ping"}"#,
    ] {
        let answer = post(&addr, &[], body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, Some(-32600)),
            "{body}: {answer:?}"
        );
    }
    // The id is echoed once it is known.
    let answer = post(
        &addr,
        &[],
        r#"{"jsonrpc": "2.0", "id": 7, "method": {"no": 1}}"#,
    )
    .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(answer.messages()[0]["id"], json!(7), "{answer:?}");
    let answer = post(&addr, &[("Content-Type", "text/plain")], INITIALIZE).await;
    assert_eq!(answer.status, 415, "{answer:?}");
    let answer = post(&addr, &[("Accept", "application/json")], INITIALIZE).await;
    assert_eq!(answer.status, 406, "{answer:?}");
    let forged = [("Mcp-Session-Id", "not-a-session")];
    let answer = post(&addr, &forged, SEARCH).await;
    assert_eq!(
        (answer.status, answer.code()),
        (404, Some(-32001)),
        "{answer:?}"
    );
    assert_eq!(answer.messages()[0]["id"], json!(2), "{answer:?}");
    for method in ["GET", "DELETE"] {
        let answer = exchange(&addr, method, &forged, "").await;
        assert_eq!(answer.status, 404, "{method}: {answer:?}");
    }
    let id = session(&addr).await;
    let answer = exchange(&addr, "DELETE", &[("Mcp-Session-Id", id.as_str())], "").await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let answer = exchange(&addr, "DELETE", &[("Mcp-Session-Id", id.as_str())], "").await;
    assert_eq!(answer.status, 404, "deleted twice: {answer:?}");

    // A body over the transport's limit is refused before it is read.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        MAX_MESSAGE_BYTES + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let answer = parse_answer(&raw[..n]);
    assert_eq!(
        (answer.status, answer.code()),
        (413, Some(-32000)),
        "{answer:?}"
    );
    assert!(answer.body.contains("16 MiB"), "{answer:?}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_caps_its_sessions_and_ends_idle_ones() {
    let (addr, gateway, stop, server) = http_gateway(HttpOptions {
        max_sessions: 2,
        session_idle_timeout: Duration::from_secs(1),
        ..HttpOptions::default()
    })
    .await;
    let first = session(&addr).await;
    session(&addr).await;
    let answer = exchange(&addr, "POST", &[], INITIALIZE).await;
    assert_eq!(
        (answer.status, answer.code()),
        (503, Some(-32000)),
        "{answer:?}"
    );
    assert_eq!(answer.messages()[0]["id"], json!(1), "{answer:?}");
    assert!(answer.body.contains("--max-sessions"), "{answer:?}");
    assert_eq!(gateway.open_sessions(), 2);
    // Idle past the timeout, both end, and their state is dropped.
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.open_sessions() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} sessions still held",
            gateway.open_sessions()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = exchange(&addr, "POST", &[("Mcp-Session-Id", first.as_str())], SEARCH).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    session(&addr).await;
    assert_eq!(gateway.open_sessions(), 1);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.open_sessions() > 0 {
        assert!(Instant::now() < deadline, "a session outlived the server");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads until the server closes the connection, or `limit` passes: whether it closed.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut sink = Vec::new();
    matches!(
        tokio::time::timeout(limit, stream.read_to_end(&mut sink)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_gateway_cuts_slow_sockets_caps_connections_and_stops_within_its_deadline() {
    let (addr, _gateway, stop, server) = http_gateway(HttpOptions {
        connections: ConnectionLimits {
            read_timeout: Duration::from_secs(1),
            max_connections: 4,
            shutdown_timeout: Duration::from_secs(60),
        },
        ..HttpOptions::default()
    })
    .await;
    // A connection that sends nothing, and one that sends half its headers: both closed.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(30)).await);
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
        .await
        .unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(30)).await);
    // A body that never completes gets 408 once the read timeout passes.
    let mut stalled = TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"jsonrpc\"").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stalled.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let answer = parse_answer(&raw);
    assert_eq!(answer.status, 408, "{answer:?}");

    // At shutdown, a client's open event stream ends: the server stops long before its 60 s deadline.
    let id = session(&addr).await;
    let mut events = TcpStream::connect(&addr).await.unwrap();
    events
        .write_all(format!("GET /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {id}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 12];
    events.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("an open event stream held the shutdown")
        .unwrap()
        .unwrap();
    assert!(closed_within(&mut events, Duration::from_secs(5)).await);

    // A request whose body never completes does not hold the shutdown past its deadline; and past the connection
    // cap, a new connection is not served until one closes.
    let (addr, _gateway, stop, server) = http_gateway(HttpOptions {
        connections: ConnectionLimits {
            read_timeout: Duration::from_secs(600),
            max_connections: 1,
            shutdown_timeout: Duration::from_secs(1),
        },
        ..HttpOptions::default()
    })
    .await;
    let mut holder = TcpStream::connect(&addr).await.unwrap();
    holder
        .write_all(format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{").as_bytes())
        .await
        .unwrap();
    let mut waiting = TcpStream::connect(&addr).await.unwrap();
    waiting
        .write_all(format!("DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\nMcp-Session-Id: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting.read(&mut byte))
            .await
            .is_err(),
        "answered past the connection cap"
    );
    // Its read timeout is ten minutes: only the one-second deadline can end it.
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("a half-sent request held the shutdown past its deadline")
        .unwrap()
        .unwrap();
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_headers_and_silent_sockets_do_not_hold_the_shutdown() {
    // The read timeout and the deadline are both long: only closing the connections that are
    // answering nothing lets the server stop in time.
    let (addr, _gateway, stop, server) = http_gateway(HttpOptions {
        connections: ConnectionLimits {
            read_timeout: Duration::from_secs(600),
            max_connections: 16,
            shutdown_timeout: Duration::from_secs(600),
        },
        ..HttpOptions::default()
    })
    .await;
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Ty").as_bytes())
        .await
        .unwrap();
    // A connection that was answered once and then began another request.
    let id = session(&addr).await;
    let mut again = TcpStream::connect(&addr).await.unwrap();
    again
        .write_all(
            format!(
                "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\nMcp-Session-Id: {id}\r\n\r\nPOST /mcp HT"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut first = [0u8; 12];
    again.read_exact(&mut first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("a half-sent request's headers held the shutdown")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for stream in [&mut silent, &mut half, &mut again] {
        assert!(closed_within(stream, Duration::from_secs(5)).await);
    }
}

/// The small stdio server of the end-to-end tests (`echo` and `hang`), behind `sh`, which exits at once until
/// `ready` exists in `dir`: a server whose start fails until something outside the gateway is fixed. Its last
/// argument stands for a secret that must stay out of errors.
fn fails_until_ready(dir: &std::path::Path) -> decide_mcp::ServerSpec {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mcp_client.py");
    let line = format!(
        "test -e {dir}/ready || exit 3; exec python3 {script} upstream",
        dir = dir.display()
    );
    decide_mcp::ServerSpec::Stdio {
        command: "sh".into(),
        args: vec!["-c".into(), line, "sh".into(), "--token=sk-secret".into()],
        env: Default::default(),
        cwd: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_fails_at_start_is_named_in_searches_and_retried_in_the_background() {
    let Some((command, mut args)) = everything() else {
        return;
    };
    args.push("stdio".into());
    let dir = std::env::temp_dir().join(format!("decide-mcp-retry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("ready"));
    let servers = vec![
        (
            Some("everything".to_owned()),
            decide_mcp::ServerSpec::Stdio {
                command,
                args,
                env: Default::default(),
                cwd: None,
            },
        ),
        (Some("flaky".to_owned()), fails_until_ready(&dir)),
    ];
    let gateway = Arc::new(
        Gateway::start(
            servers,
            GatewayOptions {
                decision_model: Arc::new(MockDecisionModel::answers_yes_no(|_| 0.5)),
                conformal: None,
                expose: decide_mcp::Expose::Search,
                always_include: Vec::new(),
                max_results: 5,
                target_recall: None,
                mcp: options_for_gateway(),
            },
        )
        .await
        .expect("one failed upstream stopped the gateway"),
    );
    let healthy = gateway.tool_count().await;
    assert!(healthy > 0);
    let down = gateway.down().await;
    assert_eq!(down.len(), 1, "{down:?}");
    let (name, error) = &down[0];
    assert_eq!(name, "flaky");
    assert!(error.starts_with("MCP server flaky:"), "{error}");
    assert!(!error.contains("sk-secret"), "{error}");

    // A client's search finds the healthy server's tools and is told which server it cannot search.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(decide_mcp::serve_http(
        Arc::clone(&gateway),
        listener,
        HttpOptions::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let id = session(&addr).await;
    let answer = post(&addr, &[("Mcp-Session-Id", id.as_str())], SEARCH).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let result = &answer.messages()[0]["result"]["structuredContent"];
    assert_eq!(
        result["tools"].as_array().map(Vec::len),
        Some(5),
        "{result}"
    );
    assert_eq!(
        result["unavailable"][0]["server"],
        json!("flaky"),
        "{result}"
    );
    assert!(!result.to_string().contains("sk-secret"), "{result}");

    // Once it can start, it is restarted without any search or call asking for it.
    std::fs::write(dir.join("ready"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !gateway.down().await.is_empty() {
        assert!(Instant::now() < deadline, "flaky was not restarted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gateway.tool_count().await, healthy + 2);
    let answer = post(&addr, &[("Mcp-Session-Id", id.as_str())], SEARCH).await;
    let result = &answer.messages()[0]["result"]["structuredContent"];
    assert!(result.get("unavailable").is_none(), "{result}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether process `pid` runs (a zombie has exited; only its parent has not read its status yet).
#[cfg(target_os = "linux")]
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_the_http_gateway_stops_what_its_upstreams_launchers_started() {
    let dir = std::env::temp_dir().join(format!("decide-mcp-stop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mcp_client.py");
    // A launcher (as npx or uvx) that leaves a child of its own beside the server.
    let line = format!(
        "sleep 600 & echo $! > {dir}/pid; exec python3 {script} upstream",
        dir = dir.display()
    );
    let spec = decide_mcp::ServerSpec::Stdio {
        command: "sh".into(),
        args: vec!["-c".into(), line],
        env: Default::default(),
        cwd: None,
    };
    let gateway = Arc::new(
        Gateway::start(
            vec![(Some("tiny".to_owned()), spec)],
            GatewayOptions {
                decision_model: Arc::new(MockDecisionModel::answers_yes_no(|_| 0.5)),
                conformal: None,
                expose: decide_mcp::Expose::Search,
                always_include: Vec::new(),
                max_results: 5,
                target_recall: None,
                mcp: options_for_gateway(),
            },
        )
        .await
        .unwrap(),
    );
    let pid = std::fs::read_to_string(dir.join("pid"))
        .unwrap()
        .trim()
        .to_owned();
    assert!(alive(&pid));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(decide_mcp::serve_http(
        Arc::clone(&gateway),
        listener,
        HttpOptions::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    // An open session holds the gateway until the server ends it.
    session(&addr).await;
    assert_eq!(gateway.open_sessions(), 1);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    let weak = Arc::downgrade(&gateway);
    drop(gateway);
    let deadline = Instant::now() + Duration::from_secs(30);
    while weak.strong_count() > 0 || alive(&pid) {
        assert!(
            Instant::now() < deadline,
            "after the shutdown: gateway held {} times, launcher's child {pid} alive: {}",
            weak.strong_count(),
            alive(&pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(dir);
}
