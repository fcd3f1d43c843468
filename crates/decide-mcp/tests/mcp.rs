//! The MCP provider against a real MCP server nobody here wrote (`@modelcontextprotocol/server-everything` from npm,
//! installed by `.ci/run` into `target/mcp-servers`), over stdio and streamable HTTP, plus servers that fail.
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
use decide_mcp::{McpError, McpOptions, McpToolProvider, METADATA_MCP};
use serde_json::json;

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
