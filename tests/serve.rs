//! `decide serve` end to end: the binary on a free port, queried over HTTP in both wire
//! formats (through `HttpDecisionModel`, the Rust client), compared with the embedded engine,
//! then stopped with SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use decide_contract::{ChoiceQuestion, DecisionModel, DecisionRequest, YesNoQuestion};
use decide_engine::Engine;
use decide_http::{HttpDecisionModel, WireFormat};

mod common;

struct Server {
    child: Child,
    base: String,
    stderr: BufReader<std::process::ChildStderr>,
}

/// A failed test must not leave a server running.
impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_decide"))
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let mut server = Self {
            child,
            base: String::new(),
            stderr,
        };
        // The model loads, then the server prints where it listens.
        let mut line = String::new();
        loop {
            line.clear();
            let read = server.stderr.read_line(&mut line).unwrap();
            assert!(read > 0, "decide serve exited before listening");
            if let Some(at) = line.find("listening on ") {
                server.base = line[at + "listening on ".len()..].trim().to_string();
                return server;
            }
        }
    }

    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = self.child.wait().unwrap();
        let mut rest = String::new();
        self.stderr.read_to_string(&mut rest).unwrap();
        (status, rest)
    }
}

/// A bare HTTP/1.1 GET: the status line and the body.
fn get(base: &str, path: &str) -> (String, String) {
    http(base, "GET", path, "")
}

/// A bare HTTP/1.1 request (with a JSON body unless it is empty): the status line and the body.
fn http(base: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let host = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let headers = if body.is_empty() {
        String::new()
    } else {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n{body}"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.lines().next().unwrap_or_default().to_string();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

fn request() -> DecisionRequest {
    DecisionRequest::builder()
        .input("Please cancel my subscription, I am moving abroad")
        .question(
            "cancel",
            YesNoQuestion::new("Does the user want to cancel?").unwrap(),
        )
        .question(
            "tool",
            YesNoQuestion::builder("Is the tool needed?")
                .candidate("cancel_subscription", "Cancel a customer's subscription")
                .build()
                .unwrap(),
        )
        .question(
            "intent",
            ChoiceQuestion::builder("What does the user want?")
                .option_with_description("cancel", "End the subscription")
                .option_with_description("upgrade", "A bigger plan")
                .option("support")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[test]
fn serve_answers_both_formats_like_the_engine_and_stops_on_sigterm() {
    let mut server = Server::start(&[]);
    let (status, body) = get(&server.base, "/health");
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("\"status\":\"ok\""), "{body}");

    let engine = Engine::builder().build().expect("run models/fetch first");
    let expected = engine.decide(&request()).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6;

    // System One carries the candidate as a criterion: every answer equals the engine's.
    let remote = HttpDecisionModel::builder(&server.base)
        .format(WireFormat::SystemOne)
        .build();
    let got = remote.decide(&request()).unwrap();
    assert_eq!(got.model_name(), Some(engine.info().name.as_str()));
    for name in ["cancel", "tool"] {
        let (a, b) = (
            got.yes_no(name).unwrap().probability(),
            expected.yes_no(name).unwrap().probability(),
        );
        assert!(close(a, b), "{name}: {a} vs {b}");
    }
    let (a, b) = (
        got.choice("intent").unwrap(),
        expected.choice("intent").unwrap(),
    );
    assert_eq!(a.value(), b.value());
    for option in ["cancel", "upgrade", "support"] {
        assert!(close(
            a.probability_of(option).unwrap(),
            b.probability_of(option).unwrap()
        ));
    }

    // The OpenAI format has no slot for a candidate: it joins the instructions, as clients do,
    // and the engine answers that request (the documents of a request are scored together, so
    // the other answers are compared with it too).
    let remote = HttpDecisionModel::builder(&server.base)
        .format(WireFormat::OpenAiDecisions)
        .build();
    let got = remote.decide(&request()).unwrap();
    let openai_expected = engine
        .decide(
            &DecisionRequest::builder()
                .input(request().input().clone())
                .question("cancel", request().question("cancel").unwrap().clone())
                .question(
                    "tool",
                    YesNoQuestion::new(
                        "Is the tool needed?\n\nIf true: cancel_subscription: Cancel a customer's subscription",
                    )
                    .unwrap(),
                )
                .question("intent", request().question("intent").unwrap().clone())
                .build()
                .unwrap(),
        )
        .unwrap();
    for name in ["cancel", "tool"] {
        let (a, b) = (
            got.yes_no(name).unwrap().probability(),
            openai_expected.yes_no(name).unwrap().probability(),
        );
        assert!(close(a, b), "{name}: {a} vs {b}");
    }
    for option in ["cancel", "upgrade", "support"] {
        assert!(close(
            got.choice("intent")
                .unwrap()
                .probability_of(option)
                .unwrap(),
            openai_expected
                .choice("intent")
                .unwrap()
                .probability_of(option)
                .unwrap()
        ));
    }

    let (status, text) = get(&server.base, "/metrics");
    assert!(status.contains("200"));
    assert!(
        text.contains("decide_requests_total{endpoint=\"/v1/systemone\",status=\"200\"} 1"),
        "{text}"
    );

    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
    assert!(rest.contains("decide serve: stopped"), "{rest}");
}

#[test]
fn serve_with_an_api_key_refuses_other_keys() {
    let mut server = Server::start(&["--api-key", "k3y"]);
    let err = HttpDecisionModel::builder(&server.base)
        .build()
        .decide(&request())
        .unwrap_err();
    assert!(err.to_string().contains("HTTP 401"), "{err}");
    let ok = HttpDecisionModel::builder(&server.base)
        .api_key("k3y")
        .build()
        .decide(&request());
    assert!(ok.is_ok(), "{ok:?}");
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

#[test]
fn serve_rejects_bad_options_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_decide"))
        .args(["serve", "--addr", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: --addr not-an-address"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn sigterm_finishes_the_request_in_flight() {
    let mut server = Server::start(&[]);
    let host = server.base.trim_start_matches("http://").to_string();
    let body = r#"{"state": "Please cancel my subscription", "questions": {"cancel": {"type": "noul", "instructions": "Cancel?"}}}"#;
    let mut stream = TcpStream::connect(&host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // Headers and half the body: the request is in flight when SIGTERM arrives.
    let (first, rest) = body.split_at(body.len() / 2);
    write!(
        stream,
        "POST /v1/systemone HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{first}",
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "exited with a request in flight"
    );
    stream.write_all(rest.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"noul\""), "{response}");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    // New connections are refused once it has stopped.
    assert!(TcpStream::connect(&host).is_err());
}

/// The Chromium to drive: `$DECIDE_CHROMIUM`, else `chromium` on the PATH (Debian's package).
fn chromium() -> Option<String> {
    let candidates = std::env::var("DECIDE_CHROMIUM")
        .ok()
        .into_iter()
        .chain(["chromium".to_string(), "chromium-browser".to_string()]);
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs headless Chromium on `url` with `args`, killed if it takes longer than two minutes;
/// its standard output.
fn headless(chromium: &str, profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1280,1000",
            // Virtual time runs the page's script, its fetches included, before the DOM is read.
            "--virtual-time-budget=60000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish in two minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap()
}

/// The values of `attribute` on the elements of `html` that have it, in document order.
fn attributes<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
    let key = format!("{attribute}=\"");
    html.split(key.as_str())
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap_or(0)])
        .collect()
}

/// The names of the selected tools the page shows, in order.
fn chips(html: &str) -> Vec<&str> {
    html.split("<span class=\"chip\">")
        .skip(1)
        .map(|rest| &rest[..rest.find('<').unwrap_or(0)])
        .collect()
}

#[test]
fn the_playground_decides_the_example_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var("DECIDE_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "DECIDE_REQUIRE_CHROMIUM=1 but no chromium (apt-get install chromium, or set DECIDE_CHROMIUM)"
        );
        eprintln!("skipped: no chromium (apt-get install chromium, or set DECIDE_CHROMIUM)");
        return;
    };
    let mut server = Server::start(&[]);
    let base = server.base.clone();
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let profile = tmp.join(format!("chromium-profile-{}", std::process::id()));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(root.join("examples").join(name)).unwrap())
            .unwrap()
    };
    // What the server answers to a body, and the page's DOM once its script has run.
    let post = |path: &str, body: serde_json::Value| -> (String, serde_json::Value) {
        let (status, text) = http(&base, "POST", path, &body.to_string());
        let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: {text}"));
        (status, value)
    };
    let page = |query: &str| {
        headless(
            &chromium,
            &profile,
            &["--dump-dom"],
            &format!("{base}/?{query}"),
        )
    };
    let names = |answer: &serde_json::Value| -> Vec<String> {
        let selected = answer["selected"].as_array().unwrap();
        selected.iter().map(|s| s["name"].to_string()).collect()
    };
    let quoted =
        |chips: Vec<&str>| -> Vec<String> { chips.iter().map(|c| format!("{c:?}")).collect() };

    // `?example&run`: the page loads the shipped example into its fields and decides.
    let dom = page("example&run");
    assert!(
        dom.contains("data-state=\"done\""),
        "the page did not finish: {dom}"
    );
    let (status, answer) = post(
        "/v1/select",
        serde_json::json!({
            "messages": read("conversation.json"),
            "tools": read("tools.json")["tools"],
            "target_recall": 0.9,
        }),
    );
    assert!(status.contains("200"), "{status}: {answer}");
    let (tools, route) = dom
        .split_once("id=\"route-scores\"")
        .expect("the route's bars");
    let shown = chips(tools);
    assert_eq!(
        quoted(shown.clone()),
        names(&answer),
        "the server's selection"
    );
    // As the README says: the tool called earlier and the email the user asks for, among a few.
    assert!(
        shown.contains(&"get_forecast") && shown.contains(&"send_email") && shown.len() < 27 / 2,
        "{shown:?}"
    );
    let bars = attributes(tools, "data-name");
    assert_eq!(bars.len(), 27, "a bar for every tool");
    let probabilities = attributes(tools, "data-probability");
    // The tool passed without asking comes first, then the most probable one.
    assert_eq!(bars[0], "get_forecast");
    assert_eq!(
        probabilities[0], "",
        "passed without asking: no probability"
    );
    assert_eq!(bars[1], "send_email", "the top tool");
    assert!(tools.contains("passed without asking: the conversation already called it"));
    let route_name = dom
        .split("id=\"route\" class=\"route\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("a route");
    let routes = read("routes.json");
    let (status, routed) = post(
        "/v1/route",
        serde_json::json!({
            "messages": read("conversation.json"),
            "routes": routes["routes"],
            "default": routes["default"],
        }),
    );
    assert!(status.contains("200"), "{status}: {routed}");
    assert_eq!(route_name, routed["route"].as_str().unwrap());
    assert_eq!(attributes(route, "data-name").len(), 3, "a bar per route");
    assert!(dom.contains("curl -s"), "the equivalent curl call");

    // The example's tools in OpenAI's shape: the page shows what the server answers for them.
    let (status, answer) = post(
        "/v1/select",
        serde_json::json!({
            "messages": read("conversation.json"),
            "tools": read("tools-openai.json"),
            "target_recall": 0.9,
        }),
    );
    assert!(status.contains("200"), "{status}: {answer}");
    let dom = page("example&tools=openai&run");
    assert!(dom.contains("data-state=\"done\""), "{dom}");
    assert_eq!(quoted(chips(&dom)), names(&answer));

    // An error the server gives shows next to the field it names.
    let (status, refused) = post(
        "/v1/select",
        serde_json::json!({"text": "hi", "tools": read("tools.json")["tools"], "target_recall": 1.5}),
    );
    assert!(status.contains("400"), "{status}: {refused}");
    let dom = page("example&threshold=1.5&run");
    assert!(dom.contains("data-state=\"error\""), "{dom}");
    let shown = dom
        .split("id=\"threshold-error\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_default();
    assert_eq!(
        shown,
        refused["error"]["message"].as_str().unwrap(),
        "the server's message next to the threshold"
    );

    // A screenshot for a person to look at.
    let shot = tmp.join("playground.png");
    let _ = std::fs::remove_file(&shot);
    let url = format!("{base}/?example&run");
    headless(
        &chromium,
        &profile,
        &[&format!("--screenshot={}", shot.display())],
        &url,
    );
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", shot.display());
    let _ = std::fs::remove_dir_all(&profile);

    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

/// `/v1/tool_search` answers OpenAI's client-executed `tool_search_call` with a `tool_search_output` item and
/// Anthropic's custom search `tool_use` with a `tool_result` of `tool_reference` blocks, over the example catalogue;
/// `tests/tool_search_check.py` validates both calls and answers with the providers' SDK types.
#[test]
fn serve_answers_the_providers_client_executed_tool_search_in_their_sdk_types() {
    let Some(python) = common::python_with(
        "openai.types.responses, anthropic.types",
        "pip install openai==3.57.0 anthropic==2.14.0",
    ) else {
        return;
    };
    let mut server = Server::start(&[]);
    let tools = common::root().join("examples/tools.json");
    let stdout = common::run_python(
        &python,
        "tests/tool_search_check.py",
        &[&server.base, tools.to_str().unwrap()],
    );
    eprintln!("{stdout}");
    server.stop();
}

/// Sends `request` as is on a new connection and reads the whole response (the server closes
/// the connection: requests send `Connection: close`).
fn exchange(base: &str, request: &str) -> String {
    let host = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// A POST of `body` to `path` with the given extra header lines (each ending in `\r\n`).
fn post_raw(base: &str, path: &str, headers: &str, body: &str) -> String {
    exchange(
        base,
        &format!(
            "POST {path} HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

const ROUTE_BODY: &str = r#"{"text": "write a Rust function", "routes": [{"name": "code", "description": "programming"}, {"name": "chat", "description": "small talk"}], "default": "chat"}"#;

#[test]
fn serve_refuses_other_hosts_other_web_pages_and_bodies_not_sent_as_json() {
    let mut server = Server::start(&["--allowed-origins", "https://app.example"]);
    let host = server.base.trim_start_matches("http://").to_string();
    let port = host.rsplit(':').next().unwrap().to_string();
    let json = "Content-Type: application/json\r\n";
    let ok = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: {host}\r\n{json}"),
        ROUTE_BODY,
    );
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let by_name = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: localhost:{port}\r\n{json}"),
        ROUTE_BODY,
    );
    assert!(by_name.starts_with("HTTP/1.1 200"), "{by_name}");
    // DNS rebinding: a page's own name that resolves to this machine.
    let rebound = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: attacker.example:{port}\r\n{json}"),
        ROUTE_BODY,
    );
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    assert!(rebound.contains("--allowed-hosts"), "{rebound}");
    // A form or text/plain body needs no CORS preflight, so any page could send one.
    let plain = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: {host}\r\nContent-Type: text/plain\r\n"),
        ROUTE_BODY,
    );
    assert!(plain.starts_with("HTTP/1.1 415"), "{plain}");
    let other_page = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: {host}\r\nOrigin: https://evil.example\r\n{json}"),
        ROUTE_BODY,
    );
    assert!(other_page.starts_with("HTTP/1.1 403"), "{other_page}");
    assert!(
        !other_page.contains("access-control-allow-origin"),
        "{other_page}"
    );
    // The configured origin gets its preflight and its answers with CORS headers.
    let preflight = exchange(
        &server.base,
        &format!(
            "OPTIONS /v1/route HTTP/1.1\r\nHost: {host}\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n"
        ),
    );
    assert!(preflight.starts_with("HTTP/1.1 204"), "{preflight}");
    assert!(
        preflight.contains("access-control-allow-origin: https://app.example"),
        "{preflight}"
    );
    let allowed = post_raw(
        &server.base,
        "/v1/route",
        &format!("Host: {host}\r\nOrigin: https://app.example\r\n{json}"),
        ROUTE_BODY,
    );
    assert!(allowed.starts_with("HTTP/1.1 200"), "{allowed}");
    assert!(
        allowed.contains("access-control-allow-origin: https://app.example"),
        "{allowed}"
    );
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

#[test]
fn serve_refuses_an_empty_api_key_and_timeouts_it_cannot_hold() {
    for args in [
        &["--api-key", ""][..],
        &["--timeout", "2e19"],
        &["--read-timeout", "inf"],
        &["--shutdown-timeout", "0"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_decide"))
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut status = None;
        for _ in 0..300 {
            status = child.try_wait().unwrap();
            if status.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if status.is_none() {
            let _ = child.kill();
        }
        let status = status.unwrap_or_else(|| panic!("{args:?}: serving instead of refusing"));
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: {}", args[0])),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// Reads until the server closes the connection or `limit` passes: whether it closed.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut sink = Vec::new();
    stream.read_to_end(&mut sink).is_ok()
}

#[test]
fn serve_closes_silent_connections_caps_them_and_stops_past_its_shutdown_deadline() {
    let mut server = Server::start(&["--read-timeout", "1"]);
    let host = server.base.trim_start_matches("http://").to_string();
    // A connection that sends nothing, then one that sends half its headers: both closed.
    let mut silent = TcpStream::connect(&host).unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(30)));
    let mut slow = TcpStream::connect(&host).unwrap();
    write!(slow, "GET /health HTTP/1.1\r\nHost: {host}\r\n").unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(30)));
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");

    let mut server = Server::start(&[
        "--read-timeout",
        "600",
        "--max-connections",
        "1",
        "--shutdown-timeout",
        "1",
    ]);
    let host = server.base.trim_start_matches("http://").to_string();
    // At the cap, a new connection is not served until the one open closes.
    let mut holder = TcpStream::connect(&host).unwrap();
    write!(holder, "GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut first = [0u8; 12];
    holder.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let mut waiting = TcpStream::connect(&host).unwrap();
    write!(
        waiting,
        "GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        waiting.read(&mut byte).is_err(),
        "answered past the connection cap"
    );
    drop(holder);
    waiting
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut response = String::new();
    waiting.read_to_string(&mut response).unwrap();
    assert!(response.contains("200 OK"), "{response}");

    // A request whose body never completes does not hold SIGTERM past the shutdown deadline.
    let mut stalled = TcpStream::connect(&host).unwrap();
    write!(
        stalled,
        "POST /v1/route HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"text\""
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let mut exited = None;
    for _ in 0..300 {
        exited = server.child.try_wait().unwrap();
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = exited.expect("still running 30 s after SIGTERM");
    assert!(status.success(), "{status}");
}

/// A counter or gauge of the `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// `count` tools with long descriptions, each distinct (no cached embedding helps).
fn heavy_tools(count: usize, tag: &str) -> String {
    let tools: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            let words: Vec<String> = (0..300).map(|w| format!("{tag}{i}w{w}")).collect();
            serde_json::json!({"name": format!("tool_{i}"), "description": words.join(" ")})
        })
        .collect();
    serde_json::json!({"text": "which tools do I need", "tools": tools}).to_string()
}

#[test]
fn a_request_past_its_deadline_stops_running() {
    let mut server = Server::start(&["--timeout", "0.3", "--max-concurrent-requests", "1"]);
    let host = server.base.trim_start_matches("http://").to_string();
    let headers = format!("Host: {host}\r\nContent-Type: application/json\r\n");
    let body = heavy_tools(255, "a");
    let late = post_raw(&server.base, "/v1/select", &headers, &body);
    assert!(late.starts_with("HTTP/1.1 504"), "{late}");
    // The rows not yet run when the deadline passed are dropped from the queue, not run.
    let mut text = String::new();
    for _ in 0..600 {
        text = get(&server.base, "/metrics").1;
        if metric(&text, "decide_rows_cancelled_total") > 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        metric(&text, "decide_rows_cancelled_total") > 0.0,
        "no row dropped: {text}"
    );
    assert!(metric(&text, "decide_batch_rows_sum") < 256.0, "{text}");
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

/// A decision with 64 choice questions of `options` distinct, wordy options each, in both wire
/// formats: tokenizing and running it takes far longer than a short deadline.
fn heavy_decisions(options: usize, tag: &str) -> (String, String) {
    let option = |q: usize, o: usize| {
        let words: Vec<String> = (0..12).map(|w| format!("{tag}{q}o{o}w{w}")).collect();
        (format!("option_{o}"), words.join(" "))
    };
    let openai: Vec<serde_json::Value> = (0..64)
        .map(|q| {
            let choices: Vec<serde_json::Value> = (0..options)
                .map(|o| {
                    let (value, description) = option(q, o);
                    serde_json::json!({"value": value, "description": description})
                })
                .collect();
            serde_json::json!({"type": "choice", "name": format!("q{q}"),
                "instructions": "Which option fits?", "choices": choices})
        })
        .collect();
    let system_one: serde_json::Map<String, serde_json::Value> = (0..64)
        .map(|q| {
            let criteria: serde_json::Map<String, serde_json::Value> = (0..options)
                .map(|o| {
                    let (value, description) = option(q, o);
                    (value, serde_json::Value::from(description))
                })
                .collect();
            (
                format!("q{q}"),
                serde_json::json!({"type": "choice", "instructions": "Which option fits?",
                    "criteria": criteria}),
            )
        })
        .collect();
    (
        serde_json::json!({"input": "which one", "questions": openai}).to_string(),
        serde_json::json!({"state": "which one", "questions": system_one}).to_string(),
    )
}

/// After a decision's `504`, its admission slot stays taken until its work has really ended
/// (the next request is refused with `503` meanwhile), and then it is free again: the deadline
/// does not let new work pile up beside work nobody waits for.
#[test]
fn a_decision_past_its_deadline_keeps_its_slot_until_its_work_ends() {
    let mut server = Server::start(&["--timeout", "0.3", "--max-concurrent-requests", "1"]);
    let host = server.base.trim_start_matches("http://").to_string();
    let headers = format!("Host: {host}\r\nContent-Type: application/json\r\n");
    let small = r#"{"state": "hi", "questions": {"q": {"type": "noul", "instructions": "Is it a greeting?"}}}"#;
    for (round, path) in ["/v1/decisions", "/v1/systemone"].into_iter().enumerate() {
        // The slot is freed by the end of one forward batch; the next request follows the 504
        // within milliseconds, so only a batch ending in that gap lets it in: a few tries make
        // that chance negligible, while a slot freed at the 504 lets every try in.
        let mut refused = false;
        for attempt in 0..3 {
            let (openai, system_one) = heavy_decisions(128, &format!("{round}x{attempt}x"));
            let heavy = if path == "/v1/decisions" {
                openai
            } else {
                system_one
            };
            let late = post_raw(&server.base, path, &headers, &heavy);
            assert!(late.starts_with("HTTP/1.1 504"), "{path}: {late}");
            let next = post_raw(&server.base, "/v1/systemone", &headers, small);
            if next.starts_with("HTTP/1.1 503") {
                refused = true;
                break;
            }
            assert!(next.starts_with("HTTP/1.1 200"), "{path}: {next}");
        }
        assert!(refused, "{path}: the slot was free while the late work ran");
        // Once the work ends (its queued rows dropped), the slot is free again.
        let mut answer = String::new();
        for _ in 0..600 {
            answer = post_raw(&server.base, "/v1/systemone", &headers, small);
            if !answer.starts_with("HTTP/1.1 503") {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    let (_, text) = get(&server.base, "/metrics");
    assert!(metric(&text, "decide_rows_cancelled_total") > 0.0, "{text}");
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A burst of large requests (tool descriptions of almost the whole 2 MiB body, new texts each
/// time) leaves the server's memory near its idle size: what is tokenized is bounded by what the
/// model reads, the embedding cache is bounded in bytes, and freed memory goes back.
#[cfg(target_os = "linux")]
#[test]
fn memory_returns_near_idle_after_a_burst_of_large_requests() {
    let mut server = Server::start(&[]);
    let pid = server.child.id();
    let host = server.base.trim_start_matches("http://").to_string();
    let headers = format!("Host: {host}\r\nContent-Type: application/json\r\n");
    let small = post_raw(&server.base, "/v1/route", &headers, ROUTE_BODY);
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    let idle = rss(pid);
    let large = |i: usize| {
        let description = format!("tool{i} ").repeat(1_900_000 / 7);
        serde_json::json!({"text": "which tool", "tools": [{"name": "big", "description": description}]})
            .to_string()
    };
    let mut peak = idle;
    for round in 0..3 {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (base, headers, body) =
                    (server.base.clone(), headers.clone(), large(round * 4 + c));
                std::thread::spawn(move || post_raw(&base, "/v1/select", &headers, &body))
            })
            .collect();
        for c in clients {
            let response = c.join().unwrap();
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        }
        peak = peak.max(rss(pid));
    }
    let near_idle = idle + 40 * 1024 * 1024;
    let mut now = rss(pid);
    for _ in 0..300 {
        if now <= near_idle {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        now = rss(pid);
    }
    assert!(
        now <= near_idle,
        "resident {} MB 30 s after the burst (idle {} MB, peak {} MB)",
        now >> 20,
        idle >> 20,
        peak >> 20
    );
    let (status, rest) = server.stop();
    assert!(status.success(), "{status}: {rest}");
}

/// `decide select` and `decide route` against `POST /v1/select` and `/v1/route` of one server:
/// the same inputs get the same answers, and the same bad inputs the same errors (the command
/// line names its file first, the server the field in `error.param`).
#[test]
fn the_command_line_and_the_server_answer_and_refuse_alike() {
    let dir = common::TempDir::new("alike");
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "send_email", "description": "Send an email",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "create_invoice", "description": "Bill a customer"}}
    ]);
    let routes = serde_json::json!([
        {"name": "small", "description": "Greetings and small talk"},
        {"name": "code", "description": "Writing and fixing program code"}
    ]);
    let user = |text: &str| serde_json::json!([{"role": "user", "content": text}]);
    let tools_file = dir.file("tools.json", tools.to_string());
    let routes_file = dir.file(
        "routes.json",
        serde_json::json!({"default": "small", "routes": routes}).to_string(),
    );
    let mut server = Server::start(&[]);

    // The same answers.
    let messages = user("Is it raining in Lisbon right now?");
    let file = dir.file("good.json", messages.to_string());
    let cli = common::decide(&[
        "select",
        "--tools",
        &tools_file,
        "--messages",
        &file,
        "--json",
    ]);
    assert!(cli.status.success(), "{}", common::stderr(&cli));
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/select",
        &serde_json::json!({"messages": messages, "tools": tools}).to_string(),
    );
    assert!(status.contains("200"), "{status} {body}");
    let (cli, served): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&common::stdout(&cli)).unwrap(),
        serde_json::from_str(&body).unwrap(),
    );
    let names = |v: &serde_json::Value| {
        v["selected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&cli), names(&served));
    assert_eq!(names(&cli), [serde_json::json!("get_weather")]);
    for (a, b) in cli["scores"]
        .as_array()
        .unwrap()
        .iter()
        .zip(served["scores"].as_array().unwrap())
    {
        assert_eq!(a["name"], b["name"]);
        assert_eq!(a["reason"], b["reason"]);
        let (a, b) = (
            a["probability"].as_f64().unwrap(),
            b["probability"].as_f64().unwrap(),
        );
        assert!((a - b).abs() < 1e-5, "{a} against {b}");
    }
    assert_eq!(cli["needs_tool"]["open"], served["needs_tool"]["open"]);
    let messages = user("Fix this Rust borrow checker error in my parser");
    let file = dir.file("route.json", messages.to_string());
    let cli = common::decide(&[
        "route",
        "--routes",
        &routes_file,
        "--messages",
        &file,
        "--json",
    ]);
    assert!(cli.status.success(), "{}", common::stderr(&cli));
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/route",
        &serde_json::json!({"messages": messages, "routes": routes, "default": "small"})
            .to_string(),
    );
    assert!(status.contains("200"), "{status} {body}");
    let (cli, served): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&common::stdout(&cli)).unwrap(),
        serde_json::from_str(&body).unwrap(),
    );
    assert_eq!(cli["route"], "code");
    assert_eq!(cli["route"], served["route"]);

    // The same refusals.
    let bad: [(&str, serde_json::Value); 3] = [
        (
            "blank",
            serde_json::json!([{"role": "user", "content": "  "}]),
        ),
        (
            "assistant-only",
            serde_json::json!([{"role": "assistant", "content": "How can I help?"}]),
        ),
        (
            "blank-after-history",
            serde_json::json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": ""}]),
        ),
    ];
    for (name, messages) in bad {
        let file = dir.file(&format!("{name}.json"), messages.to_string());
        let cli = common::decide(&["select", "--tools", &tools_file, "--messages", &file]);
        let (status, body) = http(
            &server.base,
            "POST",
            "/v1/select",
            &serde_json::json!({"messages": messages, "tools": tools}).to_string(),
        );
        assert!(status.contains("400"), "{name}: {status} {body}");
        let served: serde_json::Value = serde_json::from_str(&body).unwrap();
        let message = served["error"]["message"].as_str().unwrap();
        common::assert_one_line_error(&cli, &format!("{file}: {message}"));
        assert_eq!(served["error"]["param"], "messages", "{name}: {body}");
    }
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/select",
        &serde_json::json!({"text": "hi", "tools": tools, "always_include": ["get_wether"]})
            .to_string(),
    );
    assert!(status.contains("400"), "{status} {body}");
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = served["error"]["message"].as_str().unwrap();
    let detail = message.trim_start_matches("always_include: ");
    let cli = common::decide(&[
        "select",
        "--tools",
        &tools_file,
        "--always-include",
        "get_wether",
        "hi",
    ]);
    common::assert_one_line_error(&cli, &format!("--always-include: {detail}"));
    let unnamed = serde_json::json!([{"description": "Greetings"}]);
    let file = dir.file(
        "unnamed.json",
        serde_json::json!({"default": "small", "routes": unnamed}).to_string(),
    );
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/route",
        &serde_json::json!({"text": "hi", "routes": unnamed, "default": "small"}).to_string(),
    );
    assert!(status.contains("400"), "{status} {body}");
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = served["error"]["message"].as_str().unwrap();
    let cli = common::decide(&["route", "--routes", &file, "hi"]);
    common::assert_one_line_error(&cli, &format!("{file}: {message}"));
    let (status, _) = server.stop();
    assert!(status.success());
}
