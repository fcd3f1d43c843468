//! The server over the real default model (decide-tools-minilm, built by `models/fetch`),
//! loaded once for this test binary: answers equal the embedded engine's, malformed bodies
//! get a 400 naming the field, the limits answer as documented, and concurrent requests are
//! batched with unchanged answers.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use decide_contract::{
    ChoiceQuestion, DecisionInput, DecisionModel, DecisionRequest, DecisionResponse, ScaleQuestion,
    YesNoQuestion,
};
use decide_engine::Engine;
use decide_server::{router, AppState, ServerConfig};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().build().expect("run models/fetch first"))
}

fn app_with(config: ServerConfig) -> (Router, AppState) {
    let state = AppState::new(engine().clone(), config).unwrap();
    (router(state.clone()), state)
}

fn app() -> Router {
    app_with(ServerConfig::default()).0
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<String>,
    key: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = req
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, bytes)
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, _, bytes) = call(app, "POST", path, Some(body.to_string()), None).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// Batched and one-by-one forward passes pad differently; f32 sums then differ in the last bits.
const TOL: f64 = 1e-6;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL
}

const TICKET: &str = "My flight to Lisbon was cancelled and I want my money back";

fn openai_body() -> Value {
    json!({
        "model": "gpt-6-luna",
        "input": TICKET,
        "questions": [
            {"type": "predicate", "name": "refund", "instructions": "Does the user ask for a refund?"},
            {"type": "choice", "name": "team", "instructions": "Which team should handle this?",
             "choices": [{"value": "payments", "description": "Refunds and payments"},
                         {"value": "bookings", "description": "New bookings and seat changes"},
                         {"value": "lost-luggage"}]},
            {"type": "score", "name": "urgency", "instructions": "How urgent is it?",
             "levels": [{"label": "low", "description": "can wait a week"},
                        {"label": "medium"},
                        {"label": "high", "description": "needs help today"}]}
        ]
    })
}

/// The request the server builds from `openai_body()`.
fn openai_equivalent() -> DecisionRequest {
    DecisionRequest::builder()
        .input(TICKET)
        .question(
            "refund",
            YesNoQuestion::new("Does the user ask for a refund?").unwrap(),
        )
        .question(
            "team",
            ChoiceQuestion::builder("Which team should handle this?")
                .option_with_description("payments", "Refunds and payments")
                .option_with_description("bookings", "New bookings and seat changes")
                .option("lost-luggage")
                .build()
                .unwrap(),
        )
        .question(
            "urgency",
            ScaleQuestion::builder("How urgent is it?")
                .level_with_description("low", "can wait a week")
                .level("medium")
                .level_with_description("high", "needs help today")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_decisions_match_the_embedded_engine() {
    let expected = engine().decide(&openai_equivalent()).unwrap();
    let (status, body) = post(&app(), "/v1/decisions", openai_body()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], engine().info().name.as_str());
    let answers = body["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0]["type"], "predicate");
    assert_eq!(answers[0]["name"], "refund");
    let p = answers[0]["probability"].as_f64().unwrap();
    assert!(
        close(p, expected.yes_no("refund").unwrap().probability()),
        "{p}"
    );

    let team = expected.choice("team").unwrap();
    assert_eq!(answers[1]["type"], "choice");
    assert_eq!(answers[1]["choice"], team.value());
    let probs = answers[1]["probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 3);
    for entry in probs {
        let value = entry["value"].as_str().unwrap();
        let p = entry["probability"].as_f64().unwrap();
        assert!(
            close(p, team.probability_of(value).unwrap()),
            "{value}: {p}"
        );
    }
    assert!(close(
        answers[1]["confidence"].as_f64().unwrap(),
        team.confidence().unwrap()
    ));

    let urgency = expected.scale("urgency").unwrap();
    assert_eq!(answers[2]["type"], "score");
    assert!(close(answers[2]["score"].as_f64().unwrap(), urgency.mean()));
    let levels = answers[2]["probabilities"].as_array().unwrap();
    for (i, entry) in levels.iter().enumerate() {
        assert_eq!(entry["value"], i);
        assert!(close(
            entry["probability"].as_f64().unwrap(),
            urgency.probabilities()[i]
        ));
    }
    assert_eq!(levels[2]["label"], "high");

    let usage = &body["usage"];
    let tokens = expected.token_usage().unwrap().input_tokens;
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert!(
        usage["input_tokens"].as_u64().unwrap() <= tokens,
        "cached candidates cost nothing"
    );
    assert_eq!(usage["output_tokens"], 0);
    assert_eq!(usage["total_tokens"], usage["input_tokens"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_messages_become_a_conversation_and_images_alone_are_refused() {
    let messages = json!([
        {"type": "message", "role": "system", "content": "You are a travel agent."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find me a hotel in Porto"}]},
        {"type": "message", "role": "assistant", "content": "Which dates?"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Next weekend, and here is my passport"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}
    ]);
    let question = json!([{"type": "predicate", "name": "hotel", "instructions": "Does the user want a hotel?"}]);
    let (status, body) = post(
        &app(),
        "/v1/decisions",
        json!({"model": "m", "input": messages, "questions": question}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let input: DecisionInput = serde_json::from_value(json!({"messages": [
        {"role": "user", "text": "Find me a hotel in Porto"},
        {"role": "assistant", "text": "Which dates?"},
        {"role": "user", "text": "Next weekend, and here is my passport\n[attached image]"}
    ]}))
    .unwrap();
    let expected = engine()
        .decide(
            &DecisionRequest::builder()
                .input(input)
                .question(
                    "hotel",
                    YesNoQuestion::new("Does the user want a hotel?").unwrap(),
                )
                .build()
                .unwrap(),
        )
        .unwrap();
    let p = body["answers"][0]["probability"].as_f64().unwrap();
    assert!(close(p, expected.yes_no("hotel").unwrap().probability()));

    let only_image = json!([{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]);
    let (status, body) = post(
        &app(),
        "/v1/decisions",
        json!({"model": "m", "input": only_image, "questions": question}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answers"][0]["type"], "refusal");
    assert_eq!(body["answers"][0]["name"], "hotel");
    assert_eq!(body["usage"]["input_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_one_matches_the_embedded_engine() {
    let body = json!({
        "model": "jev-latest",
        "state": {"ticket": TICKET, "customer": "gold"},
        "questions": {
            "refund": {"type": "noul", "instructions": "Refund?",
                       "criteria": {"true": "the user asks for their money back", "false": "the user asks for something else"}},
            "rebook": {"type": "noul", "instructions": "Does the user want a new flight?"},
            "team": {"type": "choice", "instructions": "Which team?",
                     "criteria": {"payments": "Refunds and payments", "bookings": null}},
            "urgency": {"type": "score", "instructions": "How urgent?",
                        "criteria": ["low", {"label": "high", "description": "needs help today"}]}
        }
    });
    let (status, got) = post(&app(), "/v1/systemone", body).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let mut fields = serde_json::Map::new();
    fields.insert("ticket".into(), json!(TICKET));
    fields.insert("customer".into(), json!("gold"));
    let request = DecisionRequest::builder()
        .input(fields)
        .question(
            "refund",
            YesNoQuestion::builder("Refund?")
                .yes_when("the user asks for their money back")
                .no_when("the user asks for something else")
                .build()
                .unwrap(),
        )
        .question(
            "rebook",
            YesNoQuestion::new("Does the user want a new flight?").unwrap(),
        )
        .question(
            "team",
            ChoiceQuestion::builder("Which team?")
                .option_with_description("payments", "Refunds and payments")
                .option("bookings")
                .build()
                .unwrap(),
        )
        .question(
            "urgency",
            ScaleQuestion::builder("How urgent?")
                .level("low")
                .level_with_description("high", "needs help today")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let expected: DecisionResponse = engine().decide(&request).unwrap();
    let a = &got["answers"];
    assert_eq!(a["refund"]["type"], "noul");
    assert!(close(
        a["refund"]["noul"].as_f64().unwrap(),
        expected.yes_no("refund").unwrap().probability()
    ));
    assert!(close(
        a["rebook"]["noul"].as_f64().unwrap(),
        expected.yes_no("rebook").unwrap().probability()
    ));
    let team = expected.choice("team").unwrap();
    assert_eq!(a["team"]["choice"], team.value());
    for option in ["payments", "bookings"] {
        assert!(close(
            a["team"]["probabilities"][option].as_f64().unwrap(),
            team.probability_of(option).unwrap()
        ));
    }
    let urgency = expected.scale("urgency").unwrap();
    assert!(close(
        a["urgency"]["score"].as_f64().unwrap(),
        urgency.mean()
    ));
    assert_eq!(a["urgency"]["legend"]["1"], "high");
    assert!(close(
        a["urgency"]["probabilities"]["1"].as_f64().unwrap(),
        urgency.probabilities()[1]
    ));
    assert!(got["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(got["usage"]["output_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_a_400_naming_the_field() {
    let app = app();
    let q = json!([{"type": "predicate", "name": "a", "instructions": "A?"}]);
    let openai_cases = [
        (json!({"questions": q}), "input", "missing"),
        (json!({"input": "", "questions": q}), "input", "blank"),
        (json!({"input": 3, "questions": q}), "input", "a number"),
        (json!({"input": "hi"}), "questions", "missing"),
        (
            json!({"input": "hi", "questions": []}),
            "questions",
            "at least one",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "predicate", "name": "a"}]}),
            "questions[0].instructions",
            "missing",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "vote", "name": "a", "instructions": "x"}]}),
            "questions[0].type",
            "vote",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "choice", "name": "a", "instructions": "x", "choices": [{"value": "only"}]}]}),
            "questions[0].choices",
            "at least 2",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "choice", "name": "a", "instructions": "x", "choices": [{"value": "x"}, {"value": 7}]}]}),
            "questions[0].choices[1].value",
            "a number",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "choice", "name": "a", "instructions": "x", "choices": [{"value": "x"}, {"value": "x"}]}]}),
            "questions[0].choices",
            "already defined",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "score", "name": "a", "instructions": "x", "levels": [{"label": "lo"}]}]}),
            "questions[0].levels",
            "2 to 10",
        ),
        (
            json!({"input": "hi", "questions": [{"type": "predicate", "name": "a", "instructions": "x"}, {"type": "predicate", "name": "a", "instructions": "y"}]}),
            "questions[1].name",
            "duplicate",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}], "questions": q}),
            "input[0].role",
            "robot",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_audio"}]}], "questions": q}),
            "input[0].content[0].type",
            "input_audio",
        ),
    ];
    for (body, field, words) in openai_cases {
        let (status, got) = post(&app, "/v1/decisions", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {got}");
        assert_eq!(got["error"]["type"], "invalid_request_error");
        assert_eq!(got["error"]["param"], field, "{body} -> {got}");
        let message = got["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(field) && message.contains(words),
            "{message}"
        );
    }
    let (status, _, bytes) = call(
        &app,
        "POST",
        "/v1/decisions",
        Some("{\"input\": ".into()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid JSON at line 1"),
        "{got}"
    );

    let system_one_cases = [
        (
            json!({"questions": {"a": {"type": "noul", "instructions": "A?"}}}),
            "state",
            "missing",
        ),
        (
            json!({"state": true, "questions": {"a": {"type": "noul", "instructions": "A?"}}}),
            "state",
            "a boolean",
        ),
        (
            json!({"state": "s", "questions": []}),
            "questions",
            "an array",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "choice", "instructions": "A?"}}}),
            "questions.a.criteria",
            "missing",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "choice", "instructions": "A?", "criteria": {"x": null}}}}),
            "questions.a.criteria",
            "at least 2",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "noul", "instructions": "A?", "criteria": {"maybe": "x"}}}}),
            "questions.a.criteria.maybe",
            "unknown",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "score", "instructions": "A?", "criteria": "high"}}}),
            "questions.a.criteria",
            "list of levels",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "rank", "instructions": "A?"}}}),
            "questions.a.type",
            "rank",
        ),
        (
            json!({"state": "s", "questions": {"a": {"type": "noul"}}}),
            "questions.a.instructions",
            "missing",
        ),
    ];
    for (body, field, words) in system_one_cases {
        let (status, got) = post(&app, "/v1/systemone", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {got}");
        assert_eq!(got["error"]["field"], field, "{body} -> {got}");
        let message = got["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_questions_and_options() {
    let config = ServerConfig {
        limits: decide_http::Limits {
            max_questions: 2,
            max_options: 3,
            max_levels: 10,
        },
        ..ServerConfig::default()
    };
    let (app, _) = app_with(config);
    let q = |n: &str| json!({"type": "predicate", "name": n, "instructions": "x"});
    let (status, got) = post(
        &app,
        "/v1/decisions",
        json!({"input": "hi", "questions": [q("a"), q("b"), q("c")]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "questions");
    assert!(got["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 2"));
    let criteria = json!({"a": null, "b": null, "c": null, "d": null});
    let (status, got) = post(&app, "/v1/systemone", json!({"state": "hi", "questions": {"q": {"type": "choice", "instructions": "x", "criteria": criteria}}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4 options, at most 3"),
        "{got}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let (app, _) = app_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    });
    let body = openai_body().to_string();
    let (status, _, bytes) = call(&app, "POST", "/v1/decisions", Some(body.clone()), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(got["error"]["type"], "authentication_error");
    let (status, _, _) = call(
        &app,
        "POST",
        "/v1/decisions",
        Some(body.clone()),
        Some("s3cre"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(
        &app,
        "POST",
        "/v1/decisions",
        Some(body.clone()),
        Some("s3cret!"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, bytes) = call(
        &app,
        "POST",
        "/v1/systemone",
        Some("{}".into()),
        Some("nope"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        got["error"]["field"].is_null() && got["error"]["message"].is_string(),
        "System One shape: {got}"
    );
    let (status, _, _) = call(&app, "GET", "/v1/models", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(&app, "GET", "/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "health stays open");
    let (status, _, _) = call(&app, "POST", "/v1/decisions", Some(body), Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_get_413() {
    let (app, _) = app_with(ServerConfig {
        max_body_bytes: 1024,
        ..ServerConfig::default()
    });
    let big = json!({"input": "x".repeat(2000), "questions": [{"type": "predicate", "name": "a", "instructions": "A?"}]});
    let (status, got) = post(&app, "/v1/decisions", big.clone()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes"),
        "{got}"
    );
    let big = json!({"state": "x".repeat(2000), "questions": {}});
    let (status, got) = post(&app, "/v1/systemone", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(got["error"]["field"].is_null(), "System One shape: {got}");
    let (status, _) = post(&app, "/v1/decisions", openai_body()).await;
    assert_eq!(status, StatusCode::OK, "a body under the limit passes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_concurrency_limit_only_503_with_retry_after() {
    let (app, state) = app_with(ServerConfig {
        max_concurrent_requests: 1,
        retry_after_secs: 2,
        ..ServerConfig::default()
    });
    let mut calls = Vec::new();
    for i in 0..16 {
        let app = app.clone();
        let body = json!({"input": format!("request number {i}: book a table for {i} people"),
                          "questions": [{"type": "predicate", "name": "book", "instructions": "Booking?"}]});
        calls.push(tokio::spawn(async move {
            call(&app, "POST", "/v1/decisions", Some(body.to_string()), None).await
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for c in calls {
        let (status, headers, _) = c.await.unwrap();
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                busy += 1;
                assert_eq!(headers[header::RETRY_AFTER], "2");
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(ok >= 1 && busy >= 1, "ok {ok}, busy {busy}");
    let text = state.metrics().render();
    assert!(
        text.contains(&format!("decide_rejected_total {busy}\n")),
        "{text}"
    );
    // The server recovers: the next request goes through.
    let (status, _) = post(&app, "/v1/decisions", openai_body()).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_gets_504() {
    let (app, _) = app_with(ServerConfig {
        request_timeout: Duration::from_nanos(1),
        ..ServerConfig::default()
    });
    let (status, got) = post(&app, "/v1/decisions", openai_body()).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{got}");
    assert_eq!(got["error"]["type"], "timeout_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_are_batched_with_unchanged_answers() {
    let (app, state) = app_with(ServerConfig::default());
    let inputs: Vec<String> = (0..24)
        .map(|i| {
            format!(
                "Customer {i} writes: my order #{} arrived broken, I want a replacement",
                1000 + i * 7
            )
        })
        .collect();
    let mut calls = Vec::new();
    for text in inputs.clone() {
        let app = app.clone();
        calls.push(tokio::spawn(async move {
            post(&app, "/v1/systemone", json!({"state": text, "questions": {
                "replace": {"type": "noul", "instructions": "Does the customer want a replacement?"},
                "dept": {"type": "choice", "instructions": "Which department?", "criteria": {"returns": "Returns and replacements", "sales": "New orders", "it": "Website problems"}}
            }})).await
        }));
    }
    for (text, c) in inputs.iter().zip(calls) {
        let (status, got) = c.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{got}");
        let single = engine()
            .decide(
                &DecisionRequest::builder()
                    .input(text.as_str())
                    .question(
                        "replace",
                        YesNoQuestion::new("Does the customer want a replacement?").unwrap(),
                    )
                    .question(
                        "dept",
                        ChoiceQuestion::builder("Which department?")
                            .option_with_description("returns", "Returns and replacements")
                            .option_with_description("sales", "New orders")
                            .option_with_description("it", "Website problems")
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            )
            .unwrap();
        let p = got["answers"]["replace"]["noul"].as_f64().unwrap();
        assert!(
            close(p, single.yes_no("replace").unwrap().probability()),
            "{p}"
        );
        for option in ["returns", "sales", "it"] {
            let p = got["answers"]["dept"]["probabilities"][option]
                .as_f64()
                .unwrap();
            assert!(close(
                p,
                single
                    .choice("dept")
                    .unwrap()
                    .probability_of(option)
                    .unwrap()
            ));
        }
    }
    let metrics = state.metrics();
    assert!(
        metrics.max_batch_requests() > 1,
        "24 concurrent requests never shared a forward pass"
    );
    assert!(metrics.batches() < 24, "{} batches", metrics.batches());
    let (status, _, bytes) = call(&app, "GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        text.contains("decide_requests_total{endpoint=\"/v1/systemone\",status=\"200\"} 24\n"),
        "{text}"
    );
    assert!(text.contains("decide_request_duration_seconds_count{endpoint=\"/v1/systemone\"} 24\n"));
    assert!(text.contains("# TYPE decide_batch_requests histogram"));
    assert!(text.contains("decide_queue_depth 0\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_off_runs_one_request_per_forward_pass() {
    let (app, state) = app_with(ServerConfig {
        max_batch_requests: 1,
        ..ServerConfig::default()
    });
    let mut calls = Vec::new();
    for i in 0..8 {
        let app = app.clone();
        calls.push(tokio::spawn(async move {
            post(&app, "/v1/systemone", json!({"state": format!("message {i}"), "questions": {"q": {"type": "noul", "instructions": "Is it a greeting?"}}})).await
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap().0, StatusCode::OK);
    }
    assert_eq!(state.metrics().max_batch_requests(), 1);
    assert_eq!(state.metrics().batches(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_health() {
    let app = app();
    let (status, _, bytes) = call(&app, "GET", "/v1/models", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(got["object"], "list");
    assert_eq!(got["data"][0]["id"], engine().info().name.as_str());
    let (status, _, bytes) = call(&app, "GET", "/health", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(got["status"], "ok");
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather and forecast for a city", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "send_email", "description": "Send an email to a contact", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "create_invoice", "description": "Create an invoice for a customer", "parameters": {"type": "object"}}}
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_answers_like_the_filter_over_the_engine() {
    use std::sync::Arc;

    let app = app();
    let text = "Will it rain in Oslo tomorrow?";
    let (status, got) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "max_results": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let filter = decide_filter::FilteringToolProvider::builder()
        .tool_provider(Arc::new(
            decide_chat::StaticToolProvider::from_specifications(
                decide_chat::parse_tools(&tools()).unwrap(),
            ),
        ))
        .decision_model(Arc::new(engine().clone()))
        .max_results(1)
        // The default model has a needs-tool head, so the endpoint's gate is on.
        .needs_tool_gate(engine().needs_tool().unwrap().companion_min_probability)
        .build()
        .unwrap();
    let user = decide_chat::ChatMessage::user(text);
    let decide_chat::ChatMessage::User(u) = user.clone() else {
        unreachable!()
    };
    let expected = filter
        .select(
            &decide_chat::ToolProviderRequest::builder(u)
                .messages(vec![user])
                .build(),
        )
        .unwrap();
    let scores = got["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 3);
    for (s, d) in scores.iter().zip(&expected.decisions) {
        assert_eq!(s["name"], d.name.as_str());
        match d.probability {
            Some(p) => assert!(close(s["probability"].as_f64().unwrap(), p)),
            None => assert!(s["probability"].is_null()),
        }
    }
    let selected: Vec<&str> = got["selected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(selected, expected.names());
    let best = scores
        .iter()
        .max_by(|a, b| {
            a["probability"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["probability"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(best["name"], "get_weather");
    let gate = expected.gate.unwrap();
    assert_eq!(got["needs_tool"]["open"], gate.open, "{got}");
    assert!(close(
        got["needs_tool"]["answer"].as_f64().unwrap(),
        gate.answer.unwrap()
    ));
    let (status, off) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "needs_tool_gate": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{off}");
    assert!(off.get("needs_tool").is_none(), "{off}");
    let (status, both) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "needs_tool_gate": true, "target_recall": 0.9}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{both}");
    assert_eq!(both["error"]["param"], "needs_tool_gate", "{both}");

    let (status, got) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "max_results": -1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "max_results", "{got}");
    let (status, got) = post(&app, "/v1/select", json!({"text": text, "tool": tools()})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "tool", "{got}");
    let (status, got) = post(&app, "/v1/select", json!({"messages": [{"role": "user", "content": text}], "tools": tools(), "min_probability": 2})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "min_probability", "{got}");
    // As `decide select` refuses it: a blank last user message leaves nothing to decide on.
    let blank = json!({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"},
                                    {"role": "user", "content": "  "}], "tools": tools()});
    let (status, got) = post(&app, "/v1/select", blank).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert_eq!(got["error"]["param"], "messages", "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the last user message is blank"),
        "{got}"
    );
}

/// The base model, which has no conformal table.
fn base_engine() -> Engine {
    Engine::builder()
        .model(decide_engine::BASE_MODEL)
        .build()
        .expect("run models/fetch first")
}

/// The base model with a conformal table in its manifest: the files linked from the real folder
/// into a scratch one, the manifest copied with `[conformal]` added. n = 4, so R = 0.6 gives
/// k = ⌊0.4 · 5⌋ = 2 and the threshold 0.4.
fn engine_with_conformal() -> Engine {
    let src = base_engine().info().dir.clone();
    let dir = std::env::temp_dir().join(format!("decide-server-conformal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "manifest.toml" {
            std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    let manifest = std::fs::read_to_string(src.join("manifest.toml")).unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!("{manifest}\n[conformal]\nneeded_probabilities = [0.2, 0.4, 0.6, 0.8]\ncases = 4\nsource = \"test\"\n"),
    )
    .unwrap();
    let engine = Engine::builder()
        .model(dir.to_str().unwrap())
        .build()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_takes_a_target_recall_from_the_conformal_table() {
    let text = "Will it rain in Oslo tomorrow?";
    // A model without a table: 400 naming the field.
    let (status, got) = post(
        &router(AppState::new(base_engine(), ServerConfig::default()).unwrap()),
        "/v1/select",
        json!({"text": text, "tools": tools(), "target_recall": 0.9}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert_eq!(got["error"]["param"], "target_recall", "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no conformal calibration"),
        "{got}"
    );

    let engine = engine_with_conformal();
    assert_eq!(engine.conformal().unwrap().threshold(0.6), Ok(0.4));
    let app = router(AppState::new(engine, ServerConfig::default()).unwrap());
    let (status, at_recall) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "target_recall": 0.6}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{at_recall}");
    let (status, at_threshold) = post(
        &app,
        "/v1/select",
        json!({"text": text, "tools": tools(), "min_probability": 0.4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{at_threshold}");
    assert_eq!(at_recall, at_threshold);
    for body in [
        json!({"text": text, "tools": tools(), "target_recall": 1.5}),
        json!({"text": text, "tools": tools(), "target_recall": "high"}),
        json!({"text": text, "tools": tools(), "target_recall": 0.9, "min_probability": 0.5}),
    ] {
        let (status, got) = post(&app, "/v1/select", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
        assert_eq!(got["error"]["param"], "target_recall", "{got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_answers_like_the_router_over_the_engine() {
    use std::sync::Arc;

    let app = app();
    let routes = json!([
        {"name": "code", "description": "Programming, debugging and software questions"},
        {"name": "chat", "descriptions": ["Small talk", "General questions"]}
    ]);
    let text = "Why does my Rust borrow checker complain about this loop?";
    let (status, got) = post(
        &app,
        "/v1/route",
        json!({"text": text, "routes": routes, "default": "chat"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let router = decide_router::DecisionModelChatModelRouter::builder()
        .decision_model(Arc::new(engine().clone()))
        .build()
        .unwrap();
    let chat = decide_chat::ChatRequest::user(text);
    let expected = router
        .decide(&decide_router::ChatModelRoutingRequest::new(
            &chat,
            vec![
                decide_router::ChatModelRoute::new(
                    "code",
                    "Programming, debugging and software questions",
                ),
                decide_router::ChatModelRoute::with_descriptions(
                    "chat",
                    ["Small talk", "General questions"],
                ),
            ],
        ))
        .unwrap();
    assert_eq!(got["route"], expected.result.route_name().unwrap());
    assert_eq!(got["route"], "code");
    for (name, p) in &expected.probabilities {
        assert!(
            close(got["probabilities"][name].as_f64().unwrap(), *p),
            "{name}"
        );
    }

    let (status, got) = post(
        &app,
        "/v1/route",
        json!({"text": text, "routes": routes, "default": "math"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "default", "{got}");
    let (status, got) = post(
        &app,
        "/v1/route",
        json!({"text": text, "routes": [{"description": "x"}], "default": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(got["error"]["param"], "routes[0].name", "{got}");
}

/// A misspelt key of a route would leave the route described by its name alone: refused, over
/// real HTTP, with its path named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_refuses_a_misspelt_route_key_over_http() {
    let state = AppState::new(engine().clone(), ServerConfig::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(decide_server::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let body = json!({
        "text": "Why does my borrow checker complain?",
        "routes": [{"name": "code", "descriptons": ["Programming"]}, {"name": "chat"}],
        "default": "chat"
    });
    let (status, got) = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        write!(
            stream,
            "POST /v1/route HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let (head, json) = answer.split_once("\r\n\r\n").unwrap();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, serde_json::from_str::<Value>(json).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(status, 400, "{got}");
    assert_eq!(got["error"]["type"], "invalid_request_error", "{got}");
    assert_eq!(got["error"]["param"], "routes[0].descriptons", "{got}");
    let message = got["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "routes[0].descriptons: unknown field (expected name, description, descriptions)"
        ),
        "{message}"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn the_queue_keeps_batches_under_its_token_budget() {
    use decide_server::{BatchConfig, BatchedEngine, Batcher, Metrics};
    use std::sync::Arc;

    let metrics = Arc::new(Metrics::new());
    // Once the question's document is cached, each request below is one row (its input); a
    // budget of 40 padded tokens holds at most 40 / (shortest row) of them.
    let batcher = Batcher::start(
        engine().clone(),
        BatchConfig {
            max_batch_tokens: 40,
            max_batch_requests: 64,
            queue_capacity: 64,
            bulk_pass_tokens: 40,
            max_bulk_tokens: usize::MAX,
        },
        metrics.clone(),
    )
    .unwrap();
    let model = BatchedEngine::new(engine().clone(), Arc::new(batcher));
    let request = |i: usize| {
        DecisionRequest::builder()
            .input(format!("Order {i}: please send me a replacement"))
            .question(
                "replace",
                YesNoQuestion::new("Does the customer want a replacement?").unwrap(),
            )
            .build()
            .unwrap()
    };
    model.decide(&request(0)).unwrap();
    let shortest = (1..=16)
        .map(|i| {
            let rows = engine().stage_decision(&request(i)).unwrap();
            assert_eq!(rows.rows().len(), 1, "the document is cached");
            rows.rows()[0].len()
        })
        .min()
        .unwrap();
    let most = 40 / shortest;
    assert!(most < 16, "the budget must bind: rows of {shortest} tokens");
    let threads: Vec<_> = (1..=16)
        .map(|i| {
            let model = model.clone();
            std::thread::spawn(move || (i, model.decide(&request(i)).unwrap()))
        })
        .collect();
    for t in threads {
        let (i, got) = t.join().unwrap();
        let single = engine().decide(&request(i)).unwrap();
        let (a, b) = (
            got.yes_no("replace").unwrap().probability(),
            single.yes_no("replace").unwrap().probability(),
        );
        assert!(close(a, b), "{i}: {a} vs {b}");
    }
    assert!(
        metrics.max_batch_requests() <= most,
        "{} > {most}",
        metrics.max_batch_requests()
    );
    assert!(
        metrics.batches() > (16 / most) as u64,
        "17 requests, at most {most} a batch: {}",
        metrics.batches()
    );
}

/// Decisions go first: behind four large embedding jobs, a decision's rows run in the next
/// forward call, not after the bulk rows queued before them; bulk rows run in passes of their
/// own small budget, and the bulk tokens queued at once stay within the queue's limit (one job
/// alone is always admitted).
#[test]
fn decisions_pass_bulk_work_and_bulk_work_is_admitted_within_its_budget() {
    use decide_server::{BatchConfig, BatchedEngine, Batcher, Lane, Metrics};
    use std::sync::Arc;

    let texts: Vec<String> = (0..200)
        .map(|i| format!("bulk text number {i} about shipping a replacement order"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let rows: Vec<_> = engine()
        .stage_embeddings(&refs)
        .unwrap()
        .into_iter()
        .map(|e| e.row)
        .collect();
    let tokens: usize = rows.iter().map(|r| r.len()).sum();
    let longest = rows.iter().map(|r| r.len()).max().unwrap();
    let metrics = Arc::new(Metrics::new());
    let batcher = Arc::new(
        Batcher::start(
            engine().clone(),
            BatchConfig {
                max_batch_tokens: 16_384,
                max_batch_requests: 64,
                queue_capacity: 64,
                bulk_pass_tokens: 2 * longest,
                max_bulk_tokens: 4 * tokens,
            },
            metrics.clone(),
        )
        .unwrap(),
    );
    let bulk: Vec<_> = (0..4)
        .map(|_| batcher.submit(rows.clone(), Lane::Bulk).unwrap())
        .collect();
    // A fifth would go past the budget.
    assert!(batcher.submit(rows.clone(), Lane::Bulk).is_err());
    let model = BatchedEngine::new(engine().clone(), batcher.clone());
    let request = DecisionRequest::builder()
        .input("Please send me a replacement")
        .question(
            "replace",
            YesNoQuestion::new("Does the customer want a replacement?").unwrap(),
        )
        .build()
        .unwrap();
    let answer = model.decide(&request).unwrap();
    let single = engine().decide(&request).unwrap();
    assert!(close(
        answer.yes_no("replace").unwrap().probability(),
        single.yes_no("replace").unwrap().probability()
    ));
    // 800 bulk rows at 2 a pass, taken in turns: the decision ran long before the last job
    // finished (in one first-come line, after all four).
    let mut bulk = bulk;
    assert!(
        matches!(
            bulk[3].try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ),
        "the decision waited for the bulk rows queued before it ({} passes)",
        metrics.batches()
    );
    for pending in bulk {
        let vectors = pending.blocking_recv().unwrap().unwrap();
        assert_eq!(vectors.len(), rows.len());
    }
    assert!(metrics.batches() >= 400, "bulk rows ran in small passes");
    // Once the queue has run them, their budget is free again.
    let again = batcher.submit(rows.clone(), Lane::Bulk).unwrap();
    assert_eq!(again.blocking_recv().unwrap().unwrap().len(), rows.len());
    // A decision that needs more than one whole forward call waits with the bulk work.
    assert_eq!(batcher.decision_lane(&rows), Lane::Decision);
    let large: Vec<_> = rows
        .iter()
        .cycle()
        .take(16_384 / longest + 1)
        .cloned()
        .collect();
    assert_eq!(batcher.decision_lane(&large), Lane::Bulk);
}

/// The largest difference between a vector of the answer and one of the engine.
fn max_diff(got: &Value, expected: &[f32]) -> f64 {
    let got = got.as_array().unwrap();
    assert_eq!(got.len(), expected.len());
    got.iter()
        .zip(expected)
        .map(|(g, e)| (g.as_f64().unwrap() - *e as f64).abs())
        .fold(0.0, f64::max)
}

const DOCS: [&str; 3] = [
    "Current weather and forecast for a city",
    "Send an email to a contact",
    "Create an invoice for a customer",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_embed_and_rerank_answer_like_the_engine() {
    let app = app();
    let expected = engine().embed(&DOCS).unwrap();
    let (status, got) = post(&app, "/embed", json!({"inputs": DOCS})).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    for (i, e) in expected.iter().enumerate() {
        let d = max_diff(&got[i], e);
        assert!(d <= 1e-5, "/embed {i}: {d}");
    }
    // One string is one embedding in a list, as text-embeddings-inference answers.
    let (status, got) = post(
        &app,
        "/embed",
        json!({"inputs": DOCS[1], "normalize": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got.as_array().unwrap().len(), 1);
    assert!(max_diff(&got[0], &expected[1]) <= 1e-5);

    // Without a cross-encoder, the model's cosines, and their calibrated probabilities.
    let query = "Will it rain in Oslo tomorrow?";
    let raw = engine().score(query, &DOCS).unwrap().raw;
    let calibration = engine().calibration().unwrap();
    let mut order: Vec<usize> = (0..DOCS.len()).collect();
    order.sort_by(|a, b| raw[*b].total_cmp(&raw[*a]));
    let (status, got) = post(
        &app,
        "/rerank",
        json!({"query": query, "texts": DOCS, "raw_scores": true, "return_text": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    for (r, i) in got.as_array().unwrap().iter().zip(&order) {
        assert_eq!(r["index"], *i, "{got}");
        assert!(close(r["score"].as_f64().unwrap(), raw[*i]), "{got}");
        assert_eq!(r["text"], DOCS[*i]);
    }
    assert_eq!(order[0], 0, "the weather tool ranks first: {got}");
    let (status, got) = post(
        &app,
        "/v1/rerank",
        json!({"model": engine().info().name, "query": query, "documents": DOCS, "top_n": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["model"], engine().info().name.as_str());
    assert_eq!(got["scored_by"], "bi-encoder cosine");
    let results = got["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for (r, i) in results.iter().zip(&order) {
        assert_eq!(r["index"], *i);
        assert!(close(
            r["relevance_score"].as_f64().unwrap(),
            calibration.probability(raw[*i])
        ));
        assert!(r.get("document").is_none(), "return_documents is off");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_embeddings_share_the_queue_with_unchanged_vectors() {
    let (app, state) = app_with(ServerConfig::default());
    let expected = engine().embed(&DOCS).unwrap();
    let before = state.metrics().batches();
    let calls = (0..12).map(|i| {
        let app = app.clone();
        async move {
            let text = DOCS[i % DOCS.len()];
            let (status, got) = post(&app, "/v1/embeddings", json!({"input": text})).await;
            (i, status, got)
        }
    });
    for (i, status, got) in futures_join(calls).await {
        assert_eq!(status, StatusCode::OK, "{got}");
        let d = max_diff(&got["data"][0]["embedding"], &expected[i % DOCS.len()]);
        assert!(d <= 1e-5, "request {i}: {d}");
    }
    assert!(
        state.metrics().batches() > before,
        "the rows went through the queue"
    );
}

/// Runs the futures concurrently on the runtime and collects their outputs in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_and_rerank_refuse_bad_bodies_naming_the_field() {
    let app = app();
    let long = "lorem ipsum dolor ".repeat(400);
    // OpenAI's shape.
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [1, 2, 3]}), "input[0]"),
        (json!({"input": ["ok", ""]}), "input[1]"),
        (json!({"input": {"text": "x"}}), "input"),
        (json!({"input": long}), "input"),
        (
            json!({"input": "x", "model": "text-embedding-3-small"}),
            "model",
        ),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 8}), "dimensions"),
        (json!({"input": "x", "inputs": "y"}), "inputs"),
        (
            json!({"query": "q", "documents": ["a"], "max_tokens_per_doc": 10}),
            "max_tokens_per_doc",
        ),
        (
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            "top_n",
        ),
        (
            json!({"query": "q", "documents": [{"title": "a"}]}),
            "documents[0]",
        ),
        (json!({"query": "q", "documents": []}), "documents"),
    ] {
        let path = if body.get("query").is_some() {
            "/v1/rerank"
        } else {
            "/v1/embeddings"
        };
        let (status, got) = post(&app, path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {got}");
        assert_eq!(got["error"]["param"], param, "{body}: {got}");
        assert_eq!(got["error"]["type"], "invalid_request_error");
    }
    // text-embeddings-inference's shape: {"error", "error_type"}.
    for (path, body, start) in [
        ("/embed", json!({"inputs": long}), "inputs: longer than"),
        (
            "/embed",
            json!({"inputs": "x", "prompt_name": "query"}),
            "prompt_name:",
        ),
        (
            "/embed",
            json!({"inputs": "x", "truncation_direction": "Left"}),
            "truncation_direction:",
        ),
        (
            "/rerank",
            json!({"query": "", "texts": ["a"]}),
            "query: empty",
        ),
        (
            "/rerank",
            json!({"query": "q", "text": ["a"]}),
            "text: unknown field",
        ),
    ] {
        let (status, got) = post(&app, path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {got}");
        assert_eq!(got["error_type"], "Validation", "{got}");
        assert!(
            got["error"].as_str().unwrap().starts_with(start),
            "{body}: {got}"
        );
    }
    // `truncate` lets a long text lose its end, as the engine embeds it.
    let (status, got) = post(&app, "/embed", json!({"inputs": long, "truncate": true})).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let expected = engine().embed(&[long.as_str()]).unwrap();
    assert!(max_diff(&got[0], &expected[0]) <= 1e-5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_endpoints_need_the_key_but_the_playground_does_not_and_metrics_count_them() {
    let (app, state) = app_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    });
    let body = json!({"inputs": "hello"}).to_string();
    let (status, _, bytes) = call(&app, "POST", "/embed", Some(body.clone()), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(got["error_type"], "Unauthorized", "TEI shape: {got}");
    let (status, _, _) = call(&app, "POST", "/embed", Some(body), Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK);
    let rerank = json!({"query": "rain?", "documents": DOCS}).to_string();
    for path in ["/v1/rerank", "/v2/rerank"] {
        let (status, _, _) = call(&app, "POST", path, Some(rerank.clone()), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, _) = call(&app, "POST", path, Some(rerank.clone()), Some("s3cret")).await;
        assert_eq!(status, StatusCode::OK);
    }

    let (status, headers, bytes) = call(&app, "GET", "/", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = String::from_utf8(bytes).unwrap();
    assert!(
        page.contains("decide playground")
            && !page.contains("http://")
            && !page.contains("https://"),
        "one self-contained page"
    );
    let (status, _, bytes) =
        call(&app, "GET", "/playground/examples/routes.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        bytes,
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/routes.json"
        ))
        .unwrap()
    );
    let (status, _, bytes) =
        call(&app, "GET", "/playground/examples/secrets.json", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&bytes).contains("tools.json"));

    let text = state.metrics().render();
    for line in [
        "decide_requests_total{endpoint=\"/embed\",status=\"200\"} 1",
        "decide_requests_total{endpoint=\"/embed\",status=\"401\"} 1",
        "decide_requests_total{endpoint=\"/v1/rerank\",status=\"200\"} 1",
        "decide_requests_total{endpoint=\"/v2/rerank\",status=\"401\"} 1",
        "decide_requests_total{endpoint=\"/\",status=\"200\"} 1",
        "decide_requests_total{endpoint=\"/playground/examples\",status=\"200\"} 1",
        "decide_requests_total{endpoint=\"/playground/examples\",status=\"404\"} 1",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_encoder_model_reranks_and_refuses_embeddings() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../decide-engine/fixtures/tiny-bert-1"
    );
    let cross = Engine::builder().model(fixture).build().unwrap();
    let state = AppState::new(cross.clone(), ServerConfig::default()).unwrap();
    let app = router(state);
    let (status, got) = post(&app, "/v1/embeddings", json!({"input": "hello"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bi-encoder"),
        "{got}"
    );
    let (status, got) = post(&app, "/rerank", json!({"query": "rain?", "texts": DOCS})).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let pairs: Vec<(&str, &str)> = DOCS.iter().map(|d| ("rain?", *d)).collect();
    let logits = cross.classify_pairs(&pairs).unwrap();
    for r in got.as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        let p = decide_engine::sigmoid(logits[i][0] as f64);
        assert!((r["score"].as_f64().unwrap() - p).abs() <= 1e-5, "{got}");
    }
}

/// A POST with any headers; the body is JSON.
async fn post_with(app: &Router, path: &str, headers: &[(&str, &str)], body: &str) -> StatusCode {
    let mut req = Request::builder().method("POST").uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive_and_an_empty_key_is_refused() {
    let (app, _) = app_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    });
    let body = json!({"text": "hi", "routes": [{"name": "a", "description": "x"}], "default": "a"})
        .to_string();
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let status = post_with(
            &app,
            "/v1/route",
            &[("authorization", &format!("{scheme} s3cret"))],
            &body,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{scheme}");
    }
    let status = post_with(
        &app,
        "/v1/route",
        &[("authorization", "Basic s3cret")],
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let empty = AppState::new(
        engine().clone(),
        ServerConfig {
            api_key: Some(String::new()),
            ..ServerConfig::default()
        },
    );
    assert!(
        empty.is_err(),
        "an empty key must not mean no authentication"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_and_tool_limits_are_checked_before_the_entries_are() {
    // Too many entries, and a mistake in the second: the limit is what is reported, because it
    // is checked first (validating every entry of a huge list was the slow part).
    let mut routes: Vec<Value> = (0..300)
        .map(|i| json!({"name": format!("r{i}"), "description": "d"}))
        .collect();
    routes[1] = json!({"name": "r0", "description": "d"});
    let (status, body) = post(
        &app(),
        "/v1/route",
        json!({"text": "hi", "routes": routes, "default": "r0"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "routes", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 routes, at most 255"),
        "{body}"
    );
    let tools: Vec<Value> = (0..300).map(|_| json!({"name": "same"})).collect();
    let (status, body) = post(&app(), "/v1/select", json!({"text": "hi", "tools": tools})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 tools, at most 255"),
        "{body}"
    );
}

/// A body posted as written: a `Value` cannot hold a key twice.
async fn post_text(app: &Router, path: &str, body: &str) -> (StatusCode, Value) {
    let (status, _, bytes) = call(app, "POST", path, Some(body.to_string()), None).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_named_twice_is_refused_by_every_endpoint_in_its_own_shape() {
    let app = app();
    let predicate = r#"[{"type": "predicate", "name": "a", "instructions": "A?"}]"#;
    // OpenAI's shape, which our own endpoints share.
    for (path, body, param) in [
        (
            "/v1/decisions",
            format!(r#"{{"input": "hi", "questions": {predicate}, "input": "there"}}"#),
            "input",
        ),
        (
            "/v1/select",
            r#"{"text": "hi", "tools": [{"name": "a"}, {"name": "b", "name": "c"}]}"#.into(),
            "tools[1].name",
        ),
        (
            "/v1/route",
            r#"{"text": "hi", "routes": [{"name": "a", "description": "x", "description": "y"}, {"name": "b"}]}"#.into(),
            "routes[0].description",
        ),
        (
            "/v1/tool_search",
            r#"{"provider": "openai", "query": "x", "tools": [{"name": "a"}], "query": "y"}"#.into(),
            "query",
        ),
        (
            "/v1/embeddings",
            r#"{"input": "a", "input": "b"}"#.into(),
            "input",
        ),
        (
            "/v1/rerank",
            r#"{"query": "q", "documents": ["a"], "top_n": 1, "top_n": 2}"#.into(),
            "top_n",
        ),
    ] {
        let (status, got) = post_text(&app, path, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {got}");
        assert_eq!(got["error"]["type"], "invalid_request_error", "{got}");
        assert_eq!(got["error"]["param"], param, "{path}: {got}");
        let message = got["error"]["message"].as_str().unwrap();
        let key = param.rsplit('.').next().unwrap();
        assert!(
            message.starts_with(&format!("{param}: duplicate key \"{key}\" at line 1 column ")),
            "{path}: {message}"
        );
    }
    // Where: the line and column of the second naming.
    let (_, got) = post_text(
        &app,
        "/v1/embeddings",
        "{\"input\": \"a\",\n \"input\": \"b\"}",
    )
    .await;
    assert_eq!(
        got["error"]["message"],
        "input: duplicate key \"input\" at line 2 column 8"
    );
    // System One's shape.
    let (status, got) = post_text(
        &app,
        "/v1/systemone",
        r#"{"state": {"ticket": "a", "ticket": "b"}, "questions": {}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert_eq!(got["error"]["field"], "state.ticket", "{got}");
    assert!(got["error"]["message"]
        .as_str()
        .unwrap()
        .contains("duplicate key \"ticket\""));
    // text-embeddings-inference's shape.
    for (path, body, start) in [
        (
            "/embed",
            r#"{"inputs": "a", "inputs": "b"}"#,
            "inputs: duplicate key",
        ),
        (
            "/rerank",
            r#"{"query": "q", "texts": ["a"], "query": "r"}"#,
            "query: duplicate key",
        ),
    ] {
        let (status, got) = post_text(&app, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {got}");
        assert_eq!(got["error_type"], "Validation", "{got}");
        assert!(
            got["error"].as_str().unwrap().starts_with(start),
            "{path}: {got}"
        );
    }
    // A body large enough to be checked off the runtime says the same.
    let tools: Vec<String> = (0..200)
        .map(|i| {
            format!(
                r#"{{"name": "t{i}", "description": "{}"}}"#,
                "x".repeat(500)
            )
        })
        .collect();
    let body = format!(
        r#"{{"text": "hi", "tools": [{}], "text": "again"}}"#,
        tools.join(", ")
    );
    assert!(body.len() > 64 * 1024);
    let (status, got) = post_text(&app, "/v1/select", &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert_eq!(got["error"]["param"], "text", "{got}");
    // Not JSON at all is still the endpoint's own complaint, and a key repeated in different
    // objects is no repeat.
    let (status, got) = post_text(&app, "/v1/decisions", r#"{"input": "hi", "#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert!(!got["error"]["message"]
        .as_str()
        .unwrap()
        .contains("duplicate"));
    let (status, got) = post_text(
        &app,
        "/v1/select",
        r#"{"text": "weather", "tools": [{"name": "a", "description": "d"}, {"name": "b", "description": "d"}]}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_search_skips_hosted_tools_and_still_refuses_a_malformed_function() {
    let app = app();
    let weather = json!({"type": "function", "name": "get_weather", "description": "Current weather of a city",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                         "defer_loading": true});
    let email = json!({"type": "function", "name": "send_email", "description": "Sends an email",
                       "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
                       "defer_loading": true});
    let (status, got) = post(
        &app,
        "/v1/tool_search",
        json!({"provider": "openai", "max_results": 1, "query": "weather in Paris",
               "tools": [{"type": "tool_search", "execution": "client"}, weather, {"type": "web_search"}, email]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["tools"], json!([weather]), "{got}");
    let (status, got) = post(
        &app,
        "/v1/tool_search",
        json!({"provider": "anthropic", "max_results": 1,
               "call": {"type": "tool_use", "id": "toolu_1", "name": "tool_search", "input": {"query": "send a mail"}},
               "tools": [{"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
                         {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                         {"name": "get_weather", "description": "Current weather of a city", "input_schema": {"type": "object"}},
                         {"name": "send_email", "description": "Sends an email", "input_schema": {"type": "object"}}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(
        got["content"],
        json!([{"type": "tool_reference", "tool_name": "send_email"}])
    );
    let (status, got) = post(
        &app,
        "/v1/tool_search",
        json!({"provider": "openai", "query": "x",
               "tools": [{"type": "web_search"}, weather, {"type": "function", "description": "no name"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
    assert_eq!(got["error"]["param"], "tools[2].name", "{got}");
}
