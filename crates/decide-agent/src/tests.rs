//! Tests of the tool attributes, tool execution, the loop, memory, streaming, and the filter and router plugged in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;

use decide_chat::{
    AssistantMessage, ChatMessage, ChatModelError, ChatRequest, ChatResponse, InvocationContext,
    MockChatModel, ProvidedTool, StaticToolProvider, ToolCall, ToolExecutionError, ToolProvider,
    ToolProviderError, ToolProviderRequest, ToolProviderResult, ToolSpecification,
};
use futures_util::StreamExt;
use serde_json::json;

use crate::{
    evict, tool, tools, Agent, AgentError, AgentEvent, AgentRequest, ChatStream, ChatStreamEvent,
    InMemoryChatMemoryStore, MessageWindowChatMemory, StreamingChatModel, Tool, ToolBox,
};

// ---------------------------------------------------------------------------------------------------------------
// The tool attributes

/// The calculator of LangChain4j's agent tutorial, with its Java method names.
struct Calculator;

#[tools]
impl Calculator {
    #[tool(
        name = "stringLength",
        description = "Calculates the length of a string"
    )]
    fn string_length(&self, s: String) -> i32 {
        s.chars().count() as i32
    }

    #[tool("Calculates the sum of two numbers")]
    fn add(&self, a: i32, b: i32) -> i32 {
        a + b
    }

    #[tool("Calculates the square root of a number")]
    fn sqrt(x: i32) -> f64 {
        f64::from(x).sqrt()
    }

    /// Not a tool: an ordinary method stays as it was.
    #[allow(dead_code)]
    fn helper(&self) -> u8 {
        1
    }
}

/// Looks up the weather.
///
/// Returns a short text.
#[tool]
fn weather(
    /// The city, e.g. "Paris"
    city: String,
    /// Celsius unless false
    celsius: Option<bool>,
    context: &InvocationContext,
) -> String {
    let user = context
        .attribute("user_id")
        .and_then(|v| v.as_str())
        .unwrap_or("nobody");
    format!(
        "sunny in {city} ({}) for {user}",
        if celsius.unwrap_or(true) { "C" } else { "F" }
    )
}

#[tool("Divides a by b")]
fn divide(a: f64, b: f64) -> Result<f64, String> {
    if b == 0.0 {
        Err("division by zero".to_owned())
    } else {
        Ok(a / b)
    }
}

#[tool("Waits, then echoes")]
async fn slow_echo(text: String, millis: u64) -> String {
    tokio::time::sleep(Duration::from_millis(millis)).await;
    text
}

#[tool("Always panics")]
fn explode() -> String {
    panic!("boom")
}

#[tool("Records an event")]
fn record(event: String) {
    let _ = event;
}

#[test]
fn the_calculator_specs_match_the_tutorial() {
    let tools = Arc::new(Calculator).into_tools();
    let specs: Vec<_> = tools
        .iter()
        .map(|t| t.specification().to_openai_json()["function"].clone())
        .collect();
    // The `functions` of the tutorial's first recorded request, field for field.
    assert_eq!(
        json!(specs),
        json!([
            {"name": "stringLength", "description": "Calculates the length of a string",
             "parameters": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}},
            {"name": "add", "description": "Calculates the sum of two numbers",
             "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                            "required": ["a", "b"]}},
            {"name": "sqrt", "description": "Calculates the square root of a number",
             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}
        ])
    );
    assert!(tools.iter().all(|t| !t.is_async()));
}

#[test]
fn doc_comments_describe_the_tool_and_its_parameters() {
    let tool = weather_tool();
    let spec = tool.specification();
    assert_eq!(spec.name, "weather");
    assert_eq!(
        spec.description.as_deref(),
        Some("Looks up the weather.\n\nReturns a short text.")
    );
    assert_eq!(
        spec.parameters,
        Some(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
                "celsius": {"type": ["boolean", "null"], "description": "Celsius unless false"}
            },
            "required": ["city"]
        }))
    );
    let unsigned = slow_echo_tool();
    assert!(unsigned.is_async());
    assert_eq!(
        unsigned.specification().parameters.as_ref().unwrap()["properties"]["millis"],
        json!({"type": "integer", "minimum": 0})
    );
    assert_eq!(
        record_tool().specification().parameters,
        Some(
            json!({"type": "object", "properties": {"event": {"type": "string"}}, "required": ["event"]})
        )
    );
    assert_eq!(
        explode_tool().specification().parameters,
        Some(json!({"type": "object", "properties": {}}))
    );
}

#[tokio::test]
async fn generated_executors_read_arguments_and_write_results() {
    let context = InvocationContext::new().with_attribute("user_id", "u-7");
    let run = |tool: Tool, arguments: &str| {
        let context = context.clone();
        let arguments = arguments.to_owned();
        async move { tool.execute(arguments, context).await }
    };
    let outcome = run(weather_tool(), r#"{"city": "Paris"}"#).await;
    assert_eq!(outcome.text, "sunny in Paris (C) for u-7");
    assert!(!outcome.is_error);
    let outcome = run(weather_tool(), r#"{"city": "Oslo", "celsius": false}"#).await;
    assert_eq!(outcome.text, "sunny in Oslo (F) for u-7");

    let calculator = Arc::new(Calculator).into_tools();
    let sqrt = run(calculator[2].clone(), r#"{"x": 10}"#).await;
    assert_eq!(sqrt.text, "3.1622776601683795");
    let length = run(calculator[0].clone(), "{\n \"s\": \"hello\"\n}").await;
    assert_eq!(length.text, "5");

    assert_eq!(run(divide_tool(), r#"{"a": 1, "b": 4}"#).await.text, "0.25");
    let failed = run(divide_tool(), r#"{"a": 1, "b": 0}"#).await;
    assert_eq!(failed.text, "Error: division by zero");
    assert!(failed.is_error);
    assert_eq!(
        run(record_tool(), r#"{"event": "x"}"#).await.text,
        "Success"
    );
    assert_eq!(
        run(slow_echo_tool(), r#"{"text": "hi", "millis": 1}"#)
            .await
            .text,
        "hi"
    );

    let missing = run(weather_tool(), "{}").await;
    assert_eq!(missing.text, "Error: invalid tool arguments: city: missing");
    let wrong_type = run(calculator[1].clone(), r#"{"a": "five", "b": 5}"#).await;
    assert!(
        wrong_type
            .text
            .starts_with("Error: invalid tool arguments: a: invalid type: string \"five\""),
        "{}",
        wrong_type.text
    );
    let not_json = run(calculator[1].clone(), "{a: 5").await;
    assert!(not_json
        .text
        .starts_with("Error: invalid tool arguments: not JSON"));
    let panicked = run(explode_tool(), "").await;
    assert_eq!(panicked.text, "Error: the tool panicked: boom");
    assert!(panicked.is_error);
}

#[test]
fn a_duplicate_tool_name_fails_the_build() {
    let error = Agent::builder(Arc::new(MockChatModel::answering("x")))
        .tool_box(Arc::new(Calculator))
        .tool(weather_tool())
        .tool(Tool::blocking(ToolSpecification::new("add"), |_, _| {
            Ok("0".into())
        }))
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "duplicate tool name 'add': tools[1] and tools[4] have it"
    );
    let error = Agent::builder(Arc::new(MockChatModel::answering("x")))
        .max_rounds(0)
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid agent configuration: max_rounds: must be at least 1"
    );
    let error = Agent::builder(Arc::new(MockChatModel::answering("x")))
        .temperature(-1.0)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("temperature"), "{error}");
}

// ---------------------------------------------------------------------------------------------------------------
// The loop

fn calls(calls: &[(&str, &str, &str)]) -> ChatResponse {
    ChatResponse::new(AssistantMessage {
        text: None,
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall::new(Some(id), *name, *args))
            .collect(),
    })
}

/// A model that gives the scripted responses in order, one per call, and fails when they run out.
fn scripted(responses: Vec<ChatResponse>) -> MockChatModel {
    let responses = Mutex::new(responses.into_iter());
    MockChatModel::answers(move |_| {
        responses
            .lock()
            .unwrap()
            .next()
            .ok_or_else(|| ChatModelError::model("the script has ended"))
    })
}

const QUESTION: &str =
    "What is the square root of the sum of the numbers of letters in the words \"hello\" and \"world\"";
const ANSWER: &str = "The square root of the sum of the numbers of letters in the words \"hello\" and \"world\" is approximately 3.162.";

#[tokio::test]
async fn the_calculator_conversation_of_the_tutorial() {
    let model = Arc::new(scripted(vec![
        calls(&[("c1", "stringLength", "{\n \"s\": \"hello\"\n}")]),
        calls(&[("c2", "stringLength", "{\n \"s\": \"world\"\n}")]),
        calls(&[("c3", "add", "{\n \"a\": 5,\n \"b\": 5\n}")]),
        calls(&[("c4", "sqrt", "{\n \"x\": 10\n}")]),
        ChatResponse::text(ANSWER),
    ]));
    let agent = Agent::builder(model.clone())
        .tool_box(Arc::new(Calculator))
        .temperature(1.0)
        .top_p(1.0)
        .build()
        .unwrap();
    let response = agent.chat(AgentRequest::new(QUESTION)).await.unwrap();
    assert_eq!(response.text, ANSWER);
    assert_eq!(response.rounds.len(), 5);
    let results: Vec<_> = response
        .tool_executions()
        .map(|e| e.outcome.text.as_str())
        .collect();
    assert_eq!(results, ["5", "5", "10", "3.1622776601683795"]);

    // Every request carries the whole history so far and all three tools.
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(request.messages().len(), 1 + 2 * i, "request {i}");
        let names: Vec<_> = request.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["stringLength", "add", "sqrt"]);
        assert_eq!(request.temperature(), Some(1.0));
    }
    let last = &requests[4];
    assert_eq!(last.messages()[0], ChatMessage::user(QUESTION));
    assert_eq!(
        last.messages()[7],
        ChatMessage::tool_calls(vec![ToolCall::new(Some("c4"), "sqrt", "{\n \"x\": 10\n}")])
    );
    assert_eq!(
        last.messages()[8],
        ChatMessage::tool_result(Some("c4"), Some("sqrt"), "3.1622776601683795")
    );
    assert_eq!(
        response.messages.len(),
        10,
        "user + 4 × (call, result) + answer"
    );
}

#[tokio::test]
async fn parallel_calls_run_concurrently_and_answer_in_call_order() {
    // Each tool waits for the other to have started: run one after the other, the first would time out.
    let (to_b, from_a) = std_mpsc::channel::<()>();
    let (to_a, from_b) = std_mpsc::channel::<()>();
    let from_a = Mutex::new(from_a);
    let from_b = Mutex::new(from_b);
    let a = Tool::blocking(ToolSpecification::new("a"), move |_, _| {
        to_b.send(()).unwrap();
        from_b
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| ToolExecutionError::failed("b never started"))?;
        Ok("from a".into())
    });
    let b = Tool::blocking(ToolSpecification::new("b"), move |_, _| {
        to_a.send(()).unwrap();
        from_a
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| ToolExecutionError::failed("a never started"))?;
        Ok("from b".into())
    });
    let model = Arc::new(scripted(vec![
        calls(&[
            ("1", "slow_echo", r#"{"text": "slow", "millis": 300}"#),
            ("2", "a", "{}"),
            ("3", "slow_echo", r#"{"text": "fast", "millis": 1}"#),
            ("4", "b", "{}"),
        ]),
        ChatResponse::text("done"),
    ]));
    let agent = Agent::builder(model.clone())
        .tools([slow_echo_tool(), a, b])
        .build()
        .unwrap();
    let response = agent.chat(AgentRequest::new("go")).await.unwrap();
    let last = model.requests().pop().unwrap();
    let results: Vec<_> = last.messages()[2..]
        .iter()
        .map(|m| match m {
            ChatMessage::ToolResult(r) => (r.tool_call_id.clone().unwrap(), r.text.clone()),
            other => panic!("not a tool result: {other:?}"),
        })
        .collect();
    assert_eq!(
        results,
        [
            ("1".to_owned(), "slow".to_owned()),
            ("2".to_owned(), "from a".to_owned()),
            ("3".to_owned(), "fast".to_owned()),
            ("4".to_owned(), "from b".to_owned()),
        ]
    );
    assert!(response.tool_executions().all(|e| !e.outcome.is_error));
}

#[tokio::test]
async fn errors_panics_and_unknown_tools_go_back_to_the_llm() {
    let model = Arc::new(scripted(vec![
        calls(&[
            ("1", "divide", r#"{"a": 1, "b": 0}"#),
            ("2", "explode", "{}"),
            ("3", "teleport", "{}"),
            ("4", "divide", r#"{"a": 1}"#),
        ]),
        ChatResponse::text("I could not compute it."),
    ]));
    let agent = Agent::builder(model.clone())
        .tools([divide_tool(), explode_tool()])
        .build()
        .unwrap();
    let response = agent.chat(AgentRequest::new("1/0?")).await.unwrap();
    assert_eq!(response.text, "I could not compute it.");
    let texts: Vec<_> = model.requests()[1].messages()[2..]
        .iter()
        .map(ChatMessage::text)
        .collect();
    assert_eq!(
        texts,
        [
            "Error: division by zero",
            "Error: the tool panicked: boom",
            "Error: there is no tool named 'teleport'; the tools are: divide, explode",
            "Error: invalid tool arguments: b: missing",
        ]
    );
    assert!(response.tool_executions().all(|e| e.outcome.is_error));
}

#[tokio::test]
async fn the_loop_stops_after_max_rounds() {
    let model = Arc::new(MockChatModel::answers(|_| {
        Ok(calls(&[("x", "record", r#"{"event": "again"}"#)]))
    }));
    let agent = Agent::builder(model.clone())
        .tool(record_tool())
        .max_rounds(3)
        .build()
        .unwrap();
    let error = agent.chat(AgentRequest::new("loop")).await.unwrap_err();
    assert!(matches!(
        error,
        AgentError::MaxRoundsReached { max_rounds: 3, .. }
    ));
    assert_eq!(
        error.to_string(),
        "the LLM still called tools after 3 rounds (last: record); raise max_rounds or check the tools"
    );
    assert_eq!(model.call_count(), 3);
}

#[tokio::test(flavor = "current_thread")]
async fn the_context_reaches_a_sync_tool_on_the_blocking_pool() {
    // On a current-thread runtime every task runs on this thread; only the blocking pool runs elsewhere.
    let runtime_thread = std::thread::current().id();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let probe = Tool::blocking(ToolSpecification::new("probe"), move |_, context| {
        recorded.lock().unwrap().push((
            std::thread::current().id(),
            context.attribute("tenant").cloned(),
            context.chat_memory_id.clone(),
        ));
        Ok("ok".into())
    });
    let model = Arc::new(scripted(vec![
        calls(&[
            ("1", "probe", "{}"),
            ("2", "weather", r#"{"city": "Rome"}"#),
        ]),
        ChatResponse::text("done"),
    ]));
    let agent = Agent::builder(model.clone())
        .tools([probe, weather_tool()])
        .build()
        .unwrap();
    let context = InvocationContext::new()
        .with_attribute("tenant", "acme")
        .with_attribute("user_id", "ann");
    let response = agent
        .chat(
            AgentRequest::new("probe")
                .memory_id("conv-9")
                .context(context),
        )
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_ne!(seen[0].0, runtime_thread, "ran on the runtime thread");
    assert_eq!(seen[0].1, Some(json!("acme")));
    assert_eq!(seen[0].2.as_deref(), Some("conv-9"));
    let weather = response.tool_executions().nth(1).unwrap();
    assert_eq!(weather.outcome.text, "sunny in Rome (C) for ann");
}

#[tokio::test]
async fn a_model_without_an_async_path_is_called_on_the_blocking_pool() {
    let model = Arc::new(MockChatModel::answering("hello").without_async_support());
    let agent = Agent::builder(model.clone())
        .system_message("Be brief.")
        .build()
        .unwrap();
    let response = agent.chat(AgentRequest::new("hi")).await.unwrap();
    assert_eq!(response.text, "hello");
    assert_eq!(
        model.request().unwrap().messages(),
        [ChatMessage::system("Be brief."), ChatMessage::user("hi")]
    );
    assert!(response.rounds[0].tools.is_empty());
}

// ---------------------------------------------------------------------------------------------------------------
// Memory

#[test]
fn eviction_never_orphans_a_tool_result() {
    let turn = vec![
        ChatMessage::system("s"),
        ChatMessage::user("q1"),
        ChatMessage::tool_calls(vec![
            ToolCall::new(Some("1"), "a", "{}"),
            ToolCall::new(Some("2"), "b", "{}"),
        ]),
        ChatMessage::tool_result(Some("1"), Some("a"), "ra"),
        ChatMessage::tool_result(Some("2"), Some("b"), "rb"),
        ChatMessage::assistant("answer 1"),
        ChatMessage::user("q2"),
    ];
    for max in 3..=turn.len() {
        let mut messages = turn.clone();
        evict(&mut messages, max);
        assert!(messages.len() <= max, "{max}");
        assert_eq!(messages[0], ChatMessage::system("s"), "{max}");
        // Every tool result follows the assistant message that called it.
        for (i, message) in messages.iter().enumerate() {
            if let ChatMessage::ToolResult(result) = message {
                let caller = messages[..i].iter().rev().find_map(|m| match m {
                    ChatMessage::Assistant(a) if !a.tool_calls.is_empty() => Some(a),
                    _ => None,
                });
                let caller =
                    caller.unwrap_or_else(|| panic!("orphan with max {max}: {messages:?}"));
                assert!(caller
                    .tool_calls
                    .iter()
                    .any(|c| c.id == result.tool_call_id));
            }
        }
        assert_eq!(messages.last(), Some(&ChatMessage::user("q2")));
    }
    // With 5: evicting q1 leaves the call and both results, 6 messages; the call goes with its results.
    let mut messages = turn.clone();
    evict(&mut messages, 5);
    assert_eq!(
        messages,
        [
            ChatMessage::system("s"),
            ChatMessage::assistant("answer 1"),
            ChatMessage::user("q2")
        ]
    );
}

#[tokio::test]
async fn memory_keeps_a_window_per_conversation() {
    assert!(MessageWindowChatMemory::new(2).is_none(), "below 3");
    let store = Arc::new(InMemoryChatMemoryStore::new());
    let memory = MessageWindowChatMemory::with_store(4, store.clone()).unwrap();
    let model = Arc::new(MockChatModel::answers(|request| {
        Ok(ChatResponse::text(format!(
            "seen {}",
            request.messages().len()
        )))
    }));
    let agent = Agent::builder(model.clone())
        .system_message("sys")
        .chat_memory(memory.clone())
        .build()
        .unwrap();
    for text in ["one", "two", "three"] {
        agent
            .chat(AgentRequest::new(text).memory_id("ann"))
            .await
            .unwrap();
    }
    agent
        .chat(AgentRequest::new("hello").memory_id("bob"))
        .await
        .unwrap();
    let requests = model.requests();
    let lens: Vec<_> = requests.iter().map(|r| r.messages().len()).collect();
    assert_eq!(
        lens,
        [2, 4, 4, 2],
        "the window holds 4, the system message included"
    );
    assert_eq!(
        memory.messages("ann").unwrap(),
        [
            ChatMessage::system("sys"),
            ChatMessage::assistant("seen 4"),
            ChatMessage::user("three"),
            ChatMessage::assistant("seen 4"),
        ]
    );
    assert_eq!(memory.messages("bob").unwrap().len(), 3);
    memory.clear("ann").unwrap();
    assert!(memory.messages("ann").unwrap().is_empty());
}

/// A store of its own: records every write, and fails for one conversation id.
#[derive(Default)]
struct RecordingStore {
    inner: InMemoryChatMemoryStore,
    writes: Mutex<Vec<(String, usize)>>,
}

impl crate::ChatMemoryStore for RecordingStore {
    fn get_messages(&self, memory_id: &str) -> Result<Vec<ChatMessage>, crate::MemoryError> {
        if memory_id == "broken" {
            return Err(crate::MemoryError::message("the database is down"));
        }
        self.inner.get_messages(memory_id)
    }

    fn update_messages(
        &self,
        memory_id: &str,
        messages: Vec<ChatMessage>,
    ) -> Result<(), crate::MemoryError> {
        self.writes
            .lock()
            .unwrap()
            .push((memory_id.to_owned(), messages.len()));
        self.inner.update_messages(memory_id, messages)
    }

    fn delete_messages(&self, memory_id: &str) -> Result<(), crate::MemoryError> {
        self.inner.delete_messages(memory_id)
    }
}

#[tokio::test]
async fn the_memory_store_is_pluggable_and_its_errors_surface() {
    let store = Arc::new(RecordingStore::default());
    let memory = MessageWindowChatMemory::with_store(10, store.clone()).unwrap();
    let agent = Agent::builder(Arc::new(MockChatModel::answering("ok")))
        .chat_memory(memory)
        .build()
        .unwrap();
    agent
        .chat(AgentRequest::new("hi").memory_id("ann"))
        .await
        .unwrap();
    assert_eq!(
        *store.writes.lock().unwrap(),
        [("ann".to_owned(), 1), ("ann".to_owned(), 2)]
    );
    // The memory id comes from the context when the request names none.
    let context = InvocationContext::new().with_chat_memory_id("bob");
    agent
        .chat(AgentRequest::new("hi").context(context))
        .await
        .unwrap();
    assert_eq!(store.writes.lock().unwrap()[2].0, "bob");
    let error = agent
        .chat(AgentRequest::new("hi").memory_id("broken"))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "chat memory store: the database is down");
}

#[tokio::test]
async fn a_small_window_drops_a_finished_tool_round_whole() {
    let memory = MessageWindowChatMemory::new(3).unwrap();
    let model = Arc::new(scripted(vec![
        calls(&[("1", "record", r#"{"event": "e"}"#)]),
        ChatResponse::text("recorded"),
        ChatResponse::text("bye"),
    ]));
    let agent = Agent::builder(model.clone())
        .tool(record_tool())
        .chat_memory(memory.clone())
        .build()
        .unwrap();
    agent.chat(AgentRequest::new("record e")).await.unwrap();
    // The result was sent with its call.
    assert_eq!(
        model.requests()[1].messages()[1..],
        [
            ChatMessage::tool_calls(vec![ToolCall::new(
                Some("1"),
                "record",
                r#"{"event": "e"}"#
            )]),
            ChatMessage::tool_result(Some("1"), Some("record"), "Success"),
        ]
    );
    agent.chat(AgentRequest::new("bye")).await.unwrap();
    let sent = model.requests()[2].messages().to_vec();
    assert_eq!(
        sent,
        [ChatMessage::assistant("recorded"), ChatMessage::user("bye")]
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Tool providers: static, dynamic, the filter

struct CountingProvider {
    dynamic: bool,
    asked: AtomicUsize,
    seen: Mutex<Vec<usize>>,
}

impl ToolProvider for CountingProvider {
    fn provide_tools(
        &self,
        request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.seen
            .lock()
            .unwrap()
            .push(request.messages().map_or(0, <[_]>::len));
        let spec = ToolSpecification::new("provided").with_description("A provided tool");
        let executor = Arc::new(|_: &str, _: &InvocationContext| Ok("provided result".to_owned()));
        Ok(ToolProviderResult::new(vec![
            ProvidedTool::new(spec).with_executor(executor),
            ProvidedTool::new(ToolSpecification::new("no_executor")),
        ]))
    }

    fn is_dynamic(&self) -> bool {
        self.dynamic
    }
}

#[tokio::test]
async fn a_static_provider_is_asked_once_a_dynamic_one_every_call() {
    for dynamic in [false, true] {
        let provider = Arc::new(CountingProvider {
            dynamic,
            asked: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let model = Arc::new(scripted(vec![
            calls(&[("1", "provided", "{}")]),
            calls(&[("2", "record", r#"{"event": "e"}"#)]),
            ChatResponse::text("done"),
        ]));
        let agent = Agent::builder(model.clone())
            .tool(record_tool())
            .tool_provider(provider.clone())
            .build()
            .unwrap();
        let response = agent.chat(AgentRequest::new("go")).await.unwrap();
        assert_eq!(
            response.tool_executions().next().unwrap().outcome.text,
            "provided result"
        );
        let expected_asks = if dynamic { 3 } else { 1 };
        assert_eq!(provider.asked.load(Ordering::SeqCst), expected_asks);
        let expected_seen: &[usize] = if dynamic { &[1, 3, 5] } else { &[1] };
        assert_eq!(*provider.seen.lock().unwrap(), expected_seen);
        for round in &response.rounds {
            // The agent's own tool first, then the provider's; a tool without an executor is not sent.
            assert_eq!(round.tools, ["record", "provided"]);
        }
    }
}

#[tokio::test]
async fn a_provider_tool_with_the_name_of_an_agent_tool_is_an_error() {
    let provider =
        StaticToolProvider::new(vec![ProvidedTool::new(ToolSpecification::new("record"))
            .with_executor(Arc::new(|_: &str, _: &InvocationContext| Ok(String::new())))]);
    let agent = Agent::builder(Arc::new(MockChatModel::answering("x")))
        .tool(record_tool())
        .tool_provider(Arc::new(provider))
        .build()
        .unwrap();
    let error = agent.chat(AgentRequest::new("x")).await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("duplicate tool name 'record'"),
        "{error}"
    );
}

fn provided(name: &str, description: &str, result: &'static str) -> ProvidedTool {
    ProvidedTool::new(ToolSpecification::new(name).with_description(description)).with_executor(
        Arc::new(move |_: &str, _: &InvocationContext| Ok(result.to_owned())),
    )
}

#[tokio::test]
async fn the_filtering_provider_plugs_in_unchanged() {
    use decide_contract::MockDecisionModel;
    use decide_filter::FilteringToolProvider;

    let tools = StaticToolProvider::new(vec![
        provided("send_email", "Send an email", "sent"),
        provided("get_weather", "Current weather for a city", "rain"),
        provided("create_invoice", "Create an invoice", "created"),
        divide_tool().into_provided().unwrap(),
    ]);
    assert!(
        slow_echo_tool().into_provided().is_none(),
        "async tools have no provider form"
    );
    let decisions = Arc::new(MockDecisionModel::answers_yes_no(|q| match q.candidate() {
        Some(c) if c.name == "get_weather" => 0.9,
        _ => 0.1,
    }));
    let filter = FilteringToolProvider::builder()
        .tool_provider(Arc::new(tools))
        .decision_model(decisions.clone())
        .build()
        .unwrap();
    let model = Arc::new(scripted(vec![
        calls(&[("1", "get_weather", r#"{"city": "Paris"}"#)]),
        ChatResponse::text("It rains in Paris."),
    ]));
    let agent = Agent::builder(model.clone())
        .tool(record_tool())
        .tool_provider(Arc::new(filter))
        .build()
        .unwrap();
    let response = agent
        .chat(AgentRequest::new("Will it rain in Paris?"))
        .await
        .unwrap();
    assert_eq!(response.text, "It rains in Paris.");
    for request in model.requests() {
        let names: Vec<_> = request.tools().iter().map(|t| t.name.as_str()).collect();
        // The agent's own tool is never filtered; of the provider's, only the relevant one passes.
        assert_eq!(names, ["record", "get_weather"]);
    }
    assert_eq!(
        response.tool_executions().next().unwrap().outcome.text,
        "rain"
    );
    // A static wrapped provider makes a static filter: one decision for the whole turn.
    assert_eq!(decisions.requests().len(), 1);
}

#[tokio::test]
async fn the_routing_chat_model_plugs_in_unchanged() {
    use decide_contract::{ChoiceAnswer, MockDecisionModel};
    use decide_router::{DecisionModelChatModelRouter, RoutingChatModel, ROUTE_ATTRIBUTE};

    let small = Arc::new(MockChatModel::answering("Hi!"));
    let large = Arc::new(scripted(vec![
        calls(&[("r1", "divide", r#"{"a": 10, "b": 4}"#)]),
        ChatResponse::text("10/4 is 2.5"),
    ]));
    let decisions = Arc::new(MockDecisionModel::always_answers([(
        "route",
        ChoiceAnswer::from_probabilities([("simple", 0.2), ("complex", 0.8)]).unwrap(),
    )]));
    let router = RoutingChatModel::builder()
        .route("simple", "Greetings", small.clone())
        .route("complex", "Arithmetic and reasoning", large.clone())
        .router(Arc::new(DecisionModelChatModelRouter::new(
            decisions.clone(),
        )))
        .default_route("simple")
        .build()
        .unwrap();
    let agent = Agent::builder(Arc::new(router))
        .tool(divide_tool())
        .build()
        .unwrap();
    let response = agent
        .chat(AgentRequest::new("What is 10/4?"))
        .await
        .unwrap();
    assert_eq!(response.text, "10/4 is 2.5");
    assert_eq!((small.call_count(), large.call_count()), (0, 2));
    for round in &response.rounds {
        assert_eq!(
            round.response.attribute(ROUTE_ATTRIBUTE),
            Some(&json!("complex"))
        );
    }
    // The tool results went back to the route that called the tool, without a second decision.
    assert_eq!(decisions.requests().len(), 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Streaming

/// Streams each scripted response: its text in pieces of 3 characters, then the response.
struct ScriptedStream {
    responses: Mutex<std::vec::IntoIter<ChatResponse>>,
    requests: Mutex<Vec<ChatRequest>>,
}

impl StreamingChatModel for ScriptedStream {
    fn chat_stream(&self, request: ChatRequest) -> ChatStream {
        self.requests.lock().unwrap().push(request);
        let Some(response) = self.responses.lock().unwrap().next() else {
            return Box::pin(futures_util::stream::iter([Err(ChatModelError::model(
                "the script has ended",
            ))]));
        };
        let text: Vec<char> = response
            .message
            .text
            .clone()
            .unwrap_or_default()
            .chars()
            .collect();
        let mut events: Vec<_> = text
            .chunks(3)
            .map(|piece| Ok(ChatStreamEvent::Token(piece.iter().collect())))
            .collect();
        events.push(Ok(ChatStreamEvent::Response(response)));
        Box::pin(futures_util::stream::iter(events))
    }
}

#[tokio::test]
async fn streaming_sends_tokens_executes_streamed_tool_calls_and_ends_with_the_response() {
    let streaming = Arc::new(ScriptedStream {
        responses: Mutex::new(
            vec![
                calls(&[("1", "divide", r#"{"a": 9, "b": 3}"#)]),
                ChatResponse::text("9/3 is 3."),
            ]
            .into_iter(),
        ),
        requests: Mutex::new(Vec::new()),
    });
    let unused = Arc::new(MockChatModel::always_fails_with("not streaming"));
    let agent = Agent::builder(unused.clone())
        .streaming_chat_model(streaming.clone())
        .tool(divide_tool())
        .build()
        .unwrap();
    let events: Vec<_> = agent
        .chat_stream(AgentRequest::new("9/3?"))
        .map(Result::unwrap)
        .collect()
        .await;
    let tokens: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Token(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, ["9/3", " is", " 3."]);
    assert!(matches!(&events[0], AgentEvent::ToolExecuted(e) if e.outcome.text == "3.0"));
    let AgentEvent::Done(response) = events.last().unwrap() else {
        panic!("not done last: {events:?}");
    };
    assert_eq!(response.text, "9/3 is 3.");
    assert_eq!(unused.call_count(), 0);
    assert_eq!(streaming.requests.lock().unwrap().len(), 2);

    // Without a streaming model, the answer comes as one token.
    let agent = Agent::builder(Arc::new(MockChatModel::answering("whole")))
        .build()
        .unwrap();
    let events: Vec<_> = agent.chat_stream(AgentRequest::new("x")).collect().await;
    assert_eq!(events.len(), 2);
    assert!(matches!(&events[0], Ok(AgentEvent::Token(t)) if t == "whole"));

    // A failing model ends the stream with its error.
    let agent = Agent::builder(Arc::new(MockChatModel::always_fails_with("down")))
        .build()
        .unwrap();
    let events: Vec<_> = agent.chat_stream(AgentRequest::new("x")).collect().await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].as_ref().unwrap_err().to_string(),
        "chat model: down"
    );
}
