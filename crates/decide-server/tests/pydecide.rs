//! pydecide 0.2.19 (PyPI), pointed at the server's base URL: its System One and OpenAI
//! Decisions backends get the embedded engine's probabilities.
//!
//! Runs `tests/pydecide_check.py` with the workspace's `.venv/bin/python` (or `$DECIDE_PYTHON`,
//! or `python3`). Where pydecide is not installed the test says so and passes, unless
//! `DECIDE_REQUIRE_PYDECIDE=1` (as in CI, which installs it), where that is a failure.

use std::path::PathBuf;
use std::process::Command;

use decide_contract::{
    ChoiceQuestion, DecisionModel, DecisionRequest, DecisionResponse, ScaleQuestion, YesNoQuestion,
};
use decide_engine::Engine;
use decide_server::{AppState, ServerConfig};
use serde_json::Value;

const STATE: &str = "My flight to Lisbon was cancelled this morning and I want my money back";

fn python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates: Vec<PathBuf> = std::env::var_os("DECIDE_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([root.join(".venv/bin/python"), PathBuf::from("python3")])
        .collect();
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args([
                "-c",
                "import decide, sys; sys.exit(decide.__version__ != '0.2.19')",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    })
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
    let Some(python) = python() else {
        assert!(
            std::env::var("DECIDE_REQUIRE_PYDECIDE").as_deref() != Ok("1"),
            "DECIDE_REQUIRE_PYDECIDE=1 but no python with pydecide 0.2.19 (pip install pydecide==0.2.19)"
        );
        eprintln!("skipped: no python with pydecide 0.2.19 (pip install pydecide==0.2.19)");
        return;
    };
    let engine = Engine::builder().build().expect("run models/fetch first");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let state = AppState::new(engine.clone(), ServerConfig::default()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(decide_server::serve(listener, state, async {
        let _ = stopped.await;
    }));

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pydecide_check.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&base)
        .output()
        .unwrap();
    let _ = stop.send(());
    runtime.block_on(server).unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();

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
