//! End-to-end tests of the `decide` binary with the real default model (fetched by
//! `models/fetch`): what a user types and what comes back, bad input included.

use std::path::Path;

mod common;

use common::{assert_one_line_error, decide, root, stderr, stdout, TempDir};

/// `decide select --json` on the README's quick-start example, with `extra` options: what it
/// prints and the names it selected.
fn select_example(extra: &[&str]) -> (serde_json::Value, Vec<String>) {
    let mut args = vec![
        "select",
        "--tools",
        "examples/tools.json",
        "--messages",
        "examples/conversation.json",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = decide(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names = v["selected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    (v, names)
}

#[test]
fn select_on_the_shipped_example_passes_the_forecast_and_the_email_it_asks_for() {
    let (v, names) = select_example(&[]);
    assert!(names.iter().any(|n| n == "get_forecast"), "{v}");
    let catalogue: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/tools.json")).unwrap())
            .unwrap();
    let all = v["scores"].as_array().unwrap();
    assert_eq!(all.len(), catalogue["tools"].as_array().unwrap().len());
    // The forecast tool was already called in the conversation: it passes without asking.
    let forecast = all.iter().find(|s| s["name"] == "get_forecast").unwrap();
    assert_eq!(forecast["reason"], "already-called");
    assert!(forecast["probability"].is_null());
    let asked: Vec<&serde_json::Value> = all.iter().filter(|s| s["reason"] == "asked").collect();
    assert_eq!(asked.len(), all.len() - 1);
    assert!(asked
        .iter()
        .all(|s| (0.0..=1.0).contains(&s["probability"].as_f64().unwrap())));
    assert!(
        names.len() < all.len() / 2,
        "the filter must filter: {names:?}"
    );
    // The follow-up asks for an email too ("email it to Anna"): the trained default model ranks
    // it first of the tools it is asked about (0.585) and passes it at the default threshold.
    let p = |name: &str| {
        asked.iter().find(|s| s["name"] == name).unwrap()["probability"]
            .as_f64()
            .unwrap()
    };
    assert!(
        asked
            .iter()
            .all(|s| s["name"] == "send_email"
                || s["probability"].as_f64().unwrap() < p("send_email")),
        "send_email is not the most probable tool: {v}"
    );
    assert!(p("send_email") >= 0.5, "{v}");
    assert!(names.iter().any(|n| n == "send_email"), "{v}");
    let (_, names) = select_example(&["--target-recall", "0.9"]);
    assert!(
        names.iter().any(|n| n == "get_forecast") && names.iter().any(|n| n == "send_email"),
        "{names:?}"
    );
    // 90% of needed MCP tools (the calibration cases') lie above 0.014: 10 of the 27 tools.
    assert!(
        names.len() < all.len() / 2,
        "the filter must filter: {names:?}"
    );
}

#[test]
fn select_takes_a_plain_text_and_prints_a_table() {
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools-openai.json",
        "what's the weather in Oslo tomorrow?",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("tools selected"), "{out}");
    // The default model's needs-tool gate says what it decided on, above the table.
    assert!(
        out.lines().nth(1).unwrap().starts_with("needs a tool: "),
        "{out}"
    );
    let first_row = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("tool "))
        .nth(1)
        .unwrap();
    assert!(
        first_row.starts_with('*') && first_row.contains("get_forecast"),
        "{out}"
    );
}

#[test]
fn max_results_limits_the_selection() {
    // One threshold of 0 passes all 27 tools; the needs-tool gate would pass only the best one
    // and its companions, however many the model puts over their bar.
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--needs-tool-gate",
        "off",
        "--min-probability",
        "0",
        "--max-results",
        "3",
        "--json",
        "email the forecast to Anna",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["selected"].as_array().unwrap().len(), 3);
}

#[test]
fn score_streams_one_line_per_case_in_order() {
    let t = TempDir::new("score");
    let data = t.file(
        "cases.jsonl",
        concat!(
            r#"{"id":"a","messages":[{"role":"user","content":"will it snow in Oslo?"}],"expected":["get_forecast"]}"#, "\n",
            "\n",
            r#"{"id":2,"messages":[{"role":"user","content":"mail the notes to Bob"}]}"#, "\n",
        ),
    );
    let o = decide(&[
        "score",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], "a");
    assert_eq!(lines[1]["id"], 2);
    assert_eq!(lines[0]["scores"].as_array().unwrap().len(), 5);
    assert!(lines[0]["ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_missing_file_is_named() {
    let o = decide(&["select", "--tools", "no/such/tools.json", "hello"]);
    assert_one_line_error(&o, "no/such/tools.json");
}

#[test]
fn broken_json_names_the_line_and_column() {
    let t = TempDir::new("broken");
    let tools = t.file("tools.json", "[\n  {\"name\": \"a\",,}\n]");
    let o = decide(&["select", "--tools", &tools, "hello"]);
    assert_one_line_error(&o, "tools.json:2:");
}

#[test]
fn a_tool_without_a_name_is_named() {
    let t = TempDir::new("noname");
    let tools = t.file(
        "tools.json",
        r#"[{"name":"a","description":"x"},{"description":"y"}]"#,
    );
    let o = decide(&["select", "--tools", &tools, "hello"]);
    assert_one_line_error(&o, "tools[1].name");
}

#[test]
fn duplicate_tool_names_are_refused() {
    let t = TempDir::new("dup");
    let tools = t.file("tools.json", r#"[{"name":"a"},{"name":"b"},{"name":"a"}]"#);
    let o = decide(&["select", "--tools", &tools, "hello"]);
    assert_one_line_error(&o, "duplicate tool name \"a\"");
}

#[test]
fn an_empty_conversation_is_refused() {
    let t = TempDir::new("empty");
    let messages = t.file("conversation.json", "[]");
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--messages",
        &messages,
    ]);
    assert_one_line_error(&o, "empty conversation");
}

#[test]
fn a_conversation_without_user_text_is_refused() {
    let t = TempDir::new("nouser");
    let messages = t.file(
        "conversation.json",
        r#"[{"role":"system","content":"be nice"}]"#,
    );
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--messages",
        &messages,
    ]);
    assert_one_line_error(&o, "no user message");
}

#[test]
fn non_utf8_input_is_refused() {
    let t = TempDir::new("utf8");
    let tools = t.file("tools.json", b"[{\"name\":\"a\xff\"}]");
    let o = decide(&["select", "--tools", &tools, "hello"]);
    assert_one_line_error(&o, "not UTF-8");
}

/// The files under `dir`, one level of folders deep.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn a_model_folder_with_a_missing_file_is_named() {
    let t = TempDir::new("model");
    t.file(
        "config.json",
        std::fs::read(root().join("models/all-MiniLM-L6-v2/config.json")).unwrap(),
    );
    let select = || {
        decide(&[
            "--model",
            t.0.to_str().unwrap(),
            "select",
            "--tools",
            "examples/tools.json",
            "hi",
        ])
    };
    assert_one_line_error(&select(), "missing tokenizer.json");
    // A built model's folder without its weights says which command builds them.
    let src = root().join("models/decide-tools-minilm");
    std::fs::create_dir_all(t.0.join("1_Pooling")).unwrap();
    for entry in walk(&src) {
        let name = entry.strip_prefix(&src).unwrap();
        if name != Path::new("model.safetensors") {
            std::fs::copy(&entry, t.0.join(name)).unwrap();
        }
    }
    assert_one_line_error(&select(), "run models/fetch");
}

#[test]
fn an_unknown_model_says_how_to_get_one() {
    let o = decide(&[
        "--model",
        "no-such-model",
        "select",
        "--tools",
        "examples/tools.json",
        "hi",
    ]);
    assert_one_line_error(&o, "model 'no-such-model' was not found");
}

#[test]
fn absurd_options_are_refused() {
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--min-probability",
        "2",
        "hi",
    ]);
    assert_one_line_error(&o, "--min-probability");
    let o = decide(&[
        "--max-batch-tokens",
        "0",
        "select",
        "--tools",
        "examples/tools.json",
        "hi",
    ]);
    assert_one_line_error(&o, "max-batch-tokens");
    let o = decide(&[
        "--device",
        "tpu",
        "select",
        "--tools",
        "examples/tools.json",
        "hi",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_bad_jsonl_line_is_named_and_nothing_after_it_is_lost() {
    let t = TempDir::new("badline");
    let data = t.file(
        "cases.jsonl",
        concat!(
            r#"{"id":"a","messages":[{"role":"user","content":"hi"}]}"#,
            "\n",
            r#"{"id":"b","messages":[{"role":"user","content":"hi"}],"expected":["nope"]}"#,
            "\n",
        ),
    );
    let o = decide(&[
        "score",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
    ]);
    assert_one_line_error(&o, "cases.jsonl:2: expected[0]: unknown tool \"nope\"");
    // The good line before the bad one was still written.
    assert_eq!(stdout(&o).lines().count(), 1);
}

#[test]
fn duplicate_ids_are_refused() {
    let t = TempDir::new("dupid");
    let line = r#"{"id":"a","messages":[{"role":"user","content":"hi"}]}"#;
    let data = t.file("cases.jsonl", format!("{line}\n{line}\n"));
    let o = decide(&[
        "score",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
    ]);
    assert_one_line_error(&o, "cases.jsonl:2: id: duplicate id");
}

#[test]
fn models_list_and_path_work_offline() {
    let o = decide(&["models", "list"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("all-MiniLM-L6-v2"));
    let o = decide(&["models", "path", "all-MiniLM-L6-v2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(Path::new(stdout(&o).trim())
        .join("model.safetensors")
        .is_file());
}

#[test]
fn filter_options_reach_the_filter() {
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--always-include",
        "query,fetch",
        "--json",
        "will it rain in Paris tomorrow?",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let selected: Vec<&str> = v["selected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        selected.contains(&"query") && selected.contains(&"fetch"),
        "{v}"
    );
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--max-messages",
        "0",
        "hi",
    ]);
    assert_one_line_error(&o, "--max-messages");
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--fallback",
        "maybe",
        "hi",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("expected all-tools, no-tools or fail"),
        "{}",
        stderr(&o)
    );
}

/// `decide route --json` on the shipped routes: the chosen route and every route's probability.
fn route_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["route", "--routes", "examples/routes.json", "--json"];
    all.extend_from_slice(args);
    let o = decide(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "one JSON object");
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn route_sends_a_code_request_to_the_code_route() {
    let v = route_json(&["Write a Python function that reverses a string"]);
    assert_eq!(v["route"], "code", "{v}");
    let probabilities = v["probabilities"].as_object().unwrap();
    let names: Vec<&str> = probabilities.keys().map(String::as_str).collect();
    assert_eq!(names, ["simple", "code", "images"], "in the file's order");
    let sum: f64 = probabilities.values().map(|p| p.as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-6, "{v}");
    let best = probabilities
        .iter()
        .max_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap()))
        .unwrap();
    assert_eq!(best.0, "code");
}

#[test]
fn route_prints_a_table_for_people() {
    let o = decide(&[
        "route",
        "--routes",
        "examples/routes.json",
        "Good morning, how are you?",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("route: simple ("), "{out}");
    let rows: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].starts_with("* simple"), "{out}");
    assert!(rows[1..].iter().all(|r| r.starts_with("  ")), "{out}");
}

#[test]
fn route_reads_conversations_with_follow_ups_and_images() {
    let t = TempDir::new("route-conversations");
    let follow_up = t.file(
        "follow-up.json",
        r#"[
            {"role": "user", "content": "Can you write a bash script that backs up my home folder every night?"},
            {"role": "assistant", "content": "Sure. I can write a script that uses rsync, plus a cron entry to run it at 2 am. Should it also delete backups older than 30 days?"},
            {"role": "user", "content": "yes, go ahead"}
        ]"#,
    );
    // By default the last user message is read alone, as if it were the whole request.
    let code = |v: &serde_json::Value| v["probabilities"]["code"].as_f64().unwrap();
    let by_default = route_json(&["--messages", &follow_up]);
    let alone = route_json(&["yes, go ahead"]);
    assert_eq!(code(&by_default), code(&alone), "{by_default} {alone}");
    // With --max-messages 3 the input is the conversation, and the earlier turns make the same
    // words more of a programming request than they are as a conversation of one message.
    // (Whether they carry it past small talk is the model's call; the router's real-model tests
    // and scripts/route_report.py measure that.)
    let last = t.file(
        "last.json",
        r#"[{"role": "user", "content": "yes, go ahead"}]"#,
    );
    let with_turns = route_json(&["--messages", &follow_up, "--max-messages", "3"]);
    let one_turn = route_json(&["--messages", &last, "--max-messages", "3"]);
    assert!(
        code(&with_turns) > code(&one_turn) + 0.1,
        "code at {} with the earlier turns, {} without",
        code(&with_turns),
        code(&one_turn)
    );
    let image = t.file(
        "image.json",
        r#"[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        ]}]"#,
    );
    assert_eq!(route_json(&["--messages", &image])["route"], "images");
}

#[test]
fn route_takes_the_default_route_without_a_user_message_or_below_the_minimum() {
    let t = TempDir::new("route-default");
    let system_only = t.file(
        "conversation.json",
        r#"[{"role": "system", "content": "You are helpful."}]"#,
    );
    let v = route_json(&["--messages", &system_only]);
    assert_eq!(
        v,
        serde_json::json!({"route": "simple", "probabilities": {}})
    );
    // No route of three reaches probability 1: the default route, with the probabilities still reported.
    let v = route_json(&[
        "--min-probability",
        "1",
        "Write a Python function that reverses a string",
    ]);
    assert_eq!(v["route"], "simple", "{v}");
    assert_eq!(v["probabilities"].as_object().unwrap().len(), 3);
}

#[test]
fn bad_routes_files_are_named_with_the_field() {
    let t = TempDir::new("route-bad");
    let text = "hello";
    let cases = [
        (
            r#"{"default": "a", "routes": [{"name": "a"}, {"name": "b"}, {"description": "x"}]}"#,
            "routes.json: routes[2].name: missing",
        ),
        (
            r#"{"default": "a", "routes": [{"name": "a"}, {"name": "a"}]}"#,
            "routes.json: routes[1].name: duplicate route name \"a\"",
        ),
        (
            r#"{"default": "z", "routes": [{"name": "a"}, {"name": "b"}]}"#,
            "routes.json: default: \"z\" is not one of the routes a, b",
        ),
        (
            r#"{"default": "a", "routes": [{"name": "a", "descriptions": ["x", "y"]}, {"name": "a#1"}]}"#,
            "give the option 'a#1' twice",
        ),
        (
            r#"{"default": "a", "routes": [{"name": "a", "descripton": "x"}]}"#,
            "routes[0].descripton: unknown field",
        ),
        (r#"{"default": "a", "routes": [}"#, "routes.json:1:"),
    ];
    for (contents, needle) in cases {
        let routes = t.file("routes.json", contents);
        assert_one_line_error(&decide(&["route", "--routes", &routes, text]), needle);
    }
    assert_one_line_error(
        &decide(&["route", "--routes", "no/such/routes.json", text]),
        "no/such/routes.json",
    );
    assert_one_line_error(
        &decide(&[
            "route",
            "--routes",
            "examples/routes.json",
            "--min-probability",
            "2",
            text,
        ]),
        "--min-probability: must be between 0 and 1",
    );
    assert_one_line_error(
        &decide(&["route", "--routes", "examples/routes.json", " "]),
        "TEXT: empty message",
    );
}

/// Four labelled cases over the shipped catalogue: two with one tool, one with two, one with none.
const EVAL_CASES: &str = concat!(
    r#"{"id":"snow","messages":[{"role":"user","content":"will it snow in Oslo tomorrow?"}],"expected":["get_forecast"]}"#,
    "\n",
    r#"{"id":"mail","messages":[{"role":"user","content":"email the forecast for Paris to Anna"}],"expected":["get_forecast","send_email"]}"#,
    "\n",
    "\n",
    r#"{"id":"thanks","messages":[{"role":"user","content":"thanks, that's all!"}],"expected":[]}"#,
    "\n",
    r#"{"id":"time","messages":[{"role":"user","content":"what time is it in Tokyo right now?"}],"expected":["get_current_time"]}"#,
    "\n",
);

#[test]
fn eval_reports_every_metric_in_range() {
    let t = TempDir::new("eval");
    let data = t.file("cases.jsonl", EVAL_CASES);
    let args = [
        "eval",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let o = decide(&json_args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["cases"], 4, "{v}");
    assert_eq!(v["single_tool_cases"], 2, "{v}");
    assert_eq!(v["tool_cases"], 3, "{v}");
    assert_eq!(v["no_tool_cases"], 1, "{v}");
    // Every tool of every case is asked about: 4 cases × 5 tools.
    assert_eq!(v["pairs"], 20, "{v}");
    assert_eq!(v["threshold"], 0.5, "{v}");
    assert_eq!(v["model"], "decide-tools-minilm", "{v}");
    for key in [
        "top1_accuracy",
        "recall_at_1",
        "recall_at_3",
        "recall_at_5",
        "recall_at_10",
        "mrr",
        "recall",
        "all_needed_selected",
        "no_tool_none_selected",
        "ece",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key}: {v}"));
        assert!((0.0..=1.0).contains(&x), "{key} = {x}");
    }
    // Nothing selected anywhere would leave precision undefined (null), never NaN.
    assert!(
        v["precision"].is_null() || (0.0..=1.0).contains(&v["precision"].as_f64().unwrap()),
        "{v}"
    );
    // With five tools every catalogue fits in the top 5, so recall@5 and @10 are 1.
    assert_eq!(v["recall_at_5"], 1.0, "{v}");
    assert_eq!(v["recall_at_10"], 1.0, "{v}");
    let (p50, p95) = (
        v["latency_p50_ms"].as_f64().unwrap(),
        v["latency_p95_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p95, "{v}");
    assert!(v["pairs_per_second"].as_f64().unwrap() > 0.0, "{v}");
    // Selected per case, at 0.5 without --target-recall.
    let mean = v["mean_selected"].as_f64().unwrap();
    assert!((0.0..=5.0).contains(&mean), "{v}");
    assert!(v["target_recall"].is_null(), "{v}");

    // The same report as a table for people.
    let o = decide(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(table.starts_with("4 cases from "), "{table}");
    for row in [
        "top-1 accuracy",
        "recall@10",
        "MRR",
        "precision at 0.5",
        "no-tool cases, nothing selected",
        "tools selected per case at 0.5",
        "needs-tool gate at 0.5 (--min-probability), then tools from 0.2",
        "calibration error",
        "latency p95",
        "pairs per second",
    ] {
        assert!(table.contains(row), "{row} missing in {table}");
    }
}

#[test]
fn eval_needs_labels_and_refuses_bad_input() {
    let t = TempDir::new("eval-bad");
    let eval = |data: &str| {
        decide(&[
            "eval",
            "--data",
            data,
            "--tools",
            "examples/tools-openai.json",
        ])
    };
    let first = EVAL_CASES.lines().next().unwrap();
    let unlabelled = t.file(
        "unlabelled.jsonl",
        format!(
            "{first}\n{}\n",
            r#"{"id":"b","messages":[{"role":"user","content":"hi"}]}"#
        ),
    );
    assert_one_line_error(&eval(&unlabelled), "unlabelled.jsonl:2: expected: missing");
    let twice = t.file(
        "twice.jsonl",
        r#"{"id":"a","messages":[{"role":"user","content":"snow?"}],"expected":["get_forecast","get_forecast"]}"#,
    );
    assert_one_line_error(
        &eval(&twice),
        "twice.jsonl:1: expected tool \"get_forecast\" is named twice",
    );
    let duplicate = t.file("duplicate.jsonl", format!("{first}\n{first}\n"));
    assert_one_line_error(&eval(&duplicate), "duplicate.jsonl:2: id: duplicate id");
    let empty = t.file("empty.jsonl", "\n\n");
    assert_one_line_error(&eval(&empty), "empty.jsonl: no cases");
    let good = t.file("good.jsonl", EVAL_CASES);
    assert_one_line_error(
        &decide(&[
            "eval",
            "--data",
            &good,
            "--tools",
            "examples/tools-openai.json",
            "--max-results",
            "2",
        ]),
        "--max-results",
    );
    assert_one_line_error(
        &decide(&[
            "eval",
            "--data",
            &good,
            "--tools",
            "examples/tools-openai.json",
            "--min-probability",
            "1.5",
        ]),
        "--min-probability",
    );
    // A --cases-out that cannot be created is named before the model loads.
    let missing = t.0.join("no-such-dir/cases.jsonl");
    assert_one_line_error(
        &decide(&[
            "eval",
            "--data",
            &good,
            "--tools",
            "examples/tools-openai.json",
            "--cases-out",
            missing.to_str().unwrap(),
        ]),
        &format!("--cases-out {}", missing.display()),
    );
}

#[test]
fn eval_seen_in_splits_the_needed_tools_by_the_training_file() {
    let t = TempDir::new("eval-seen");
    let data = t.file("cases.jsonl", EVAL_CASES);
    // "Trained" on one case that needed get_forecast, one that needed nothing, and one without labels.
    let train = t.file(
        "train.jsonl",
        concat!(
            r#"{"id":"t1","messages":[{"role":"user","content":"will it snow?"}],"expected":["get_forecast"]}"#,
            "\n",
            r#"{"id":"t2","messages":[{"role":"user","content":"hello"}],"expected":[]}"#,
            "\n",
            r#"{"id":"t3","messages":[{"role":"user","content":"hi"}]}"#,
            "\n",
        ),
    );
    let args = [
        "eval",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
        "--seen-in",
        &train,
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let o = decide(&json_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let s = &v["seen_in"];
    assert_eq!(s["files"], serde_json::json!([train]), "{v}");
    assert_eq!(s["tools"], 1, "{v}");
    // Every needed (case, tool) pair falls in exactly one group.
    let needed: usize = EVAL_CASES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let c: serde_json::Value = serde_json::from_str(l).unwrap();
            c["expected"].as_array().unwrap().len()
        })
        .sum();
    let (seen, unseen) = (
        s["seen"]["needed"].as_u64().unwrap() as usize,
        s["unseen"]["needed"].as_u64().unwrap() as usize,
    );
    // get_forecast is needed twice (snow, mail); send_email and get_current_time once each.
    assert_eq!((seen, unseen), (2, 2), "{v}");
    assert_eq!(seen + unseen, needed, "{v}");
    for group in ["seen", "unseen"] {
        for key in ["recall_at_5", "recall_at_10", "mrr"] {
            let x = s[group][key]
                .as_f64()
                .unwrap_or_else(|| panic!("{group}.{key}: {v}"));
            assert!((0.0..=1.0).contains(&x), "{group}.{key} = {x}");
        }
        // Five tools: every needed tool is in the top 5.
        assert_eq!(s[group]["recall_at_5"], 1.0, "{v}");
    }

    // The table gets the extra rows.
    let o = decide(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    for row in [
        "needed (case, tool) pairs split by --seen-in",
        "(1 tools named there)",
        "seen: needed (case, tool) pairs",
        "seen: recall@5",
        "unseen: recall@10",
        "unseen: MRR",
    ] {
        assert!(table.contains(row), "{row} missing in {table}");
    }
}

#[test]
fn eval_seen_in_names_a_missing_or_broken_file() {
    let t = TempDir::new("eval-seen-bad");
    let data = t.file("cases.jsonl", EVAL_CASES);
    let eval = |seen_in: &str| {
        decide(&[
            "eval",
            "--data",
            &data,
            "--tools",
            "examples/tools-openai.json",
            "--seen-in",
            seen_in,
        ])
    };
    let missing = t.path("missing.jsonl");
    assert_one_line_error(&eval(&missing), &format!("--seen-in: {missing}"));
    let first = EVAL_CASES.lines().next().unwrap();
    let broken = t.file("broken.jsonl", format!("{first}\n{{\"id\": \n"));
    assert_one_line_error(
        &eval(&broken),
        &format!("--seen-in: {broken}:2: invalid JSON"),
    );
    let unknown = t.file(
        "unknown.jsonl",
        r#"{"id":"u","messages":[{"role":"user","content":"hi"}],"expected":["no_such_tool"]}"#,
    );
    assert_one_line_error(
        &eval(&unknown),
        &format!("{unknown}:1: expected[0]: unknown tool \"no_such_tool\""),
    );
}

/// `decide eval --cases-out` on a data set's reporting part with `--kernels KERNELS`: the case lines.
fn eval_cases_out(t: &TempDir, set: &str, kernels: &str) -> Vec<serde_json::Value> {
    eval_cases_out_in(t, set, kernels, "f32")
}

/// [`eval_cases_out`] in `dtype`.
fn eval_cases_out_in(t: &TempDir, set: &str, kernels: &str, dtype: &str) -> Vec<serde_json::Value> {
    let out = t.0.join(format!("{set}-{kernels}-{dtype}.jsonl"));
    let data = format!("crates/decide-eval/data/{set}/report.jsonl");
    let o = decide(&[
        "--kernels",
        kernels,
        "--dtype",
        dtype,
        "eval",
        "--data",
        &data,
        "--tools",
        &format!("crates/decide-eval/data/{set}/catalogue.json"),
        "--cases-out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // One line per case, in the file's order, each with the whole catalogue ranked.
    assert_eq!(
        Some(lines.len() as u64),
        report["cases"].as_u64(),
        "{report}"
    );
    let ids: Vec<serde_json::Value> = std::fs::read_to_string(root().join(&data))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].clone())
        .collect();
    let got: Vec<serde_json::Value> = lines.iter().map(|c| c["id"].clone()).collect();
    assert_eq!(got, ids);
    for c in &lines {
        assert!(c["expected"].is_array(), "{c}");
        let p: Vec<f64> = c["ranking"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["probability"].as_f64().unwrap())
            .collect();
        assert!(!p.is_empty(), "{c}");
        assert!(p.windows(2).all(|w| w[0] >= w[1]), "not ranked: {c}");
    }
    lines
}

/// The fused CPU kernels decide as candle's own f32 ops do on a data set's reporting
/// part: the same top-1 tool on every case, and every probability within 1e-4 (measured: under
/// 1e-6 on all four parts of both sets, AVX-512).
fn assert_fused_kernels_match_stock(set: &str) {
    let t = TempDir::new(&format!("kernels-{set}"));
    let stock = eval_cases_out(&t, set, "stock");
    let fused = eval_cases_out(&t, set, "auto");
    assert_eq!(stock.len(), fused.len(), "{set}");
    let mut max_diff = 0.0f64;
    for (s, f) in stock.iter().zip(&fused) {
        assert_eq!(s["id"], f["id"], "{set}");
        let (s, f) = (
            s["ranking"].as_array().unwrap(),
            f["ranking"].as_array().unwrap(),
        );
        assert_eq!(s.len(), f.len(), "{set}");
        assert_eq!(
            s[0]["tool"], f[0]["tool"],
            "{set}: top-1 differs: {s:?} {f:?}"
        );
        let fused_p = probabilities(f);
        for r in s {
            let tool = r["tool"].as_str().unwrap();
            let diff = (r["probability"].as_f64().unwrap() - fused_p[tool]).abs();
            assert!(diff <= 1e-4, "{set}: {tool}: probability off by {diff}");
            max_diff = max_diff.max(diff);
        }
    }
    eprintln!(
        "{set}: {} cases, same top-1, max |probability difference| {max_diff:.2e}",
        stock.len()
    );
}

/// A ranking's probabilities by tool name.
fn probabilities(ranking: &[serde_json::Value]) -> std::collections::HashMap<&str, f64> {
    ranking
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap(),
                r["probability"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// int8 against f32 on the own reporting part, case by case. What int8 keeps, as measured
/// (2026-12-02, 2-core AVX-512 VNNI machine, docs/benchmarks.md): the same top-1 tool in 141 of
/// the 145 cases (the other four are ties within 0.001 of a probability), every probability
/// within 0.023 of f32's, recall@10 unchanged. The bounds below hold that with a margin; they
/// are looser than the f32 kernels' 1e-4 because 8-bit products move a pooled embedding by about
/// 4e-4 in cosine.
#[test]
fn int8_stays_close_to_f32_on_the_own_reporting_part() {
    let t = TempDir::new("int8-own");
    let f32s = eval_cases_out_in(&t, "own", "auto", "f32");
    let int8 = eval_cases_out_in(&t, "own", "auto", "int8");
    assert_eq!(f32s.len(), int8.len());
    let (mut same, mut max_diff) = (0, 0f64);
    let recall_at_10 = |cases: &[serde_json::Value]| {
        let (mut hit, mut total) = (0, 0);
        for c in cases {
            let top: Vec<&serde_json::Value> = c["ranking"]
                .as_array()
                .unwrap()
                .iter()
                .take(10)
                .map(|r| &r["tool"])
                .collect();
            for e in c["expected"].as_array().unwrap() {
                total += 1;
                hit += top.contains(&e) as usize;
            }
        }
        hit as f64 / total.max(1) as f64
    };
    for (f, q) in f32s.iter().zip(&int8) {
        assert_eq!(f["id"], q["id"]);
        let (f, q) = (
            f["ranking"].as_array().unwrap(),
            q["ranking"].as_array().unwrap(),
        );
        same += (f[0]["tool"] == q[0]["tool"]) as usize;
        let p = probabilities(q);
        for r in f {
            let diff = (r["probability"].as_f64().unwrap() - p[r["tool"].as_str().unwrap()]).abs();
            max_diff = max_diff.max(diff);
        }
    }
    let share = same as f64 / f32s.len() as f64;
    let (r32, r8) = (recall_at_10(&f32s), recall_at_10(&int8));
    eprintln!(
        "own: same top-1 in {same}/{} cases, max |probability difference| {max_diff:.3}, \
         recall@10 {r32:.4} (f32) {r8:.4} (int8)",
        f32s.len()
    );
    assert!(
        share >= 0.95,
        "same top-1 in only {same} of {} cases",
        f32s.len()
    );
    assert!(max_diff <= 0.04, "a probability moved by {max_diff}");
    assert!(
        (r32 - r8).abs() <= 0.01,
        "recall@10 {r32} (f32) against {r8} (int8)"
    );
}

#[test]
fn int8_selects_and_refuses_the_stock_kernels() {
    let (v, names) = select_example(&["--dtype", "int8"]);
    assert!(names.iter().any(|n| n == "get_forecast"), "{v}");
    let o = decide(&[
        "--dtype",
        "int8",
        "--kernels",
        "stock",
        "select",
        "--tools",
        "examples/tools.json",
        "hello",
    ]);
    assert_one_line_error(&o, "int8 runs on the fused CPU kernels");
    let o = decide(&[
        "--dtype",
        "int4",
        "select",
        "--tools",
        "examples/tools.json",
        "hi",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("expected f32, int8, f16, bf16 or auto"),
        "{}",
        stderr(&o)
    );
}

/// The hand-written set: 145 cases, 62 tools (about 30 s in the test profile on 2 busy cores).
#[test]
fn fused_kernels_match_stock_on_the_own_reporting_part() {
    assert_fused_kernels_match_stock("own");
}

/// LiveMCPBench: 59 cases, 526 tools; 70 to 130 s in the test profile on 2 busy cores, so only
/// with `cargo test --test cli -- --ignored`.
#[test]
#[ignore = "slow: over 60 s in the test profile"]
fn fused_kernels_match_stock_on_the_livemcpbench_reporting_part() {
    assert_fused_kernels_match_stock("livemcpbench");
}

#[test]
fn calibrate_fits_on_labelled_cases_and_refuses_duplicates() {
    let t = TempDir::new("calibrate");
    let a = r#"{"id":"a","messages":[{"role":"user","content":"will it snow in Oslo?"}],"expected":["get_forecast"]}"#;
    let b = r#"{"id":"b","messages":[{"role":"user","content":"mail the notes to Bob"}],"expected":["send_email"]}"#;
    let data = t.file("cases.jsonl", format!("{a}\n{b}\n"));
    // --dry-run: the shipped manifest must not change under the tests.
    let o = decide(&[
        "calibrate",
        "--data",
        &data,
        "--tools",
        "examples/tools-openai.json",
        "--dry-run",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["written"].is_null(), "{v}");
    assert!(
        v["ece_before"].as_f64().is_some() && v["ece"].as_f64().is_some(),
        "{v}"
    );
    assert_eq!(v["pairs"], 10);
    assert_eq!(v["positives"], 2);
    assert!(v["a"].as_f64().unwrap() > 0.0, "{v}");
    let dup = t.file("dup.jsonl", format!("{a}\n{a}\n"));
    let o = decide(&[
        "calibrate",
        "--data",
        &dup,
        "--tools",
        "examples/tools-openai.json",
    ]);
    assert_one_line_error(&o, "dup.jsonl:2: id: duplicate id");
    let empty = t.file("empty.jsonl", "\n");
    let o = decide(&[
        "calibrate",
        "--data",
        &empty,
        "--tools",
        "examples/tools-openai.json",
    ]);
    assert_one_line_error(&o, "empty.jsonl: no cases");
}

/// A copy of the default model whose manifest may be rewritten: the weights are linked, the
/// manifest copied.
fn scratch_model(t: &TempDir) -> String {
    let src = root().join("models/all-MiniLM-L6-v2");
    let dir = t.0.join("model");
    copy_linked(&src, &dir);
    std::fs::remove_file(dir.join("manifest.toml")).unwrap();
    std::fs::copy(src.join("manifest.toml"), dir.join("manifest.toml")).unwrap();
    dir.to_str().unwrap().to_string()
}

fn copy_linked(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_linked(&entry.path(), &to);
        } else {
            std::os::unix::fs::symlink(entry.path().canonicalize().unwrap(), &to).unwrap();
        }
    }
}

#[test]
fn calibrate_writes_the_manifest_and_draws_the_reliability_plot() {
    let t = TempDir::new("calibrate-write");
    let model = scratch_model(&t);
    let plot = t.0.join("reliability.png");
    let o = decide(&[
        "--model",
        &model,
        "--lexical-weight",
        "0.5",
        "calibrate",
        "--data",
        "models/calibration/tools.jsonl",
        "--tools",
        "examples/tools.json",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("before: a = ") && out.contains("after:  a = "),
        "{out}"
    );
    assert!(out.contains("written to "), "{out}");
    let png = std::fs::read(&plot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    let manifest = std::fs::read_to_string(Path::new(&model).join("manifest.toml")).unwrap();
    let v: toml::Value = toml::from_str(&manifest).unwrap();
    assert_eq!(
        v["scoring"]["lexical_weight"].as_float(),
        Some(0.5),
        "{manifest}"
    );
    let a = v["calibration"]["a"].as_float().unwrap();
    assert!(a > 1.0 && a < 50.0, "{manifest}");
    // The rest of the manifest is untouched: the file hashes still verify.
    assert!(manifest.contains("[files]") && manifest.contains("\"model.safetensors\" = "));
    // The model loads with the new fit and selects with it.
    let o = decide(&[
        "--model",
        &model,
        "select",
        "--tools",
        "examples/tools.json",
        "--json",
        "Will it rain in Paris tomorrow?",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A catalogue count that matches neither one nor every --data is refused before loading.
    let o = decide(&[
        "calibrate",
        "--data",
        "models/calibration/tools.jsonl",
        "--data",
        "models/calibration/tools.jsonl",
        "--data",
        "models/calibration/tools.jsonl",
        "--tools",
        "examples/tools.json",
        "--tools",
        "examples/tools.json",
        "--dry-run",
    ]);
    assert_one_line_error(
        &o,
        "--tools: give one catalogue for all --data or one per --data",
    );
}

/// `decide select --json --target-recall R` on the shipped conversation with `model`: the names
/// selected.
fn selected_at_recall(model: &str, recall: &str) -> Vec<String> {
    let o = decide(&[
        "--model",
        model,
        "select",
        "--tools",
        "examples/tools.json",
        "--messages",
        "examples/conversation.json",
        "--target-recall",
        recall,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    v["selected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// `decide --model MODEL select` of the forecast question against the shipped catalogue, with
/// `extra` arguments.
fn select_rain(model: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "--model",
        model,
        "select",
        "--tools",
        "examples/tools.json",
        "Will it rain in Paris tomorrow?",
    ];
    args.extend_from_slice(extra);
    decide(&args)
}

/// `decide --model MODEL calibrate` on the calibration cases and the shipped catalogue, with
/// `extra` arguments.
fn calibrate_shipped(model: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "--model",
        model,
        "calibrate",
        "--data",
        "models/calibration/tools.jsonl",
        "--tools",
        "examples/tools.json",
    ];
    args.extend_from_slice(extra);
    decide(&args)
}

#[test]
fn target_recall_selects_by_the_conformal_table_calibrate_writes() {
    let t = TempDir::new("target-recall");
    let model = scratch_model(&t);
    let select = |extra: &[&str]| select_rain(&model, extra);
    // Before calibrating, the copy has no table.
    let o = select(&["--target-recall", "0.9"]);
    assert_one_line_error(
        &o,
        "--target-recall: model all-MiniLM-L6-v2 has no conformal calibration; run decide calibrate",
    );

    let o = calibrate_shipped(&model, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let manifest = std::fs::read_to_string(Path::new(&model).join("manifest.toml")).unwrap();
    let v: toml::Value = toml::from_str(&manifest).unwrap();
    let table = &v["conformal"];
    let needed: Vec<f64> = table["needed_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("{manifest}"))
        .iter()
        .map(|p| p.as_float().unwrap())
        .collect();
    // One probability per needed (case, tool) pair of the data, sorted, as the report says.
    assert_eq!(needed.len() as u64, report["positives"].as_u64().unwrap());
    assert_eq!(report["conformal"]["needed"], needed.len(), "{report}");
    assert!(needed.windows(2).all(|w| w[0] <= w[1]), "{manifest}");
    assert_eq!(table["cases"].as_integer(), Some(120), "{manifest}");
    assert_eq!(
        table["source"].as_str(),
        Some("models/calibration/tools.jsonl with examples/tools.json")
    );
    // The printed threshold is the k-th smallest probability, k = ⌊(1 − R)(n + 1)⌋.
    let k = ((1.0 - 0.9) * (needed.len() + 1) as f64 + 1e-9).floor() as usize;
    let t90 = if k == 0 { 0.0 } else { needed[k - 1] };
    assert_eq!(
        report["conformal"]["thresholds"]["0.9"].as_f64(),
        Some(t90),
        "{report}"
    );

    // The shipped conversation asks for the forecast (already called) and an email.
    let at_90 = selected_at_recall(&model, "0.9");
    assert!(
        at_90.iter().any(|n| n == "get_forecast") && at_90.iter().any(|n| n == "send_email"),
        "{at_90:?}"
    );
    // A higher target never selects fewer tools.
    let mut last = 0;
    for r in ["0.5", "0.8", "0.9", "0.95", "0.99"] {
        let n = selected_at_recall(&model, r).len();
        assert!(n >= last, "R = {r}: {n} tools, fewer than {last}");
        last = n;
    }
    let o = select(&["--target-recall", "0.9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("target recall 0.9: min probability {t90}")),
        "{}",
        stdout(&o)
    );

    // eval measures at the same threshold and says so.
    let o = decide(&[
        "--model",
        &model,
        "eval",
        "--data",
        "crates/decide-eval/data/own/tune.jsonl",
        "--tools",
        "crates/decide-eval/data/own/catalogue.json",
        "--target-recall",
        "0.9",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(e["threshold"].as_f64(), Some(t90), "{e}");
    assert_eq!(e["target_recall"].as_f64(), Some(0.9), "{e}");
    assert!(e["mean_selected"].as_f64().unwrap() > 0.0, "{e}");

    // Bad targets and both options at once.
    for bad in ["1.5", "0", "1"] {
        let o = select(&["--target-recall", bad]);
        assert_one_line_error(&o, "--target-recall: must be between 0 and 1");
    }
    let o = select(&["--target-recall", "0.9", "--min-probability", "0.3"]);
    assert_one_line_error(&o, "--target-recall: replaces --min-probability");
    // Another lexical weight makes other probabilities: the table no longer applies.
    let o = decide(&[
        "--model",
        &model,
        "--lexical-weight",
        "0.9",
        "select",
        "--tools",
        "examples/tools.json",
        "--target-recall",
        "0.9",
        "hi",
    ]);
    assert_one_line_error(&o, "has no conformal calibration");
    // calibrate writes the table; it does not read one.
    let o = calibrate_shipped(&model, &["--target-recall", "0.9", "--dry-run"]);
    assert_one_line_error(&o, "--target-recall: not used by calibrate");
}

#[test]
fn calibrate_keeps_each_conformal_source_apart() {
    let t = TempDir::new("conformal-sources");
    let model = scratch_model(&t);
    let calibrate = |extra: &[&str]| calibrate_shipped(&model, extra);
    let json = |o: &std::process::Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_str(stdout(o).trim()).unwrap()
    };
    // Two small sources: slices of the own tuning cases (with their catalogue) and of the
    // calibration cases (with the shipped one).
    let head = |from: &str, lines: usize, name: &str| {
        let text = std::fs::read_to_string(root().join(from)).unwrap();
        let path = t.0.join(name);
        let kept: Vec<&str> = text.lines().take(lines).collect();
        std::fs::write(&path, kept.join("\n") + "\n").unwrap();
        path.to_str().unwrap().to_string()
    };
    let own = head("crates/decide-eval/data/own/tune.jsonl", 20, "own.jsonl");
    let cal = head("models/calibration/tools.jsonl", 30, "cal.jsonl");
    let alone = json(&calibrate(&["--json", "--dry-run"]));
    let o = calibrate(&[
        "--conformal-data",
        &own,
        "--conformal-data",
        &cal,
        "--conformal-tools",
        "crates/decide-eval/data/own/catalogue.json",
        "--conformal-tools",
        "examples/tools.json",
        "--json",
    ]);
    let report = json(&o);
    // The Platt fit reads --data only.
    assert_eq!(report["a"], alone["a"], "{report}");
    assert_eq!(report["b"], alone["b"], "{report}");
    let sources = report["conformal"]["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 3, "{report}");
    assert_eq!(sources[0], alone["conformal"]["sources"][0], "{report}");
    assert_eq!(
        sources[1]["source"].as_str(),
        Some(format!("{own} with crates/decide-eval/data/own/catalogue.json").as_str())
    );
    assert_eq!(sources[1]["cases"].as_u64(), Some(20), "{report}");
    assert_eq!(sources[2]["cases"].as_u64(), Some(30), "{report}");
    // Each target's threshold is the lowest of the sources' own.
    for r in ["0.9", "0.95", "0.99"] {
        let lowest = sources
            .iter()
            .map(|s| s["thresholds"][r].as_f64().unwrap())
            .fold(1.0, f64::min);
        assert_eq!(
            report["conformal"]["thresholds"][r].as_f64(),
            Some(lowest),
            "{r}: {report}"
        );
    }
    let needed: u64 = sources.iter().map(|s| s["needed"].as_u64().unwrap()).sum();
    assert_eq!(
        report["conformal"]["needed"].as_u64(),
        Some(needed),
        "{report}"
    );

    // The manifest keeps them apart, and select reads them back.
    let manifest = std::fs::read_to_string(Path::new(&model).join("manifest.toml")).unwrap();
    assert_eq!(manifest.matches("[[conformal]]").count(), 3, "{manifest}");
    let t90 = report["conformal"]["thresholds"]["0.9"].as_f64().unwrap();
    let o = select_rain(&model, &["--target-recall", "0.9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("target recall 0.9: min probability {t90}")),
        "{}",
        stdout(&o)
    );
    // Mistakes are named before anything is scored.
    let o = calibrate(&["--conformal-tools", "examples/tools.json"]);
    assert_one_line_error(&o, "--conformal-tools: given without --conformal-data");
    let o = calibrate(&[
        "--conformal-data",
        "models/calibration/tools.jsonl",
        "--conformal-data",
        "models/calibration/tools.jsonl",
        "--conformal-tools",
        "examples/tools.json",
        "--conformal-tools",
        "examples/tools.json",
        "--conformal-tools",
        "examples/tools.json",
    ]);
    assert_one_line_error(
        &o,
        "--conformal-tools: give one catalogue for all --conformal-data",
    );
    // A source whose cases need no tool has nothing to cover.
    let o = calibrate(&[
        "--conformal-data",
        "scripts/tooldata/no-tool.jsonl",
        "--conformal-tools",
        "examples/tools.json",
        "--dry-run",
    ]);
    assert_one_line_error(&o, "scripts/tooldata/no-tool.jsonl: no case needs a tool");
}

#[test]
fn bm25_needs_no_model_files_and_selects_by_words() {
    let o = decide(&[
        "--model",
        "bm25",
        "select",
        "--tools",
        "examples/tools.json",
        "--json",
        "send an email to anna",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let best = v["scores"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            a["probability"]
                .as_f64()
                .partial_cmp(&b["probability"].as_f64())
                .unwrap()
        })
        .unwrap();
    assert_eq!(best["name"], "send_email", "{v}");
    let o = decide(&[
        "--model",
        "bm25",
        "eval",
        "--data",
        "crates/decide-eval/data/own/tune.jsonl",
        "--tools",
        "crates/decide-eval/data/own/catalogue.json",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["model"], "bm25");
    let mrr = v["mrr"].as_f64().unwrap();
    assert!(mrr > 0.3 && mrr <= 1.0, "{v}");
}

#[test]
fn bench_measures_every_cell_and_the_decisions() {
    let plot = std::env::temp_dir().join(format!("decide-bench-{}.png", std::process::id()));
    let o = decide(&[
        "bench",
        "--batch-sizes",
        "1,3",
        "--seq-lens",
        "8,21",
        "--decision-tools",
        "5",
        "--reps",
        "2",
        "--min-time-s",
        "0",
        "--json",
        "--no-progress",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let png = std::fs::read(&plot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 4_000,
        "{} bytes",
        png.len()
    );
    std::fs::remove_file(&plot).unwrap();
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["kernels"].as_str().unwrap().starts_with("fused-"), "{v}");
    assert!(v["matmul_peak_gflops"].as_f64().unwrap() > 0.0);
    let cells = v["cells"].as_array().unwrap();
    let grid: Vec<(u64, u64)> = cells
        .iter()
        .map(|c| (c["batch"].as_u64().unwrap(), c["tokens"].as_u64().unwrap()))
        .collect();
    assert_eq!(grid, [(1, 8), (3, 8), (1, 21), (3, 21)]);
    for c in cells {
        let median = c["median_ms"].as_f64().unwrap();
        assert!(
            median > 0.0 && c["p95_ms"].as_f64().unwrap() >= median,
            "{c}"
        );
        let pairs = c["pairs_per_s"].as_f64().unwrap();
        let expected = c["batch"].as_f64().unwrap() / (median / 1e3);
        assert!((pairs - expected).abs() <= 1e-6 * expected, "{c}");
        assert_eq!(c["reps"].as_u64(), Some(2));
    }
    let d = &v["decisions"][0];
    assert_eq!(
        (d["tools"].as_u64(), d["messages"].as_u64()),
        (Some(5), Some(10))
    );

    let table = decide(&[
        "bench",
        "--batch-sizes",
        "2",
        "--seq-lens",
        "8",
        "--no-decisions",
        "--reps",
        "1",
        "--min-time-s",
        "0",
        "--kernels",
        "stock",
        "--no-progress",
    ]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.contains("kernels stock"), "{text}");
    assert!(text.contains("pairs/s"), "{text}");
}

#[test]
fn bench_times_a_real_catalogue() {
    let args = |kernels: &str, catalogue: &str| {
        decide(&[
            "--kernels",
            kernels,
            "bench",
            "--batch-sizes",
            "1",
            "--seq-lens",
            "8",
            "--no-decisions",
            "--catalogue",
            catalogue,
            "--reps",
            "2",
            "--min-time-s",
            "0",
            "--json",
            "--no-progress",
        ])
    };
    let tools: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("examples/tools.json")).unwrap())
            .unwrap();
    let want = tools["tools"].as_array().unwrap().len() as u64;
    // Both the packed (fused) and the padded (stock) path.
    for kernels in ["auto", "stock"] {
        let o = args(kernels, "examples/tools.json");
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let c = &v["catalogue"];
        assert_eq!(c["texts"].as_u64(), Some(want), "{v}");
        // Each text is at least a name and the two special tokens.
        assert!(c["tokens"].as_u64().unwrap() >= 3 * want, "{c}");
        let median = c["median_ms"].as_f64().unwrap();
        let per_s = c["texts_per_s"].as_f64().unwrap();
        assert!(
            (per_s - want as f64 / (median / 1e3)).abs() <= 1e-6 * per_s,
            "{c}"
        );
    }
    assert_one_line_error(&args("auto", "no/such/tools.json"), "no/such/tools.json");
}

#[test]
fn bench_refuses_bad_grids() {
    let o = decide(&["bench", "--seq-lens", "1"]);
    assert_one_line_error(&o, "--seq-lens");
    let o = decide(&["bench", "--plot", "/no/such/folder/x.png"]);
    assert_one_line_error(
        &o,
        "--plot /no/such/folder/x.png: no such folder /no/such/folder",
    );
    let o = decide(&["bench", "--seq-lens", "4096", "--no-decisions"]);
    assert_one_line_error(&o, "longer than the model's 256 tokens");
    let o = decide(&["bench", "--kernels", "amx"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("expected auto, avx512, avx2, avx-vnni, portable or stock"));
    let o = decide(&["bench", "--precision", "f16"]);
    assert_one_line_error(&o, "f16 is not available on the cpu");
}

#[test]
fn rerank_rescores_only_the_shortlist() {
    let probabilities = |extra: &[&str]| -> Vec<(String, f64)> {
        let mut args = extra.to_vec();
        args.extend([
            "select",
            "--tools",
            "examples/tools.json",
            "--json",
            "Will it rain in Paris tomorrow?",
        ]);
        let o = decide(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        v["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_string(),
                    s["probability"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let plain = probabilities(&[]);
    let cascade = probabilities(&[
        "--rerank",
        "crates/decide-engine/fixtures/tiny-bert-1",
        "--rerank-top",
        "2",
    ]);
    let mut ranked = plain.clone();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<&String> = ranked.iter().take(2).map(|(n, _)| n).collect();
    let mut changed = 0;
    for ((name, p), (_, q)) in plain.iter().zip(&cascade) {
        if top.contains(&name) {
            changed += usize::from((p - q).abs() > 1e-9);
        } else {
            assert!((p - q).abs() < 1e-12, "{name}: {p} vs {q}");
        }
    }
    assert!(changed > 0, "the rescorer answered none of {top:?}");
    let o = decide(&[
        "--rerank",
        "no-such-model",
        "select",
        "--tools",
        "examples/tools.json",
        "hello",
    ]);
    assert_one_line_error(&o, "--rerank no-such-model");
}

/// Runs `decide` with `args` and `input` on its standard input (a pipe).
fn decide_with_stdin(args: &[&str], input: &str) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_decide"));
    command
        .args(args)
        .current_dir(root())
        .env_remove("DECIDE_MODEL");
    common::run_with_input(command, input)
}

#[test]
fn score_reads_cases_from_a_pipe() {
    let cases = concat!(
        r#"{"id":"a","messages":[{"role":"user","content":"will it snow in Oslo?"}]}"#,
        "\n",
        r#"{"id":"b","messages":[{"role":"user","content":"mail the notes to Bob"}]}"#,
        "\n",
    );
    let o = decide_with_stdin(
        &[
            "score",
            "--data",
            "/dev/stdin",
            "--tools",
            "examples/tools-openai.json",
        ],
        cases,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
        .collect();
    assert_eq!(ids, ["\"a\"", "\"b\""]);
}

#[test]
fn trace_logging_never_shows_the_request_text() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_decide"))
        .args([
            "select",
            "--tools",
            "examples/tools.json",
            "Quokkaberry please email the report",
        ])
        .current_dir(root())
        .env_remove("DECIDE_MODEL")
        .env("DECIDE_LOG", "trace")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let log = stderr(&o);
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "no log at all"
    );
    // The tokenizer's trace events spelt the text out a character at a time.
    assert!(
        !log.contains("tokenizers"),
        "{}",
        &log[..log.len().min(2000)]
    );
    assert!(!log.to_lowercase().contains("quokkaberry"));
}

#[test]
fn terminal_escapes_in_tool_names_are_not_printed_raw() {
    let t = TempDir::new("escapes");
    let tools = t.file(
        "tools.json",
        r#"[{"name": "wipe\u001b[2J\u001b]0;owned\u0007", "description": "send an email"},
            {"name": "weather", "description": "the forecast"}]"#,
    );
    let o = decide(&["select", "--tools", &tools, "email Bob the report"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("wipe\\u{1b}[2J"), "{out}");
}

#[test]
fn always_include_must_name_a_tool() {
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--always-include",
        "get_forecast,no_such_tool",
        "hello",
    ]);
    assert_one_line_error(&o, "--always-include: no tool is named \"no_such_tool\"");
}

#[test]
fn a_blank_user_message_is_refused_like_a_blank_text() {
    let t = TempDir::new("blank");
    let messages = t.file(
        "conversation.json",
        r#"[{"role":"user","content":"what is the weather?"},{"role":"assistant","content":"where?"},{"role":"user","content":"   "}]"#,
    );
    let o = decide(&[
        "select",
        "--tools",
        "examples/tools.json",
        "--messages",
        &messages,
    ]);
    assert_one_line_error(&o, "the last user message is blank");
    assert_one_line_error(
        &decide(&["select", "--tools", "examples/tools.json", "  "]),
        "TEXT: empty message",
    );
}

/// The default model's folder copied to `t`, with `change` applied to the weights' bytes and
/// `manifest` to the manifest's text.
fn altered_model(
    t: &TempDir,
    change: impl Fn(&mut Vec<u8>),
    manifest: impl Fn(String) -> String,
) -> String {
    let src = root().join("models/decide-tools-minilm");
    std::fs::create_dir_all(t.0.join("1_Pooling")).unwrap();
    for entry in walk(&src) {
        let name = entry.strip_prefix(&src).unwrap();
        std::fs::copy(&entry, t.0.join(name)).unwrap();
    }
    let weights = t.0.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    change(&mut bytes);
    std::fs::write(&weights, bytes).unwrap();
    let path = t.0.join("manifest.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, manifest(text)).unwrap();
    t.0.to_str().unwrap().to_string()
}

#[test]
fn a_corrupted_model_is_refused_not_answered() {
    // Bytes overwritten in the weights: the manifest's sha256 no longer matches.
    let t = TempDir::new("corrupt");
    let dir = altered_model(
        &t,
        |bytes| {
            let middle = bytes.len() / 2;
            bytes[middle..middle + 4096].fill(0x5a);
        },
        |m| m,
    );
    let o = decide(&[
        "--model",
        &dir,
        "select",
        "--tools",
        "examples/tools.json",
        "email Bob",
    ]);
    assert_one_line_error(&o, "model.safetensors: sha256");
    // NaN weights in a folder whose manifest lists no checksum for them: the outputs say so.
    let t = TempDir::new("nan");
    let dir = altered_model(
        &t,
        |bytes| {
            let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            bytes[8 + header..].fill(0xff);
        },
        |m| {
            m.lines()
                .filter(|l| !l.starts_with("\"model.safetensors\""))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    let o = decide(&[
        "--model",
        &dir,
        "select",
        "--tools",
        "examples/tools.json",
        "email Bob",
    ]);
    assert_one_line_error(&o, "NaN or infinite outputs");
}

#[test]
fn calibrate_fits_a_needs_tool_head_that_select_reads_and_eval_measures() {
    let t = TempDir::new("needs-tool");
    let model = scratch_model(&t);
    // Before: no head, so no gate unless asked for.
    let o = select_rain(&model, &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v.get("needs_tool").is_none(), "{v}");
    let o = calibrate_shipped(
        &model,
        &[
            "--needs-tool-data",
            "models/calibration/tools.jsonl",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["needs_tool"]["cases"], 120, "{v}");
    assert_eq!(v["needs_tool"]["no_tool_cases"], 22, "{v}");
    assert_eq!(v["needs_tool"]["companion_min_probability"], 0.2, "{v}");
    let manifest = std::fs::read_to_string(Path::new(&model).join("manifest.toml")).unwrap();
    assert!(manifest.contains("[needs_tool]"), "{manifest}");
    // The gate is on by default once the model has a head, and says what it decided on.
    let o = select_rain(&model, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let gate = &v["needs_tool"];
    assert!(
        (0.0..=1.0).contains(&gate["answer"].as_f64().unwrap()),
        "{v}"
    );
    assert_eq!(
        gate["open"],
        gate["probability"].as_f64().unwrap() >= 0.5,
        "{v}"
    );
    let o = select_rain(&model, &["--json", "--needs-tool-gate", "off"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v.get("needs_tool").is_none(), "{v}");
    // The table says so too.
    let o = select_rain(&model, &[]);
    assert!(stdout(&o).contains("needs a tool:"), "{}", stdout(&o));
    // eval measures the gated selection and says which rule it measured.
    let o = decide(&[
        "--model",
        &model,
        "eval",
        "--data",
        "models/calibration/tools.jsonl",
        "--tools",
        "examples/tools.json",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["companion_min_probability"], 0.2, "{v}");
    // Bad input is named.
    assert_one_line_error(
        &select_rain(
            &model,
            &["--needs-tool-gate", "on", "--target-recall", "0.9"],
        ),
        "--needs-tool-gate: cannot be combined with --target-recall",
    );
    let bad = t.0.join("unlabelled.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"expected\": []}\n\
         {\"id\": \"b\", \"messages\": [{\"role\": \"user\", \"content\": \"rain?\"}]}\n",
    )
    .unwrap();
    let o = calibrate_shipped(
        &model,
        &["--needs-tool-data", bad.to_str().unwrap(), "--dry-run"],
    );
    assert_one_line_error(&o, "unlabelled.jsonl:2: expected: missing");
    let o = calibrate_shipped(
        &model,
        &[
            "--needs-tool-data",
            "models/calibration/tools.jsonl",
            "--companion-min-probability",
            "1.5",
            "--dry-run",
        ],
    );
    assert_one_line_error(&o, "--companion-min-probability: must be between 0 and 1");
}
