//! The OpenAI-compatible chat completions client (OpenAI, vLLM, llama.cpp's server, Ollama's `/v1`, …).

use std::collections::BTreeMap;
use std::time::Duration;

use decide_chat::{
    AssistantMessage, ChatFuture, ChatMessage, ChatModel, ChatModelError, ChatRequest,
    ChatResponse, ChatStream, ChatStreamEvent, ChatTokenUsage, ResponseFormat, StreamingChatModel,
    ToolCall,
};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::http::{block_on, HttpConfig, LlmError};
use crate::sse::SseDecoder;

/// The response attribute holding the server's `finish_reason`.
pub const FINISH_REASON_ATTRIBUTE: &str = "finish_reason";

/// A [`ChatModel`] and [`StreamingChatModel`] speaking the OpenAI chat completions API: `POST {base_url}/chat/completions`.
///
/// The request carries the model, the messages, the tools as `tools` (`{"type": "function", "function": {...}}`),
/// and only the parameters that are set: a server's own defaults apply to the rest. Tool results are sent as
/// `{"role": "tool", "tool_call_id", "content"}`, assistant tool calls as `tool_calls` with string `arguments`.
#[derive(Debug, Clone)]
pub struct OpenAiChatModel {
    config: HttpConfig,
    client: reqwest::Client,
    model: String,
    parameters: Map<String, Value>,
}

impl OpenAiChatModel {
    /// Starts a client of `base_url` (e.g. `https://api.openai.com/v1`, `http://localhost:8000/v1`) for `model`.
    pub fn builder(base_url: &str, model: impl Into<String>) -> OpenAiChatModelBuilder {
        OpenAiChatModelBuilder {
            config: HttpConfig::new(base_url),
            model: model.into(),
            parameters: Map::new(),
        }
    }

    /// The URL requests go to.
    pub fn url(&self) -> String {
        self.config.url("chat/completions")
    }

    /// The JSON body for `request`; `stream` adds `"stream": true` and asks for the usage in the last chunk.
    pub fn request_json(&self, request: &ChatRequest, stream: bool) -> Value {
        let mut body = Map::new();
        let model = request.model_name().unwrap_or(&self.model);
        body.insert("model".into(), json!(model));
        let messages: Vec<Value> = request.messages().iter().map(message_json).collect();
        body.insert("messages".into(), Value::Array(messages));
        if let Some(t) = request.temperature() {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(p) = request.top_p() {
            body.insert("top_p".into(), json!(p));
        }
        if let Some(m) = request.max_output_tokens() {
            body.insert("max_tokens".into(), json!(m));
        }
        if !request.stop_sequences().is_empty() {
            body.insert("stop".into(), json!(request.stop_sequences()));
        }
        for (key, value) in &self.parameters {
            body.entry(key.clone()).or_insert_with(|| value.clone());
        }
        match request.response_format() {
            ResponseFormat::Text => {}
            ResponseFormat::Json => {
                body.insert("response_format".into(), json!({"type": "json_object"}));
            }
            ResponseFormat::JsonSchema(schema) => {
                body.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}),
                );
            }
        }
        if !request.tools().is_empty() {
            let tools = request.tools().iter().map(|t| t.to_openai_json()).collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        if stream {
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Value::Object(body)
    }

    async fn call(
        config: HttpConfig,
        client: reqwest::Client,
        url: String,
        body: Value,
    ) -> Result<ChatResponse, LlmError> {
        let response = config.post(&client, &url, &body, true).await?;
        let json = config.json(&url, response).await?;
        parse_response(&json).map_err(|message| LlmError::Decode { url, message })
    }
}

/// A message in chat-completions form. Tool results carry no `name`: the API's tool message has only `role`,
/// `tool_call_id` and `content`, and strict servers reject unknown fields.
fn message_json(message: &ChatMessage) -> Value {
    let mut json = message.to_openai_json();
    if let (ChatMessage::ToolResult(_), Some(object)) = (message, json.as_object_mut()) {
        object.remove("name");
    }
    json
}

/// Reads a chat completion: the first choice's message, the usage, the model and the finish reason.
pub fn parse_response(json: &Value) -> Result<ChatResponse, String> {
    if let Some(error) = json.get("error") {
        return Err(format!("error: {error}"));
    }
    let choice = json
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or("choices: missing or empty")?;
    let message = choice.get("message").ok_or("choices[0].message: missing")?;
    let text = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(other) => return Err(format!("choices[0].message.content: not a string: {other}")),
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or("choices[0].message.tool_calls: not an array")?;
        for (i, call) in calls.iter().enumerate() {
            let at = format!("choices[0].message.tool_calls[{i}]");
            let function = call
                .get("function")
                .ok_or(format!("{at}.function: missing"))?;
            tool_calls.push(tool_call(call.get("id"), function, &at)?);
        }
    } else if let Some(function) = message.get("function_call").filter(|c| !c.is_null()) {
        // The legacy `functions` API: one call, no id.
        tool_calls.push(tool_call(
            None,
            function,
            "choices[0].message.function_call",
        )?);
    }
    let mut response = ChatResponse::new(AssistantMessage { text, tool_calls });
    if let Some(model) = json.get("model").and_then(Value::as_str) {
        response = response.with_model_name(model);
    }
    if let Some(usage) = usage(json.get("usage")) {
        response = response.with_token_usage(usage);
    }
    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
        response = response.with_attribute(FINISH_REASON_ATTRIBUTE, reason);
    }
    Ok(response)
}

fn tool_call(id: Option<&Value>, function: &Value, at: &str) -> Result<ToolCall, String> {
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or(format!("{at}.function.name: missing"))?;
    // The API sends the arguments as JSON text; some compatible servers send the object itself.
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    Ok(ToolCall::new(id.and_then(Value::as_str), name, arguments))
}

fn usage(usage: Option<&Value>) -> Option<ChatTokenUsage> {
    let usage = usage?;
    let count = |key| usage.get(key).and_then(Value::as_u64);
    Some(ChatTokenUsage::new(
        count("prompt_tokens")?,
        count("completion_tokens").unwrap_or(0),
    ))
}

impl ChatModel for OpenAiChatModel {
    fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
        // A client of its own: connections pooled by one runtime cannot be used from another.
        let client = self.config.client()?;
        let future = Self::call(
            self.config.clone(),
            client,
            self.url(),
            self.request_json(request, false),
        );
        Ok(block_on(future)??)
    }

    fn chat_async(&self, request: ChatRequest) -> ChatFuture {
        let future = Self::call(
            self.config.clone(),
            self.client.clone(),
            self.url(),
            self.request_json(&request, false),
        );
        Box::pin(async move { Ok(future.await?) })
    }

    fn model_name(&self) -> Option<String> {
        Some(self.model.clone())
    }
}

impl StreamingChatModel for OpenAiChatModel {
    fn chat_stream(&self, request: ChatRequest) -> ChatStream {
        let config = self.config.clone();
        let client = self.client.clone();
        let url = self.url();
        let body = self.request_json(&request, true);
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let result = stream_into(&config, &client, &url, &body, &sender).await;
            let event = result
                .map(ChatStreamEvent::Response)
                .map_err(ChatModelError::from);
            let _ = sender.send(event);
        });
        Box::pin(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|event| (event, receiver)) },
        ))
    }
}

type Sender = tokio::sync::mpsc::UnboundedSender<Result<ChatStreamEvent, ChatModelError>>;

/// Reads an SSE chat completion stream, sending its tokens, and returns the assembled response.
async fn stream_into(
    config: &HttpConfig,
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    sender: &Sender,
) -> Result<ChatResponse, LlmError> {
    let response = config.post(client, url, body, false).await?;
    let mut chunks = Box::pin(config.chunks(url, response));
    let mut decoder = SseDecoder::default();
    let mut assembly = StreamAssembly::default();
    let decode = |message: String| LlmError::Decode {
        url: url.to_owned(),
        message,
    };
    while let Some(chunk) = chunks.next().await {
        for data in decoder.push(&chunk?) {
            if data.trim() == "[DONE]" {
                return assembly.finish().map_err(decode);
            }
            let json: Value = serde_json::from_str(&data)
                .map_err(|error| decode(format!("a stream event is not JSON: {error}: {data}")))?;
            if let Some(token) = assembly.add(&json).map_err(decode)? {
                let _ = sender.send(Ok(ChatStreamEvent::Token(token)));
            }
        }
    }
    // Some servers close the stream without `[DONE]`; what arrived is the answer if it finished.
    if assembly.finish_reason.is_some() {
        return assembly.finish().map_err(decode);
    }
    Err(decode(
        "the stream ended before the answer was complete".into(),
    ))
}

/// A tool call being assembled from the fragments of a stream.
#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// The pieces of a streamed answer, put together.
#[derive(Debug, Default)]
struct StreamAssembly {
    text: Option<String>,
    calls: BTreeMap<u64, PartialCall>,
    model: Option<String>,
    usage: Option<ChatTokenUsage>,
    finish_reason: Option<String>,
}

impl StreamAssembly {
    /// Adds one chunk; returns its text delta, if any.
    fn add(&mut self, chunk: &Value) -> Result<Option<String>, String> {
        if let Some(error) = chunk.get("error") {
            return Err(format!("error: {error}"));
        }
        if let Some(model) = chunk.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_owned());
        }
        if let Some(usage) = usage(chunk.get("usage")) {
            self.usage = Some(usage);
        }
        let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            // The usage chunk has no choices.
            return Ok(None);
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(None);
        };
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, call) in calls.iter().enumerate() {
                // `index` says which call a fragment continues; servers that omit it send whole calls in order.
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(self.calls.len() as u64 + position as u64);
                let partial = self.calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    partial.id = Some(id.to_owned());
                }
                if let Some(function) = call.get("function") {
                    if let Some(name) = function.get("name").and_then(Value::as_str) {
                        partial.name.push_str(name);
                    }
                    match function.get("arguments") {
                        Some(Value::String(piece)) => partial.arguments.push_str(piece),
                        Some(Value::Null) | None => {}
                        Some(other) => partial.arguments.push_str(&other.to_string()),
                    }
                }
            }
        }
        match delta.get("content") {
            Some(Value::String(piece)) if !piece.is_empty() => {
                self.text.get_or_insert_with(String::new).push_str(piece);
                Ok(Some(piece.clone()))
            }
            _ => Ok(None),
        }
    }

    fn finish(self) -> Result<ChatResponse, String> {
        let mut tool_calls = Vec::new();
        for (index, call) in self.calls {
            if call.name.is_empty() {
                return Err(format!("tool call {index}: the stream never gave its name"));
            }
            tool_calls.push(ToolCall::new(call.id.as_deref(), call.name, call.arguments));
        }
        let mut response = ChatResponse::new(AssistantMessage {
            text: self.text,
            tool_calls,
        });
        if let Some(model) = self.model {
            response = response.with_model_name(model);
        }
        if let Some(usage) = self.usage {
            response = response.with_token_usage(usage);
        }
        if let Some(reason) = self.finish_reason {
            response = response.with_attribute(FINISH_REASON_ATTRIBUTE, reason);
        }
        Ok(response)
    }
}

/// Builds an [`OpenAiChatModel`]; every check happens in [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct OpenAiChatModelBuilder {
    config: HttpConfig,
    model: String,
    parameters: Map<String, Value>,
}

impl OpenAiChatModelBuilder {
    /// The API key, sent as `Authorization: Bearer <key>`; none by default (local servers need none).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.config.api_key = Some(key.into());
        self
    }

    /// The timeout of a call, and of the wait for each piece of a stream (default 120 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// The timeout for opening a connection (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Retries after a timeout, a transport error, 408, 409, 429 or 5xx (default 2); a stream is retried only
    /// before its first piece.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// The wait before the first retry, doubled for each further one (default 500 ms).
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.config.retry_backoff = backoff;
        self
    }

    /// Any other body field sent with every request (`presence_penalty`, `seed`, `parallel_tool_calls`, …); a
    /// field the request itself sets wins.
    pub fn parameter(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.parameters.insert(name.into(), value.into());
        self
    }

    /// Checks the base URL, the model name and the timeouts.
    pub fn build(self) -> Result<OpenAiChatModel, LlmError> {
        self.config.validate()?;
        if self.model.trim().is_empty() {
            return Err(LlmError::Config("model: cannot be blank".into()));
        }
        let client = self.config.client()?;
        Ok(OpenAiChatModel {
            config: self.config,
            client,
            model: self.model,
            parameters: self.parameters,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_fragments_assemble_into_calls() {
        let mut assembly = StreamAssembly::default();
        let chunks = [
            json!({"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": null,
                "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                "function": {"name": "add", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": "{\"a\": 1,"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "c2",
                "function": {"name": "sqrt", "arguments": "{\"x\": 4}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": " \"b\": 2}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        ];
        for chunk in &chunks {
            assert_eq!(assembly.add(chunk).unwrap(), None);
        }
        let response = assembly.finish().unwrap();
        assert_eq!(
            response.message.tool_calls,
            [
                ToolCall::new(Some("c1"), "add", "{\"a\": 1, \"b\": 2}"),
                ToolCall::new(Some("c2"), "sqrt", "{\"x\": 4}")
            ]
        );
        assert_eq!(response.message.text, None);
        assert_eq!(response.token_usage, Some(ChatTokenUsage::new(7, 3)));
        assert_eq!(response.model_name.as_deref(), Some("m"));
        assert_eq!(
            response.attribute(FINISH_REASON_ATTRIBUTE),
            Some(&json!("tool_calls"))
        );
    }

    #[test]
    fn responses_are_read_with_named_errors() {
        let legacy = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "function_call": {"name": "sqrt", "arguments": "{\"x\": 10}"}}, "finish_reason": "function_call"}]});
        let response = parse_response(&legacy).unwrap();
        assert_eq!(
            response.message.tool_calls,
            [ToolCall::new(None, "sqrt", "{\"x\": 10}")]
        );
        let object_arguments = json!({"choices": [{"message": {"content": "",
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {"a": 1}}}]}}]});
        assert_eq!(
            parse_response(&object_arguments)
                .unwrap()
                .message
                .tool_calls[0]
                .arguments,
            "{\"a\":1}"
        );
        assert_eq!(
            parse_response(&json!({"choices": []})).unwrap_err(),
            "choices: missing or empty"
        );
        assert_eq!(
            parse_response(&json!({"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}))
                .unwrap_err(),
            "choices[0].message.tool_calls[0].function.name: missing"
        );
        assert!(parse_response(&json!({"error": {"message": "bad"}}))
            .unwrap_err()
            .contains("bad"));
    }

    #[test]
    fn the_builder_names_what_is_wrong() {
        let error = OpenAiChatModel::builder("ftp://x", "m")
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid client configuration: base_url 'ftp://x': the scheme must be http or https"
        );
        let error = OpenAiChatModel::builder("http://x", " ")
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid client configuration: model: cannot be blank"
        );
        let model = OpenAiChatModel::builder("http://x/v1/", "m")
            .build()
            .unwrap();
        assert_eq!(model.url(), "http://x/v1/chat/completions");
    }
}
