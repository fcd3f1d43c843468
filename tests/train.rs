//! End-to-end tests of `decide train`: bad data is refused before any training, and a tiny
//! model trains, is written as a folder, and loads with `--model` for `decide eval`.

use std::path::Path;

mod common;

use common::{assert_one_line_error, decide, root, TempDir};

const TOOLS: &str = r#"[
 {"name": "weather", "description": "get the forecast for a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
 {"name": "email", "description": "send a message to a person"},
 {"name": "calendar", "description": "create a meeting in the calendar"},
 {"name": "search", "description": "search the web for pages"},
 {"name": "files", "description": "read a file from the disk"},
 {"name": "maps", "description": "find a route between two places"}
]"#;

fn case(id: &str, text: &str, expected: &[&str]) -> String {
    let expected: Vec<String> = expected.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        "{{\"id\": \"{id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"{text}\"}}], \"expected\": [{}]}}\n",
        expected.join(", ")
    )
}

fn fixture() -> String {
    root()
        .join("crates/decide-engine/fixtures/tiny-bert-1")
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn bad_data_is_refused_before_training() {
    let t = TempDir::new("bad");
    let tools = t.file("tools.json", TOOLS);
    let out = t.path("out");
    let good = t.file("good.jsonl", case("1", "rain in Paris?", &["weather"]));
    let run = |data: &str, eval: Option<&str>| {
        let mut args = vec!["train", "--base", "no-such-model-anywhere", "--data", data];
        if let Some(e) = eval {
            args.extend(["--eval", e]);
        }
        args.extend(["--tools", tools.as_str(), "--out", out.as_str()]);
        decide(&args)
    };
    let unknown = t.file("unknown.jsonl", case("1", "hi", &["teleport"]));
    assert_one_line_error(
        &run(&unknown, None),
        "unknown.jsonl:1: expected[0]: unknown tool \"teleport\"",
    );
    let empty = t.file("empty.jsonl", "\n");
    assert_one_line_error(&run(&empty, None), "empty.jsonl: no cases");
    let dup = t.file(
        "dup.jsonl",
        &(case("1", "a", &["email"]) + &case("1", "b", &["maps"])),
    );
    assert_one_line_error(&run(&dup, None), "dup.jsonl:2: id: duplicate id");
    let unlabelled = t.file(
        "unlabelled.jsonl",
        "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
    );
    assert_one_line_error(
        &run(&unlabelled, None),
        "unlabelled.jsonl:1: expected: missing",
    );
    let overlap = t.file("overlap.jsonl", case("1", "other text", &["email"]));
    assert_one_line_error(
        &run(&good, Some(&overlap)),
        "overlap.jsonl:1: id: \"1\" is also a training case",
    );
    // Good data gets as far as the model, which does not exist: the data was checked first.
    assert_one_line_error(&run(&good, None), "no-such-model-anywhere");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn training_on_a_gpu_this_build_lacks_is_a_one_line_error() {
    let t = TempDir::new("cuda");
    let tools = t.file("tools.json", TOOLS);
    let data = t.file("data.jsonl", case("1", "rain in Paris?", &["weather"]));
    let out = t.path("out");
    let o = decide(&[
        "--device",
        "cuda",
        "train",
        "--base",
        &fixture(),
        "--data",
        &data,
        "--tools",
        &tools,
        "--out",
        &out,
    ]);
    assert_one_line_error(&o, "this build has no cuda backend");
    assert!(!Path::new(&out).exists(), "nothing written");
}

#[test]
fn a_tiny_model_trains_and_loads_with_model() {
    let t = TempDir::new("tiny");
    let tools = t.file("tools.json", TOOLS);
    let train = [
        case("t1", "will it rain tomorrow in Oslo", &["weather"]),
        case("t2", "write to Anna about the invoice", &["email"]),
        case("t3", "set up a meeting with Bob on Monday", &["calendar"]),
        case("t4", "look up reviews of the new phone online", &["search"]),
        case("t5", "open notes.txt and show it", &["files"]),
        case("t6", "how do I drive from Lyon to Nice", &["maps"]),
        case("t7", "thanks, that is all", &[]),
        case(
            "t8",
            "is it sunny in Rome and email Carl",
            &["weather", "email"],
        ),
    ]
    .concat();
    let eval = [
        case("e1", "forecast for Berlin this weekend", &["weather"]),
        case("e2", "send a message to my boss", &["email"]),
    ]
    .concat();
    let data = t.file("train.jsonl", &train);
    let eval = t.file("eval.jsonl", &eval);
    let out = t.path("model");
    let fixture = fixture();
    // The tiny model trains on `data` against `tools` into `out`, with `extra` options.
    let train_to = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "train", "--base", &fixture, "--data", &data, "--tools", &tools, "--out", out,
        ];
        args.extend_from_slice(extra);
        decide(&args)
    };
    let o = train_to(
        &out,
        &[
            "--eval",
            &eval,
            "--epochs",
            "2",
            "--lr",
            "1e-2",
            "--batch-size",
            "4",
            "--max-length",
            "32",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("epoch 1/2: loss"), "{err}");
    assert!(err.contains("eval recall@5"), "{err}");
    assert!(err.contains("1 no-tool cases skipped"), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("wrote"));
    assert!(!Path::new(&format!("{out}.partial")).exists());
    let manifest = std::fs::read_to_string(Path::new(&out).join("manifest.toml")).unwrap();
    assert!(manifest.contains("[calibration]"), "{manifest}");
    assert!(manifest.contains("data_sha256"), "{manifest}");
    let o = decide(&[
        "--model", &out, "eval", "--data", &eval, "--tools", &tools, "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["cases"], 2);
    assert!(report["recall_at_5"].as_f64().is_some(), "{report}");
    // A second run may replace a folder decide train wrote, but not any other folder.
    let other = t.file("keep.txt", "mine");
    let o = train_to(Path::new(&other).parent().unwrap().to_str().unwrap(), &[]);
    assert_one_line_error(&o, "is not a model written by decide train");
    // With a margin the no-tool case trains too, and the manifest says with which.
    let margin = t.path("margin");
    let o = train_to(
        &margin,
        &[
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--max-length",
            "32",
            "--no-tool-margin",
            "0.3",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("1 no-tool cases trained against the margin"),
        "{err}"
    );
    let manifest = std::fs::read_to_string(Path::new(&margin).join("manifest.toml")).unwrap();
    assert!(manifest.contains("no_tool_margin = 0.3"), "{manifest}");
    assert!(manifest.contains("no_tool_cases_skipped = 0"), "{manifest}");
    assert!(manifest.contains("products = \"f32\""), "{manifest}");
    // --dtype bf16 trains the linear layers on AMX tiles where the CPU has them, and the
    // manifest says so; elsewhere it is a one-line error and nothing is written.
    let tiled = t.path("tiled");
    let o = train_to(
        &tiled,
        &[
            "--dtype",
            "bf16",
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--max-length",
            "32",
        ],
    );
    // The engine's own detection, not /proc/cpuinfo: a CPU with AMX whose OS refuses the
    // process the tiles' state (an old kernel, a seccomp profile) runs as one without it.
    if decide_engine::Bf16Tiles::detect().is_some() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("(linear layers in bf16 on AMX tiles)"),
            "{err}"
        );
        assert!(err.contains("epoch 1/1: loss"), "{err}");
        let manifest = std::fs::read_to_string(Path::new(&tiled).join("manifest.toml")).unwrap();
        assert!(manifest.contains("products = \"bf16-amx\""), "{manifest}");
    } else {
        eprintln!("bf16 training: this CPU has no AMX, so only its error is checked");
        assert_one_line_error(&o, "bf16 on the cpu needs AMX");
        assert!(!Path::new(&tiled).exists(), "nothing written");
    }
    // --stop-after ends the --epochs schedule early, as Ctrl-C after that epoch would: the
    // manifest keeps the schedule's length and says how many epochs ran. Trained on tools read
    // with their argument names, the model is to be read so too.
    let stopped = t.path("stopped");
    let short = ["--batch-size", "4", "--max-length", "32"];
    let o = train_to(
        &stopped,
        &[
            &[
                "--epochs",
                "3",
                "--stop-after",
                "1",
                "--tool-parameters",
                "true",
            ][..],
            &short[..],
        ]
        .concat(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("epoch 1/3: loss"), "{err}");
    assert!(!err.contains("epoch 2/3"), "{err}");
    let manifest = std::fs::read_to_string(Path::new(&stopped).join("manifest.toml")).unwrap();
    assert!(manifest.contains("\nepochs = 3\n"), "{manifest}");
    assert!(manifest.contains("\nepochs_run = 1\n"), "{manifest}");
    assert!(
        manifest.contains("\ntool_parameters = true\n"),
        "{manifest}"
    );
    assert!(
        !std::fs::read_to_string(Path::new(&out).join("manifest.toml"))
            .unwrap()
            .contains("tool_parameters")
    );
    let o = train_to(
        &t.path("never"),
        &[&["--epochs", "2", "--stop-after", "3"][..], &short[..]].concat(),
    );
    assert_one_line_error(&o, "--stop-after 3: must be between 1 and --epochs (2)");
}

#[test]
fn a_cross_encoder_trains_from_the_default_bi_encoder_and_reranks_its_shortlist() {
    let t = TempDir::new("cross");
    let tools = t.file("tools.json", TOOLS);
    let train = [
        case("t1", "will it rain tomorrow in Oslo", &["weather"]),
        case("t2", "write to Anna about the invoice", &["email"]),
        case("t3", "set up a meeting with Bob on Monday", &["calendar"]),
        case("t4", "open notes.txt and show it", &["files"]),
        case("t5", "thanks, that is all", &[]),
    ]
    .concat();
    let eval = [
        case("e1", "forecast for Berlin this weekend", &["weather"]),
        case("e2", "how do I drive from Lyon to Nice", &["maps"]),
    ]
    .concat();
    let data = t.file("train.jsonl", &train);
    let eval = t.file("eval.jsonl", &eval);
    let out = t.path("reranker");
    // The default model is a bi-encoder: the pooler and the logit start fresh.
    let o = decide(&[
        "--rerank-top",
        "3",
        "train",
        "--head",
        "cross-encoder",
        "--data",
        &data,
        "--eval",
        &eval,
        "--tools",
        &tools,
        "--out",
        &out,
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--max-length",
        "48",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("training a cross-encoder"), "{err}");
    assert!(
        err.contains("(reranking decide-tools-minilm's top 3) recall@5"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("--rerank"), "{stdout}");
    assert!(!Path::new(&format!("{out}.spool")).exists());
    assert!(!Path::new(&out).join("modules.json").exists());
    let manifest = std::fs::read_to_string(Path::new(&out).join("manifest.toml")).unwrap();
    assert!(manifest.contains("head = \"cross-encoder\""), "{manifest}");
    assert!(manifest.contains("[calibration]"), "{manifest}");
    // The bi-encoder's lexical weight does not carry over to a logit; the tool texts it was
    // trained on (the default's, with their argument names) do.
    assert!(manifest.contains("\nlexical_weight = 0.0\n"), "{manifest}");
    assert!(
        manifest.contains("\ntool_parameters = true\n"),
        "{manifest}"
    );
    // It loads as a reranker behind the default model.
    let o = decide(&[
        "--rerank",
        &out,
        "--rerank-top",
        "3",
        "select",
        "--tools",
        &tools,
        "--json",
        "is it going to snow in Zurich tomorrow?",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["scores"].as_array().unwrap().len(), 6, "{v}");
    // A head that does not exist is a usage error naming it.
    let o = decide(&[
        "train",
        "--head",
        "tri-encoder",
        "--data",
        &data,
        "--out",
        &out,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("'tri-encoder' is not a head"));
}

#[test]
fn training_to_a_dotted_name_keeps_the_users_files_beside_it() {
    let t = TempDir::new("dotted");
    let tools = t.file("tools.json", TOOLS);
    let data = t.file(
        "train.jsonl",
        [
            case("t1", "will it rain tomorrow in Oslo", &["weather"]),
            case("t2", "write to Anna about the invoice", &["email"]),
            case("t3", "thanks, that is all", &[]),
        ]
        .concat(),
    );
    // What `--out model.v2` once took for its scratch names, and deleted.
    std::fs::create_dir_all(t.0.join("model.partial")).unwrap();
    let kept = t.file("model.partial/notes.txt", "mine");
    let spool = t.file("model.spool", "also mine");
    let out = t.path("model.v2");
    let o = decide(&[
        "train",
        "--base",
        &fixture(),
        "--data",
        &data,
        "--tools",
        &tools,
        "--out",
        &out,
        "--epochs",
        "1",
        "--max-length",
        "32",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(&spool).unwrap(), "also mine");
    assert!(Path::new(&out).join("model.safetensors").is_file());
    // Nothing of the run's own is left beside --out.
    let mut names: Vec<String> = std::fs::read_dir(&t.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model.partial",
            "model.spool",
            "model.v2",
            "tools.json",
            "train.jsonl"
        ]
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_training_with_the_shells_code_for_sigint() {
    let t = TempDir::new("sigint");
    let tools = t.file("tools.json", TOOLS);
    let train = [
        case("t1", "will it rain tomorrow in Oslo", &["weather"]),
        case("t2", "write to Anna about the invoice", &["email"]),
    ]
    .concat();
    let data = t.file("train.jsonl", &train);
    let out = t.path("model");
    let fixture = fixture();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_decide"))
        .current_dir(root())
        .args([
            "train", "--base", &fixture, "--data", &data, "--tools", &tools,
        ])
        .args(["--out", &out, "--epochs", "100000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Past loading, into the epochs: the interruption is the handler's, not the default one.
    use std::io::{BufRead, Read};
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("training a ") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "decide train ended before training"
        );
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let stderr = rest;
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("error: interrupted in epoch"), "{stderr}");
}
