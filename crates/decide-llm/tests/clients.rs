//! The clients against a scripted server on loopback: the recorded transcripts of LangChain4j's calculator
//! (OpenAI) and LangChain's dog and cat experts (Ollama) replayed request by request, streaming, retries, timeouts and errors.

mod fake;

use std::sync::Arc;
use std::time::Duration;

use decide_agent::{tool, tools, Agent, AgentEvent, AgentRequest, StreamingChatModel};
use decide_chat::{ChatMessage, ChatModel, ChatRequest, ChatTokenUsage};
use decide_llm::{LlmError, OllamaChatModel, OpenAiChatModel, FINISH_REASON_ATTRIBUTE};
use fake::{FakeServer, Reply};
use futures_util::StreamExt;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------------------------
// The calculator of LangChain4j's agent tutorial, over the OpenAI API

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
    fn sqrt(&self, x: i32) -> f64 {
        f64::from(x).sqrt()
    }
}

const QUESTION: &str = "What is the square root of the sum of the numbers of letters in the words \"hello\" and \"world\"";

/// The tutorial's last recorded request, as its transcript shows it (legacy `functions` format). The earlier requests are
/// its prefixes: the user message, then one more call and result per round.
fn calculator_last_request() -> Value {
    json!({
      "model": "gpt-3.5-turbo",
      "messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": null, "function_call": {"name": "stringLength", "arguments": "{\n \"s\": \"hello\"\n}"}},
        {"role": "function", "content": "5", "name": "stringLength"},
        {"role": "assistant", "content": null, "function_call": {"name": "stringLength", "arguments": "{\n \"s\": \"world\"\n}"}},
        {"role": "function", "content": "5", "name": "stringLength"},
        {"role": "assistant", "content": null, "function_call": {"name": "add", "arguments": "{\n \"a\": 5,\n \"b\": 5\n}"}},
        {"role": "function", "content": "10", "name": "add"},
        {"role": "assistant", "content": null, "function_call": {"name": "sqrt", "arguments": "{\n \"x\": 10\n}"}},
        {"role": "function", "content": "3.1622776601683795", "name": "sqrt"}
      ],
      "temperature": 1.0,
      "top_p": 1.0,
      "presence_penalty": 0.0,
      "frequency_penalty": 0.0,
      "functions": [
        {"name": "stringLength", "description": "Calculates the length of a string",
         "parameters": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}},
        {"name": "add", "description": "Calculates the sum of two numbers",
         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}},
        {"name": "sqrt", "description": "Calculates the square root of a number",
         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}
      ]
    })
}

/// The tutorial's five recorded responses (legacy format), in order.
fn calculator_responses() -> Vec<Value> {
    let call = |name: &str, arguments: &str, prompt: u64, completion: u64| {
        json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1700030623, "model": "gpt-3.5-turbo-0613",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                            "function_call": {"name": name, "arguments": arguments}}, "finish_reason": "function_call"}],
               "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
    };
    vec![
        call("stringLength", "{\n \"s\": \"hello\"\n}", 118, 15),
        call("stringLength", "{\n \"s\": \"world\"\n}", 142, 15),
        call("add", "{\n \"a\": 5,\n \"b\": 5\n}", 166, 21),
        call("sqrt", "{\n \"x\": 10\n}", 195, 14),
        json!({"id": "chatcmpl-y", "object": "chat.completion", "created": 1700030635, "model": "gpt-3.5-turbo-0613",
               "choices": [{"index": 0, "message": {"role": "assistant",
                 "content": "The square root of the sum of the numbers of letters in the words \"hello\" and \"world\" is approximately 3.162."},
                 "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 224, "completion_tokens": 29, "total_tokens": 253}}),
    ]
}

/// A legacy request in today's wire format: `function_call` becomes `tool_calls` with the id `call_<n>`, a
/// `function` result becomes a `tool` message answering that id, `functions` becomes `tools`.
fn modern_request(legacy: &Value) -> Value {
    let mut request = legacy.clone();
    let mut calls = 0;
    let messages: Vec<Value> = legacy["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| match message["role"].as_str() {
            Some("assistant") if message.get("function_call").is_some() => {
                calls += 1;
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{calls}"), "type": "function", "function": message["function_call"]}]})
            }
            Some("function") => {
                json!({"role": "tool", "tool_call_id": format!("call_{calls}"), "content": message["content"]})
            }
            _ => message.clone(),
        })
        .collect();
    request["messages"] = json!(messages);
    let functions = request
        .as_object_mut()
        .unwrap()
        .remove("functions")
        .unwrap();
    let tools: Vec<Value> = functions
        .as_array()
        .unwrap()
        .iter()
        .map(|f| json!({"type": "function", "function": f}))
        .collect();
    request["tools"] = json!(tools);
    request
}

/// A legacy response in today's wire format: the call gets the id `call_<round>`.
fn modern_response(legacy: &Value, round: usize) -> Value {
    let mut response = legacy.clone();
    let choice = &mut response["choices"][0];
    if let Some(call) = choice["message"]
        .as_object_mut()
        .unwrap()
        .remove("function_call")
    {
        choice["message"]["tool_calls"] =
            json!([{"id": format!("call_{round}"), "type": "function", "function": call}]);
        choice["finish_reason"] = json!("tool_calls");
    }
    response
}

#[tokio::test]
async fn calculator_is_replayed_request_by_request() {
    let replies = calculator_responses()
        .iter()
        .enumerate()
        .map(|(i, r)| Reply::Json(200, modern_response(r, i + 1)))
        .collect();
    let server = FakeServer::start(replies).await;
    let model = OpenAiChatModel::builder(&server.url, "gpt-3.5-turbo")
        .api_key("sk-test")
        .parameter("presence_penalty", 0.0)
        .parameter("frequency_penalty", 0.0)
        .build()
        .unwrap();
    let agent = Agent::builder(Arc::new(model))
        .tool_box(Arc::new(Calculator))
        .temperature(1.0)
        .top_p(1.0)
        .build()
        .unwrap();
    let response = agent.chat(AgentRequest::new(QUESTION)).await.unwrap();
    assert_eq!(
        response.text,
        "The square root of the sum of the numbers of letters in the words \"hello\" and \"world\" is approximately 3.162."
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 5);
    let last = modern_request(&calculator_last_request());
    for (round, request) in requests.iter().enumerate() {
        let mut expected = last.clone();
        expected["messages"] = json!(last["messages"].as_array().unwrap()[..1 + 2 * round]);
        assert_eq!(request.body, expected, "request {}", round + 1);
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/chat/completions");
        assert_eq!(request.header("authorization"), Some("Bearer sk-test"));
        assert_eq!(request.header("content-type"), Some("application/json"));
    }
    let usage = response.response().unwrap().token_usage;
    assert_eq!(usage, Some(ChatTokenUsage::new(224, 29)));
    assert_eq!(
        response.response().unwrap().model_name.as_deref(),
        Some("gpt-3.5-turbo-0613")
    );
}

#[test]
fn the_modern_format_helpers_are_right() {
    // The helpers the replay relies on, checked on the first turn by hand.
    let modern = modern_request(&calculator_last_request());
    assert_eq!(
        modern["messages"][1],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
               "function": {"name": "stringLength", "arguments": "{\n \"s\": \"hello\"\n}"}}]})
    );
    assert_eq!(
        modern["messages"][8],
        json!({"role": "tool", "tool_call_id": "call_4", "content": "3.1622776601683795"})
    );
    assert_eq!(modern["tools"][2]["function"]["name"], json!("sqrt"));
    assert!(modern.get("functions").is_none());
}

// ---------------------------------------------------------------------------------------------------------------
// OpenAI streaming

fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    .to_string()
}

#[tokio::test]
async fn openai_streams_tokens_then_the_response() {
    let server = FakeServer::start(vec![Reply::Sse(vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "The"}), None),
        chunk(json!({"content": " answer"}), None),
        chunk(json!({"content": " is 42."}), None),
        chunk(json!({}), Some("stop")),
        json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
            .to_string(),
        "[DONE]".to_owned(),
    ])])
    .await;
    let model = OpenAiChatModel::builder(&server.url, "m").build().unwrap();
    let events: Vec<_> = model
        .chat_stream(ChatRequest::user("question"))
        .map(Result::unwrap)
        .collect()
        .await;
    let tokens: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            decide_agent::ChatStreamEvent::Token(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, ["The", " answer", " is 42."]);
    let Some(decide_agent::ChatStreamEvent::Response(response)) = events.last() else {
        panic!("no response last");
    };
    assert_eq!(response.message.text.as_deref(), Some("The answer is 42."));
    assert_eq!(response.token_usage, Some(ChatTokenUsage::new(9, 4)));
    assert_eq!(
        response.attribute(FINISH_REASON_ATTRIBUTE),
        Some(&json!("stop"))
    );
    assert_eq!(
        server.bodies()[0],
        json!({"model": "m", "messages": [{"role": "user", "content": "question"}],
               "stream": true, "stream_options": {"include_usage": true}})
    );
}

#[tokio::test]
async fn the_agent_executes_tool_calls_that_arrive_in_a_stream() {
    let calls = |delta: Value| chunk(json!({"tool_calls": [delta]}), None);
    let server = FakeServer::start(vec![
        Reply::Sse(vec![
            chunk(json!({"role": "assistant", "content": null}), None),
            calls(json!({"index": 0, "id": "call_a", "type": "function", "function": {"name": "stringLength", "arguments": ""}})),
            calls(json!({"index": 0, "function": {"arguments": "{\"s\": \"hel"}})),
            calls(json!({"index": 1, "id": "call_b", "type": "function", "function": {"name": "stringLength", "arguments": "{\"s\":"}})),
            calls(json!({"index": 0, "function": {"arguments": "lo\"}"}})),
            calls(json!({"index": 1, "function": {"arguments": " \"world\"}"}})),
            chunk(json!({}), Some("tool_calls")),
            "[DONE]".to_owned(),
        ]),
        Reply::Sse(vec![
            chunk(json!({"content": "Both"}), None),
            chunk(json!({"content": " have 5."}), Some("stop")),
            "[DONE]".to_owned(),
        ]),
    ])
    .await;
    let model = Arc::new(OpenAiChatModel::builder(&server.url, "m").build().unwrap());
    let agent = Agent::builder(model.clone())
        .streaming_chat_model(model)
        .tool_box(Arc::new(Calculator))
        .build()
        .unwrap();
    let events: Vec<_> = agent
        .chat_stream(AgentRequest::new("lengths of hello and world?"))
        .map(Result::unwrap)
        .collect()
        .await;
    let summary: Vec<String> = events
        .iter()
        .map(|e| match e {
            AgentEvent::Token(t) => format!("token {t}"),
            AgentEvent::ToolExecuted(x) => {
                format!("tool {} {}", x.call.id.as_deref().unwrap(), x.outcome.text)
            }
            AgentEvent::Done(r) => format!("done {}", r.text),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "tool call_a 5",
            "tool call_b 5",
            "token Both",
            "token  have 5.",
            "done Both have 5."
        ]
    );
    let second = &server.bodies()[1];
    assert_eq!(
        second["messages"][1],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "stringLength", "arguments": "{\"s\": \"hello\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "stringLength", "arguments": "{\"s\": \"world\"}"}}]})
    );
    assert_eq!(
        second["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_a", "content": "5"})
    );
    assert_eq!(
        second["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_b", "content": "5"})
    );
    assert_eq!(second["stream"], json!(true));
}

// ---------------------------------------------------------------------------------------------------------------
// Retries, timeouts, errors, the synchronous path

fn answer(text: &str) -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
}

fn quick(url: &str) -> decide_llm::OpenAiChatModelBuilder {
    OpenAiChatModel::builder(url, "m").retry_backoff(Duration::from_millis(1))
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_are_not() {
    let server = FakeServer::start(vec![
        Reply::Json(503, json!({"error": {"message": "overloaded"}})),
        Reply::Json(200, answer("fine")),
    ])
    .await;
    let model = quick(&server.url).build().unwrap();
    let response = model.chat_async(ChatRequest::user("x")).await.unwrap();
    assert_eq!(response.message.text.as_deref(), Some("fine"));
    assert_eq!(server.requests().len(), 2);

    let server = FakeServer::start(vec![
        Reply::Json(429, json!({"error": {"message": "slow down"}})),
        Reply::Json(429, json!({"error": {"message": "slow down"}})),
    ])
    .await;
    let model = quick(&server.url).max_retries(1).build().unwrap();
    let error = model.chat_async(ChatRequest::user("x")).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("{}/chat/completions: HTTP 429: slow down", server.url)
    );
    assert_eq!(server.requests().len(), 2, "one try and one retry");

    let server = FakeServer::start(vec![Reply::Json(
        400,
        json!({"error": {"message": "Invalid schema for function 'add'"}}),
    )])
    .await;
    let model = quick(&server.url).build().unwrap();
    let error = model.chat_async(ChatRequest::user("x")).await.unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("HTTP 400: Invalid schema for function 'add'"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_silent_server_times_out_and_a_closed_port_is_a_transport_error() {
    let server = FakeServer::start(vec![Reply::Hang]).await;
    let model = quick(&server.url)
        .timeout(Duration::from_millis(200))
        .max_retries(0)
        .build()
        .unwrap();
    let error = model.chat_async(ChatRequest::user("x")).await.unwrap_err();
    let decide_chat::ChatModelError::Model(inner) = &error else {
        panic!("{error:?}")
    };
    assert!(matches!(
        inner.downcast_ref::<LlmError>(),
        Some(LlmError::Timeout { .. })
    ));
    assert_eq!(
        error.to_string(),
        format!("{}/chat/completions: no answer within 200ms", server.url)
    );

    let server = FakeServer::start(vec![Reply::Hang]).await;
    let model = quick(&server.url)
        .timeout(Duration::from_millis(200))
        .max_retries(0)
        .build()
        .unwrap();
    let mut stream = model.chat_stream(ChatRequest::user("x"));
    let first = stream.next().await.unwrap().unwrap_err();
    assert!(
        first.to_string().contains("no answer within 200ms"),
        "{first}"
    );

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let model = quick(&format!("http://127.0.0.1:{port}"))
        .max_retries(0)
        .build()
        .unwrap();
    let error = model.chat_async(ChatRequest::user("x")).await.unwrap_err();
    let decide_chat::ChatModelError::Model(inner) = &error else {
        panic!("{error:?}")
    };
    assert!(
        matches!(
            inner.downcast_ref::<LlmError>(),
            Some(LlmError::Transport { .. })
        ),
        "{error}"
    );
}

#[test]
fn the_synchronous_path_works_outside_and_inside_a_runtime() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(FakeServer::start(vec![
        Reply::Json(200, answer("from a plain thread")),
        Reply::Json(200, answer("from the blocking pool")),
    ]));
    let model = Arc::new(quick(&server.url).build().unwrap());
    let response = model.chat(&ChatRequest::user("x")).unwrap();
    assert_eq!(
        response.message.text.as_deref(),
        Some("from a plain thread")
    );
    let shared = Arc::clone(&model);
    let response = runtime
        .block_on(runtime.spawn_blocking(move || shared.chat(&ChatRequest::user("y"))))
        .unwrap()
        .unwrap();
    assert_eq!(
        response.message.text.as_deref(),
        Some("from the blocking pool")
    );
}

#[tokio::test]
async fn request_parameters_are_sent_only_when_set() {
    let server = FakeServer::start(vec![Reply::Json(200, answer("ok"))]).await;
    let model = OpenAiChatModel::builder(&server.url, "default-model")
        .build()
        .unwrap();
    let request = ChatRequest::builder()
        .message(ChatMessage::system("Be brief."))
        .message(ChatMessage::user("hi"))
        .model_name("other-model")
        .max_output_tokens(50)
        .stop_sequences(["END"])
        .response_format(decide_chat::ResponseFormat::Json)
        .build()
        .unwrap();
    model.chat_async(request).await.unwrap();
    assert_eq!(
        server.bodies()[0],
        json!({"model": "other-model",
               "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
               "max_tokens": 50, "stop": ["END"], "response_format": {"type": "json_object"}})
    );
    assert!(server.requests()[0].header("authorization").is_none());
}

// ---------------------------------------------------------------------------------------------------------------
// LangChain's dog and cat experts example, over Ollama's /api/chat

/// A tool that helps users find information about cats.
#[tool]
fn cat_expert(cat_category: String) -> String {
    format!("I'm here to help you find information about {cat_category} cats.")
}

const HOUNDS: &str = "Hounds are a type of dog that were originally bred for hunting,\n            known for their strong sense of smell and excellent tracking skills.\n            They come in various breeds such as Beagle, Bloodhound, Basset Hound,\n            Dachshund (or Weiner Dog), Coonhound, and Greyhound among others";

/// A tool that helps users find information about dogs.
#[tool]
fn dog_expert(dog_category: String) -> String {
    let _ = dog_category;
    HOUNDS.to_owned()
}

/// The tools of both recorded requests of the example, as its transcript shows them.
fn experts_tools() -> Value {
    json!([{"type": "function", "function": {"name": "cat_expert", "description": "A tool that helps users find information about cats.",
             "parameters": {"properties": {"cat_category": {"type": "string"}}, "required": ["cat_category"], "type": "object"}}},
           {"type": "function", "function": {"name": "dog_expert", "description": "A tool that helps users find information about dogs.",
             "parameters": {"properties": {"dog_category": {"type": "string"}}, "required": ["dog_category"], "type": "object"}}}])
}

/// Drops what LangChain's Python client adds and Ollama does not need: empty `images`, an empty `format`, `options`
/// whose values are all null, a null `keep_alive`.
fn without_langchain_defaults(mut request: Value) -> Value {
    let object = request.as_object_mut().unwrap();
    for message in object["messages"].as_array_mut().unwrap() {
        if message["images"] == json!([]) {
            message.as_object_mut().unwrap().remove("images");
        }
    }
    if object.get("format") == Some(&json!("")) {
        object.remove("format");
    }
    if object
        .get("options")
        .and_then(Value::as_object)
        .is_some_and(|o| o.values().all(Value::is_null))
    {
        object.remove("options");
    }
    if object.get("keep_alive") == Some(&Value::Null) {
        object.remove("keep_alive");
    }
    request
}

#[tokio::test]
async fn experts_is_replayed_request_by_request() {
    let server = FakeServer::start(vec![
        Reply::Json(200, json!({"model": "qwen2.5:14b-instruct-q8_0", "created_at": "2024-11-02T06:55:19.165983569Z",
            "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "dog_expert", "arguments": {"dog_category": "Hound"}}}]},
            "done_reason": "stop", "done": true, "total_duration": 903539694, "load_duration": 12678860,
            "prompt_eval_count": 218, "prompt_eval_duration": 145095000, "eval_count": 23, "eval_duration": 610960000})),
        Reply::Json(200, json!({"model": "qwen2.5:14b-instruct-q8_0", "created_at": "2024-11-02T06:55:22.095858086Z",
            "message": {"role": "assistant", "content": "Hounds are a type of dog that were originally bred for hunting."},
            "done_reason": "stop", "done": true, "prompt_eval_count": 323, "eval_count": 90})),
    ])
    .await;
    let model = OllamaChatModel::builder(&server.url, "qwen2.5:14b-instruct-q8_0")
        .build()
        .unwrap();
    let agent = Agent::builder(Arc::new(model))
        .tools([cat_expert_tool(), dog_expert_tool()])
        .build()
        .unwrap();
    let response = agent
        .chat(AgentRequest::new("tell me about Hound Dogs"))
        .await
        .unwrap();
    assert_eq!(
        response.text,
        "Hounds are a type of dog that were originally bred for hunting."
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.path == "/api/chat"));

    // The first request of the transcript.
    let first = json!({"model": "qwen2.5:14b-instruct-q8_0", "messages": [{"role": "user", "content":
        "tell me about Hound Dogs", "images": []}], "tools": experts_tools(), "stream": false,
        "format": "", "options": {"mirostat": null, "mirostat_eta": null, "mirostat_tau": null, "num_ctx": null,
        "num_gpu": null, "num_thread": null, "num_predict": null, "repeat_last_n": null, "repeat_penalty": null,
        "temperature": null, "seed": null, "stop": null, "tfs_z": null, "top_k": null, "top_p": null},
        "keep_alive": null});
    assert_eq!(requests[0].body, without_langchain_defaults(first));

    // The second: Ollama gave the call no id, so the client made one; the result must refer to it.
    let id = requests[1].body["messages"][1]["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(id.starts_with("call_"));
    let second = json!({"model": "qwen2.5:14b-instruct-q8_0", "messages": [
        {"role": "user", "content": "tell me about Hound Dogs", "images": []},
        {"role": "assistant", "content": "", "images": [], "tool_calls":
            [{"type": "function", "id": id, "function": {"name": "dog_expert", "arguments": {"dog_category": "Hound"}}}]},
        {"role": "tool", "content": HOUNDS, "images": [], "tool_call_id": id}],
        "tools": experts_tools(), "stream": false, "format": ""});
    assert_eq!(requests[1].body, without_langchain_defaults(second));
    assert_eq!(
        response.rounds[0].response.token_usage,
        Some(ChatTokenUsage::new(218, 23))
    );
}

#[tokio::test]
async fn ollama_streams_lines_and_tool_calls() {
    let line = |content: &str| json!({"model": "q", "message": {"role": "assistant", "content": content}, "done": false});
    let server = FakeServer::start(vec![
        Reply::Ndjson(vec![
            json!({"model": "q", "message": {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "cat_expert", "arguments": {"cat_category": "Siamese"}}}]}, "done": false}),
            json!({"model": "q", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop",
                   "prompt_eval_count": 10, "eval_count": 5}),
        ]),
        Reply::Ndjson(vec![
            line("Siamese"),
            line(" cats"),
            line(" talk."),
            json!({"model": "q", "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop",
                   "prompt_eval_count": 20, "eval_count": 3}),
        ]),
    ])
    .await;
    let model = Arc::new(OllamaChatModel::builder(&server.url, "q").build().unwrap());
    let agent = Agent::builder(model.clone())
        .streaming_chat_model(model)
        .tools([cat_expert_tool(), dog_expert_tool()])
        .build()
        .unwrap();
    let events: Vec<_> = agent
        .chat_stream(AgentRequest::new("Siamese cats?"))
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
    assert_eq!(tokens, ["Siamese", " cats", " talk."]);
    let AgentEvent::ToolExecuted(execution) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(
        execution.outcome.text,
        "I'm here to help you find information about Siamese cats."
    );
    let AgentEvent::Done(done) = events.last().unwrap() else {
        panic!("not done")
    };
    assert_eq!(done.text, "Siamese cats talk.");
    assert_eq!(
        done.response().unwrap().token_usage,
        Some(ChatTokenUsage::new(20, 3))
    );
    let bodies = server.bodies();
    assert_eq!(bodies[0]["stream"], json!(true));
    assert_eq!(bodies[1]["messages"][2]["role"], json!("tool"));
    assert_eq!(
        bodies[1]["messages"][2]["tool_call_id"],
        bodies[1]["messages"][1]["tool_calls"][0]["id"]
    );
}
