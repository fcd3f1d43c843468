//! The filter with the real default model (decide-tools-minilm, built by `models/fetch`) over
//! a catalogue of 48 tools from real MCP servers' `tools/list`, with hand-written requests:
//! single-turn ones and follow-ups that only make sense with the earlier turns.
//!
//! The bounds are the quality this plain embedder measured on these cases, kept as a floor so
//! that a regression fails; raise them when the model improves.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use decide_chat::{
    parse_messages, parse_tools, ChatMessage, StaticToolProvider, ToolProviderRequest,
    ToolSpecification,
};
use decide_engine::Engine;
use decide_filter::{FilteringToolProvider, Reason};
use serde_json::Value;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().build().expect("run models/fetch first"))
}

fn catalogue() -> Vec<ToolSpecification> {
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(data("catalogue.json")).unwrap()).unwrap();
    parse_tools(&json).unwrap()
}

struct Case {
    id: String,
    messages: Vec<ChatMessage>,
    expected: Vec<String>,
}

fn cases() -> Vec<Case> {
    std::fs::read_to_string(data("queries.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Case {
                id: v["id"].as_str().unwrap().to_string(),
                messages: parse_messages(&v["messages"]).unwrap(),
                expected: serde_json::from_value(v["expected"].clone()).unwrap(),
            }
        })
        .collect()
}

/// The request an agent makes: the last user message, the conversation as previous messages.
fn request(messages: &[ChatMessage]) -> ToolProviderRequest {
    let user = messages
        .iter()
        .rev()
        .find_map(|m| match m {
            ChatMessage::User(u) => Some(u.clone()),
            _ => None,
        })
        .unwrap();
    ToolProviderRequest::builder(user)
        .messages(messages.to_vec())
        .build()
}

/// A top-5 filter: the five most probable tools above a low floor, plus those passed without
/// asking.
fn top5() -> FilteringToolProvider {
    FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(
            catalogue(),
        )))
        .decision_model(Arc::new(engine().clone()))
        .min_probability(0.02)
        .max_results(5)
        .build()
        .unwrap()
}

fn is_follow_up(case: &Case) -> bool {
    case.messages
        .iter()
        .any(|m| matches!(m, ChatMessage::Assistant(_)))
}

#[test]
fn single_turn_requests_keep_their_tools() {
    let filter = top5();
    let (mut kept_all, mut total, mut passed) = (0, 0, 0);
    for case in cases().iter().filter(|c| !is_follow_up(c)) {
        let selection = filter.select(&request(&case.messages)).unwrap();
        let names = selection.names();
        total += 1;
        passed += names.len();
        if case.expected.iter().all(|e| names.contains(&e.as_str())) {
            kept_all += 1;
        } else {
            eprintln!("{}: expected {:?}, kept {names:?}", case.id, case.expected);
        }
    }
    assert_eq!(total, 18);
    // Measured: 15 of 18 keep every needed tool among 5 of 48.
    assert!(
        kept_all >= 14,
        "only {kept_all} of {total} cases kept their tools"
    );
    assert!(passed <= 5 * total);
}

#[test]
fn follow_ups_keep_the_tools_of_the_earlier_turns() {
    let filter = top5();
    let mut kept = 0;
    let follow_ups: Vec<Case> = cases().into_iter().filter(is_follow_up).collect();
    assert_eq!(follow_ups.len(), 6);
    for case in &follow_ups {
        let selection = filter.select(&request(&case.messages)).unwrap();
        let names = selection.names();
        if case.expected.iter().all(|e| names.contains(&e.as_str())) {
            kept += 1;
        } else {
            eprintln!("{}: expected {:?}, kept {names:?}", case.id, case.expected);
        }
    }
    // Measured: 5 of 6.
    assert!(kept >= 5, "only {kept} of 6 follow-ups kept their tools");
}

#[test]
fn and_for_berlin_selects_the_forecast_again() {
    let case = cases().into_iter().find(|c| c.id == "q19").unwrap();
    let last = match case.messages.last().unwrap() {
        ChatMessage::User(u) => u.text(),
        other => panic!("q19 ends with {other:?}"),
    };
    assert!(last.to_lowercase().contains("berlin"), "{last}");
    let selection = top5().select(&request(&case.messages)).unwrap();
    assert!(selection.names().contains(&"get_forecast"));
    let forecast = selection
        .decisions
        .iter()
        .find(|d| d.name == "get_forecast")
        .unwrap();
    assert_eq!(forecast.reason, Reason::AlreadyCalled);
    // Alone, the same words are no weather request: the model is asked and doubts it.
    let alone = top5().select(&request(&[ChatMessage::user(last)])).unwrap();
    let forecast = alone
        .decisions
        .iter()
        .find(|d| d.name == "get_forecast")
        .unwrap();
    assert_eq!(forecast.reason, Reason::Asked);
    assert!(forecast.probability.unwrap() < 0.5, "{forecast:?}");
}

#[test]
fn the_default_filter_passes_few_tools() {
    // By default the model's needs-tool gate decides, as `decide select` and `/v1/select` do: a
    // conversation that needs a tool gets its best one and the companions over the lower bar,
    // never most of a 48-tool catalogue, and only the needed one when it is clear.
    let filter = FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(
            catalogue(),
        )))
        .decision_model(Arc::new(engine().clone()))
        .build()
        .unwrap();
    for case in cases() {
        let names = filter
            .select(&request(&case.messages))
            .unwrap()
            .names()
            .len();
        assert!(names <= 6, "{}: {names} tools passed", case.id);
    }
    let sentry = cases()
        .into_iter()
        .find(|c| c.expected == ["get_sentry_issue"])
        .unwrap();
    let names = filter.select(&request(&sentry.messages)).unwrap();
    assert_eq!(names.names(), ["get_sentry_issue"]);
}
