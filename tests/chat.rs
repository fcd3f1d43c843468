//! `decide chat` end to end: the binary against a scripted OpenAI-compatible server written here and an MCP server
//! (a small Python script) it starts, with the local model filtering the tools and routing the calls.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

mod common;

use common::root;

/// Serves `replies` (chat completion bodies) in order on loopback and records the request bodies.
fn scripted_llm(replies: Vec<Value>) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::clone(&recorded);
    std::thread::spawn(move || {
        let mut replies = replies.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap();
                    }
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            requests
                .lock()
                .unwrap()
                .push(serde_json::from_slice::<Value>(&body).unwrap());
            let reply = replies
                .next()
                .unwrap_or_else(|| json!({"error": {"message": "the script has ended"}}))
                .to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                reply.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (url, recorded)
}

fn tool_call(name: &str, arguments: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]}}]})
}

fn answer(text: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
}

/// An MCP server with a calculator tool and an e-mail tool, written to a file for `--mcp "python3 FILE"`.
fn mcp_server(dir: &Path) -> PathBuf {
    let script = r#"
import json, sys
TOOLS = [
    {"name": "add_numbers", "description": "Adds two numbers and returns their sum",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}},
    {"name": "send_email", "description": "Sends an email message to a recipient",
     "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}},
]
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "calc", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        params = message["params"]
        if params["name"] == "add_numbers":
            a, b = params["arguments"]["a"], params["arguments"]["b"]
            result = {"content": [{"type": "text", "text": str(a + b)}]}
        else:
            result = {"content": [{"type": "text", "text": "sent"}]}
    else:
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"#;
    let path = dir.join("calc_mcp.py");
    std::fs::write(&path, script).unwrap();
    path
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("decide-chat-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn decide_chat(args: &[&str], input: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_decide"));
    command
        .current_dir(root())
        .arg("chat")
        .args(args)
        .env_remove("DECIDE_BASE_URL")
        .env_remove("DECIDE_API_KEY");
    common::run_with_input(command, input)
}

fn names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn chat_filters_the_mcp_tools_and_prints_what_each_call_received() {
    let dir = temp_dir("filter");
    let script = mcp_server(&dir);
    let (url, requests) = scripted_llm(vec![
        tool_call("add_numbers", r#"{"a": 2, "b": 3}"#),
        answer("2 plus 3 is 5."),
    ]);
    let mcp = format!("python3 {}", script.display());
    let output = decide_chat(
        &[
            "--base-url",
            &url,
            "--chat-model",
            "m",
            "--mcp",
            &mcp,
            "--filter",
        ],
        "Please add the numbers 2 and 3\n",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "[call 1] tools: add_numbers",
            r#"  add_numbers({"a": 2, "b": 3}) -> 5"#,
            "[call 2] tools: add_numbers",
            "2 plus 3 is 5.",
        ]
    );
    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 2);
    for request in requests.iter() {
        assert_eq!(request["model"], json!("m"));
        // The e-mail tool was filtered out of every call.
        assert_eq!(names(request), ["add_numbers"]);
    }
    assert_eq!(
        requests[1]["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "5"})
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn chat_routes_each_call_to_a_model_and_keeps_the_conversation() {
    let dir = temp_dir("routes");
    let script = mcp_server(&dir);
    let routes = dir.join("routes.json");
    std::fs::write(
        &routes,
        json!({"default": "big-model", "routes": [
            {"name": "small-model", "description": "Greetings, thanks and small talk"},
            {"name": "big-model", "description": "Arithmetic, calculations and multi-step reasoning"}]})
        .to_string(),
    )
    .unwrap();
    let (url, requests) = scripted_llm(vec![
        answer("Hi! How can I help?"),
        answer("You said hello."),
    ]);
    let mcp = format!("python3 {}", script.display());
    let output = decide_chat(
        &[
            "--base-url",
            &url,
            "--routes",
            routes.to_str().unwrap(),
            "--mcp",
            &mcp,
        ],
        "Hello there!\nWhat did I say first?\n",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "[call 1] route small-model, tools: add_numbers, send_email"
    );
    assert_eq!(lines[1], "Hi! How can I help?");
    assert_eq!(lines[3], "You said hello.");
    let requests = requests.lock().unwrap();
    assert_eq!(requests[0]["model"], json!("small-model"));
    // Without --filter every tool goes; the second message sees the first turn.
    assert_eq!(names(&requests[0]), ["add_numbers", "send_email"]);
    assert_eq!(requests[1]["messages"].as_array().unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn chat_options_are_checked_with_a_one_line_error() {
    let output = decide_chat(&["--base-url", "http://127.0.0.1:9/v1"], "");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        "error: --chat-model: required (or --routes, whose route names are the models)"
    );
    // An LLM that is never reached, and one MCP server with extra options.
    let with_mcp = |mcp: &str, options: &[&str]| {
        let mut args = vec![
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--chat-model",
            "m",
            "--mcp",
            mcp,
        ];
        args.extend_from_slice(options);
        decide_chat(&args, "")
    };
    let output = with_mcp("/nonexistent/server", &[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(
            "error: --mcp /nonexistent/server: MCP server /nonexistent/server: cannot connect"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let dir = temp_dir("options");
    let mcp = format!("python3 {}", mcp_server(&dir).display());
    let output = with_mcp(&mcp, &["--filter", "--min-probability", "1.5"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "error: --min-probability: must be between 0 and 1, but was 1.5"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `@modelcontextprotocol/server-everything` from npm (installed by `.ci/run` into
/// `target/mcp-servers`), as a `--mcp` command; `None` (the test says it was skipped) when it is
/// not installed, unless `DECIDE_REQUIRE_MCP` is set.
fn server_everything() -> Option<String> {
    let script = root().join(
        "target/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    if script.exists() {
        return Some(format!("node {} stdio", script.display()));
    }
    let message = format!(
        "MCP server-everything is not installed at {}",
        script.display()
    );
    assert!(
        std::env::var_os("DECIDE_REQUIRE_MCP").is_none(),
        "{message}"
    );
    eprintln!("skipped: {message}");
    None
}

/// The agent of LangChain4j's tutorial, against a real MCP server: "What is 19 plus 23? Use your
/// tools." must reach the LLM with the server's sum tool. The trained model puts `get-sum` among
/// the first two of the 13 tools but far below 0.5 (about 0.07), so `--filter` keeps a share of
/// the needed tools (`--target-recall 0.9`) by default: the sum tool goes out, with a few tools,
/// not all. A lower bar for the gate sends it with the few tools near the best one's probability.
#[test]
fn chat_filter_sends_the_sum_tool_of_a_real_mcp_server() {
    let Some(mcp) = server_everything() else {
        return;
    };
    for (options, most) in [(&[][..], 4), (&["--min-probability", "0.1"][..], 4)] {
        let (url, requests) = scripted_llm(vec![
            tool_call("get-sum", r#"{"a": 19, "b": 23}"#),
            answer("19 plus 23 is 42."),
        ]);
        let mut args = vec![
            "--base-url",
            &url,
            "--chat-model",
            "m",
            "--mcp",
            &mcp,
            "--filter",
        ];
        args.extend_from_slice(options);
        let output = decide_chat(&args, "What is 19 plus 23? Use your tools.\n");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{options:?}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let requests = requests.lock().unwrap();
        let first = names(&requests[0]);
        assert!(
            first.contains(&"get-sum".to_string()),
            "{options:?}: {first:?}\n{stdout}"
        );
        // The filter passes on a few of the server's 13 tools, not all of them.
        assert!(first.len() <= most, "{options:?}: {first:?}");
        assert!(stdout.contains("-> The sum of 19 and 23 is 42"), "{stdout}");
    }
}

/// `@modelcontextprotocol/server-memory` from npm, installed beside server-everything.
fn server_memory() -> Option<PathBuf> {
    let script = root()
        .join("target/mcp-servers/node_modules/@modelcontextprotocol/server-memory/dist/index.js");
    if script.exists() {
        return Some(script);
    }
    let message = format!("MCP server-memory is not installed at {}", script.display());
    assert!(
        std::env::var_os("DECIDE_REQUIRE_MCP").is_none(),
        "{message}"
    );
    eprintln!("skipped: {message}");
    None
}

/// A Python with the official MCP SDK (`mcp` from PyPI).
fn mcp_python() -> Option<PathBuf> {
    common::python_with(
        "mcp.client.stdio, mcp.client.streamable_http",
        "pip install mcp==2.3.0",
    )
}

/// The upstreams of `decide mcp` in the `mcpServers` shape MCP clients use: server-everything (through `sh`, which
/// writes its pid so the client can kill it), server-memory on a scratch file, and the tiny server of
/// `tests/mcp_client.py` whose `echo` clashes with server-everything's. The config file and the pid file.
fn gateway_upstreams(dir: &Path, python: &Path) -> Option<(String, String)> {
    let everything = server_everything()?;
    let memory = server_memory()?;
    let pidfile = dir.join("everything.pid");
    let config = json!({"mcpServers": {
        "everything": {"command": "sh", "args": ["-c", format!("echo $$ > {}; exec {everything}", pidfile.display())]},
        "memory": {"command": "node", "args": [memory], "env": {"MEMORY_FILE_PATH": dir.join("memory.jsonl")}},
        "tiny": {"command": python, "args": [root().join("tests/mcp_client.py"), "upstream"]},
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, config.to_string()).unwrap();
    Some((
        path.to_string_lossy().into_owned(),
        pidfile.to_string_lossy().into_owned(),
    ))
}

fn run_mcp_client(python: &Path, args: &[&str]) -> Value {
    let stdout = common::run_python(python, "tests/mcp_client.py", args);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The official MCP Python SDK starts `decide mcp --expose found` over stdio in front of two npm servers (and a
/// tiny one): `search_tools` finds the sum tool for "add two numbers", the list grows (with
/// `notifications/tools/list_changed`), calls go through with their results and structured content unchanged, a
/// tool error comes back marked `isError`, clashing names get the server's prefix, and a killed upstream fails
/// the next call naming it, then is restarted. The assertions are in `tests/mcp_client.py`.
#[test]
fn an_mcp_client_finds_and_calls_the_tools_of_two_npm_servers_through_decide_mcp_over_stdio() {
    let Some(python) = mcp_python() else { return };
    let dir = temp_dir("mcp-stdio");
    let Some((config, pidfile)) = gateway_upstreams(&dir, &python) else {
        return;
    };
    let seen = run_mcp_client(
        &python,
        &["stdio", env!("CARGO_BIN_EXE_decide"), &config, &pidfile],
    );
    eprintln!("{seen}");
    assert!(
        seen["killed"].as_str().unwrap().contains("everything"),
        "{seen}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `decide mcp --http 127.0.0.1:0 ARGS` and reads the URL it listens on from its standard error.
fn mcp_http(args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_decide"))
        .current_dir(root())
        .args(["mcp", "--http", "127.0.0.1:0"])
        .args(args)
        .env_remove("DECIDE_MODEL")
        .env_remove("DECIDE_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = line_of_stderr(&mut child, "listening on ", "decide mcp");
    let at = line.find("listening on ").unwrap();
    let url = line[at + "listening on ".len()..].trim().to_owned();
    assert!(url.ends_with("/mcp"), "{line}");
    (child, url)
}

/// Reads `child`'s standard error up to the first line holding `needle` and returns it; the rest
/// is drained in the background, so that a full pipe never blocks the child.
fn line_of_stderr(child: &mut std::process::Child, needle: &str, what: &str) -> String {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains(needle) {
        line.clear();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("{what} ended before printing {needle:?}");
        }
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    line
}

/// The same client over streamable HTTP, against `decide mcp --http` (with an API key) in its default mode:
/// `tools/list` holds `search_tools` and `call_tool`, and found tools are called through `call_tool`.
#[test]
fn an_mcp_client_finds_and_calls_the_tools_of_two_npm_servers_through_decide_mcp_over_http() {
    let Some(python) = mcp_python() else { return };
    let dir = temp_dir("mcp-http");
    let Some((config, pidfile)) = gateway_upstreams(&dir, &python) else {
        return;
    };
    let (mut child, url) = mcp_http(&["--config", &config, "--api-key", "s3cret"]);
    let seen = run_mcp_client(&python, &["http", &url, &pidfile, "s3cret"]);
    eprintln!("{seen}");
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// server-everything over streamable HTTP, as `--mcp-url` (its own launcher, on a free port), beside server-memory
/// from a config file; the same client over HTTP against `--expose found --always-include read_graph`: the
/// always-included tool is listed and callable from the start, `search_tools` finds the URL upstream's sum tool,
/// `notifications/tools/list_changed` arrives over HTTP, the found tool is called by its own name, and a second
/// search only adds to the list. The assertions are in `tests/mcp_client.py`.
#[test]
fn an_mcp_client_over_http_lists_found_and_always_included_tools_of_a_url_upstream() {
    let Some(python) = mcp_python() else { return };
    let Some(everything) = server_everything() else {
        return;
    };
    let Some(memory) = server_memory() else {
        return;
    };
    let dir = temp_dir("mcp-url");
    let script = everything
        .strip_prefix("node ")
        .and_then(|s| s.strip_suffix(" stdio"))
        .unwrap()
        .to_owned();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut upstream = Command::new("node")
        .args([&script, "streamableHttp"])
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    line_of_stderr(
        &mut upstream,
        "listening on port",
        "server-everything over HTTP",
    );
    let config = dir.join("memory.json");
    let memory_config = json!({"mcpServers": {"memory": {"command": "node", "args": [memory],
        "env": {"MEMORY_FILE_PATH": dir.join("memory.jsonl")}}}});
    std::fs::write(&config, memory_config.to_string()).unwrap();
    let upstream_url = format!("http://127.0.0.1:{port}/mcp");
    let (mut child, url) = mcp_http(&[
        "--expose",
        "found",
        "--always-include",
        "read_graph",
        "--mcp-url",
        &upstream_url,
        "--config",
        config.to_str().unwrap(),
    ]);
    let seen = run_mcp_client(&python, &["http-found", &url, "read_graph"]);
    eprintln!("{seen}");
    child.kill().unwrap();
    child.wait().unwrap();
    upstream.kill().unwrap();
    upstream.wait().unwrap();
    assert_eq!(
        seen["listed at the start"],
        json!(["search_tools", "read_graph"])
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn mcp_options_are_checked_with_a_one_line_error() {
    let dir = temp_dir("mcp-options");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_decide"))
            .current_dir(root())
            .arg("mcp")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let check = |output: Output, needle: &str| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
    };
    check(run(&[]), "--mcp: no upstream server");
    check(
        run(&[
            "--mcp",
            "node x.js",
            "--http",
            "127.0.0.1:0",
            "--api-key",
            " ",
        ]),
        "--api-key (or DECIDE_API_KEY): empty",
    );
    // An exported key is `decide serve`'s or the HTTP gateway's: the stdio gateway starts all the same
    // (and fails here only on its missing server).
    let exported = Command::new(env!("CARGO_BIN_EXE_decide"))
        .current_dir(root())
        .args(["mcp", "--mcp", "/nonexistent/mcp-server"])
        .env("DECIDE_API_KEY", "s3cret")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    check(
        exported,
        "MCP server /nonexistent/mcp-server: cannot connect",
    );
    let config = dir.join("bad.json");
    std::fs::write(&config, r#"{"mcpServers": {"x": {"comand": "node"}}}"#).unwrap();
    check(
        run(&["--config", config.to_str().unwrap()]),
        "bad.json: mcpServers.x.comand: unknown field",
    );
    check(
        run(&["--mcp", "node x.js", "--target-recall", "1.5"]),
        "--target-recall: 1.5",
    );
    check(
        run(&["--mcp", "/nonexistent/mcp-server"]),
        "MCP server /nonexistent/mcp-server: cannot connect",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Answers one chat completion on loopback and returns the request's header lines.
fn header_recording_llm() -> (String, std::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let (mut head, mut length) = (String::new(), 0);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim_end().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
            head.push_str(&line);
        }
        let mut body = vec![0; length];
        let _ = reader.read_exact(&mut body);
        let reply = answer("hello").to_string();
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
            reply.len()
        );
        let _ = tx.send(head);
    });
    (url, rx)
}

#[test]
fn the_serve_key_in_decide_api_key_never_reaches_the_llm_server() {
    let (url, headers) = header_recording_llm();
    let out = Command::new(env!("CARGO_BIN_EXE_decide"))
        .current_dir(root())
        .args(["chat", "--base-url", &url, "--chat-model", "m"])
        .env_remove("DECIDE_BASE_URL")
        .env_remove("DECIDE_LLM_API_KEY")
        .env("DECIDE_API_KEY", "serve-only-secret")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(b"hi\n")?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = headers
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap();
    assert!(!head.contains("serve-only-secret"), "{head}");
}

/// Whether a process whose command line holds `needle` is running.
fn running(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
            .unwrap_or(false)
    })
}

#[cfg(target_os = "linux")]
#[test]
fn an_mcp_server_that_never_answers_is_stopped_after_the_default_start_timeout() {
    // A number no other process carries, so the check below finds only this test's child.
    let seconds = format!("{}.5", 100_000 + std::process::id());
    let command = format!("sleep {seconds}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_decide"))
        .current_dir(root())
        .args([
            "chat",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--chat-model",
            "m",
            "--mcp",
            &command,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..450 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if status.is_none() {
        let _ = child.kill();
    }
    let status = status.expect("decide chat still waiting 45 s later");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("did not start and list its tools within 15 s"),
        "{err}"
    );
    let mut orphaned = running(&command);
    for _ in 0..50 {
        if !orphaned {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        orphaned = running(&command);
    }
    assert!(!orphaned, "the MCP server outlived decide chat");
}
