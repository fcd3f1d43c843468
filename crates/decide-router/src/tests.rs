//! One test per documented behaviour of the router, against `MockDecisionModel` and `MockChatModel`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use decide_chat::{
    AssistantMessage, Capabilities, ChatMessage, ChatModel, ChatModelError, ChatRequest,
    ChatResponse, Content, MockChatModel, ResponseFormat, ToolCall, UserMessage,
};
use decide_contract::{
    Answer, ChoiceAnswer, DecisionError, DecisionInput, DecisionRequest, MockDecisionModel,
};
use serde_json::{json, Value};

use crate::{
    ChatModelRoute, ChatModelRouter, ChatModelRoutingRequest, ChatModelRoutingResult,
    DecisionModelChatModelRouter, Fallback, RouteReason, RouterError, RoutingChatModel,
    RoutingChatModelBuilder, DEFAULT_MAX_MESSAGES, DEFAULT_QUESTION, QUESTION_NAME,
    ROUTE_ATTRIBUTE,
};

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

const SIMPLE: &str = "Greetings, short factual questions, simple lookups";
const COMPLEX: &str = "Multi-step reasoning, code, analysis";

fn routes() -> Vec<ChatModelRoute> {
    vec![
        ChatModelRoute::new("simple", SIMPLE),
        ChatModelRoute::new("complex", COMPLEX),
    ]
}

/// A decision model that always gives these route probabilities.
fn choosing(probabilities: &[(&str, f64)]) -> Arc<MockDecisionModel> {
    let answer = ChoiceAnswer::from_probabilities(probabilities.iter().copied()).unwrap();
    Arc::new(MockDecisionModel::always_answers([(QUESTION_NAME, answer)]))
}

/// A decision model that answers from the rendered input: `pick` returns the option to choose, with probability
/// 0.9 and the rest shared by the other options.
fn reading(pick: impl Fn(&str) -> String + Send + Sync + 'static) -> Arc<MockDecisionModel> {
    Arc::new(MockDecisionModel::answers(move |request| {
        let chosen = pick(&request.input().render());
        let question = request
            .question(QUESTION_NAME)
            .unwrap()
            .as_choice()
            .unwrap();
        let others = (question.options().len() - 1) as f64;
        let answer = ChoiceAnswer::from_probabilities(question.options().iter().map(|o| {
            let p = if o.name == chosen { 0.9 } else { 0.1 / others };
            (o.name.clone(), p)
        }))?;
        Ok(vec![(QUESTION_NAME.to_owned(), answer.into())])
    }))
}

fn router(model: &Arc<MockDecisionModel>) -> DecisionModelChatModelRouter {
    DecisionModelChatModelRouter::new(model.clone())
}

/// A router over `model` that reads the last `n` messages.
fn reading_last(model: &Arc<MockDecisionModel>, n: usize) -> DecisionModelChatModelRouter {
    DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .max_messages(n)
        .build()
        .unwrap()
}

/// A closure router, typed so that the closure's lifetimes are inferred.
fn closure_router(
    f: impl Fn(&ChatModelRoutingRequest<'_>) -> Result<ChatModelRoutingResult, RouterError>
        + Send
        + Sync
        + 'static,
) -> Arc<dyn ChatModelRouter> {
    Arc::new(f)
}

fn route_to(
    chat_request: &ChatRequest,
    routes: Vec<ChatModelRoute>,
) -> ChatModelRoutingRequest<'_> {
    ChatModelRoutingRequest::new(chat_request, routes)
}

fn conversation(messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest::from_messages(messages).unwrap()
}

fn input_json(request: &DecisionRequest) -> Value {
    match request.input() {
        DecisionInput::Fields(fields) => Value::Object(fields.clone()),
        DecisionInput::Text(text) => Value::String(text.clone()),
    }
}

/// `(name, description)` of the options of the routing question.
fn options(request: &DecisionRequest) -> Vec<(String, String)> {
    let question = request
        .question(QUESTION_NAME)
        .unwrap()
        .as_choice()
        .unwrap();
    question
        .options()
        .iter()
        .map(|o| (o.name.clone(), o.description.clone()))
        .collect()
}

struct Models {
    small: Arc<MockChatModel>,
    large: Arc<MockChatModel>,
}

fn models() -> Models {
    Models {
        small: Arc::new(MockChatModel::answering("small answer").with_model_name("small")),
        large: Arc::new(MockChatModel::answering("large answer").with_model_name("large")),
    }
}

fn routing_builder(models: &Models, router: Arc<dyn ChatModelRouter>) -> RoutingChatModelBuilder {
    RoutingChatModel::builder()
        .route("simple", SIMPLE, models.small.clone())
        .route("complex", COMPLEX, models.large.clone())
        .router(router)
        .default_route("simple")
}

fn routing(models: &Models, router: Arc<dyn ChatModelRouter>) -> RoutingChatModel {
    routing_builder(models, router).build().unwrap()
}

fn route_attribute(response: &ChatResponse) -> Option<&str> {
    response.attribute(ROUTE_ATTRIBUTE).and_then(Value::as_str)
}

fn json_schema_request(text: &str) -> ChatRequest {
    ChatRequest::user(text)
        .to_builder()
        .response_format(ResponseFormat::JsonSchema(json!({"type": "object"})))
        .build()
        .unwrap()
}

/// The error inside a routing model's `ChatModelError::Model`.
fn router_error(error: &ChatModelError) -> &RouterError {
    match error {
        ChatModelError::Model(inner) => inner
            .downcast_ref::<RouterError>()
            .unwrap_or_else(|| panic!("not a router error: {error}")),
        other => panic!("not a router error: {other:?}"),
    }
}

#[path = "../../../tests/support/warnings.rs"]
mod support;
use support::warnings;

// ---------------------------------------------------------------------------------------------
// 1. One choice question, the routes as options; names describe routes without description;
//    several descriptions give one option each, summed per route
// ---------------------------------------------------------------------------------------------

#[test]
fn the_decision_model_chooses_the_route_whose_description_fits() {
    let request = ChatRequest::user("Refactor this function");
    for (probabilities, expected) in [
        ([("simple", 0.2), ("complex", 0.8)], "complex"),
        ([("simple", 0.7), ("complex", 0.3)], "simple"),
    ] {
        let model = choosing(&probabilities);
        let decision = router(&model)
            .decide(&route_to(&request, routes()))
            .unwrap();
        assert_eq!(decision.result, ChatModelRoutingResult::route(expected));
        assert_eq!(decision.reason, RouteReason::Chosen);
        assert_eq!(decision.probabilities.len(), 2);
        let sent = model.request().unwrap();
        assert_eq!(sent.questions().len(), 1, "one question");
        let question = sent.question(QUESTION_NAME).unwrap().as_choice().unwrap();
        assert_eq!(question.text(), DEFAULT_QUESTION);
        assert_eq!(
            options(&sent),
            [
                ("simple".to_owned(), SIMPLE.to_owned()),
                ("complex".to_owned(), COMPLEX.to_owned())
            ]
        );
    }
}

#[test]
fn a_route_without_description_is_described_by_its_name() {
    let model = choosing(&[("simple", 0.3), ("complex", 0.7)]);
    let routes = vec![
        ChatModelRoute::without_description("simple"),
        ChatModelRoute::new("complex", COMPLEX),
    ];
    let request = ChatRequest::user("hi");
    router(&model).route(&route_to(&request, routes)).unwrap();
    assert_eq!(
        options(&model.request().unwrap()),
        [
            ("simple".to_owned(), "simple".to_owned()),
            ("complex".to_owned(), COMPLEX.to_owned())
        ]
    );
}

#[test]
fn several_descriptions_give_one_option_each_and_are_summed_per_route() {
    let model = choosing(&[("simple", 0.4), ("complex#1", 0.3), ("complex#2", 0.3)]);
    let routes = vec![
        ChatModelRoute::new("simple", SIMPLE),
        ChatModelRoute::with_descriptions("complex", ["Code", "Multi-step reasoning"]),
    ];
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .min_probability(0.55)
        .build()
        .unwrap();
    let request = ChatRequest::user("Write a parser");
    let decision = router.decide(&route_to(&request, routes)).unwrap();
    // 0.4 for simple against 0.3 + 0.3 for complex: summed, complex wins and passes 0.55.
    assert_eq!(decision.result, ChatModelRoutingResult::route("complex"));
    assert!((decision.probability("complex").unwrap() - 0.6).abs() < 1e-9);
    assert_eq!(decision.probability("simple"), Some(0.4));
    assert_eq!(
        decision.probability("complex#1"),
        None,
        "per route, not per option"
    );
    assert_eq!(
        options(&model.request().unwrap()),
        [
            ("simple".to_owned(), SIMPLE.to_owned()),
            ("complex#1".to_owned(), "Code".to_owned()),
            ("complex#2".to_owned(), "Multi-step reasoning".to_owned())
        ]
    );
}

#[test]
fn several_descriptions_reach_a_router_unchanged() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let models = models();
    let model = RoutingChatModel::builder()
        .route_with_descriptions("complex", ["Code", "Analysis"], models.large.clone())
        .route_without_description("simple", models.small.clone())
        .router(closure_router(move |request| {
            record.lock().unwrap().extend_from_slice(request.routes());
            Ok(ChatModelRoutingResult::DefaultRoute)
        }))
        .default_route("simple")
        .build()
        .unwrap();
    model.chat(&ChatRequest::user("hi")).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ChatModelRoute::with_descriptions("complex", ["Code", "Analysis"]),
            ChatModelRoute::without_description("simple"),
        ]
    );
    assert!(model.routes()[1].descriptions().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 2. The last max_messages messages up to the last user message, as sent; markers for attachments
// ---------------------------------------------------------------------------------------------

fn long_conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You are helpful."),
        ChatMessage::user("Hello"),
        ChatMessage::assistant("Hi! How can I help?"),
        ChatMessage::user("Can you write a Python script that renames files?"),
        ChatMessage::assistant("Sure. Should it also handle subfolders?"),
        ChatMessage::user("yes, go ahead"),
        ChatMessage::tool_calls(vec![ToolCall::new(Some("c1"), "run_python", "{}")]),
        ChatMessage::tool_result(Some("c1"), None, "done"),
    ]
}

#[test]
fn the_last_user_message_alone_is_sent_by_default() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let request = conversation(long_conversation());
    assert_eq!(router(&model).max_messages(), DEFAULT_MAX_MESSAGES);
    router(&model).route(&route_to(&request, routes())).unwrap();
    assert_eq!(
        model.request().unwrap().input(),
        &DecisionInput::Text("yes, go ahead".into())
    );
}

#[test]
fn the_last_three_messages_up_to_the_last_user_message_are_sent() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let request = conversation(long_conversation());
    reading_last(&model, 3)
        .route(&route_to(&request, routes()))
        .unwrap();
    assert_eq!(
        input_json(&model.request().unwrap()),
        json!({"messages": [
            {"role": "user", "text": "Can you write a Python script that renames files?"},
            {"role": "assistant", "text": "Sure. Should it also handle subfolders?"},
            {"role": "user", "text": "yes, go ahead"}
        ]})
    );
}

#[test]
fn system_messages_tool_calls_and_results_are_never_sent_and_do_not_count() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let mut messages = long_conversation();
    messages.push(ChatMessage::user("and now in Rust"));
    let request = conversation(messages);
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .max_messages(10)
        .build()
        .unwrap();
    router.route(&route_to(&request, routes())).unwrap();
    let sent = input_json(&model.request().unwrap());
    let texts: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "Hello",
            "Hi! How can I help?",
            "Can you write a Python script that renames files?",
            "Sure. Should it also handle subfolders?",
            "yes, go ahead",
            "and now in Rust"
        ]
    );
}

#[test]
fn a_short_follow_up_is_read_with_the_turn_it_answers() {
    // The model routes to "complex" only when it can see that the conversation is about code.
    let model = reading(|input| {
        if input.contains("Python") {
            "complex"
        } else {
            "simple"
        }
        .to_owned()
    });
    let request = conversation(long_conversation());
    let with_history = reading_last(&model, 3)
        .route(&route_to(&request, routes()))
        .unwrap();
    assert_eq!(with_history, ChatModelRoutingResult::route("complex"));
    let last_only = reading_last(&model, 1);
    let alone = last_only.route(&route_to(&request, routes())).unwrap();
    assert_eq!(alone, ChatModelRoutingResult::route("simple"));
    assert_eq!(
        input_json(&model.requests()[1]),
        json!("yes, go ahead"),
        "max_messages 1 sends the plain text"
    );
}

#[test]
fn attachments_are_markers_with_the_plain_text_of_max_messages_one() {
    let model = choosing(&[("simple", 0.5), ("complex", 0.5)]);
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .max_messages(1)
        .build()
        .unwrap();
    let picture = conversation(vec![ChatMessage::User(UserMessage::from_contents(vec![
        Content::text("What is in this picture?"),
        Content::image("data:image/png;base64,iVBORw0KGgo="),
    ]))]);
    let image_only = conversation(vec![ChatMessage::User(UserMessage::from_contents(vec![
        Content::image("https://example.com/cat.png"),
    ]))]);
    router.route(&route_to(&picture, routes())).unwrap();
    router.route(&route_to(&image_only, routes())).unwrap();
    let inputs: Vec<Value> = model.requests().iter().map(input_json).collect();
    assert_eq!(
        inputs,
        [
            json!("What is in this picture?\n[attached image]"),
            json!("[attached image]")
        ]
    );
}

#[test]
fn an_image_route_can_be_chosen_for_an_attached_image() {
    let model = reading(|input| {
        if input.contains("[attached image]") {
            "vision"
        } else {
            "simple"
        }
        .to_owned()
    });
    let mut all = routes();
    all.push(ChatModelRoute::new(
        "vision",
        "Questions about an attached image or photo",
    ));
    let request = conversation(vec![
        ChatMessage::user("Hello"),
        ChatMessage::assistant("Hi!"),
        ChatMessage::User(UserMessage::from_contents(vec![Content::image(
            "data:image/png;base64,iVBORw0KGgo=",
        )])),
    ]);
    let decision = router(&model).decide(&route_to(&request, all)).unwrap();
    assert_eq!(decision.result, ChatModelRoutingResult::route("vision"));
    assert_eq!(
        input_json(&model.request().unwrap()),
        json!("[attached image]")
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The default route without a user message, and below min_probability
// ---------------------------------------------------------------------------------------------

#[test]
fn without_a_user_message_the_default_route_is_used_without_asking() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    for messages in [
        vec![ChatMessage::system("You are helpful.")],
        vec![ChatMessage::assistant("Hello, how can I help?")],
        vec![ChatMessage::system("s"), ChatMessage::user("   ")],
    ] {
        let request = conversation(messages);
        let decision = router(&model)
            .decide(&route_to(&request, routes()))
            .unwrap();
        assert_eq!(decision.result, ChatModelRoutingResult::DefaultRoute);
        assert_eq!(decision.reason, RouteReason::NoUserMessage);
        assert!(decision.probabilities.is_empty());
    }
    assert!(model.requests().is_empty(), "the model was not asked");

    // Through the routing model, the default route's model answers.
    let models = models();
    let routing = routing(&models, Arc::new(router(&model)));
    let response = routing
        .chat(&conversation(vec![ChatMessage::system("s")]))
        .unwrap();
    assert_eq!(route_attribute(&response), Some("simple"));
    assert_eq!(models.small.call_count(), 1);
}

#[test]
fn below_min_probability_the_default_route_is_used_and_at_it_the_route_is_chosen() {
    let models = models();
    let with_min = |model: &Arc<MockDecisionModel>| {
        let router = DecisionModelChatModelRouter::builder()
            .decision_model(model.clone())
            .min_probability(0.7)
            .build()
            .unwrap();
        routing(&models, Arc::new(router))
    };
    let below = choosing(&[("simple", 0.45), ("complex", 0.55)]);
    let response = with_min(&below).chat(&ChatRequest::user("x")).unwrap();
    assert_eq!(route_attribute(&response), Some("simple"), "0.55 < 0.7");
    let at = choosing(&[("simple", 0.3), ("complex", 0.7)]);
    let response = with_min(&at).chat(&ChatRequest::user("x")).unwrap();
    assert_eq!(route_attribute(&response), Some("complex"), "0.7 = 0.7");
    assert_eq!(models.small.call_count(), 1);
    assert_eq!(models.large.call_count(), 1);

    let request = ChatRequest::user("x");
    let decision = DecisionModelChatModelRouter::builder()
        .decision_model(below)
        .min_probability(0.7)
        .build()
        .unwrap()
        .decide(&route_to(&request, routes()))
        .unwrap();
    assert_eq!(decision.reason, RouteReason::BelowMinProbability);
    assert_eq!(
        decision.probability("complex"),
        Some(0.55),
        "still reported"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. min_probability needs probabilities, whatever the fallback
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn min_probability_without_probabilities_is_an_error_whatever_the_fallback() {
    let model = Arc::new(MockDecisionModel::always_answers([(
        QUESTION_NAME,
        ChoiceAnswer::new("complex"),
    )]));
    let request = ChatRequest::user("x");
    for fallback in [Fallback::DefaultRoute, Fallback::Fail] {
        let router = DecisionModelChatModelRouter::builder()
            .decision_model(model.clone())
            .min_probability(0.5)
            .fallback(fallback)
            .build()
            .unwrap();
        let error = router.route(&route_to(&request, routes())).unwrap_err();
        assert!(matches!(error, RouterError::NoProbabilities), "{error}");
        assert!(
            error.to_string().contains("reported no probabilities"),
            "{error}"
        );
        let error = router
            .route_async(&route_to(&request, routes()))
            .await
            .unwrap_err();
        assert!(matches!(error, RouterError::NoProbabilities), "{error}");
    }
    // Without a minimum, the option the model picked decides.
    let decision = router(&model)
        .decide(&route_to(&request, routes()))
        .unwrap();
    assert_eq!(decision.result, ChatModelRoutingResult::route("complex"));
    assert!(decision.probabilities.is_empty());
}

// ---------------------------------------------------------------------------------------------
// 5. Fallback: the default route with a warning, or the error
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_failing_decision_model_gives_the_default_route_and_logs_a_warning() {
    let model = Arc::new(MockDecisionModel::always_fails_with("engine exploded"));
    let router = router(&model);
    assert_eq!(router.fallback(), Fallback::DefaultRoute);
    let request = ChatRequest::user("x");
    let (decision, logs) = warnings(|| router.decide(&route_to(&request, routes())).unwrap());
    assert_eq!(decision.result, ChatModelRoutingResult::DefaultRoute);
    assert_eq!(
        decision.reason,
        RouteReason::Fallback {
            error: "engine exploded".into()
        }
    );
    assert!(logs.contains("WARN"), "{logs}");
    assert!(logs.contains("failed to select a route"), "{logs}");
    assert!(logs.contains("engine exploded"), "{logs}");

    let result = router
        .route_async(&route_to(&request, routes()))
        .await
        .unwrap();
    assert_eq!(result, ChatModelRoutingResult::DefaultRoute);
}

#[test]
fn a_refusal_is_a_failed_decision() {
    let model = Arc::new(MockDecisionModel::always_answers([(
        QUESTION_NAME,
        Answer::refusal_because("no idea"),
    )]));
    let request = ChatRequest::user("x");
    let decision = router(&model)
        .decide(&route_to(&request, routes()))
        .unwrap();
    assert_eq!(decision.result, ChatModelRoutingResult::DefaultRoute);
    assert!(matches!(decision.reason, RouteReason::Fallback { .. }));
}

#[tokio::test]
async fn fail_returns_the_decision_models_error() {
    let model = Arc::new(MockDecisionModel::always_fails_with("engine exploded"));
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .fallback(Fallback::Fail)
        .build()
        .unwrap();
    let request = ChatRequest::user("x");
    let error = router.route(&route_to(&request, routes())).unwrap_err();
    assert!(
        matches!(error, RouterError::Decision(DecisionError::Model(_))),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "engine exploded");
    let error = router
        .route_async(&route_to(&request, routes()))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "engine exploded");

    // Through the routing model, the chat fails and no chat model is called.
    let models = models();
    let error = routing(&models, Arc::new(router))
        .chat(&request)
        .unwrap_err();
    assert_eq!(error.to_string(), "engine exploded");
    assert_eq!(models.small.call_count() + models.large.call_count(), 0);
}

#[test]
fn fallback_names_parse() {
    assert_eq!(
        "default-route".parse::<Fallback>().unwrap(),
        Fallback::DefaultRoute
    );
    assert_eq!(
        "DEFAULT_ROUTE".parse::<Fallback>().unwrap(),
        Fallback::DefaultRoute
    );
    assert_eq!("Fail".parse::<Fallback>().unwrap(), Fallback::Fail);
    assert_eq!(
        "maybe".parse::<Fallback>().unwrap_err().to_string(),
        "fallback: \"maybe\" is not one of default-route, fail"
    );
    assert_eq!(Fallback::DefaultRoute.to_string(), "default-route");
}

// ---------------------------------------------------------------------------------------------
// 6. Capabilities: one capable route is chosen without asking; none capable keeps all
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_only_route_that_supports_a_json_schema_is_chosen_without_asking() {
    let model = choosing(&[("simple", 0.9), ("complex", 0.1)]);
    let small = Arc::new(MockChatModel::answering("small"));
    let large = Arc::new(
        MockChatModel::answering("{}").with_capabilities(Capabilities::JSON_SCHEMA_RESPONSE_FORMAT),
    );
    let routing = RoutingChatModel::builder()
        .route("simple", SIMPLE, small.clone())
        .route("complex", COMPLEX, large.clone())
        .router(Arc::new(router(&model)))
        .default_route("simple")
        .build()
        .unwrap();
    let request = json_schema_request("Extract the invoice fields");
    let response = routing.chat(&request).unwrap();
    assert_eq!(route_attribute(&response), Some("complex"));
    let response = routing.chat_async(request).await.unwrap();
    assert_eq!(route_attribute(&response), Some("complex"));
    assert!(
        model.requests().is_empty(),
        "the decision model was not asked"
    );
    assert_eq!((small.call_count(), large.call_count()), (0, 2));
    // A plain request is routed by the decision model, which prefers simple.
    let response = routing.chat(&ChatRequest::user("hi")).unwrap();
    assert_eq!(route_attribute(&response), Some("simple"));
    assert_eq!(model.requests().len(), 1);
}

#[test]
fn a_single_candidate_is_chosen_without_asking() {
    let model = choosing(&[("simple", 0.9), ("complex", 0.1)]);
    let request = ChatRequest::user("x");
    let decision = router(&model)
        .decide(&route_to(
            &request,
            vec![ChatModelRoute::new("complex", COMPLEX)],
        ))
        .unwrap();
    assert_eq!(decision.result, ChatModelRoutingResult::route("complex"));
    assert_eq!(decision.reason, RouteReason::OnlyCandidate);
    assert!(model.requests().is_empty());
    let error = router(&model)
        .decide(&route_to(&request, Vec::new()))
        .unwrap_err();
    assert!(error.to_string().contains("no route"), "{error}");
}

/// The names of the routes a router was offered, call by call.
type Offered = Arc<Mutex<Vec<Vec<String>>>>;

/// A router that records the names of the routes it is offered and picks the one given.
fn recording_router(pick: ChatModelRoutingResult) -> (Arc<dyn ChatModelRouter>, Offered) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let router = closure_router(move |request| {
        record.lock().unwrap().push(
            request
                .routes()
                .iter()
                .map(|r| r.name().to_owned())
                .collect(),
        );
        Ok(pick.clone())
    });
    (router, seen)
}

#[test]
fn when_no_route_declares_the_capability_all_routes_stay_candidates() {
    let models = models();
    let (router, seen) = recording_router(ChatModelRoutingResult::route("complex"));
    let routing = routing(&models, router);
    let response = routing.chat(&json_schema_request("x")).unwrap();
    assert_eq!(route_attribute(&response), Some("complex"));
    assert_eq!(*seen.lock().unwrap(), [vec!["simple", "complex"]]);
    assert!(
        models
            .large
            .request()
            .unwrap()
            .required_capabilities()
            .json_schema_response_format
    );
}

#[test]
fn a_json_schema_request_reaches_only_the_capable_routes() {
    let capable = || {
        Arc::new(
            MockChatModel::answering("{}")
                .with_capabilities(Capabilities::JSON_SCHEMA_RESPONSE_FORMAT),
        )
    };
    let build = |router: Arc<dyn ChatModelRouter>| {
        RoutingChatModel::builder()
            .route("simple", SIMPLE, Arc::new(MockChatModel::answering("x")))
            .route("complex", COMPLEX, capable())
            .route_without_description("reasoning", capable())
            .router(router)
            .default_route("simple")
            .build()
            .unwrap()
    };
    let (router, seen) = recording_router(ChatModelRoutingResult::route("reasoning"));
    let routing = build(router);
    assert_eq!(
        routing.select_route(&json_schema_request("x")).unwrap(),
        "reasoning"
    );
    assert_eq!(*seen.lock().unwrap(), [vec!["complex", "reasoning"]]);
    assert!(
        routing.capabilities().json_schema_response_format,
        "the union"
    );

    // The default route cannot handle it: the first capable route is used.
    let (router, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    let routing = build(router);
    assert_eq!(
        routing.select_route(&json_schema_request("x")).unwrap(),
        "complex"
    );
    assert_eq!(
        routing.select_route(&ChatRequest::user("x")).unwrap(),
        "simple"
    );

    // Choosing an incapable route is an error naming the capable ones.
    let (router, _) = recording_router(ChatModelRoutingResult::route("simple"));
    let error = build(router).chat(&json_schema_request("x")).unwrap_err();
    assert!(matches!(
        router_error(&error),
        RouterError::MissingCapabilities { .. }
    ));
    assert_eq!(
        error.to_string(),
        "route 'simple' does not support the capabilities the request needs (json_schema_response_format). \
         Routes that support them: complex, reasoning"
    );
}

#[test]
fn capabilities_are_the_union_of_the_routes() {
    let models = models();
    let (router, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    assert_eq!(routing(&models, router).capabilities(), Capabilities::NONE);
}

// ---------------------------------------------------------------------------------------------
// 7. Asynchronous routing uses decide_async; without it, chat_async fails and calls no model
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn route_async_uses_decide_async() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let request = ChatRequest::user("x");
    let result = router(&model)
        .route_async(&route_to(&request, routes()))
        .await
        .unwrap();
    assert_eq!(result, ChatModelRoutingResult::route("complex"));
    assert_eq!(model.requests().len(), 1);

    let sync_only = Arc::new(
        MockDecisionModel::always_answers([(
            QUESTION_NAME,
            ChoiceAnswer::from_probabilities([("simple", 0.2), ("complex", 0.8)]).unwrap(),
        )])
        .without_async_support(),
    );
    // Whatever the fallback: a model that cannot be called this way is not a failed decision.
    let error = router(&sync_only)
        .route_async(&route_to(&request, routes()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            RouterError::Decision(DecisionError::AsyncNotSupported { .. })
        ),
        "{error:?}"
    );
    assert!(sync_only.requests().is_empty());
    // The synchronous path still works with it.
    assert_eq!(
        router(&sync_only)
            .route(&route_to(&request, routes()))
            .unwrap(),
        ChatModelRoutingResult::route("complex")
    );
}

#[tokio::test]
async fn chat_async_fails_without_async_decisions_and_calls_no_chat_model() {
    let sync_only = Arc::new(
        MockDecisionModel::always_answers([(
            QUESTION_NAME,
            ChoiceAnswer::from_probabilities([("simple", 0.2), ("complex", 0.8)]).unwrap(),
        )])
        .without_async_support(),
    );
    let models = models();
    let routing = routing(&models, Arc::new(router(&sync_only)));
    let error = routing
        .chat_async(ChatRequest::user("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ChatModelError::AsyncNotSupported { .. }),
        "{error:?}"
    );
    assert_eq!(models.small.call_count() + models.large.call_count(), 0);
}

#[tokio::test]
async fn chat_async_routes_and_records_the_route() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let models = models();
    let routing = routing(&models, Arc::new(router(&model)));
    let response = routing.chat_async(ChatRequest::user("x")).await.unwrap();
    assert_eq!(response.message.text.as_deref(), Some("large answer"));
    assert_eq!(route_attribute(&response), Some("complex"));
    // The future is 'static and Send: it can be spawned.
    let response = tokio::spawn(routing.chat_async(ChatRequest::user("y")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(route_attribute(&response), Some("complex"));
}

#[tokio::test]
async fn a_closure_router_cannot_route_asynchronously() {
    let models = models();
    let (router, seen) = recording_router(ChatModelRoutingResult::route("complex"));
    let routing = routing(&models, router.clone());
    let error = routing
        .chat_async(ChatRequest::user("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ChatModelError::AsyncNotSupported { .. }),
        "{error:?}"
    );
    assert_eq!(models.small.call_count() + models.large.call_count(), 0);
    assert!(seen.lock().unwrap().is_empty());
    let request = ChatRequest::user("x");
    let error = router
        .route_async(&route_to(&request, routes()))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("does not support asynchronous routing: implement route_async"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. The route on the response; tool results go back to the route that asked for the tool
// ---------------------------------------------------------------------------------------------

#[test]
fn the_route_is_recorded_on_the_response() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let models = models();
    let response = routing(&models, Arc::new(router(&model)))
        .chat(&ChatRequest::user("x"))
        .unwrap();
    assert_eq!(response.message.text.as_deref(), Some("large answer"));
    assert_eq!(response.model_name.as_deref(), Some("large"));
    assert_eq!(response.attribute(ROUTE_ATTRIBUTE), Some(&json!("complex")));
}

#[test]
fn nested_routing_models_record_the_outer_route() {
    let models = models();
    let (inner_router, _) = recording_router(ChatModelRoutingResult::route("complex"));
    let inner = Arc::new(routing(&models, inner_router));
    let (outer_router, _) = recording_router(ChatModelRoutingResult::route("nested"));
    let outer = RoutingChatModel::builder()
        .route(
            "plain",
            "Anything",
            Arc::new(MockChatModel::answering("plain")),
        )
        .route("nested", "Everything else", inner)
        .router(outer_router)
        .default_route("plain")
        .build()
        .unwrap();
    let response = outer.chat(&ChatRequest::user("x")).unwrap();
    assert_eq!(response.message.text.as_deref(), Some("large answer"));
    assert_eq!(route_attribute(&response), Some("nested"));
}

/// A model that calls a tool when the conversation ends with the user, and answers when it ends with a result.
fn tool_calling(name: &'static str) -> Arc<MockChatModel> {
    Arc::new(MockChatModel::answers(move |request| {
        Ok(match request.messages().last() {
            Some(ChatMessage::ToolResult(_)) => {
                ChatResponse::text(format!("{name} used the result"))
            }
            _ => ChatResponse::new(AssistantMessage {
                text: None,
                tool_calls: vec![ToolCall::new(Some("call_7"), "get_weather", "{}")],
            }),
        })
    }))
}

/// A router that picks `first` the first time it is asked and `later` afterwards, counting the calls.
fn changing_router(
    first: &'static str,
    later: &'static str,
) -> (Arc<dyn ChatModelRouter>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let count = calls.clone();
    let router = closure_router(move |_| {
        let n = count.fetch_add(1, Ordering::SeqCst);
        Ok(ChatModelRoutingResult::route(if n == 0 {
            first
        } else {
            later
        }))
    });
    (router, calls)
}

fn tool_loop_routing(
    router: Arc<dyn ChatModelRouter>,
) -> (RoutingChatModel, Arc<MockChatModel>, Arc<MockChatModel>) {
    let small = tool_calling("small");
    let large = tool_calling("large");
    let routing = RoutingChatModel::builder()
        .route("simple", SIMPLE, small.clone())
        .route("complex", COMPLEX, large.clone())
        .router(router)
        .default_route("simple")
        .build()
        .unwrap();
    (routing, small, large)
}

#[test]
fn a_tool_result_continues_on_the_route_that_asked_for_the_tool() {
    let (router, calls) = changing_router("complex", "simple");
    let (routing, small, large) = tool_loop_routing(router);
    let question = ChatMessage::user("Weather in Paris?");
    let first = routing.chat(&conversation(vec![question.clone()])).unwrap();
    assert_eq!(route_attribute(&first), Some("complex"));
    let follow = conversation(vec![
        question,
        ChatMessage::Assistant(first.message.clone()),
        ChatMessage::tool_result(Some("call_7"), None, "sunny"),
    ]);
    let second = routing.chat(&follow).unwrap();
    assert_eq!(
        second.message.text.as_deref(),
        Some("large used the result")
    );
    assert_eq!(route_attribute(&second), Some("complex"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the router was asked once");
    assert_eq!((small.call_count(), large.call_count()), (0, 2));
    // A clone shares the memory of tool calls.
    assert_eq!(routing.clone().select_route(&follow).unwrap(), "complex");
}

#[tokio::test]
async fn a_tool_result_continues_on_its_route_asynchronously_too() {
    let (router, calls) = changing_router("complex", "simple");
    let (routing, _, large) = tool_loop_routing(router);
    // The first call is synchronous: closure routers cannot route asynchronously, and the tool result needs none.
    let first = routing.chat(&ChatRequest::user("Weather?")).unwrap();
    let follow = conversation(vec![
        ChatMessage::user("Weather?"),
        ChatMessage::Assistant(first.message),
        ChatMessage::tool_result(Some("call_7"), None, "sunny"),
    ]);
    let second = routing.chat_async(follow).await.unwrap();
    assert_eq!(route_attribute(&second), Some("complex"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(large.call_count(), 2);
}

#[test]
fn a_tool_result_of_an_unknown_call_asks_the_router() {
    let (router, calls) = changing_router("simple", "complex");
    let (routing, _, _) = tool_loop_routing(router);
    let restored = conversation(vec![
        ChatMessage::user("Weather?"),
        ChatMessage::tool_calls(vec![ToolCall::new(
            Some("call_from_storage"),
            "get_weather",
            "{}",
        )]),
        ChatMessage::tool_result(Some("call_from_storage"), None, "sunny"),
    ]);
    assert_eq!(routing.select_route(&restored).unwrap(), "simple");
    let without_id = conversation(vec![
        ChatMessage::user("Weather?"),
        ChatMessage::tool_calls(vec![ToolCall::new(None, "get_weather", "{}")]),
        ChatMessage::tool_result(None, Some("get_weather"), "sunny"),
    ]);
    assert_eq!(routing.select_route(&without_id).unwrap(), "complex");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------------------------------
// 9. Build-time errors; an unknown route names the available ones
// ---------------------------------------------------------------------------------------------

fn build_error(builder: RoutingChatModelBuilder) -> String {
    builder.build().unwrap_err().to_string()
}

#[test]
fn the_routing_model_is_checked_when_it_is_built() {
    let models = models();
    let (router, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    let small = || -> Arc<dyn ChatModel> { models.small.clone() };
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .router(router.clone())
                .default_route("a")
        ),
        "routes: at least one route is required"
    );
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .route("a", "x", small())
                .route("a", "y", small())
                .router(router.clone())
                .default_route("a")
        ),
        "routes: there is more than one route named 'a'"
    );
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .route("simple", "x", small())
                .route("complex", "y", small())
                .router(router.clone())
                .default_route("medium")
        ),
        "default_route: the default route 'medium' is not one of the routes simple, complex"
    );
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .route("a", "x", small())
                .router(router.clone())
        ),
        "default_route: is required"
    );
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .route("a", "x", small())
                .default_route("a")
        ),
        "router: is required"
    );
    assert_eq!(
        build_error(
            RoutingChatModel::builder()
                .route(" ", "x", small())
                .router(router.clone())
                .default_route(" ")
        ),
        "routes: the name of route 1 is blank"
    );
    assert!(build_error(
        RoutingChatModel::builder()
            .route_with_descriptions("a", ["x", ""], small())
            .router(router.clone())
            .default_route("a")
    )
    .starts_with("routes: route 'a' has a blank description"));
}

#[test]
fn routes_that_give_the_same_option_twice_are_rejected_when_built() {
    let model = choosing(&[("a", 1.0)]);
    let colliding = || {
        RoutingChatModel::builder()
            .route_with_descriptions(
                "complex",
                ["Code", "Analysis"],
                Arc::new(MockChatModel::answering("x")),
            )
            .route(
                "complex#1",
                "Other",
                Arc::new(MockChatModel::answering("y")),
            )
            .default_route("complex")
    };
    assert_eq!(
        build_error(colliding().router(Arc::new(router(&model)))),
        "routes: the route names and descriptions give the option 'complex#1' twice; rename the route 'complex#1'"
    );
    // A router that does not turn routes into options accepts them.
    let (plain, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    assert!(colliding().router(plain).build().is_ok());
    // The decision router checks again when asked directly.
    let request = ChatRequest::user("x");
    let error = router(&model)
        .route(&route_to(
            &request,
            vec![
                ChatModelRoute::with_descriptions("complex", ["Code", "Analysis"]),
                ChatModelRoute::new("complex#1", "Other"),
            ],
        ))
        .unwrap_err();
    assert!(error.to_string().contains("'complex#1' twice"), "{error}");
    assert!(model.requests().is_empty());
    // And so does the check a command line runs before loading a model.
    assert!(crate::validate_option_names(&routes()).is_ok());
    let error = crate::validate_option_names(&[
        ChatModelRoute::new("complex#2", "Other"),
        ChatModelRoute::with_descriptions("complex", ["Code", "Analysis"]),
    ])
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "routes: the route names and descriptions give the option 'complex#2' twice; rename the route 'complex#2'"
    );
}

#[test]
fn validate_is_called_with_all_routes_when_built() {
    struct Validating(Arc<Mutex<Vec<String>>>);
    impl ChatModelRouter for Validating {
        fn route(
            &self,
            _request: &ChatModelRoutingRequest<'_>,
        ) -> Result<ChatModelRoutingResult, RouterError> {
            Ok(ChatModelRoutingResult::DefaultRoute)
        }
        fn validate(&self, routes: &[ChatModelRoute]) -> Result<(), RouterError> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(routes.iter().map(|r| r.name().to_owned()));
            if routes.iter().any(|r| r.descriptions().is_empty()) {
                return Err(RouterError::InvalidConfig {
                    option: "routes",
                    message: "every route needs a description".into(),
                });
            }
            Ok(())
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let models = models();
    routing(&models, Arc::new(Validating(seen.clone())));
    assert_eq!(*seen.lock().unwrap(), ["simple", "complex"]);
    let error = routing_builder(&models, Arc::new(Validating(seen.clone())))
        .route_without_description("bare", models.small.clone())
        .build()
        .unwrap_err();
    assert_eq!(error.to_string(), "routes: every route needs a description");
}

#[test]
fn a_router_that_names_an_unknown_route_is_an_error_naming_the_available_routes() {
    let models = models();
    let (router, _) = recording_router(ChatModelRoutingResult::route("medium"));
    let error = routing(&models, router)
        .chat(&ChatRequest::user("x"))
        .unwrap_err();
    assert!(matches!(
        router_error(&error),
        RouterError::UnknownRoute { .. }
    ));
    assert_eq!(
        error.to_string(),
        "the router selected the unknown route 'medium'. Available routes: simple, complex"
    );
    assert_eq!(models.small.call_count() + models.large.call_count(), 0);
}

#[test]
fn the_decision_router_is_checked_when_it_is_built() {
    let model = choosing(&[("a", 1.0)]);
    let error = |builder: crate::DecisionModelChatModelRouterBuilder| {
        builder.build().unwrap_err().to_string()
    };
    let base = || DecisionModelChatModelRouter::builder().decision_model(model.clone());
    assert_eq!(
        error(DecisionModelChatModelRouter::builder()),
        "decision_model: is required"
    );
    assert_eq!(
        error(base().min_probability(-0.1)),
        "min_probability: must be between 0 and 1, but was -0.1"
    );
    assert!(error(base().min_probability(1.5)).starts_with("min_probability"));
    assert!(error(base().min_probability(f64::NAN)).starts_with("min_probability"));
    assert_eq!(
        error(base().max_messages(0)),
        "max_messages: must be at least 1, but was 0"
    );
    assert_eq!(error(base().question("  ")), "question: must not be blank");
    let router = base().min_probability(0.0).build().unwrap();
    assert_eq!(router.min_probability(), Some(0.0));
    assert_eq!(router.question(), DEFAULT_QUESTION);
    assert!(format!("{router:?}").contains("DecisionModelChatModelRouter"));
}

#[test]
fn a_custom_question_is_asked() {
    let model = choosing(&[("simple", 0.2), ("complex", 0.8)]);
    let router = DecisionModelChatModelRouter::builder()
        .decision_model(model.clone())
        .question("Which assistant fits this conversation?")
        .build()
        .unwrap();
    let request = ChatRequest::user("x");
    router.route(&route_to(&request, routes())).unwrap();
    let sent = model.request().unwrap();
    let question = sent.question(QUESTION_NAME).unwrap();
    assert_eq!(question.text(), "Which assistant fits this conversation?");
}

// ---------------------------------------------------------------------------------------------
// The rest of the surface
// ---------------------------------------------------------------------------------------------

#[test]
fn routes_and_default_route_are_exposed() {
    let models = models();
    let (router, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    let routing = routing(&models, router);
    assert_eq!(routing.routes(), routes());
    assert_eq!(routing.default_route(), "simple");
    assert_eq!(routing.model_name(), None);
    assert!(format!("{routing:?}").contains("simple"));
    assert_eq!(ChatModelRoutingResult::route("x").to_string(), "route 'x'");
    assert_eq!(
        ChatModelRoutingResult::DefaultRoute.to_string(),
        "the default route"
    );
    assert!(ChatModelRoutingResult::DefaultRoute.is_default_route());
    assert_eq!(ChatModelRoutingResult::route("x").route_name(), Some("x"));
    assert_eq!(ChatModelRoutingResult::DefaultRoute.route_name(), None);
}

#[test]
fn a_failing_chat_model_fails_the_chat_as_it_is() {
    let failing = Arc::new(MockChatModel::always_fails_with("provider down"));
    let (router, _) = recording_router(ChatModelRoutingResult::DefaultRoute);
    let routing = RoutingChatModel::builder()
        .route("only", "Anything", failing)
        .router(router)
        .default_route("only")
        .build()
        .unwrap();
    let error = routing.chat(&ChatRequest::user("x")).unwrap_err();
    assert!(matches!(error, ChatModelError::Model(_)));
    assert_eq!(error.to_string(), "provider down");
}
