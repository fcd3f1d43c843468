//! Round trips between the client and server sides of both formats.

use decide_contract::{
    Answer, ChoiceAnswer, ChoiceQuestion, DecisionRequest, DecisionResponse, ScaleAnswer,
    ScaleQuestion, TokenUsage, YesNoQuestion,
};
use serde_json::{json, Value};

use crate::{openai, systemone, Limits};

fn conversation() -> serde_json::Map<String, Value> {
    json!({"messages": [
        {"role": "user", "text": "Find a hotel in Porto"},
        {"role": "assistant", "text": "Which dates?"},
        {"role": "user", "text": "Next weekend"}
    ]})
    .as_object()
    .unwrap()
    .clone()
}

fn request(criteria: bool) -> DecisionRequest {
    let yes_no = if criteria {
        YesNoQuestion::builder("Hotel?")
            .yes_when("the user wants a hotel")
            .no_when("the user wants something else")
            .build()
            .unwrap()
    } else {
        YesNoQuestion::new("Hotel?").unwrap()
    };
    DecisionRequest::builder()
        .input(conversation())
        .question("hotel", yes_no)
        .question(
            "tool",
            YesNoQuestion::builder("Is the tool needed?")
                .candidate("search_hotels", "Search hotels by city and dates")
                .build()
                .unwrap(),
        )
        .question(
            "team",
            ChoiceQuestion::builder("Team?")
                .option_with_description("stays", "Hotels and flats")
                .option("flights")
                .build()
                .unwrap(),
        )
        .question(
            "urgency",
            ScaleQuestion::builder("Urgency?")
                .level("low")
                .level_with_description("high", "today")
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[test]
fn system_one_carries_criteria_and_candidates_as_documents() {
    let body = systemone::request_body(&request(true), Some("m"));
    assert_eq!(body["model"], "m");
    assert_eq!(
        body["questions"]["tool"]["criteria"]["true"],
        "search_hotels: Search hotels by city and dates"
    );
    let parsed = systemone::parse_request(body.to_string().as_bytes(), &Limits::default()).unwrap();
    assert_eq!(parsed.model.as_deref(), Some("m"));
    let back = parsed.request;
    assert_eq!(back.input(), request(true).input());
    let hotel = back.question("hotel").unwrap().as_yes_no().unwrap();
    assert_eq!(hotel.yes_when(), Some("the user wants a hotel"));
    assert_eq!(hotel.no_when(), Some("the user wants something else"));
    let tool = back.question("tool").unwrap().as_yes_no().unwrap();
    assert_eq!(
        tool.yes_when(),
        Some("search_hotels: Search hotels by city and dates")
    );
    assert_eq!(back.question("team"), request(true).question("team"));
    assert_eq!(back.question("urgency"), request(true).question("urgency"));
}

#[test]
fn openai_round_trips_plain_questions_and_conversations() {
    let body = openai::request_body(&request(false), None);
    assert!(body.get("model").is_none());
    assert_eq!(body["input"][2]["content"][0]["text"], "Next weekend");
    assert_eq!(
        body["questions"][1]["instructions"],
        "Is the tool needed?\n\nIf true: search_hotels: Search hotels by city and dates"
    );
    let parsed = openai::parse_request(body.to_string().as_bytes(), &Limits::default()).unwrap();
    let back = parsed.request.unwrap();
    assert_eq!(back.input(), request(false).input());
    assert_eq!(back.question("hotel"), request(false).question("hotel"));
    assert_eq!(back.question("team"), request(false).question("team"));
    assert_eq!(back.question("urgency"), request(false).question("urgency"));
}

fn response() -> DecisionResponse {
    DecisionResponse::builder()
        .answer("hotel", Answer::yes_no(0.8).unwrap())
        .answer("tool", Answer::refusal_because("no text"))
        .answer(
            "team",
            ChoiceAnswer::new("stays")
                .with_probabilities([("stays", 0.7), ("flights", 0.3)])
                .unwrap()
                .with_confidence(0.7)
                .unwrap(),
        )
        .answer(
            "urgency",
            ScaleAnswer::new(0.25)
                .unwrap()
                .with_probabilities(vec![0.75, 0.25])
                .unwrap()
                .with_confidence(0.75)
                .unwrap(),
        )
        .model_name("mini")
        .token_usage(TokenUsage::new(42))
        .build()
        .unwrap()
}

#[test]
fn responses_round_trip_in_both_formats() {
    let req = request(false);
    let body = systemone::render_response(&req, &response(), "mini");
    let text = serde_json::to_string(&body).unwrap();
    assert_eq!(
        systemone::parse_response(text.as_bytes()).unwrap(),
        response()
    );
    let wire: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(wire["answers"]["urgency"]["legend"]["1"], "high");
    assert_eq!(
        wire["answers"]["hotel"],
        json!({"type": "noul", "noul": 0.8})
    );

    let parsed = openai::parse_request(
        openai::request_body(&req, None).to_string().as_bytes(),
        &Limits::default(),
    )
    .unwrap();
    let body = openai::render_response(&parsed, Some(&response()), "mini");
    let text = serde_json::to_string(&body).unwrap();
    assert_eq!(openai::parse_response(text.as_bytes()).unwrap(), response());
    let wire: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        wire["answers"][1],
        json!({"type": "refusal", "name": "tool", "refusal": "no text"})
    );
    assert_eq!(
        wire["answers"][3]["probabilities"][1],
        json!({"value": 1, "label": "high", "probability": 0.25})
    );
    assert_eq!(wire["usage"]["total_tokens"], 42);
}

#[test]
fn boolean_choices_answer_with_booleans() {
    let body = json!({"input": "Is the sky green?", "questions": [{"type": "choice", "name": "q", "instructions": "True?", "choices": [{"value": true}, {"value": false}]}]});
    let parsed = openai::parse_request(body.to_string().as_bytes(), &Limits::default()).unwrap();
    let response = DecisionResponse::builder()
        .answer(
            "q",
            ChoiceAnswer::from_probabilities([("true", 0.1), ("false", 0.9)]).unwrap(),
        )
        .build()
        .unwrap();
    let wire =
        serde_json::to_value(openai::render_response(&parsed, Some(&response), "m")).unwrap();
    assert_eq!(wire["answers"][0]["choice"], json!(false));
    assert_eq!(wire["answers"][0]["probabilities"][0]["value"], json!(true));
}

#[test]
fn system_one_accepts_pydecide_shapes() {
    let body = json!({"state": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    "questions": {
        "a": {"type": "noul", "instructions": "A?", "criteria": ["yes it is", "no it is not"], "labels": {"true": "Y", "false": "N"}},
        "b": {"type": "choice", "instructions": {"ask": "B?"}, "criteria": ["x", "y"]},
        "c": {"type": "score", "instructions": "C?", "criteria": ["lo", {"k": 1}, "hi"]}
    }});
    let parsed = systemone::parse_request(body.to_string().as_bytes(), &Limits::default()).unwrap();
    let r = parsed.request;
    assert_eq!(r.input().render(), "user: hi\nassistant: hello");
    assert_eq!(
        r.question("a").unwrap().as_yes_no().unwrap().no_when(),
        Some("no it is not")
    );
    assert_eq!(r.question("b").unwrap().text(), "{\"ask\":\"B?\"}");
    let labels: Vec<&str> = r
        .question("c")
        .unwrap()
        .as_scale()
        .unwrap()
        .level_labels()
        .collect();
    assert_eq!(labels, ["lo", "{\"k\":1}", "hi"]);
}
