//! The router with the real default model (decide-tools-minilm, built by `models/fetch`) over three routes with
//! realistic descriptions (small talk and short facts; code; images) and hand-written requests in
//! `tests/data/routing.jsonl`: single messages, follow-ups that only make sense with the earlier turns ("yes, go
//! ahead" after a code discussion), and image attachments.
//!
//! The floor is the accuracy this plain embedder measured on these cases, kept a little lower so that a regression
//! fails. Only the route descriptions were tuned, never the cases.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use decide_chat::{parse_messages, ChatMessage, ChatModel, ChatRequest, MockChatModel};
use decide_engine::Engine;
use decide_router::{
    ChatModelRoute, ChatModelRoutingRequest, DecisionModelChatModelRouter, RouteReason,
    RoutingChatModel, ROUTE_ATTRIBUTE,
};
use serde_json::Value;

const DEFAULT_ROUTE: &str = "simple";
/// The fewest requests of `routing.jsonl` that must reach their route; see the measurement below.
const FLOOR: usize = 30;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().build().expect("run models/fetch first"))
}

/// Tuned on `routing.jsonl` (the descriptions only, never the cases). "Vision: what is in …" beat "An attached image,
/// photo, … to look at, describe or read" (29 of 34), whose "look at" and "read" also drew short follow-ups such as
/// "yes, go ahead" to the image route.
fn routes() -> Vec<ChatModelRoute> {
    vec![
        ChatModelRoute::new(
            "simple",
            "Greetings, small talk, thanks and short factual questions about the world",
        ),
        ChatModelRoute::new(
            "code",
            "Programming: writing, explaining, reviewing, refactoring and debugging code, scripts and queries",
        ),
        ChatModelRoute::new("images", "Vision: what is in an attached image or photo"),
    ]
}

struct Case {
    id: String,
    messages: Vec<ChatMessage>,
    route: String,
}

fn cases() -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/routing.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Case {
                id: v["id"].as_str().unwrap().to_string(),
                messages: parse_messages(&v["messages"]).unwrap(),
                route: v["route"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

fn router() -> DecisionModelChatModelRouter {
    DecisionModelChatModelRouter::new(Arc::new(engine().clone()))
}

fn is_follow_up(case: &Case) -> bool {
    case.messages
        .iter()
        .any(|m| matches!(m, ChatMessage::Assistant(_)))
}

/// The route the router chooses for `messages`, the default route by name.
fn chosen(router: &DecisionModelChatModelRouter, messages: &[ChatMessage]) -> String {
    let request = ChatRequest::from_messages(messages.to_vec()).unwrap();
    let decision = router
        .decide(&ChatModelRoutingRequest::new(&request, routes()))
        .unwrap();
    assert!(
        matches!(
            decision.reason,
            RouteReason::Chosen | RouteReason::NoUserMessage
        ),
        "{decision:?}"
    );
    decision
        .result
        .route_name()
        .unwrap_or(DEFAULT_ROUTE)
        .to_owned()
}

#[test]
fn realistic_requests_reach_their_route() {
    let router = router();
    let cases = cases();
    assert!(cases.len() >= 30);
    assert!(cases.iter().filter(|c| is_follow_up(c)).count() >= 5);
    let mut correct = 0;
    for case in &cases {
        let route = chosen(&router, &case.messages);
        if route == case.route {
            correct += 1;
        } else {
            eprintln!("{}: expected {}, routed to {route}", case.id, case.route);
        }
    }
    let accuracy = correct as f64 / cases.len() as f64;
    println!(
        "routing accuracy: {correct} of {} ({:.1}%)",
        cases.len(),
        accuracy * 100.0
    );
    // Measured with the trained default, decide-tools-minilm (three stages, the third with the
    // route sets of scripts/routedata/train), reading the last message alone (the default): 32 of
    // 34 (94.1%) on CPU, the follow-ups r19 "yes, go ahead" and r20 "please do" going to simple,
    // as with the model before the route sets. Its two-stage predecessor measured 31 with three
    // messages, all-MiniLM-L6-v2, which it was trained from, 30. These cases chose the default
    // of one message; on the held-out route sets (scripts/route_report.py) the default routes
    // 0.77 right, the model before the route sets 0.70.
    assert!(
        correct >= FLOOR,
        "only {correct} of {} requests reached their route",
        cases.len()
    );
}

#[test]
fn yes_go_ahead_is_weighed_with_the_turn_it_answers() {
    let case = cases()
        .into_iter()
        .find(|c| {
            matches!(c.messages.last(), Some(ChatMessage::User(u)) if u.text() == "yes, go ahead")
        })
        .unwrap();
    assert_eq!(case.route, "code");
    // By default the router reads the last message alone; with the turns before it, what makes
    // it a programming request is the turn it answers: alone, the same words are not one, and the
    // earlier turns raise code well clear of that. Whether they raise it past small talk is the
    // model's call: the default before the registry stage routed it to code (0.66), the default
    // now to small talk (code 0.30 against 0.65; alone, 0.10).
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(Arc::new(engine().clone()))
        .max_messages(3)
        .build()
        .unwrap();
    let code = |messages: &[ChatMessage]| {
        let request = ChatRequest::from_messages(messages.to_vec()).unwrap();
        router
            .decide(&ChatModelRoutingRequest::new(&request, routes()))
            .unwrap()
            .probability("code")
            .unwrap()
    };
    let (with_turn, alone) = (
        code(&case.messages),
        code(&case.messages[case.messages.len() - 1..]),
    );
    assert!(alone < 0.55, "alone, code at {alone}");
    assert!(
        with_turn > alone + 0.1,
        "code at {with_turn} with the turn it answers, {alone} alone"
    );
}

#[test]
fn an_attached_image_alone_goes_to_the_image_route() {
    let case = cases().into_iter().find(|c| c.id == "r24").unwrap();
    assert_eq!(case.messages.len(), 1);
    assert_eq!(chosen(&router(), &case.messages), "images");
}

#[test]
fn a_routing_model_with_the_engine_calls_the_chosen_model() {
    let small = Arc::new(MockChatModel::answering("small"));
    let coder = Arc::new(MockChatModel::answering("coder"));
    let vision = Arc::new(MockChatModel::answering("vision"));
    let [simple, code, images]: [ChatModelRoute; 3] = routes().try_into().unwrap();
    let model = RoutingChatModel::builder()
        .add_route(simple, small.clone())
        .add_route(code, coder.clone())
        .add_route(images, vision.clone())
        .router(Arc::new(router()))
        .default_route(DEFAULT_ROUTE)
        .build()
        .unwrap();
    let response = model
        .chat(&ChatRequest::user(
            "Write a Python function that checks whether a string is a palindrome.",
        ))
        .unwrap();
    assert_eq!(response.message.text.as_deref(), Some("coder"));
    assert_eq!(response.attribute(ROUTE_ATTRIBUTE), Some(&"code".into()));
    assert_eq!(
        (small.call_count(), coder.call_count(), vision.call_count()),
        (0, 1, 0)
    );
}

#[tokio::test]
async fn chat_async_routes_with_the_engine() {
    let small = Arc::new(MockChatModel::answering("small"));
    let coder = Arc::new(MockChatModel::answering("coder"));
    let [simple, code, _]: [ChatModelRoute; 3] = routes().try_into().unwrap();
    let model = RoutingChatModel::builder()
        .add_route(simple, small.clone())
        .add_route(code, coder.clone())
        .router(Arc::new(router()))
        .default_route(DEFAULT_ROUTE)
        .build()
        .unwrap();
    let response = model
        .chat_async(ChatRequest::user("Good morning, how are you today?"))
        .await
        .unwrap();
    assert_eq!(response.attribute(ROUTE_ATTRIBUTE), Some(&"simple".into()));
    assert_eq!((small.call_count(), coder.call_count()), (1, 0));
}
