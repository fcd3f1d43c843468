//! The chat-model interface, modelled on LangChain4j's `ChatModel`: a request (messages, tools, response format,
//! common parameters), a response (an assistant message with attributes) and what a model can do.
//!
//! Only what every provider shares is here, because one request may be sent to any of several providers (the model
//! router picks one per request): provider-specific parameters belong to the provider's own client. The trait has a
//! synchronous [`ChatModel::chat`] and an asynchronous [`ChatModel::chat_async`] whose default fails with
//! [`ChatModelError::AsyncNotSupported`], as [`DecisionModel`]'s does: a model that is not truly asynchronous must say
//! so rather than block a runtime thread behind the caller's back.
//!
//! [`MockChatModel`] is a scriptable model for the tests of code that calls one.
//!
//! [`DecisionModel`]: https://docs.rs/decide-contract

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value};

use crate::message::{AssistantMessage, ChatMessage};
use crate::provider::BoxError;
use crate::tool::ToolSpecification;

/// The future of an asynchronous chat call. It is `'static`, so it can be spawned.
pub type ChatFuture =
    Pin<Box<dyn Future<Output = Result<ChatResponse, ChatModelError>> + Send + 'static>>;

/// The format the reply must have.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object (OpenAI's `json_object`).
    Json,
    /// JSON that follows this JSON schema. Not every model supports it, see
    /// [`Capabilities::json_schema_response_format`].
    JsonSchema(Value),
}

/// What a chat model supports beyond plain chat, so that a router can send a request only to models that can
/// handle it.
///
/// A plain struct of flags rather than a set of names: a capability is added by adding a field, and the compiler
/// then points at every place that must consider it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// The model accepts [`ResponseFormat::JsonSchema`].
    pub json_schema_response_format: bool,
}

impl Capabilities {
    /// No capability beyond plain chat.
    pub const NONE: Capabilities = Capabilities {
        json_schema_response_format: false,
    };

    /// Only [`json_schema_response_format`](Self::json_schema_response_format).
    pub const JSON_SCHEMA_RESPONSE_FORMAT: Capabilities = Capabilities {
        json_schema_response_format: true,
    };

    /// Whether every capability of `required` is one of these.
    pub fn contains(&self, required: &Capabilities) -> bool {
        !required.json_schema_response_format || self.json_schema_response_format
    }

    /// The capabilities of either.
    pub fn union(self, other: Capabilities) -> Capabilities {
        Capabilities {
            json_schema_response_format: self.json_schema_response_format
                || other.json_schema_response_format,
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        *self == Self::NONE
    }

    /// The names of the capabilities, as the fields are named.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.json_schema_response_format {
            names.push("json_schema_response_format");
        }
        names
    }
}

impl fmt::Display for Capabilities {
    /// The names joined with `", "`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(", "))
        }
    }
}

/// What a chat model is asked: the conversation, the tools it may call, the format of the reply, and the parameters
/// every provider understands.
///
/// Build it with [`ChatRequest::builder`]; a request that exists has at least one message and parameters in range.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    messages: Vec<ChatMessage>,
    tools: Vec<ToolSpecification>,
    response_format: ResponseFormat,
    model_name: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<u32>,
    stop_sequences: Vec<String>,
}

impl ChatRequest {
    /// Starts a request; at least one message is required.
    pub fn builder() -> ChatRequestBuilder {
        ChatRequestBuilder::default()
    }

    /// A request with these messages and nothing else; fails only when there is none.
    pub fn from_messages(messages: Vec<ChatMessage>) -> Result<ChatRequest, ChatModelError> {
        Self::builder().messages(messages).build()
    }

    /// A request with one plain text user message.
    pub fn user(text: impl Into<String>) -> ChatRequest {
        ChatRequest {
            messages: vec![ChatMessage::user(text)],
            ..ChatRequestBuilder::default().request
        }
    }

    /// A builder holding everything of this request, to change a part of it.
    pub fn to_builder(&self) -> ChatRequestBuilder {
        ChatRequestBuilder {
            request: self.clone(),
        }
    }

    /// The conversation, oldest message first.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The tools the model may call.
    pub fn tools(&self) -> &[ToolSpecification] {
        &self.tools
    }

    /// The format of the reply.
    pub fn response_format(&self) -> &ResponseFormat {
        &self.response_format
    }

    /// The model to use, for providers that serve several; `None` for the model's own default.
    pub fn model_name(&self) -> Option<&str> {
        self.model_name.as_deref()
    }

    /// The sampling temperature, if set.
    pub fn temperature(&self) -> Option<f64> {
        self.temperature
    }

    /// The nucleus-sampling mass, if set.
    pub fn top_p(&self) -> Option<f64> {
        self.top_p
    }

    /// The most tokens the reply may have, if set.
    pub fn max_output_tokens(&self) -> Option<u32> {
        self.max_output_tokens
    }

    /// Texts that end the reply when generated.
    pub fn stop_sequences(&self) -> &[String] {
        &self.stop_sequences
    }

    /// What a model needs to support to answer this request: a JSON schema response format needs
    /// [`Capabilities::json_schema_response_format`].
    pub fn required_capabilities(&self) -> Capabilities {
        Capabilities {
            json_schema_response_format: matches!(
                self.response_format,
                ResponseFormat::JsonSchema(_)
            ),
        }
    }
}

/// Builds a [`ChatRequest`]; every check happens in [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct ChatRequestBuilder {
    request: ChatRequest,
}

impl Default for ChatRequestBuilder {
    fn default() -> Self {
        Self {
            request: ChatRequest {
                messages: Vec::new(),
                tools: Vec::new(),
                response_format: ResponseFormat::Text,
                model_name: None,
                temperature: None,
                top_p: None,
                max_output_tokens: None,
                stop_sequences: Vec::new(),
            },
        }
    }
}

impl ChatRequestBuilder {
    /// The conversation, oldest message first; replaces the messages given before.
    pub fn messages(mut self, messages: Vec<ChatMessage>) -> Self {
        self.request.messages = messages;
        self
    }

    /// Appends one message.
    pub fn message(mut self, message: impl Into<ChatMessage>) -> Self {
        self.request.messages.push(message.into());
        self
    }

    /// The tools the model may call; replaces the tools given before.
    pub fn tools(mut self, tools: Vec<ToolSpecification>) -> Self {
        self.request.tools = tools;
        self
    }

    /// The format of the reply; default [`ResponseFormat::Text`].
    pub fn response_format(mut self, format: ResponseFormat) -> Self {
        self.request.response_format = format;
        self
    }

    /// The model to use, for providers that serve several.
    pub fn model_name(mut self, name: impl Into<String>) -> Self {
        self.request.model_name = Some(name.into());
        self
    }

    /// The sampling temperature; at least 0.
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.request.temperature = Some(temperature);
        self
    }

    /// The nucleus-sampling mass; above 0 and at most 1.
    pub fn top_p(mut self, top_p: f64) -> Self {
        self.request.top_p = Some(top_p);
        self
    }

    /// The most tokens the reply may have; at least 1.
    pub fn max_output_tokens(mut self, max: u32) -> Self {
        self.request.max_output_tokens = Some(max);
        self
    }

    /// Texts that end the reply when generated; replaces those given before.
    pub fn stop_sequences<I, S>(mut self, sequences: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.request.stop_sequences = sequences.into_iter().map(Into::into).collect();
        self
    }

    /// Checks the request: at least one message, parameters in range, a JSON schema that is an object.
    pub fn build(self) -> Result<ChatRequest, ChatModelError> {
        let request = self.request;
        let invalid = |message: String| Err(ChatModelError::InvalidRequest(message));
        if request.messages.is_empty() {
            return invalid("messages: at least one message is required".into());
        }
        if let Some(t) = request.temperature {
            if !(t.is_finite() && t >= 0.0) {
                return invalid(format!("temperature: must be at least 0, but was {t}"));
            }
        }
        if let Some(p) = request.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return invalid(format!("top_p: must be above 0 and at most 1, but was {p}"));
            }
        }
        if request.max_output_tokens == Some(0) {
            return invalid("max_output_tokens: must be at least 1, but was 0".into());
        }
        if let ResponseFormat::JsonSchema(schema) = &request.response_format {
            if !schema.is_object() {
                return invalid("response_format: a JSON schema must be a JSON object".into());
            }
        }
        Ok(request)
    }
}

/// How many tokens a call used, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ChatTokenUsage {
    /// Tokens of the request.
    pub input_tokens: u64,
    /// Tokens of the reply.
    pub output_tokens: u64,
}

impl ChatTokenUsage {
    /// The usage of a call.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
        }
    }

    /// Input and output together.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// What a chat model answered: the assistant message and what is known about the call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The reply: text, tool calls, or both.
    pub message: AssistantMessage,
    /// The model that answered, if the provider says.
    pub model_name: Option<String>,
    /// The tokens the call used, if the provider says.
    pub token_usage: Option<ChatTokenUsage>,
    /// Free-form facts about the call, added by the model or by decorators around it; the model router records
    /// the route it chose under `"chat_model_route"`.
    pub attributes: Map<String, Value>,
}

impl ChatResponse {
    /// A response with this message and nothing else.
    pub fn new(message: AssistantMessage) -> Self {
        Self {
            message,
            model_name: None,
            token_usage: None,
            attributes: Map::new(),
        }
    }

    /// A response with a text reply and no tool calls.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(AssistantMessage {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        })
    }

    /// The same response with the model name set.
    pub fn with_model_name(mut self, name: impl Into<String>) -> Self {
        self.model_name = Some(name.into());
        self
    }

    /// The same response with the token usage set.
    pub fn with_token_usage(mut self, usage: ChatTokenUsage) -> Self {
        self.token_usage = Some(usage);
        self
    }

    /// The same response with one more attribute; an attribute of the same name is replaced.
    pub fn with_attribute(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// The attribute `name`, if set.
    pub fn attribute(&self, name: &str) -> Option<&Value> {
        self.attributes.get(name)
    }
}

/// Why a chat call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatModelError {
    /// The request could not be built, or the model rejects it as malformed; the message names the part.
    #[error("invalid chat request: {0}")]
    InvalidRequest(String),
    /// The model, or something it depends on, has no asynchronous path; call [`ChatModel::chat`] instead.
    #[error("{model} does not support asynchronous calls")]
    AsyncNotSupported {
        /// What cannot be called asynchronously: the model's name, or its type name when it has none.
        model: String,
    },
    /// The model cannot do what the request asks, e.g. a JSON schema response format.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The provider's own error, or a decorator's (the router's), shown as is; downcast it to inspect it.
    #[error(transparent)]
    Model(BoxError),
}

impl ChatModelError {
    /// A [`Model`](Self::Model) error that only has a message.
    pub fn model(message: impl Into<String>) -> Self {
        Self::Model(message.into().into())
    }

    /// Wraps a provider's own error as [`Model`](Self::Model), keeping it for downcasting.
    pub fn from_error(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Model(Box::new(error))
    }
}

/// A chat model: answers a conversation with an assistant message.
pub trait ChatModel: Send + Sync {
    /// Answers `request`.
    fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError>;

    /// Answers `request` asynchronously. By default a future already failed with
    /// [`ChatModelError::AsyncNotSupported`]: a model that is not truly asynchronous does not pretend to be by
    /// blocking a runtime thread. A truly asynchronous client overrides it.
    fn chat_async(&self, _request: ChatRequest) -> ChatFuture {
        let model = self
            .model_name()
            .unwrap_or_else(|| std::any::type_name::<Self>().to_owned());
        Box::pin(std::future::ready(Err(ChatModelError::AsyncNotSupported {
            model,
        })))
    }

    /// What the model supports beyond plain chat; none by default.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// The model's name, if it has one.
    fn model_name(&self) -> Option<String> {
        None
    }
}

// Forwarding impls, so that shared and boxed models (`Arc<dyn ChatModel>`) are models too. Every method forwards, so
// an inner model's overrides are kept.
macro_rules! forward_chat_model {
    ($($wrapper:ty),*) => {$(
        impl<T: ChatModel + ?Sized> ChatModel for $wrapper {
            fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
                (**self).chat(request)
            }

            fn chat_async(&self, request: ChatRequest) -> ChatFuture {
                (**self).chat_async(request)
            }

            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }

            fn model_name(&self) -> Option<String> {
                (**self).model_name()
            }
        }
    )*};
}

forward_chat_model!(Arc<T>, Box<T>, &T);

type AnswerFn = dyn Fn(&ChatRequest) -> Result<ChatResponse, ChatModelError> + Send + Sync;

/// A scriptable [`ChatModel`] for tests: it answers with a fixed text, with whatever a closure computes, or always
/// fails, and records every request it receives.
///
/// Capabilities are none unless set with [`with_capabilities`](Self::with_capabilities). Asynchronous calls are
/// supported (they return a ready future) unless turned off with
/// [`without_async_support`](Self::without_async_support).
pub struct MockChatModel {
    answer: Box<AnswerFn>,
    model_name: Option<String>,
    capabilities: Capabilities,
    async_supported: bool,
    requests: Mutex<Vec<ChatRequest>>,
}

impl MockChatModel {
    /// Always answers with this text.
    pub fn answering(text: impl Into<String>) -> Self {
        let text = text.into();
        Self::answers(move |_| Ok(ChatResponse::text(text.clone())))
    }

    /// Answers with whatever `answer` computes from the request; an error is returned as is.
    pub fn answers(
        answer: impl Fn(&ChatRequest) -> Result<ChatResponse, ChatModelError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            answer: Box::new(answer),
            model_name: None,
            capabilities: Capabilities::NONE,
            async_supported: true,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Always fails with a [`ChatModelError::Model`] error with this message.
    pub fn always_fails_with(message: impl Into<String>) -> Self {
        let message = message.into();
        Self::answers(move |_| Err(ChatModelError::model(message.clone())))
    }

    /// Uses this model name, which responses carry unless the answer sets its own.
    pub fn with_model_name(mut self, name: impl Into<String>) -> Self {
        self.model_name = Some(name.into());
        self
    }

    /// Declares these capabilities.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Makes asynchronous calls fail with [`ChatModelError::AsyncNotSupported`], like a model without an
    /// asynchronous path.
    pub fn without_async_support(mut self) -> Self {
        self.async_supported = false;
        self
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.recorded().clone()
    }

    /// The only request received, or `None` unless exactly one was.
    pub fn request(&self) -> Option<ChatRequest> {
        match self.recorded().as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        }
    }

    /// How many requests were received.
    pub fn call_count(&self) -> usize {
        self.recorded().len()
    }

    fn recorded(&self) -> MutexGuard<'_, Vec<ChatRequest>> {
        // A test that panicked while holding the lock must not hide the requests from the next.
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn respond(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
        self.recorded().push(request.clone());
        let mut response = (self.answer)(request)?;
        if response.model_name.is_none() {
            response.model_name = self.model_name.clone();
        }
        Ok(response)
    }
}

impl ChatModel for MockChatModel {
    fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
        self.respond(request)
    }

    fn chat_async(&self, request: ChatRequest) -> ChatFuture {
        if !self.async_supported {
            return Box::pin(std::future::ready(Err(ChatModelError::AsyncNotSupported {
                model: self
                    .model_name
                    .clone()
                    .unwrap_or_else(|| "MockChatModel".to_owned()),
            })));
        }
        Box::pin(std::future::ready(self.respond(&request)))
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn model_name(&self) -> Option<String> {
        self.model_name.clone()
    }
}

impl fmt::Debug for MockChatModel {
    // The answer is a closure with nothing useful to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockChatModel")
            .field("model_name", &self.model_name)
            .field("capabilities", &self.capabilities)
            .field("async_supported", &self.async_supported)
            .field("requests", &self.recorded().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use serde_json::json;

    use super::*;
    use crate::message::ToolCall;

    /// The result of a future that must be ready at once, as the mock's are.
    fn ready<T>(future: Pin<Box<dyn Future<Output = T> + Send>>) -> T {
        let mut future = future;
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(value) => value,
            Poll::Pending => panic!("the future is not ready"),
        }
    }

    #[test]
    fn builder_keeps_every_part() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let request = ChatRequest::builder()
            .message(ChatMessage::system("Be brief."))
            .message(ChatMessage::user("Weather?"))
            .tools(vec![ToolSpecification::new("get_weather")])
            .response_format(ResponseFormat::JsonSchema(schema.clone()))
            .model_name("gpt-x")
            .temperature(0.2)
            .top_p(0.9)
            .max_output_tokens(100)
            .stop_sequences(["END"])
            .build()
            .unwrap();
        assert_eq!(request.messages().len(), 2);
        assert_eq!(request.tools()[0].name, "get_weather");
        assert_eq!(
            request.response_format(),
            &ResponseFormat::JsonSchema(schema)
        );
        assert_eq!(request.model_name(), Some("gpt-x"));
        assert_eq!(request.temperature(), Some(0.2));
        assert_eq!(request.top_p(), Some(0.9));
        assert_eq!(request.max_output_tokens(), Some(100));
        assert_eq!(request.stop_sequences(), ["END"]);
        assert_eq!(request.to_builder().build().unwrap(), request);
        let plain = ChatRequest::user("hi");
        assert_eq!(plain.messages(), [ChatMessage::user("hi")]);
        assert_eq!(plain.response_format(), &ResponseFormat::Text);
        assert_eq!(plain.temperature(), None);
        assert!(plain.tools().is_empty());
    }

    #[test]
    fn builder_names_what_is_wrong() {
        let error = |builder: ChatRequestBuilder| builder.build().unwrap_err().to_string();
        let base = || ChatRequest::builder().message(ChatMessage::user("hi"));
        assert_eq!(
            error(ChatRequest::builder()),
            "invalid chat request: messages: at least one message is required"
        );
        assert!(ChatRequest::from_messages(Vec::new()).is_err());
        assert!(error(base().temperature(-0.1)).contains("temperature"));
        assert!(error(base().temperature(f64::NAN)).contains("temperature"));
        assert!(error(base().top_p(0.0)).contains("top_p"));
        assert!(error(base().top_p(1.5)).contains("top_p"));
        assert!(error(base().max_output_tokens(0)).contains("max_output_tokens"));
        assert!(
            error(base().response_format(ResponseFormat::JsonSchema(json!("x"))))
                .contains("response_format")
        );
        assert!(base().temperature(0.0).top_p(1.0).build().is_ok());
    }

    #[test]
    fn only_a_json_schema_needs_a_capability() {
        let with = |format| {
            ChatRequest::user("x")
                .to_builder()
                .response_format(format)
                .build()
                .unwrap()
                .required_capabilities()
        };
        assert_eq!(with(ResponseFormat::Text), Capabilities::NONE);
        assert_eq!(with(ResponseFormat::Json), Capabilities::NONE);
        assert_eq!(
            with(ResponseFormat::JsonSchema(json!({"type": "object"}))),
            Capabilities::JSON_SCHEMA_RESPONSE_FORMAT
        );
    }

    #[test]
    fn capabilities_contain_and_unite() {
        let schema = Capabilities::JSON_SCHEMA_RESPONSE_FORMAT;
        assert!(schema.contains(&Capabilities::NONE));
        assert!(schema.contains(&schema));
        assert!(!Capabilities::NONE.contains(&schema));
        assert!(Capabilities::NONE.contains(&Capabilities::NONE));
        assert_eq!(Capabilities::NONE.union(schema), schema);
        assert!(Capabilities::NONE.is_empty());
        assert!(!schema.is_empty());
        assert_eq!(schema.to_string(), "json_schema_response_format");
        assert_eq!(Capabilities::NONE.to_string(), "none");
        assert_eq!(Capabilities::default(), Capabilities::NONE);
    }

    #[test]
    fn responses_carry_attributes() {
        let response = ChatResponse::text("hello")
            .with_model_name("m")
            .with_token_usage(ChatTokenUsage::new(3, 4))
            .with_attribute("chat_model_route", "simple")
            .with_attribute("chat_model_route", "complex");
        assert_eq!(response.message.text.as_deref(), Some("hello"));
        assert_eq!(response.model_name.as_deref(), Some("m"));
        assert_eq!(response.token_usage.unwrap().total(), 7);
        assert_eq!(
            response.attribute("chat_model_route"),
            Some(&json!("complex"))
        );
        assert_eq!(response.attribute("other"), None);
    }

    #[test]
    fn default_chat_async_is_not_supported() {
        struct Plain;
        impl ChatModel for Plain {
            fn chat(&self, _request: &ChatRequest) -> Result<ChatResponse, ChatModelError> {
                Ok(ChatResponse::text("ok"))
            }
        }
        let error = ready(Plain.chat_async(ChatRequest::user("x"))).unwrap_err();
        match error {
            ChatModelError::AsyncNotSupported { model } => {
                assert!(model.ends_with("Plain"), "{model}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(Plain.capabilities(), Capabilities::NONE);
        assert_eq!(Plain.model_name(), None);
    }

    #[test]
    fn mock_answers_records_and_declares() {
        let mock = MockChatModel::answering("hi there")
            .with_model_name("small")
            .with_capabilities(Capabilities::JSON_SCHEMA_RESPONSE_FORMAT);
        assert_eq!(mock.request(), None);
        let response = mock.chat(&ChatRequest::user("hello")).unwrap();
        assert_eq!(response.message.text.as_deref(), Some("hi there"));
        assert_eq!(response.model_name.as_deref(), Some("small"));
        assert_eq!(mock.request(), Some(ChatRequest::user("hello")));
        let response = ready(mock.chat_async(ChatRequest::user("again"))).unwrap();
        assert_eq!(response.message.text.as_deref(), Some("hi there"));
        assert_eq!(mock.call_count(), 2);
        assert_eq!(mock.request(), None, "more than one request");
        assert_eq!(mock.requests()[1], ChatRequest::user("again"));
        assert!(mock.capabilities().json_schema_response_format);
        assert_eq!(mock.model_name().as_deref(), Some("small"));
        assert!(format!("{mock:?}").contains("requests: 2"));
    }

    #[test]
    fn mock_computes_fails_and_refuses_async() {
        let calls = MockChatModel::answers(|request| {
            Ok(ChatResponse::new(AssistantMessage {
                text: None,
                tool_calls: vec![ToolCall::new(
                    Some("c1"),
                    "echo",
                    request.messages().len().to_string(),
                )],
            }))
        });
        let response = calls.chat(&ChatRequest::user("x")).unwrap();
        assert_eq!(response.message.tool_calls[0].arguments, "1");

        let failing = MockChatModel::always_fails_with("provider down");
        assert_eq!(
            failing
                .chat(&ChatRequest::user("x"))
                .unwrap_err()
                .to_string(),
            "provider down"
        );
        assert_eq!(failing.call_count(), 1);

        let sync_only = MockChatModel::answering("x").without_async_support();
        let error = ready(sync_only.chat_async(ChatRequest::user("x"))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "MockChatModel does not support asynchronous calls"
        );
        assert_eq!(sync_only.call_count(), 0, "not called");
    }

    #[test]
    fn shared_and_boxed_models_forward() {
        let mock = Arc::new(
            MockChatModel::answering("x")
                .with_model_name("m")
                .with_capabilities(Capabilities::JSON_SCHEMA_RESPONSE_FORMAT),
        );
        let shared: Arc<dyn ChatModel> = mock.clone();
        assert_eq!(shared.model_name().as_deref(), Some("m"));
        assert!(shared.capabilities().json_schema_response_format);
        assert!(shared.chat(&ChatRequest::user("x")).is_ok());
        assert!(ready(shared.chat_async(ChatRequest::user("x"))).is_ok());
        let boxed: Box<dyn ChatModel> = Box::new(MockChatModel::answering("y"));
        assert!(boxed.chat(&ChatRequest::user("x")).is_ok());
        assert_eq!(mock.call_count(), 2);
    }

    #[test]
    fn errors_read_well_and_keep_their_source() {
        assert_eq!(
            ChatModelError::Unsupported("JSON schema".into()).to_string(),
            "unsupported: JSON schema"
        );
        let error = ChatModelError::from_error(std::io::Error::other("disk"));
        let ChatModelError::Model(inner) = error else {
            panic!("not a model error")
        };
        assert!(inner.downcast_ref::<std::io::Error>().is_some());
    }
}
