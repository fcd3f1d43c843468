//! Python clients nobody here wrote (from PyPI), pointed at the server's base URL:
//!
//! * pydecide 0.2.19: its System One and OpenAI Decisions backends get the embedded engine's
//!   probabilities (`tests/pydecide_check.py`);
//! * the openai SDK's `embeddings.create` and the cohere SDK's `rerank` get the engine's
//!   embeddings and the cross-encoder's scores (`tests/clients_check.py`).
//!
//! They run with `$DECIDE_PYTHON`, or the workspace's `.venv/bin/python`, or `python3`. Where a
//! client is not installed the test says so and passes, unless `DECIDE_REQUIRE_PYDECIDE=1` or
//! `DECIDE_REQUIRE_PY_CLIENTS=1` (as in CI, which installs them), where that is a failure.

use std::path::PathBuf;
use std::process::Command;

use decide_contract::{
    ChoiceQuestion, DecisionModel, DecisionRequest, DecisionResponse, ScaleQuestion, YesNoQuestion,
};
use decide_engine::{sigmoid, Engine};
use decide_server::{AppState, ServerConfig};
use serde_json::Value;

const STATE: &str = "My flight to Lisbon was cancelled this morning and I want my money back";

/// The first python that runs `check` (a snippet that exits 0 when the clients are there).
fn python(check: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = std::env::var_os("DECIDE_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([root.join(".venv/bin/python"), PathBuf::from("python3")])
        .collect();
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", check])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The python with `packages` (module, PyPI name, version), or `None` after saying the test is
/// skipped; a failure instead when the environment variable `require` is `1`.
fn python_with(require: &str, packages: &[(&str, &str, &str)]) -> Option<PathBuf> {
    let modules: Vec<&str> = packages.iter().map(|p| p.0).collect();
    let versions: Vec<String> = packages
        .iter()
        .map(|(m, _, v)| format!("{m}.__version__ == '{v}'"))
        .collect();
    let check = format!(
        "import sys, {}; sys.exit(not ({}))",
        modules.join(", "),
        versions.join(" and ")
    );
    let found = python(&check);
    if found.is_none() {
        let pins: Vec<String> = packages
            .iter()
            .map(|(_, n, v)| format!("{n}=={v}"))
            .collect();
        let pins = pins.join(" ");
        assert!(
            std::env::var(require).as_deref() != Ok("1"),
            "{require}=1 but no python with {pins} (pip install {pins})"
        );
        eprintln!("skipped: no python with {pins} (pip install {pins})");
    }
    found
}

/// Runs `script` against a server over `state` on a free port, and reads what it prints.
fn run_against(python: &PathBuf, state: AppState, script: &str, args: &[&str]) -> Value {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(decide_server::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = Command::new(python)
        .arg(&script)
        .arg(&base)
        .args(args)
        .output()
        .unwrap();
    let _ = stop.send(());
    runtime.block_on(server).unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The request the server builds from what pydecide sends: System One carries the yes/no
/// criteria, the OpenAI format appends them to the instructions (pydecide's own rendering).
fn expected_request(system_one: bool) -> DecisionRequest {
    let refund = if system_one {
        YesNoQuestion::builder("Does the user want their money back?")
            .yes_when("the user asks for a refund")
            .no_when("the user asks for something else")
            .build()
    } else {
        YesNoQuestion::new(
            "Does the user want their money back?\n\nIf true: the user asks for a refund\nIf false: the user asks for something else",
        )
    };
    DecisionRequest::builder()
        .input(STATE)
        .question("refund", refund.unwrap())
        .question(
            "urgent",
            YesNoQuestion::new("Does the user need help today?").unwrap(),
        )
        .question(
            "team",
            ChoiceQuestion::builder("Which team should handle this?")
                .option_with_description("payments", "Refunds and payments")
                .option("bookings")
                .option_with_description("lost-luggage", "Bags that did not arrive")
                .build()
                .unwrap(),
        )
        .question(
            "urgency",
            ScaleQuestion::with_levels("How urgent is it?", ["low", "medium", "high"]).unwrap(),
        )
        .build()
        .unwrap()
}

fn check(got: &Value, expected: &DecisionResponse, backend: &str) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6;
    let a = &got["answers"];
    for name in ["refund", "urgent"] {
        let (g, e) = (
            a[name]["noul"].as_f64().unwrap(),
            expected.yes_no(name).unwrap().probability(),
        );
        assert!(close(g, e), "{backend} {name}: {g} vs {e}");
    }
    let team = expected.choice("team").unwrap();
    assert_eq!(a["team"]["choice"], team.value(), "{backend}");
    for option in ["payments", "bookings", "lost-luggage"] {
        let g = a["team"]["probabilities"][option].as_f64().unwrap();
        assert!(
            close(g, team.probability_of(option).unwrap()),
            "{backend} team {option}"
        );
    }
    let urgency = expected.scale("urgency").unwrap();
    assert!(
        close(a["urgency"]["score"].as_f64().unwrap(), urgency.mean()),
        "{backend}"
    );
    for (i, p) in urgency.probabilities().iter().enumerate() {
        assert!(
            close(a["urgency"]["probabilities"][i].as_f64().unwrap(), *p),
            "{backend} level {i}"
        );
    }
}

#[test]
fn pydecide_backends_get_the_embedded_engines_answers() {
    let pydecide = [("decide", "pydecide", "0.2.19")];
    let Some(python) = python_with("DECIDE_REQUIRE_PYDECIDE", &pydecide) else {
        return;
    };
    let engine = Engine::builder().build().expect("run models/fetch first");
    let state = AppState::new(engine.clone(), ServerConfig::default()).unwrap();
    let got = run_against(&python, state, "pydecide_check.py", &[]);

    assert_eq!(got["systemone"]["backend"], "typesafe");
    assert_eq!(got["systemone"]["model"], engine.info().name.as_str());
    check(
        &got["systemone"],
        &engine.decide(&expected_request(true)).unwrap(),
        "System One",
    );
    assert_eq!(got["openai"]["backend"], "openai_decisions");
    check(
        &got["openai"],
        &engine.decide(&expected_request(false)).unwrap(),
        "OpenAI Decisions",
    );
}

/// The largest difference between two vectors.
fn max_diff(a: &[f64], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - *y as f64).abs())
        .fold(0.0, f64::max)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn openai_and_cohere_sdks_get_the_engines_embeddings_and_scores() {
    let clients = [
        ("openai", "openai", "3.57.0"),
        ("cohere", "cohere", "7.3.1"),
    ];
    let Some(python) = python_with("DECIDE_REQUIRE_PY_CLIENTS", &clients) else {
        return;
    };
    let engine = Engine::builder().build().expect("run models/fetch first");
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../decide-engine/fixtures/tiny-bert-1");
    let reranker = Engine::builder()
        .model(fixture.to_str().unwrap())
        .build()
        .unwrap();
    let config = ServerConfig {
        api_key: Some("k3y".into()),
        ..ServerConfig::default()
    };
    let state = AppState::with_reranker(engine.clone(), Some(reranker.clone()), config).unwrap();
    let model = engine.info().name.clone();
    let got = run_against(
        &python,
        state,
        "clients_check.py",
        &[&model, &reranker.info().name],
    );

    let texts = [
        "Get weather forecast for a location.",
        "Send an email to a recipient with a subject and a body.",
        "Read the complete contents of a file from the file system.",
    ];
    let expected = engine.embed(&texts).unwrap();
    assert_eq!(got["model"], model.as_str());
    assert_eq!(got["indexes"], serde_json::json!([0, 1, 2]));
    let tokens: usize = texts
        .iter()
        .map(|t| engine.count_tokens(t).unwrap() + 2)
        .sum();
    assert_eq!(got["usage"], serde_json::json!([tokens, tokens]));
    let mut worst: f64 = 0.0;
    for (i, e) in expected.iter().enumerate() {
        worst = worst.max(max_diff(&floats(&got["batch"][i]), e));
        worst = worst.max(max_diff(&floats(&got["base64"][i]), e));
        let d = max_diff(&floats(&got["batch"][i]), e);
        assert!(
            d <= 1e-5,
            "float embedding {i} differs from Engine::embed by {d}"
        );
        let d = max_diff(&floats(&got["base64"][i]), e);
        assert!(
            d <= 1e-5,
            "base64 embedding {i} differs from Engine::embed by {d}"
        );
    }
    // The same text alone and in a batch of three.
    let alone = floats(&got["alone"]);
    let in_batch: Vec<f32> = floats(&got["batch"][1]).iter().map(|x| *x as f32).collect();
    let d = max_diff(&alone, &in_batch);
    assert!(d <= 1e-5, "alone and in a batch differ by {d}");
    eprintln!("largest difference: {worst:e} from Engine::embed, {d:e} alone against in a batch");
    // The SDK raises BadRequestError with the error object of OpenAI's error shape.
    let refused = got["refused"].clone();
    assert_eq!(refused["param"], "dimensions", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("384 dimensions"),
        "{refused}"
    );

    // The cross-encoder's scores: the sigmoid of its logit for each (query, document) pair.
    let query = "Will it rain in Berlin tomorrow?";
    let pairs: Vec<(&str, &str)> = texts.iter().map(|t| (query, *t)).collect();
    let logits = reranker.classify_pairs(&pairs).unwrap();
    let mut relevance: Vec<(usize, f64)> = logits
        .iter()
        .map(|l| sigmoid(l[0] as f64))
        .enumerate()
        .collect();
    relevance.sort_by(|a, b| b.1.total_cmp(&a.1));
    let v2 = got["rerank_v2"].as_array().unwrap();
    assert_eq!(v2.len(), 2, "top_n");
    let v1 = got["rerank_v1"].as_array().unwrap();
    assert_eq!(v1.len(), 3);
    for (ranked, name) in [(v2, "v2"), (v1, "v1")] {
        for (r, (index, p)) in ranked.iter().zip(&relevance) {
            assert_eq!(
                r[0].as_u64().unwrap() as usize,
                *index,
                "{name}: {ranked:?}"
            );
            let d = (r[1].as_f64().unwrap() - p).abs();
            assert!(d <= 1e-5, "{name}: {r} vs {p}");
        }
    }
    for r in v1 {
        assert_eq!(r[2], texts[r[0].as_u64().unwrap() as usize]);
    }
}
