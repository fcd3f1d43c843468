//! One test per documented behaviour of the filter, against `MockDecisionModel`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use decide_chat::{
    ChatMessage, Content, InvocationContext, SearchBehavior, StaticToolProvider, ToolCall,
    ToolProvider, ToolProviderError, ToolProviderRequest, ToolProviderResult, ToolSpecification,
    UserMessage, ELISION_MARKER,
};
use decide_contract::{
    Answer, Conformal, DecisionError, DecisionInput, DecisionRequest, MockDecisionModel,
};
use serde_json::{json, Value};

use crate::{
    Fallback, FilterError, FilteringToolProvider, FilteringToolProviderBuilder, Reason,
    DEFAULT_MAX_MESSAGES,
};

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

fn tool(name: &str, description: &str) -> ToolSpecification {
    ToolSpecification::new(name).with_description(description)
}

/// LangChain4j's fixture: `get_forecast` has no description.
fn catalogue() -> Vec<ToolSpecification> {
    vec![
        tool("send_email", "Send an email to someone"),
        tool("get_weather", "Current weather for a city").with_parameters(serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "units": {"type": "string"}}
        })),
        tool("create_invoice", "Create an invoice for a customer"),
        ToolSpecification::new("get_forecast"),
    ]
}

/// LangChain4j's relevances, keyed on the candidate the question carries.
fn relevance(name: &str) -> f64 {
    match name {
        "get_weather" => 0.95,
        "get_forecast" => 0.8,
        "send_email" => 0.05,
        "create_invoice" => 0.3,
        _ => 0.0,
    }
}

fn candidate_name(question: &decide_contract::YesNoQuestion) -> String {
    question
        .candidate()
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

fn mock() -> Arc<MockDecisionModel> {
    Arc::new(MockDecisionModel::answers_yes_no(|q| {
        relevance(&candidate_name(q))
    }))
}

/// A model that answers from the candidate's name and the rendered input, for behaviours that depend on what the
/// conversation says.
fn reading_model(
    probability: impl Fn(&str, &str) -> f64 + Send + Sync + 'static,
) -> Arc<MockDecisionModel> {
    Arc::new(MockDecisionModel::answers(move |request| {
        let input = request.input().render();
        request
            .questions()
            .iter()
            .map(|(name, question)| {
                let tool = question.as_yes_no().map(candidate_name).unwrap_or_default();
                Ok((name.clone(), Answer::yes_no(probability(&tool, &input))?))
            })
            .collect()
    }))
}

fn builder(
    tools: Vec<ToolSpecification>,
    model: &Arc<MockDecisionModel>,
) -> FilteringToolProviderBuilder {
    FilteringToolProvider::builder()
        .tool_provider(Arc::new(StaticToolProvider::from_specifications(tools)))
        .decision_model(model.clone())
}

fn filter(model: &Arc<MockDecisionModel>) -> FilteringToolProvider {
    builder(catalogue(), model).build().unwrap()
}

fn ask(text: &str) -> ToolProviderRequest {
    ToolProviderRequest::builder(UserMessage::new(text)).build()
}

fn ask_with(text: &str, messages: Vec<ChatMessage>) -> ToolProviderRequest {
    ToolProviderRequest::builder(UserMessage::new(text))
        .messages(messages)
        .build()
}

fn names(result: &ToolProviderResult) -> Vec<&str> {
    result.names()
}

fn input_json(input: &DecisionInput) -> Value {
    match input {
        DecisionInput::Fields(fields) => Value::Object(fields.clone()),
        DecisionInput::Text(text) => Value::String(text.clone()),
    }
}

fn request_input(request: &DecisionRequest) -> Value {
    input_json(request.input())
}

/// `(role, text)` pairs of a `{"messages": [...]}` input.
fn transcript(input: &Value) -> Vec<(String, String)> {
    input["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(r, t)| (r.to_string(), t.to_string()))
        .collect()
}

/// The candidates asked about, over all requests, in order.
fn asked(model: &MockDecisionModel) -> Vec<String> {
    model
        .requests()
        .iter()
        .flat_map(|r| {
            r.questions()
                .values()
                .map(|q| q.as_yes_no().map(candidate_name).unwrap_or_default())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn call(id: &str, name: &str, arguments: &str) -> ChatMessage {
    ChatMessage::tool_calls(vec![ToolCall::new(Some(id), name, arguments)])
}

/// A provider that counts how often it is asked, and may be dynamic.
struct Counting {
    tools: Vec<ToolSpecification>,
    dynamic: bool,
    calls: AtomicUsize,
}

impl Counting {
    fn new(tools: Vec<ToolSpecification>, dynamic: bool) -> Arc<Self> {
        Arc::new(Self {
            tools,
            dynamic,
            calls: AtomicUsize::new(0),
        })
    }
}

impl ToolProvider for Counting {
    fn provide_tools(
        &self,
        _request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(ToolProviderResult::from_specifications(self.tools.clone()))
    }

    fn is_dynamic(&self) -> bool {
        self.dynamic
    }
}

#[path = "../../../tests/support/warnings.rs"]
mod support;
use support::warnings;

// ---------------------------------------------------------------------------------------------
// 1. Relevant tools pass, inclusively, in the wrapped provider's order; max_results
// ---------------------------------------------------------------------------------------------

#[test]
fn passes_relevant_tools_in_the_wrapped_order() {
    let model = mock();
    let filter = filter(&model);
    let result = filter.provide_tools(&ask("Will it rain?")).unwrap();
    // get_weather (0.95) is more probable than get_forecast (0.8) but comes first in the catalogue anyway; both
    // irrelevant tools are dropped.
    assert_eq!(names(&result), ["get_weather", "get_forecast"]);
    assert_eq!(model.requests().len(), 1);
    assert!(!filter.is_dynamic());
}

#[test]
fn result_order_is_the_wrapped_order_not_the_probability_order() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(
        |q| match candidate_name(q).as_str() {
            "a" => 0.6,
            "b" => 0.99,
            _ => 0.7,
        },
    ));
    let filter = builder(vec![tool("a", "A"), tool("b", "B"), tool("c", "C")], &model)
        .build()
        .unwrap();
    assert_eq!(
        names(&filter.provide_tools(&ask("x")).unwrap()),
        ["a", "b", "c"]
    );
}

#[test]
fn min_probability_is_inclusive() {
    let model = mock();
    let at = builder(catalogue(), &model)
        .min_probability(0.8)
        .build()
        .unwrap();
    assert_eq!(
        names(&at.provide_tools(&ask("Will it rain?")).unwrap()),
        ["get_weather", "get_forecast"],
        "get_forecast is exactly 0.8"
    );
    let above = builder(catalogue(), &model)
        .min_probability(0.81)
        .build()
        .unwrap();
    assert_eq!(
        names(&above.provide_tools(&ask("Will it rain?")).unwrap()),
        ["get_weather"]
    );
}

#[test]
fn default_min_probability_is_one_half() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(|q| {
        if candidate_name(q) == "half" {
            0.5
        } else {
            0.4999
        }
    }));
    let filter = builder(vec![tool("below", "B"), tool("half", "H")], &model)
        .build()
        .unwrap();
    assert_eq!(filter.min_probability(), 0.5);
    assert_eq!(names(&filter.provide_tools(&ask("x")).unwrap()), ["half"]);
}

/// Ten needed tools of held-out cases had these probabilities: n + 1 = 11, so R = 0.8 → k = ⌊0.2 · 11⌋ = 2
/// (threshold 0.3), R = 0.9 → k = 1 (0.05), R = 0.95 → k = 0 (every tool).
fn conformal() -> Conformal {
    Conformal::from_needed([0.9, 0.05, 0.3, 0.95, 0.8, 0.6, 0.7, 0.85, 0.99, 0.5]).unwrap()
}

#[test]
fn target_recall_takes_the_threshold_of_the_conformal_table() {
    let model = mock();
    let expect = |recall: f64, threshold: f64, selected: &[&str]| {
        let filter = builder(catalogue(), &model)
            .target_recall(recall, &conformal())
            .build()
            .unwrap();
        assert_eq!(filter.min_probability(), threshold, "R = {recall}");
        assert_eq!(filter.target_recall(), Some(recall));
        assert_eq!(
            names(&filter.provide_tools(&ask("Will it rain?")).unwrap()),
            selected,
            "R = {recall}"
        );
    };
    // The relevances: get_weather 0.95, get_forecast 0.8, create_invoice 0.3, send_email 0.05.
    expect(0.5, 0.7, &["get_weather", "get_forecast"]);
    expect(0.8, 0.3, &["get_weather", "create_invoice", "get_forecast"]);
    expect(
        0.9,
        0.05,
        &[
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast",
        ],
    );
    expect(
        0.95,
        0.0,
        &[
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast",
        ],
    );
    // max_results still caps the set.
    let capped = builder(catalogue(), &model)
        .target_recall(0.9, &conformal())
        .max_results(1)
        .build()
        .unwrap();
    assert_eq!(
        names(&capped.provide_tools(&ask("Will it rain?")).unwrap()),
        ["get_weather"]
    );
}

#[test]
fn target_recall_replaces_min_probability_and_must_lie_in_0_1() {
    let model = mock();
    for builder in [
        builder(catalogue(), &model)
            .min_probability(0.5)
            .target_recall(0.9, &conformal()),
        builder(catalogue(), &model)
            .target_recall(0.9, &conformal())
            .min_probability(0.5),
    ] {
        let error = builder.build().unwrap_err().to_string();
        assert_eq!(
            error,
            "target_recall: replaces min_probability: set one of them, not both"
        );
    }
    for r in [0.0, 1.0, 1.5, f64::NAN] {
        let error = builder(catalogue(), &model)
            .target_recall(r, &conformal())
            .build()
            .unwrap_err();
        assert!(matches!(
            error,
            FilterError::InvalidConfig {
                option: "target_recall",
                ..
            }
        ));
        assert_eq!(
            error.to_string(),
            format!("target_recall: must be between 0 and 1 (both excluded), but was {r}")
        );
    }
    let plain = builder(catalogue(), &model).build().unwrap();
    assert_eq!(plain.target_recall(), None);
}

#[test]
fn every_relevant_tool_passes_by_default() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(|_| 0.9));
    let tools: Vec<_> = (0..30)
        .map(|i| tool(&format!("t{i}"), "relevant"))
        .collect();
    let filter = builder(tools, &model).build().unwrap();
    assert_eq!(filter.max_results(), None);
    assert_eq!(filter.provide_tools(&ask("x")).unwrap().len(), 30);
}

#[test]
fn max_results_keeps_the_most_probable_on_top_of_the_always_passed() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(
        |q| match candidate_name(q).as_str() {
            "a" => 0.6,
            "b" => 0.7,
            "c" => 0.9,
            "d" => 0.7,
            _ => 0.0,
        },
    ));
    let tools = vec![
        tool("a", "A"),
        tool("b", "B"),
        tool("c", "C"),
        tool("d", "D"),
        tool("pinned", "P"),
    ];
    let filter = builder(tools, &model)
        .max_results(2)
        .always_include(["pinned"])
        .build()
        .unwrap();
    // c is the best; b and d tie at 0.7 and the earlier one wins; pinned does not count against the limit.
    assert_eq!(
        names(&filter.provide_tools(&ask("x")).unwrap()),
        ["b", "c", "pinned"]
    );
}

// ---------------------------------------------------------------------------------------------
// 2. The conversation: system messages, the last max_messages, tool traffic, filter, shortening
// ---------------------------------------------------------------------------------------------

fn paris_then_berlin() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("You help travellers."),
        ChatMessage::user("What is the weather in Paris?"),
        call("c1", "get_weather", "{\n  \"city\": \"Paris\"\n}"),
        ChatMessage::tool_result(Some("c1"), None, "sunny, 24°C"),
        ChatMessage::assistant("It is sunny in Paris."),
    ]
}

#[test]
fn input_is_the_system_messages_and_the_conversation_with_tool_traffic() {
    let model = mock();
    let filter = filter(&model);
    filter
        .provide_tools(&ask_with("Do the same for Berlin", paris_then_berlin()))
        .unwrap();
    assert_eq!(
        request_input(&model.request().unwrap()),
        json!({"messages": [
            {"role": "system", "text": "You help travellers."},
            {"role": "user", "text": "What is the weather in Paris?"},
            {"role": "assistant", "text": "called get_weather({\"city\":\"Paris\"})"},
            {"role": "tool", "text": "get_weather returned: sunny, 24°C"},
            {"role": "assistant", "text": "It is sunny in Paris."},
            {"role": "user", "text": "Do the same for Berlin"}
        ]})
    );
}

#[test]
fn a_follow_up_selects_the_tools_of_the_earlier_turn() {
    // get_forecast is relevant only when the conversation is about the weather, which the follow-up alone is not.
    let model = reading_model(|tool, input| {
        if tool == "get_forecast" && input.contains("weather") {
            0.9
        } else {
            0.1
        }
    });
    let filter = filter(&model);
    let alone = filter
        .provide_tools(&ask("Do the same for Berlin"))
        .unwrap();
    assert!(alone.is_empty(), "{:?}", names(&alone));
    let follow_up = filter
        .provide_tools(&ask_with("Do the same for Berlin", paris_then_berlin()))
        .unwrap();
    assert_eq!(names(&follow_up), ["get_weather", "get_forecast"]);
}

/// A conversation of `turns` user/assistant pairs after two system messages.
fn long_conversation(turns: usize) -> Vec<ChatMessage> {
    let mut messages = vec![
        ChatMessage::system("first system"),
        ChatMessage::system("second system"),
    ];
    for i in 0..turns {
        messages.push(ChatMessage::user(format!("question {i}")));
        messages.push(ChatMessage::assistant(format!("answer {i}")));
    }
    messages
}

#[test]
fn default_window_is_the_system_messages_and_the_last_ten_messages() {
    let model = mock();
    let filter = filter(&model);
    assert_eq!(filter.max_messages(), DEFAULT_MAX_MESSAGES);
    filter
        .provide_tools(&ask_with("now", long_conversation(8)))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    let expected = pairs(&[
        ("system", "first system"),
        ("system", "second system"),
        ("assistant", "answer 3"),
        ("user", "question 4"),
        ("assistant", "answer 4"),
        ("user", "question 5"),
        ("assistant", "answer 5"),
        ("user", "question 6"),
        ("assistant", "answer 6"),
        ("user", "question 7"),
        ("assistant", "answer 7"),
        ("user", "now"),
    ]);
    assert_eq!(transcript(&input), expected);
}

#[test]
fn max_messages_sets_the_window() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .max_messages(3)
        .build()
        .unwrap();
    filter
        .provide_tools(&ask_with("now", long_conversation(8)))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    assert_eq!(
        transcript(&input),
        pairs(&[
            ("system", "first system"),
            ("system", "second system"),
            ("user", "question 7"),
            ("assistant", "answer 7"),
            ("user", "now"),
        ])
    );
}

#[test]
fn the_user_message_stays_when_tool_rounds_fill_the_window() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .max_messages(2)
        .build()
        .unwrap();
    let rounds = vec![
        ChatMessage::user("Weather and forecast for Oslo?"),
        call("c1", "get_weather", r#"{"city":"Oslo"}"#),
        ChatMessage::tool_result(Some("c1"), None, "snow"),
        call("c2", "get_weather", r#"{"city":"Bergen"}"#),
        ChatMessage::tool_result(Some("c2"), None, "rain"),
    ];
    filter
        .provide_tools(&ask_with("Weather and forecast for Oslo?", rounds))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    assert_eq!(
        transcript(&input),
        pairs(&[
            ("user", "Weather and forecast for Oslo?"),
            ("tool", "get_weather returned: rain"),
        ])
    );
}

#[test]
fn message_filter_drops_previous_messages_but_never_the_current_one() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .max_messages(2)
        .message_filter(|m| matches!(m, ChatMessage::Assistant(_)))
        .build()
        .unwrap();
    filter
        .provide_tools(&ask_with("Do the same for Berlin", paris_then_berlin()))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    // System, user and tool messages are dropped before the window is cut, so two messages reach back to the
    // assistant's text; the current user message is kept although the filter rejects user messages.
    assert_eq!(
        transcript(&input),
        pairs(&[
            ("assistant", "It is sunny in Paris."),
            ("user", "Do the same for Berlin"),
        ])
    );
    // The dropped call still counts as a call: get_weather passes without asking.
    assert_eq!(
        asked(&model),
        ["send_email", "create_invoice", "get_forecast"]
    );
}

#[test]
fn long_messages_are_shortened_keeping_start_and_end() {
    let model = mock();
    let filter = filter(&model);
    assert_eq!(filter.max_message_length(), 2000);
    let long = format!("START{}{}END", "a".repeat(3000), "b".repeat(3000));
    filter
        .provide_tools(&ask_with("short question", vec![ChatMessage::user(long)]))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    let texts = transcript(&input);
    let shortened = &texts[0].1;
    assert_eq!(shortened.chars().count(), 2000);
    assert!(shortened.starts_with("STARTaaa"), "{shortened}");
    assert!(shortened.ends_with("bbbEND"), "{shortened}");
    assert!(shortened.contains(ELISION_MARKER));
    assert_eq!(texts[1].1, "short question");

    let model = mock();
    let short = builder(catalogue(), &model)
        .max_message_length(15)
        .build()
        .unwrap();
    short
        .provide_tools(&ask("abcdefghijklmnopqrstuvwxyz"))
        .unwrap();
    let input = request_input(&model.request().unwrap());
    assert_eq!(transcript(&input), pairs(&[("user", "abcde […] vwxyz")]));
}

// ---------------------------------------------------------------------------------------------
// 3. Batches: the conversation is sent with every batch
// ---------------------------------------------------------------------------------------------

#[test]
fn the_conversation_is_sent_with_every_batch() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(|q| {
        if candidate_name(q) == "t4" {
            0.9
        } else {
            0.1
        }
    }));
    let tools: Vec<_> = (0..5).map(|i| tool(&format!("t{i}"), "a tool")).collect();
    let filter = builder(tools, &model)
        .max_tools_per_decision_request(2)
        .build()
        .unwrap();
    let selection = filter.select(&ask_with("go", paris_then_berlin())).unwrap();
    let requests = model.requests();
    let sizes: Vec<_> = requests.iter().map(|r| r.questions().len()).collect();
    assert_eq!(sizes, [2, 2, 1]);
    for request in &requests {
        assert_eq!(request.input(), requests[0].input(), "same conversation");
        assert!(
            request.question("tool0").is_some(),
            "names restart per batch"
        );
    }
    assert_eq!(transcript(&request_input(&requests[2])).len(), 6);
    assert_eq!(asked(&model), ["t0", "t1", "t2", "t3", "t4"]);
    assert_eq!(
        selection.names(),
        ["t4"],
        "answers are mapped back across batches"
    );
    assert_eq!(selection.decision_requests, 3);
}

#[test]
fn all_tools_are_asked_in_one_request_by_default() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(|_| 0.1));
    let tools: Vec<_> = (0..40).map(|i| tool(&format!("t{i}"), "a tool")).collect();
    let filter = builder(tools, &model).build().unwrap();
    assert_eq!(filter.max_tools_per_decision_request(), None);
    filter.provide_tools(&ask("x")).unwrap();
    let request = model.request().expect("exactly one request");
    assert_eq!(request.questions().len(), 40);
    let names: Vec<_> = request.questions().keys().cloned().collect();
    assert_eq!(names[0], "tool0");
    assert_eq!(names[39], "tool39");
}

// ---------------------------------------------------------------------------------------------
// 4. Tools passed without asking; only the wrapped provider's tools are filtered
// ---------------------------------------------------------------------------------------------

#[test]
fn always_visible_tools_pass_without_asking() {
    let model = mock();
    let mut tools = catalogue();
    tools[0] = tools[0]
        .clone()
        .with_search_behavior(SearchBehavior::AlwaysVisible);
    let filter = builder(tools, &model).build().unwrap();
    let selection = filter.select(&ask("Will it rain?")).unwrap();
    assert_eq!(
        selection.names(),
        ["send_email", "get_weather", "get_forecast"]
    );
    assert_eq!(
        asked(&model),
        ["get_weather", "create_invoice", "get_forecast"]
    );
    assert_eq!(selection.decisions[0].reason, Reason::AlwaysVisible);
    assert_eq!(selection.probability("send_email"), None);
}

#[test]
fn always_included_tools_pass_without_asking() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .always_include(["create_invoice"])
        .build()
        .unwrap();
    let selection = filter.select(&ask("Will it rain?")).unwrap();
    assert_eq!(
        selection.names(),
        ["get_weather", "create_invoice", "get_forecast"]
    );
    assert_eq!(asked(&model), ["send_email", "get_weather", "get_forecast"]);
    assert_eq!(selection.decisions[2].reason, Reason::AlwaysIncluded);
    assert_eq!(filter.always_include(), ["create_invoice"]);
}

#[test]
fn always_include_replaces_the_names_given_before() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .always_include(["create_invoice"])
        .always_include(vec!["send_email".to_owned()])
        .build()
        .unwrap();
    assert_eq!(
        names(&filter.provide_tools(&ask("Will it rain?")).unwrap()),
        ["send_email", "get_weather", "get_forecast"]
    );
}

#[test]
fn tools_already_called_pass_without_asking() {
    let model = mock();
    let filter = filter(&model);
    let history = vec![
        ChatMessage::user("Mail Bob that it will rain"),
        call("c1", "send_email", r#"{"to":"bob"}"#),
        ChatMessage::tool_result(Some("c1"), None, "sent"),
        ChatMessage::assistant("Done."),
    ];
    let selection = filter.select(&ask_with("Will it rain?", history)).unwrap();
    assert_eq!(
        selection.names(),
        ["send_email", "get_weather", "get_forecast"]
    );
    assert_eq!(
        asked(&model),
        ["get_weather", "create_invoice", "get_forecast"]
    );
    assert_eq!(selection.decisions[0].reason, Reason::AlreadyCalled);
}

#[test]
fn called_tools_can_be_scored_and_still_pass_whatever_the_model_says() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .score_called_tools(true)
        .max_results(1)
        .build()
        .unwrap();
    assert!(filter.score_called_tools());
    let history = vec![
        ChatMessage::user("Mail Bob that it will rain"),
        call("c1", "send_email", r#"{"to":"bob"}"#),
        ChatMessage::tool_result(Some("c1"), None, "sent"),
    ];
    let selection = filter.select(&ask_with("Will it rain?", history)).unwrap();
    // send_email (0.05) is asked about too, and passes although the model finds it unlikely; it
    // takes none of max_results' one place, which get_weather (0.95) keeps.
    assert_eq!(
        asked(&model),
        [
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast"
        ]
    );
    assert_eq!(selection.names(), ["send_email", "get_weather"]);
    assert_eq!(selection.decisions[0].reason, Reason::AlreadyCalled);
    assert_eq!(selection.probability("send_email"), Some(0.05));
}

#[test]
fn only_the_wrapped_providers_tools_are_filtered() {
    let model = Arc::new(MockDecisionModel::answers_yes_no(|_| 1.0));
    let filter = builder(catalogue(), &model)
        .always_include(["configured_on_the_agent"])
        .build()
        .unwrap();
    let history = vec![call("c1", "another_agent_tool", "{}")];
    let result = filter.provide_tools(&ask_with("x", history)).unwrap();
    // Names that the wrapped provider does not have are never added: tools configured on the agent reach the LLM
    // through the agent, not through this provider.
    assert_eq!(
        names(&result),
        [
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Previous messages only when the caller passes them
// ---------------------------------------------------------------------------------------------

#[test]
fn without_previous_messages_the_user_message_alone_is_used() {
    let model = mock();
    let filter = filter(&model);
    filter
        .provide_tools(&ask("Do the same for Berlin"))
        .unwrap();
    assert_eq!(
        request_input(&model.request().unwrap()),
        json!({"messages": [{"role": "user", "text": "Do the same for Berlin"}]})
    );
    // Without messages nothing is known to be called, so every tool is a candidate.
    assert_eq!(asked(&model).len(), 4);
}

// ---------------------------------------------------------------------------------------------
// 6. Dynamic providers
// ---------------------------------------------------------------------------------------------

#[test]
fn is_dynamic_follows_the_wrapped_provider() {
    let model = mock();
    for dynamic in [false, true] {
        let filter = FilteringToolProvider::builder()
            .tool_provider(Counting::new(catalogue(), dynamic))
            .decision_model(model.clone())
            .build()
            .unwrap();
        assert_eq!(filter.is_dynamic(), dynamic);
    }
}

#[test]
fn a_dynamic_provider_is_asked_each_round_and_the_decision_sees_earlier_rounds() {
    // The forecast becomes relevant once a weather result is in the conversation.
    let model = reading_model(|tool, input| match tool {
        "get_weather" => 0.9,
        "get_forecast" if input.contains("get_weather returned") => 0.9,
        _ => 0.1,
    });
    let provider = Counting::new(catalogue(), true);
    let filter = FilteringToolProvider::builder()
        .tool_provider(provider.clone())
        .decision_model(model.clone())
        .build()
        .unwrap();
    let question = "Should I take an umbrella in Oslo this week?";
    let mut memory = vec![ChatMessage::user(question)];
    let first = filter
        .provide_tools(&ask_with(question, memory.clone()))
        .unwrap();
    assert_eq!(names(&first), ["get_weather"]);

    memory.push(call("c1", "get_weather", r#"{"city":"Oslo"}"#));
    memory.push(ChatMessage::tool_result(Some("c1"), None, "light rain"));
    let second = filter.provide_tools(&ask_with(question, memory)).unwrap();
    assert_eq!(names(&second), ["get_weather", "get_forecast"]);

    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        transcript(&request_input(&requests[1])),
        pairs(&[
            ("user", question),
            ("assistant", r#"called get_weather({"city":"Oslo"})"#),
            ("tool", "get_weather returned: light rain"),
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// 7. The original user message
// ---------------------------------------------------------------------------------------------

const RAG: &str = "\n\nAnswer using the following information:\nInvoice #42 was sent by email.";

#[test]
fn tools_are_selected_for_the_original_user_message() {
    let model = mock();
    let filter = filter(&model);
    let earlier = format!("Who sent invoice 41?{RAG}");
    let augmented = format!("Will it rain?{RAG}");
    let request = ToolProviderRequest::builder(UserMessage::new(augmented.clone()))
        .original_user_message(UserMessage::new("Will it rain?"))
        .messages(vec![
            ChatMessage::user(earlier.clone()),
            ChatMessage::assistant("Alice did."),
            ChatMessage::user(augmented),
        ])
        .build();
    filter.provide_tools(&request).unwrap();
    // The stored copy of this turn is replaced by the original; the earlier turn is sent as stored.
    assert_eq!(
        transcript(&request_input(&model.request().unwrap())),
        pairs(&[
            ("user", earlier.as_str()),
            ("assistant", "Alice did."),
            ("user", "Will it rain?"),
        ])
    );
}

#[test]
fn the_stored_turn_is_replaced_in_place_during_the_tool_loop() {
    let model = mock();
    let filter = filter(&model);
    let augmented = format!("Will it rain?{RAG}");
    let request = ToolProviderRequest::builder(UserMessage::new(augmented.clone()))
        .original_user_message(UserMessage::new("Will it rain?"))
        .messages(vec![
            ChatMessage::user(augmented),
            call("c1", "get_weather", "{}"),
            ChatMessage::tool_result(Some("c1"), None, "rain"),
        ])
        .build();
    filter.provide_tools(&request).unwrap();
    assert_eq!(
        transcript(&request_input(&model.request().unwrap())),
        pairs(&[
            ("user", "Will it rain?"),
            ("assistant", "called get_weather({})"),
            ("tool", "get_weather returned: rain"),
        ])
    );
}

#[test]
fn the_current_message_is_appended_when_the_history_lacks_it() {
    let model = mock();
    let filter = filter(&model);
    // The same words asked again after an answer are a new turn, not the stored one.
    let history = vec![
        ChatMessage::user("Will it rain?"),
        ChatMessage::assistant("No."),
    ];
    filter
        .provide_tools(&ask_with("Will it rain?", history))
        .unwrap();
    assert_eq!(
        transcript(&request_input(&model.request().unwrap())),
        pairs(&[
            ("user", "Will it rain?"),
            ("assistant", "No."),
            ("user", "Will it rain?"),
        ])
    );
}

#[test]
fn the_augmented_message_is_used_when_the_original_has_no_text() {
    let model = mock();
    let filter = filter(&model);
    let request = ToolProviderRequest::builder(UserMessage::new("Describe this picture"))
        .original_user_message(UserMessage::from_contents(vec![Content::image("u")]))
        .build();
    filter.provide_tools(&request).unwrap();
    assert_eq!(
        transcript(&request_input(&model.request().unwrap())),
        pairs(&[("user", "Describe this picture")])
    );
}

// ---------------------------------------------------------------------------------------------
// 8. No text: all tools, no model call
// ---------------------------------------------------------------------------------------------

#[test]
fn a_user_message_without_text_passes_every_tool_without_asking() {
    let model = mock();
    let filter = filter(&model);
    let image = UserMessage::from_contents(vec![Content::image("https://x/cat.png")]);
    let request = ToolProviderRequest::builder(image)
        .messages(paris_then_berlin())
        .build();
    assert_eq!(filter.decision_input(&request), None);
    let selection = filter.select(&request).unwrap();
    assert_eq!(
        selection.names(),
        [
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast"
        ]
    );
    assert!(selection
        .decisions
        .iter()
        .all(|d| d.reason == Reason::NoText));
    assert!(model.requests().is_empty());
    let blank = filter.provide_tools(&ask("  ")).unwrap();
    assert_eq!(blank.len(), 4);
    assert!(model.requests().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 9. Fallbacks
// ---------------------------------------------------------------------------------------------

#[test]
fn a_failing_model_passes_every_tool_and_logs_a_warning_by_default() {
    let model = Arc::new(MockDecisionModel::always_fails_with("engine exploded"));
    let filter = builder(catalogue(), &model).build().unwrap();
    assert_eq!(filter.fallback(), Fallback::AllTools);
    let (selection, logs) = warnings(|| filter.select(&ask("Will it rain?")).unwrap());
    assert_eq!(selection.tools.len(), 4);
    let used = selection.fallback.expect("a fallback was used");
    assert_eq!(used.strategy, Fallback::AllTools);
    assert_eq!(used.reason, "engine exploded");
    assert!(logs.contains("WARN"), "{logs}");
    assert!(logs.contains("engine exploded"), "{logs}");
}

#[test]
fn a_refusal_counts_as_a_failure() {
    let model = Arc::new(MockDecisionModel::answers_questions(|name, _| {
        if name == "tool1" {
            Answer::refusal_because("policy")
        } else {
            Answer::yes_no(0.0).unwrap()
        }
    }));
    let all = builder(catalogue(), &model).build().unwrap();
    let selection = all.select(&ask("Will it rain?")).unwrap();
    assert_eq!(selection.tools.len(), 4, "all tools, as for a failure");
    let reason = selection.fallback.unwrap().reason;
    assert!(reason.contains("refused"), "{reason}");

    let fail = builder(catalogue(), &model)
        .fallback(Fallback::Fail)
        .build()
        .unwrap();
    match fail.select(&ask("Will it rain?")).unwrap_err() {
        FilterError::Decision(DecisionError::Refused { name, reason }) => {
            assert_eq!(name, "tool1");
            assert_eq!(reason.as_deref(), Some("policy"));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn no_tools_fallback_keeps_only_the_tools_passed_without_asking() {
    let model = Arc::new(MockDecisionModel::always_fails());
    let mut tools = catalogue();
    tools.push(tool("help", "Show help").with_search_behavior(SearchBehavior::AlwaysVisible));
    let filter = builder(tools, &model)
        .always_include(["send_email"])
        .fallback(Fallback::NoTools)
        .build()
        .unwrap();
    let history = vec![call("c1", "get_forecast", "{}")];
    let (selection, logs) = warnings(|| filter.select(&ask_with("x", history)).unwrap());
    assert_eq!(selection.names(), ["send_email", "get_forecast", "help"]);
    assert_eq!(selection.fallback.unwrap().strategy, Fallback::NoTools);
    assert!(logs.contains("WARN"), "{logs}");
}

#[test]
fn fail_fallback_returns_the_models_error() {
    let model = Arc::new(MockDecisionModel::always_fails_with("engine exploded"));
    let filter = builder(catalogue(), &model)
        .fallback(Fallback::Fail)
        .build()
        .unwrap();
    let error = filter.select(&ask("x")).unwrap_err();
    assert!(matches!(
        error,
        FilterError::Decision(DecisionError::Model(_))
    ));
    let error = filter.provide_tools(&ask("x")).unwrap_err();
    assert_eq!(error.to_string(), "engine exploded");
    let ToolProviderError::Provider(inner) = error else {
        panic!("unexpected variant");
    };
    assert!(inner.downcast_ref::<DecisionError>().is_some());
}

#[test]
fn a_failure_in_a_later_batch_keeps_the_earlier_scores_in_the_report() {
    let model = Arc::new(MockDecisionModel::answers(|request| {
        if request.questions().len() == 1 {
            return Err(DecisionError::model("second batch failed"));
        }
        Ok(vec![
            ("tool0".to_owned(), Answer::yes_no(0.1)?),
            ("tool1".to_owned(), Answer::yes_no(0.9)?),
        ])
    }));
    let tools = vec![tool("a", "A"), tool("b", "B"), tool("c", "C")];
    let filter = builder(tools, &model)
        .max_tools_per_decision_request(2)
        .fallback(Fallback::NoTools)
        .build()
        .unwrap();
    let selection = filter.select(&ask("x")).unwrap();
    assert!(selection.tools.is_empty(), "no tool passes under NoTools");
    let scores: Vec<_> = selection.scores().collect();
    assert_eq!(scores, [("a", 0.1), ("b", 0.9)]);
    assert_eq!(selection.decision_requests, 2);
}

#[test]
fn a_failing_wrapped_provider_is_an_error_whatever_the_fallback() {
    struct Down;
    impl ToolProvider for Down {
        fn provide_tools(
            &self,
            _request: &ToolProviderRequest,
        ) -> Result<ToolProviderResult, ToolProviderError> {
            Err(ToolProviderError::message("MCP server down"))
        }
    }
    let model = mock();
    let filter = FilteringToolProvider::new(Arc::new(Down), model.clone());
    assert!(matches!(
        filter.select(&ask("x")),
        Err(FilterError::Provider(_))
    ));
    assert_eq!(
        filter.provide_tools(&ask("x")).unwrap_err().to_string(),
        "MCP server down"
    );
    assert!(model.requests().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 10. Nothing to decide: the model is not called
// ---------------------------------------------------------------------------------------------

#[test]
fn no_tools_means_no_model_call() {
    let model = mock();
    let filter = builder(Vec::new(), &model).build().unwrap();
    let selection = filter.select(&ask("Will it rain?")).unwrap();
    assert!(selection.tools.is_empty());
    assert_eq!(selection.decision_requests, 0);
    assert!(model.requests().is_empty());
}

#[test]
fn no_candidates_left_means_no_model_call() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .always_include([
            "send_email",
            "get_weather",
            "create_invoice",
            "get_forecast",
        ])
        .build()
        .unwrap();
    let selection = filter.select(&ask("Will it rain?")).unwrap();
    assert_eq!(selection.tools.len(), 4);
    assert_eq!(selection.decision_requests, 0);
    assert!(model.requests().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 11. The question template
// ---------------------------------------------------------------------------------------------

#[test]
fn the_default_question_names_the_tool_and_carries_it_as_the_candidate() {
    let model = mock();
    let filter = filter(&model);
    filter.provide_tools(&ask("Will it rain?")).unwrap();
    let request = model.request().unwrap();
    let weather = request.question("tool1").unwrap().as_yes_no().unwrap();
    assert_eq!(
        weather.text(),
        "Would this tool help to handle the request?\nTool: get_weather\nDescription: Current weather for a city"
    );
    let candidate = weather.candidate().unwrap();
    assert_eq!(candidate.name, "get_weather");
    assert_eq!(candidate.description, "Current weather for a city");
    // The argument names go along, for a model that reads them.
    assert_eq!(candidate.parameters, ["city", "units"]);
    let forecast = request.question("tool3").unwrap().as_yes_no().unwrap();
    assert_eq!(
        forecast.text(),
        "Would this tool help to handle the request?\nTool: get_forecast\nDescription:"
    );
    assert_eq!(forecast.candidate().unwrap().name, "get_forecast");
    assert!(forecast.candidate().unwrap().parameters.is_empty());
}

#[test]
fn a_tools_server_goes_along_with_its_candidate() {
    let model = mock();
    let mut gmail = tool("send_email", "Send an email to someone");
    gmail
        .metadata
        .insert("server".into(), serde_json::json!("gmail-mcp"));
    let filter = builder(vec![gmail, tool("get_weather", "Current weather")], &model)
        .build()
        .unwrap();
    filter.provide_tools(&ask("Mail Ana")).unwrap();
    let request = model.request().unwrap();
    let server = |q: &str| {
        let question = request.question(q).unwrap().as_yes_no().unwrap();
        question.candidate().unwrap().server.clone()
    };
    assert_eq!(server("tool0").as_deref(), Some("gmail-mcp"));
    assert_eq!(server("tool1"), None);
}

#[test]
fn a_custom_question_template_is_used() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .question_template("Is {{name}} ({{description}}) useful here?")
        .build()
        .unwrap();
    filter.provide_tools(&ask("Will it rain?")).unwrap();
    let request = model.request().unwrap();
    let texts: Vec<_> = request.questions().values().map(|q| q.text()).collect();
    assert_eq!(
        texts,
        [
            "Is send_email (Send an email to someone) useful here?",
            "Is get_weather (Current weather for a city) useful here?",
            "Is create_invoice (Create an invoice for a customer) useful here?",
            "Is get_forecast () useful here?",
        ]
    );
    // The engine scores the candidate, so it is carried whatever the wording.
    assert!(request
        .questions()
        .values()
        .all(|q| q.as_yes_no().unwrap().candidate().is_some()));
}

#[test]
fn a_template_without_name_is_rejected_at_build() {
    let error = builder(catalogue(), &mock())
        .question_template("Is this tool ({{description}}) useful?")
        .build()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("question_template: the template must contain {{name}}"),
        "{error}"
    );
}

#[test]
fn a_template_with_other_variables_is_rejected_at_build() {
    let error = builder(catalogue(), &mock())
        .question_template("Would {{name}} help {{user}}?")
        .build()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("question_template: the template can only use the {{name}} and {{description}} variables"),
        "{error}"
    );
    assert!(error.to_string().contains("{{user}}"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// 12. Configuration errors fail at build and name the option
// ---------------------------------------------------------------------------------------------

#[test]
fn configuration_errors_fail_at_build_and_name_the_option() {
    let model = mock();
    let cases: Vec<(FilteringToolProviderBuilder, &str)> = vec![
        (
            builder(catalogue(), &model).min_probability(1.5),
            "min_probability: must be between 0 and 1, but was 1.5",
        ),
        (
            builder(catalogue(), &model).min_probability(-0.1),
            "min_probability: must be between 0 and 1, but was -0.1",
        ),
        (
            builder(catalogue(), &model).min_probability(f64::NAN),
            "min_probability: must be between 0 and 1, but was NaN",
        ),
        (
            builder(catalogue(), &model).max_tools_per_decision_request(0),
            "max_tools_per_decision_request: must be at least 1, but was 0",
        ),
        (
            builder(catalogue(), &model).max_messages(0),
            "max_messages: must be at least 1, but was 0",
        ),
        (
            builder(catalogue(), &model).max_results(0),
            "max_results: must be at least 1, but was 0",
        ),
        (
            builder(catalogue(), &model).max_message_length(0),
            "max_message_length: must be at least 1, but was 0",
        ),
        (
            FilteringToolProvider::builder().decision_model(model.clone()),
            "tool_provider: is required",
        ),
        (
            FilteringToolProvider::builder().tool_provider(Arc::new(StaticToolProvider::default())),
            "decision_model: is required",
        ),
    ];
    for (builder, message) in cases {
        let error = builder.build().unwrap_err();
        assert!(matches!(error, FilterError::InvalidConfig { .. }));
        assert_eq!(error.to_string(), message);
    }
    // The bounds themselves are valid.
    for p in [0.0, 1.0] {
        assert!(builder(catalogue(), &model)
            .min_probability(p)
            .build()
            .is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// The report and the public input
// ---------------------------------------------------------------------------------------------

#[test]
fn select_reports_why_each_tool_passed_and_provide_tools_agrees() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .always_include(["create_invoice"])
        .build()
        .unwrap();
    let request = ToolProviderRequest::builder(UserMessage::new("Will it rain?"))
        .messages(vec![call("c1", "send_email", "{}")])
        .invocation_context(InvocationContext::new().with_chat_memory_id("m1"))
        .build();
    let selection = filter.select(&request).unwrap();
    let report: Vec<_> = selection
        .decisions
        .iter()
        .map(|d| (d.name.as_str(), d.reason, d.probability, d.passed))
        .collect();
    assert_eq!(
        report,
        [
            ("send_email", Reason::AlreadyCalled, None, true),
            ("get_weather", Reason::Asked, Some(0.95), true),
            ("create_invoice", Reason::AlwaysIncluded, None, true),
            ("get_forecast", Reason::Asked, Some(0.8), true),
        ]
    );
    assert_eq!(selection.fallback, None);
    assert_eq!(selection.decision_requests, 1);
    assert_eq!(
        names(&filter.provide_tools(&request).unwrap()),
        selection.names()
    );
}

#[test]
fn decision_input_and_requests_show_what_the_model_receives() {
    let model = mock();
    let filter = builder(catalogue(), &model)
        .max_tools_per_decision_request(3)
        .build()
        .unwrap();
    let request = ask_with("Do the same for Berlin", paris_then_berlin());
    let input = filter.decision_input(&request).unwrap();
    let specs = catalogue();
    let refs: Vec<&ToolSpecification> = specs.iter().collect();
    let requests = filter.decision_requests(&input, &refs).unwrap();
    filter.provide_tools(&request).unwrap();
    // get_weather was called, so the model receives the three other tools in one batch of three.
    assert_eq!(requests.len(), 2);
    assert_eq!(model.requests().len(), 1);
    assert_eq!(model.request().unwrap().input(), &input);
    assert_eq!(
        filter.question_text(&specs[0]),
        requests[0].question("tool0").unwrap().text()
    );
}

// ---------------------------------------------------------------------------------------------
// The needs-tool gate
// ---------------------------------------------------------------------------------------------

/// LangChain4j's relevances, and `needs_tool` as the answer to the needs-tool question (`None`: refused, as a model
/// without a needs-tool head does).
fn gated_model(needs_tool: Option<f64>) -> Arc<MockDecisionModel> {
    Arc::new(MockDecisionModel::answers(move |request| {
        request
            .questions()
            .iter()
            .map(|(name, question)| {
                let q = question.as_yes_no().unwrap();
                let answer = match (q.is_needs_tool(), needs_tool) {
                    (true, Some(p)) => Answer::yes_no(p)?,
                    (true, None) => Answer::refusal_because("no head"),
                    (false, _) => Answer::yes_no(relevance(&candidate_name(q)))?,
                };
                Ok((name.clone(), answer))
            })
            .collect()
    }))
}

fn gated(
    model: &Arc<MockDecisionModel>,
    min_probability: f64,
    companion: f64,
) -> FilteringToolProvider {
    builder(catalogue(), model)
        .min_probability(min_probability)
        .needs_tool_gate(companion)
        .build()
        .unwrap()
}

#[test]
fn without_a_head_the_gate_opens_on_the_best_tool_and_passes_its_companions() {
    let model = gated_model(None);
    // get_weather (0.95) opens the gate; create_invoice (0.3) passes at 0.2, send_email (0.05) does not.
    let selection = gated(&model, 0.5, 0.2).select(&ask("weather?")).unwrap();
    assert_eq!(
        selection.names(),
        ["get_weather", "create_invoice", "get_forecast"]
    );
    let gate = selection.gate.unwrap();
    assert_eq!(
        (gate.answer, gate.probability, gate.open),
        (None, 0.95, true)
    );
    // A best tool under min_probability keeps the gate shut, companions or not.
    let selection = gated(&model, 0.96, 0.2).select(&ask("weather?")).unwrap();
    assert!(selection.names().is_empty());
    assert!(!selection.gate.unwrap().open);
}

/// With its companions' bar at `min_probability`, the gate selects what one threshold does, and
/// once open the tools near the best one too: those over 0.3 of the best tool's 0.95
/// (`create_invoice` at 0.3, `get_forecast` at 0.8), whatever the bar.
#[test]
fn with_the_companion_at_min_probability_the_gate_selects_what_one_threshold_does_and_the_best_ones_neighbours(
) {
    let model = gated_model(None);
    let all = [
        "send_email",
        "get_weather",
        "create_invoice",
        "get_forecast",
    ];
    let near_the_best = &all[1..];
    for (min, plain_names, gate_names) in [
        (0.05, &all[..], &all[..]),
        (0.3, near_the_best, near_the_best),
        (0.5, &["get_weather", "get_forecast"][..], near_the_best),
        (0.9, &["get_weather"][..], near_the_best),
        (0.96, &[][..], &[][..]),
    ] {
        let plain = builder(catalogue(), &model)
            .min_probability(min)
            .build()
            .unwrap();
        assert_eq!(
            plain.select(&ask("x")).unwrap().names(),
            plain_names,
            "min_probability {min}"
        );
        assert_eq!(
            gated(&model, min, min).select(&ask("x")).unwrap().names(),
            gate_names,
            "min_probability {min}"
        );
    }
}

#[test]
fn a_head_sure_of_a_tool_opens_the_gate_for_a_weaker_best_tool_and_never_shuts_it() {
    // Best tool 0.95 under a bar of 0.97: logit(0.9) + logit(0.95) = 5.14, probability 0.994.
    let selection = gated(&gated_model(Some(0.9)), 0.97, 0.2)
        .select(&ask("x"))
        .unwrap();
    let gate = selection.gate.unwrap();
    assert!(
        gate.open && (gate.probability - 0.99417).abs() < 1e-4,
        "{gate:?}"
    );
    assert_eq!(
        selection.names(),
        ["get_weather", "create_invoice", "get_forecast"]
    );
    // A head that finds no need cannot shut a gate the best tool opens on its own.
    let selection = gated(&gated_model(Some(0.01)), 0.5, 0.2)
        .select(&ask("x"))
        .unwrap();
    assert_eq!(selection.gate.unwrap().probability, 0.95);
    assert_eq!(
        selection.names(),
        ["get_weather", "create_invoice", "get_forecast"]
    );
}

#[test]
fn the_needs_tool_question_is_asked_once_and_only_with_the_gate() {
    let model = gated_model(Some(0.5));
    let with_gate = builder(catalogue(), &model)
        .needs_tool_gate(0.2)
        .max_tools_per_decision_request(2)
        .build()
        .unwrap();
    with_gate.select(&ask("x")).unwrap();
    let asked: Vec<usize> = model
        .requests()
        .iter()
        .map(|r| {
            r.questions()
                .values()
                .filter(|q| q.as_yes_no().is_some_and(|q| q.is_needs_tool()))
                .count()
        })
        .collect();
    assert_eq!(asked, [1, 0]);
    let plain = gated_model(Some(0.5));
    filter(&plain).select(&ask("x")).unwrap();
    assert!(plain.requests().iter().all(|r| r
        .questions()
        .values()
        .all(|q| !q.as_yes_no().unwrap().is_needs_tool())));
}

#[test]
fn the_gate_leaves_tools_passed_without_asking_and_max_results_as_they_were() {
    let model = gated_model(Some(0.01));
    let selection = builder(catalogue(), &model)
        .needs_tool_gate(0.2)
        .min_probability(0.99)
        .always_include(["send_email"])
        .build()
        .unwrap()
        .select(&ask("x"))
        .unwrap();
    assert_eq!(selection.names(), ["send_email"]);
    let selection = builder(catalogue(), &model)
        .needs_tool_gate(0.2)
        .max_results(1)
        .build()
        .unwrap()
        .select(&ask("x"))
        .unwrap();
    assert_eq!(selection.names(), ["get_weather"]);
}

#[test]
fn the_gate_is_checked_when_the_filter_is_built() {
    let model = mock();
    let error = |b: FilteringToolProviderBuilder| b.build().unwrap_err().to_string();
    assert!(error(builder(catalogue(), &model).needs_tool_gate(1.5)).contains("needs_tool_gate"));
    let table = Conformal::from_needed([0.9, 0.5, 0.1]).unwrap();
    let both = builder(catalogue(), &model)
        .needs_tool_gate(0.2)
        .target_recall(0.9, &table);
    assert!(error(both).contains("target_recall"));
}
