//! Ollama's native chat API: `POST {base_url}/api/chat`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use decide_chat::{
    AssistantMessage, Capabilities, ChatFuture, ChatMessage, ChatModel, ChatModelError,
    ChatRequest, ChatResponse, ChatStream, ChatStreamEvent, ChatTokenUsage, Content,
    ResponseFormat, StreamingChatModel, ToolCall,
};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::http::{block_on, HttpConfig, LlmError};
use crate::openai::FINISH_REASON_ATTRIBUTE;
use crate::sse::LineSplitter;

/// The default base URL of a local Ollama.
pub const DEFAULT_OLLAMA_URL: &str = "http://127.0.0.1:11434";

/// A [`ChatModel`] and [`StreamingChatModel`] speaking Ollama's native `/api/chat`.
///
/// Unlike the OpenAI API, tool-call arguments are JSON objects, assistant tool calls are sent back with their id and
/// tool results refer to it with `tool_call_id`, as in the recorded transcript of LangChain's Ollama tool example; streaming is newline-delimited
/// JSON. Ollama does not always give tool calls an id, so the client makes one up (`call_…`) when it is missing, which
/// keeps each tool result tied to its call.
#[derive(Debug, Clone)]
pub struct OllamaChatModel {
    config: HttpConfig,
    client: reqwest::Client,
    model: String,
    options: Map<String, Value>,
    keep_alive: Option<String>,
}

impl OllamaChatModel {
    /// Starts a client of the Ollama at `base_url` (e.g. [`DEFAULT_OLLAMA_URL`]) for `model`.
    pub fn builder(base_url: &str, model: impl Into<String>) -> OllamaChatModelBuilder {
        OllamaChatModelBuilder {
            config: HttpConfig::new(base_url),
            model: model.into(),
            options: Map::new(),
            keep_alive: None,
        }
    }

    /// The URL requests go to.
    pub fn url(&self) -> String {
        self.config.url("api/chat")
    }

    /// The JSON body for `request`; fails for content Ollama cannot take (attachments other than base64 images).
    pub fn request_json(
        &self,
        request: &ChatRequest,
        stream: bool,
    ) -> Result<Value, ChatModelError> {
        let mut body = Map::new();
        body.insert(
            "model".into(),
            json!(request.model_name().unwrap_or(&self.model)),
        );
        let messages = request
            .messages()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                message_json(m)
                    .map_err(|e| ChatModelError::InvalidRequest(format!("messages[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        body.insert("messages".into(), Value::Array(messages));
        if !request.tools().is_empty() {
            let tools = request.tools().iter().map(|t| t.to_openai_json()).collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        body.insert("stream".into(), json!(stream));
        match request.response_format() {
            ResponseFormat::Text => {}
            ResponseFormat::Json => {
                body.insert("format".into(), json!("json"));
            }
            ResponseFormat::JsonSchema(schema) => {
                body.insert("format".into(), schema.clone());
            }
        }
        let mut options = self.options.clone();
        if let Some(t) = request.temperature() {
            options.insert("temperature".into(), json!(t));
        }
        if let Some(p) = request.top_p() {
            options.insert("top_p".into(), json!(p));
        }
        if let Some(m) = request.max_output_tokens() {
            options.insert("num_predict".into(), json!(m));
        }
        if !request.stop_sequences().is_empty() {
            options.insert("stop".into(), json!(request.stop_sequences()));
        }
        if !options.is_empty() {
            body.insert("options".into(), Value::Object(options));
        }
        if let Some(keep_alive) = &self.keep_alive {
            body.insert("keep_alive".into(), json!(keep_alive));
        }
        Ok(Value::Object(body))
    }

    async fn call(
        config: HttpConfig,
        client: reqwest::Client,
        url: String,
        body: Value,
    ) -> Result<ChatResponse, LlmError> {
        let response = config.post(&client, &url, &body, true).await?;
        let json = config.json(&url, response).await?;
        let mut assembly = Assembly::default();
        assembly
            .add(&json)
            .and_then(|_| assembly.finish())
            .map_err(|message| LlmError::Decode { url, message })
    }
}

/// A message in Ollama's form.
fn message_json(message: &ChatMessage) -> Result<Value, String> {
    Ok(match message {
        ChatMessage::System(m) => json!({"role": "system", "content": m.text}),
        ChatMessage::User(m) => {
            let mut texts = Vec::new();
            let mut images = Vec::new();
            for content in &m.contents {
                match content {
                    Content::Text(text) => texts.push(text.clone()),
                    Content::Image { url, .. } => match url.split_once(";base64,") {
                        Some((prefix, data)) if prefix.starts_with("data:") => {
                            images.push(Value::String(data.to_owned()))
                        }
                        _ => {
                            return Err("Ollama takes images as base64 data URLs, not links".into())
                        }
                    },
                    other => {
                        return Err(format!("Ollama does not take {} attachments", other.kind()))
                    }
                }
            }
            let mut object = Map::new();
            object.insert("role".into(), json!("user"));
            object.insert("content".into(), json!(texts.join("\n")));
            if !images.is_empty() {
                object.insert("images".into(), Value::Array(images));
            }
            Value::Object(object)
        }
        ChatMessage::Assistant(m) => {
            let mut object = Map::new();
            object.insert("role".into(), json!("assistant"));
            object.insert("content".into(), json!(m.text.clone().unwrap_or_default()));
            if !m.tool_calls.is_empty() {
                let calls = m.tool_calls.iter().map(|call| {
                    let mut object = Map::new();
                    object.insert("type".into(), json!("function"));
                    if let Some(id) = &call.id {
                        object.insert("id".into(), json!(id));
                    }
                    // Ollama wants the arguments as an object; text that is not JSON is passed on as it is.
                    let arguments = serde_json::from_str::<Value>(&call.arguments)
                        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                    object.insert(
                        "function".into(),
                        json!({"name": call.name, "arguments": arguments}),
                    );
                    Value::Object(object)
                });
                object.insert("tool_calls".into(), Value::Array(calls.collect()));
            }
            Value::Object(object)
        }
        ChatMessage::ToolResult(m) => {
            let mut object = Map::new();
            object.insert("role".into(), json!("tool"));
            object.insert("content".into(), json!(m.text));
            if let Some(id) = &m.tool_call_id {
                object.insert("tool_call_id".into(), json!(id));
            }
            Value::Object(object)
        }
    })
}

/// A new tool call id, unique within the process and unlikely to repeat across processes.
fn new_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("call_{:x}{n:x}", start & 0xffff_ffff)
}

/// The pieces of an Ollama answer: one whole response, or the lines of a stream.
#[derive(Debug, Default)]
struct Assembly {
    text: String,
    calls: Vec<ToolCall>,
    model: Option<String>,
    usage: Option<ChatTokenUsage>,
    done_reason: Option<String>,
    done: bool,
}

impl Assembly {
    /// Adds one response or stream line; returns its text, if any.
    fn add(&mut self, json: &Value) -> Result<Option<String>, String> {
        if let Some(error) = json.get("error") {
            return Err(format!(
                "error: {}",
                error
                    .as_str()
                    .map_or_else(|| error.to_string(), str::to_owned)
            ));
        }
        if let Some(model) = json.get("model").and_then(Value::as_str) {
            self.model = Some(model.to_owned());
        }
        let message = json.get("message");
        if let Some(calls) = message
            .and_then(|m| m.get("tool_calls"))
            .filter(|c| !c.is_null())
        {
            let calls = calls.as_array().ok_or("message.tool_calls: not an array")?;
            for (i, call) in calls.iter().enumerate() {
                let at = format!("message.tool_calls[{i}].function");
                let function = call.get("function").ok_or(format!("{at}: missing"))?;
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or(format!("{at}.name: missing"))?;
                let arguments = match function.get("arguments") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                };
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(new_call_id, str::to_owned);
                self.calls.push(ToolCall::new(Some(&id), name, arguments));
            }
        }
        if json.get("done").and_then(Value::as_bool) == Some(true) {
            self.done = true;
            self.done_reason = json
                .get("done_reason")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let count = |key| json.get(key).and_then(Value::as_u64);
            if let Some(input) = count("prompt_eval_count") {
                self.usage = Some(ChatTokenUsage::new(input, count("eval_count").unwrap_or(0)));
            }
        }
        match message.and_then(|m| m.get("content")) {
            Some(Value::String(text)) if !text.is_empty() => {
                self.text.push_str(text);
                Ok(Some(text.clone()))
            }
            None | Some(Value::String(_)) | Some(Value::Null) => Ok(None),
            Some(other) => Err(format!("message.content: not a string: {other}")),
        }
    }

    fn finish(&mut self) -> Result<ChatResponse, String> {
        if !self.done {
            return Err("done: the answer never said it was done".into());
        }
        let text = (!self.text.is_empty()).then(|| std::mem::take(&mut self.text));
        let mut response = ChatResponse::new(AssistantMessage {
            text,
            tool_calls: std::mem::take(&mut self.calls),
        });
        if let Some(model) = self.model.take() {
            response = response.with_model_name(model);
        }
        if let Some(usage) = self.usage {
            response = response.with_token_usage(usage);
        }
        if let Some(reason) = self.done_reason.take() {
            response = response.with_attribute(FINISH_REASON_ATTRIBUTE, reason);
        }
        Ok(response)
    }
}

impl ChatModel for OllamaChatModel {
    fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
        let client = self.config.client()?;
        let future = Self::call(
            self.config.clone(),
            client,
            self.url(),
            self.request_json(request, false)?,
        );
        Ok(block_on(future)??)
    }

    fn chat_async(&self, request: ChatRequest) -> ChatFuture {
        let body = match self.request_json(&request, false) {
            Ok(body) => body,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let future = Self::call(self.config.clone(), self.client.clone(), self.url(), body);
        Box::pin(async move { Ok(future.await?) })
    }

    fn capabilities(&self) -> Capabilities {
        // `format` takes a JSON schema.
        Capabilities::JSON_SCHEMA_RESPONSE_FORMAT
    }

    fn model_name(&self) -> Option<String> {
        Some(self.model.clone())
    }
}

impl StreamingChatModel for OllamaChatModel {
    fn chat_stream(&self, request: ChatRequest) -> ChatStream {
        let body = match self.request_json(&request, true) {
            Ok(body) => body,
            Err(error) => return Box::pin(futures_util::stream::iter([Err(error)])),
        };
        let config = self.config.clone();
        let client = self.client.clone();
        let url = self.url();
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

async fn stream_into(
    config: &HttpConfig,
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    sender: &Sender,
) -> Result<ChatResponse, LlmError> {
    let response = config.post(client, url, body, false).await?;
    let mut chunks = Box::pin(config.chunks(url, response));
    let mut lines = LineSplitter::default();
    let mut assembly = Assembly::default();
    let decode = |message: String| LlmError::Decode {
        url: url.to_owned(),
        message,
    };
    let handle = |line: String, assembly: &mut Assembly| -> Result<(), LlmError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let json: Value = serde_json::from_str(&line)
            .map_err(|error| decode(format!("a stream line is not JSON: {error}: {line}")))?;
        if let Some(token) = assembly.add(&json).map_err(decode)? {
            let _ = sender.send(Ok(ChatStreamEvent::Token(token)));
        }
        Ok(())
    };
    while let Some(chunk) = chunks.next().await {
        for line in lines.push(&chunk?) {
            handle(line, &mut assembly)?;
        }
        if assembly.done {
            break;
        }
    }
    if let Some(rest) = lines.rest() {
        handle(rest, &mut assembly)?;
    }
    assembly.finish().map_err(decode)
}

/// Builds an [`OllamaChatModel`]; every check happens in [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct OllamaChatModelBuilder {
    config: HttpConfig,
    model: String,
    options: Map<String, Value>,
    keep_alive: Option<String>,
}

impl OllamaChatModelBuilder {
    /// An API key, sent as `Authorization: Bearer <key>`, for an Ollama behind a proxy that wants one.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.config.api_key = Some(key.into());
        self
    }

    /// The timeout of a call, and of the wait for each line of a stream (default 120 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// The timeout for opening a connection (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Retries after a timeout, a transport error, 408, 409, 429 or 5xx (default 2).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// The wait before the first retry, doubled for each further one (default 500 ms).
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.config.retry_backoff = backoff;
        self
    }

    /// A model option sent with every request (`num_ctx`, `seed`, …); the request's own parameters win.
    pub fn option(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.options.insert(name.into(), value.into());
        self
    }

    /// How long Ollama keeps the model loaded after the request (`"5m"`, `"-1"`, …).
    pub fn keep_alive(mut self, keep_alive: impl Into<String>) -> Self {
        self.keep_alive = Some(keep_alive.into());
        self
    }

    /// Checks the base URL, the model name and the timeouts.
    pub fn build(self) -> Result<OllamaChatModel, LlmError> {
        self.config.validate()?;
        if self.model.trim().is_empty() {
            return Err(LlmError::Config("model: cannot be blank".into()));
        }
        let client = self.config.client()?;
        Ok(OllamaChatModel {
            config: self.config,
            client,
            model: self.model,
            options: self.options,
            keep_alive: self.keep_alive,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decide_chat::UserMessage;

    #[test]
    fn missing_ids_are_made_up_and_distinct() {
        let mut assembly = Assembly::default();
        let line = json!({"message": {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "a", "arguments": {"x": 1}}},
                           {"function": {"name": "b", "arguments": {}}}]}, "done": true});
        assembly.add(&line).unwrap();
        let response = assembly.finish().unwrap();
        let calls = &response.message.tool_calls;
        assert_eq!(calls[0].arguments, "{\"x\":1}");
        assert!(calls[0].id.as_deref().unwrap().starts_with("call_"));
        assert_ne!(calls[0].id, calls[1].id);
        assert_eq!(response.message.text, None);
    }

    #[test]
    fn attachments_ollama_cannot_take_are_named() {
        let model = OllamaChatModel::builder(DEFAULT_OLLAMA_URL, "m")
            .build()
            .unwrap();
        let request = ChatRequest::builder()
            .message(ChatMessage::User(UserMessage::from_contents(vec![
                Content::text("look"),
                Content::image("data:image/png;base64,iVBOR"),
            ])))
            .message(ChatMessage::User(UserMessage::from_contents(vec![
                Content::image("https://x/cat.png"),
            ])))
            .build()
            .unwrap();
        let error = model.request_json(&request, false).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid chat request: messages[1]: Ollama takes images as base64 data URLs, not links"
        );
        let first = ChatRequest::from_messages(request.messages()[..1].to_vec()).unwrap();
        assert_eq!(
            model.request_json(&first, false).unwrap()["messages"][0],
            json!({"role": "user", "content": "look", "images": ["iVBOR"]})
        );
    }
}
