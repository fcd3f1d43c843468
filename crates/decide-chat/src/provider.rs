//! The tool-provider interface, modelled on LangChain4j's `ToolProvider`.
//!
//! An agent asks its [`ToolProvider`]s for tools before calling the LLM. A provider may be a fixed list
//! ([`StaticToolProvider`]), an MCP client, or a decorator such as the decision-model filter of the `decide-filter`
//! crate, which passes on only the tools a conversation needs. The types live here, next to the conversation types,
//! so that the filter, the router and the agent loop all speak the same interface.
//!
//! A provider that is [dynamic](ToolProvider::is_dynamic) is asked again before every LLM call of the tool-calling
//! loop, with the messages of the earlier rounds; a static one is asked once per user message.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::message::{ChatMessage, UserMessage};
use crate::tool::ToolSpecification;

/// A boxed error from a provider or an executor.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Who is calling and in which conversation: passed to providers and tool executors unchanged.
///
/// The attributes are free-form (user id, tenant, locale, …) because only the application knows what its tools need
/// to check; they are JSON values so that they can cross process boundaries (an MCP call, a log line) as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InvocationContext {
    /// The id of the chat memory the conversation is stored in, if the caller has one.
    pub chat_memory_id: Option<String>,
    /// The caller's attributes, in insertion order.
    pub attributes: Map<String, Value>,
}

impl InvocationContext {
    /// An empty context: no memory id, no attributes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same context with a chat memory id.
    pub fn with_chat_memory_id(mut self, id: impl Into<String>) -> Self {
        self.chat_memory_id = Some(id.into());
        self
    }

    /// The same context with one more attribute; an attribute of the same name is replaced.
    pub fn with_attribute(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// The attribute `name`, if set.
    pub fn attribute(&self, name: &str) -> Option<&Value> {
        self.attributes.get(name)
    }
}

/// Why a tool could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolExecutionError {
    /// The arguments the LLM sent do not fit the tool: the agent loop shows this to the LLM so it can retry.
    #[error("invalid tool arguments: {0}")]
    InvalidArguments(String),
    /// The tool itself failed, shown as is; downcast it to inspect it.
    #[error(transparent)]
    Failed(BoxError),
}

impl ToolExecutionError {
    /// A [`Failed`](Self::Failed) error that only has a message.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into().into())
    }
}

/// Runs one tool.
///
/// Synchronous for now: an asynchronous variant comes with the agent loop. Any
/// `Fn(&str, &InvocationContext) -> Result<String, ToolExecutionError>` closure is an executor.
pub trait ToolExecutor: Send + Sync {
    /// Runs the tool with the raw JSON `arguments` the LLM sent and returns the text for the tool-result message.
    fn execute(
        &self,
        arguments: &str,
        context: &InvocationContext,
    ) -> Result<String, ToolExecutionError>;
}

impl<F> ToolExecutor for F
where
    F: Fn(&str, &InvocationContext) -> Result<String, ToolExecutionError> + Send + Sync,
{
    fn execute(
        &self,
        arguments: &str,
        context: &InvocationContext,
    ) -> Result<String, ToolExecutionError> {
        self(arguments, context)
    }
}

/// A tool as a provider hands it out: what the LLM sees, and how to run it.
#[derive(Clone)]
pub struct ProvidedTool {
    /// What the LLM sees.
    pub specification: ToolSpecification,
    /// How to run the tool; `None` when the caller runs it (a tool whose calls are returned to the application).
    pub executor: Option<Arc<dyn ToolExecutor>>,
}

impl ProvidedTool {
    /// A tool without an executor.
    pub fn new(specification: ToolSpecification) -> Self {
        Self {
            specification,
            executor: None,
        }
    }

    /// The same tool with an executor.
    pub fn with_executor(mut self, executor: Arc<dyn ToolExecutor>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.specification.name
    }
}

impl From<ToolSpecification> for ProvidedTool {
    fn from(specification: ToolSpecification) -> Self {
        Self::new(specification)
    }
}

impl fmt::Debug for ProvidedTool {
    // Executors are closures or clients with nothing useful to print; whether there is one is what matters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProvidedTool")
            .field("specification", &self.specification)
            .field("executor", &self.executor.as_ref().map(|_| "..."))
            .finish()
    }
}

/// What a provider is asked with: the user message, the conversation so far and who is asking.
///
/// Build it with [`ToolProviderRequest::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolProviderRequest {
    user_message: UserMessage,
    original_user_message: Option<UserMessage>,
    messages: Option<Vec<ChatMessage>>,
    invocation_context: InvocationContext,
}

impl ToolProviderRequest {
    /// Starts a request for `user_message`: the message as it will be sent to the LLM.
    pub fn builder(user_message: UserMessage) -> ToolProviderRequestBuilder {
        ToolProviderRequestBuilder {
            request: ToolProviderRequest {
                user_message,
                original_user_message: None,
                messages: None,
                invocation_context: InvocationContext::default(),
            },
        }
    }

    /// The user message as it will be sent to the LLM, possibly with retrieved content or format instructions added.
    pub fn user_message(&self) -> &UserMessage {
        &self.user_message
    }

    /// The user message as the user sent it, if the caller changed it before sending it on.
    pub fn original_user_message(&self) -> Option<&UserMessage> {
        self.original_user_message.as_ref()
    }

    /// The messages before this call, as stored; `None` when the caller did not pass them, which is not the same as
    /// a conversation that has none yet (`Some(&[])`).
    pub fn messages(&self) -> Option<&[ChatMessage]> {
        self.messages.as_deref()
    }

    /// Who is asking.
    pub fn invocation_context(&self) -> &InvocationContext {
        &self.invocation_context
    }

    /// The chat memory id of the invocation context, if any.
    pub fn chat_memory_id(&self) -> Option<&str> {
        self.invocation_context.chat_memory_id.as_deref()
    }
}

/// Builds a [`ToolProviderRequest`]; every part but the user message is optional.
#[derive(Debug, Clone)]
pub struct ToolProviderRequestBuilder {
    request: ToolProviderRequest,
}

impl ToolProviderRequestBuilder {
    /// The user message as the user sent it, before retrieved content or format instructions were added.
    pub fn original_user_message(mut self, message: UserMessage) -> Self {
        self.request.original_user_message = Some(message);
        self
    }

    /// The messages before this call, as stored in the chat memory (in a tool-calling loop, including the current
    /// user message and the tool calls and results of the earlier rounds).
    pub fn messages(mut self, messages: Vec<ChatMessage>) -> Self {
        self.request.messages = Some(messages);
        self
    }

    /// Who is asking.
    pub fn invocation_context(mut self, context: InvocationContext) -> Self {
        self.request.invocation_context = context;
        self
    }

    /// The request.
    pub fn build(self) -> ToolProviderRequest {
        self.request
    }
}

/// The tools a provider hands out, in the order the LLM should see them.
#[derive(Debug, Clone, Default)]
pub struct ToolProviderResult {
    /// The tools, in order.
    pub tools: Vec<ProvidedTool>,
}

impl ToolProviderResult {
    /// A result with these tools.
    pub fn new(tools: Vec<ProvidedTool>) -> Self {
        Self { tools }
    }

    /// A result with these specifications and no executors.
    pub fn from_specifications(
        specifications: impl IntoIterator<Item = ToolSpecification>,
    ) -> Self {
        Self::new(specifications.into_iter().map(ProvidedTool::new).collect())
    }

    /// The tools' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(ProvidedTool::name).collect()
    }

    /// The tools' specifications, in order.
    pub fn specifications(&self) -> impl Iterator<Item = &ToolSpecification> + '_ {
        self.tools.iter().map(|tool| &tool.specification)
    }

    /// The first tool named `name`.
    pub fn get(&self, name: &str) -> Option<&ProvidedTool> {
        self.tools.iter().find(|tool| tool.name() == name)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Only the tools whose name is among `names`, in this result's order (not the order of `names`): the order the
    /// provider chose is kept, which keeps prompts stable for the LLM provider's cache.
    pub fn filter_by_names<I, S>(self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names: Vec<S> = names.into_iter().collect();
        let keep = |tool: &ProvidedTool| names.iter().any(|n| n.as_ref() == tool.name());
        Self::new(self.tools.into_iter().filter(keep).collect())
    }
}

/// Why a provider could not hand out its tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolProviderError {
    /// The provider's own error, shown as is (an MCP server that is down, a decision model that failed, …); downcast
    /// it to inspect it.
    #[error(transparent)]
    Provider(BoxError),
}

impl ToolProviderError {
    /// An error that only has a message.
    pub fn message(message: impl Into<String>) -> Self {
        Self::Provider(message.into().into())
    }

    /// Wraps a provider's own error, keeping it for downcasting.
    pub fn from_error(error: impl StdError + Send + Sync + 'static) -> Self {
        Self::Provider(Box::new(error))
    }
}

/// A source of tools for an agent, asked before the LLM is called.
pub trait ToolProvider: Send + Sync {
    /// The tools for this request.
    fn provide_tools(
        &self,
        request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError>;

    /// Whether the tools can change during one user turn, so that the provider must be asked again before each LLM
    /// call of the tool-calling loop rather than once per user message.
    fn is_dynamic(&self) -> bool {
        false
    }
}

// Forwarding impls, so that shared and boxed providers (`Arc<dyn ToolProvider>`) are providers too.
macro_rules! forward_tool_provider {
    ($($wrapper:ty),*) => {$(
        impl<T: ToolProvider + ?Sized> ToolProvider for $wrapper {
            fn provide_tools(
                &self,
                request: &ToolProviderRequest,
            ) -> Result<ToolProviderResult, ToolProviderError> {
                (**self).provide_tools(request)
            }

            fn is_dynamic(&self) -> bool {
                (**self).is_dynamic()
            }
        }
    )*};
}

forward_tool_provider!(Arc<T>, Box<T>, &T);

/// A provider with a fixed list of tools, handed out whatever the request.
#[derive(Debug, Clone, Default)]
pub struct StaticToolProvider {
    tools: Vec<ProvidedTool>,
}

impl StaticToolProvider {
    /// A provider of these tools, in this order.
    pub fn new(tools: Vec<ProvidedTool>) -> Self {
        Self { tools }
    }

    /// A provider of these specifications, without executors.
    pub fn from_specifications(
        specifications: impl IntoIterator<Item = ToolSpecification>,
    ) -> Self {
        Self::new(specifications.into_iter().map(ProvidedTool::new).collect())
    }

    /// The tools it hands out.
    pub fn tools(&self) -> &[ProvidedTool] {
        &self.tools
    }
}

impl ToolProvider for StaticToolProvider {
    fn provide_tools(
        &self,
        _request: &ToolProviderRequest,
    ) -> Result<ToolProviderResult, ToolProviderError> {
        Ok(ToolProviderResult::new(self.tools.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn specs(names: &[&str]) -> Vec<ToolSpecification> {
        names.iter().map(|n| ToolSpecification::new(*n)).collect()
    }

    fn request() -> ToolProviderRequest {
        ToolProviderRequest::builder(UserMessage::new("hi")).build()
    }

    #[test]
    fn static_provider_hands_out_its_tools_and_is_not_dynamic() {
        let provider = StaticToolProvider::from_specifications(specs(&["b", "a", "c"]));
        let result = provider.provide_tools(&request()).unwrap();
        assert_eq!(result.names(), ["b", "a", "c"]);
        assert!(!provider.is_dynamic());
        assert_eq!(provider.tools().len(), 3);
    }

    #[test]
    fn filter_by_names_keeps_the_result_order() {
        let result = ToolProviderResult::from_specifications(specs(&["a", "b", "c", "d"]));
        let filtered = result.filter_by_names(["d", "b", "zzz"]);
        assert_eq!(filtered.names(), ["b", "d"]);
        assert_eq!(filtered.len(), 2);
        assert!(!filtered.is_empty());
        assert!(filtered.get("d").is_some());
        assert!(filtered.get("a").is_none());
        assert!(ToolProviderResult::default().is_empty());
        let names: Vec<_> = filtered.specifications().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["b", "d"]);
    }

    #[test]
    fn request_builder_keeps_every_part() {
        let context = InvocationContext::new()
            .with_chat_memory_id("chat-1")
            .with_attribute("user_id", "u-7")
            .with_attribute("tenant", json!({"id": 3}));
        let request = ToolProviderRequest::builder(UserMessage::new("augmented"))
            .original_user_message(UserMessage::new("original"))
            .messages(vec![ChatMessage::system("s")])
            .invocation_context(context.clone())
            .build();
        assert_eq!(request.user_message(), &UserMessage::new("augmented"));
        assert_eq!(
            request.original_user_message(),
            Some(&UserMessage::new("original"))
        );
        assert_eq!(request.messages(), Some(&[ChatMessage::system("s")][..]));
        assert_eq!(request.invocation_context(), &context);
        assert_eq!(request.chat_memory_id(), Some("chat-1"));
        assert_eq!(context.attribute("user_id"), Some(&json!("u-7")));
        assert_eq!(context.attribute("missing"), None);
    }

    #[test]
    fn messages_not_passed_differ_from_no_messages() {
        assert_eq!(request().messages(), None);
        let empty = ToolProviderRequest::builder(UserMessage::new("hi"))
            .messages(Vec::new())
            .build();
        assert_eq!(empty.messages(), Some(&[][..]));
        assert_eq!(request().original_user_message(), None);
        assert_eq!(request().chat_memory_id(), None);
    }

    #[test]
    fn closures_are_executors() {
        let echo: Arc<dyn ToolExecutor> = Arc::new(|args: &str, ctx: &InvocationContext| {
            if args.trim().is_empty() {
                return Err(ToolExecutionError::InvalidArguments("empty".into()));
            }
            Ok(format!(
                "{args} for {}",
                ctx.chat_memory_id.as_deref().unwrap_or("-")
            ))
        });
        let tool = ProvidedTool::new(ToolSpecification::new("echo")).with_executor(echo);
        let executor = tool.executor.as_ref().unwrap();
        let context = InvocationContext::new().with_chat_memory_id("m");
        assert_eq!(executor.execute("{}", &context).unwrap(), "{} for m");
        let error = executor.execute(" ", &context).unwrap_err();
        assert_eq!(error.to_string(), "invalid tool arguments: empty");
        assert_eq!(ToolExecutionError::failed("boom").to_string(), "boom");
        assert!(format!("{tool:?}").contains("executor: Some"));
    }

    #[test]
    fn shared_and_boxed_providers_forward() {
        struct Dynamic;
        impl ToolProvider for Dynamic {
            fn provide_tools(
                &self,
                _request: &ToolProviderRequest,
            ) -> Result<ToolProviderResult, ToolProviderError> {
                Err(ToolProviderError::message("server down"))
            }
            fn is_dynamic(&self) -> bool {
                true
            }
        }
        let shared: Arc<dyn ToolProvider> = Arc::new(Dynamic);
        assert!(shared.is_dynamic());
        let error = shared.provide_tools(&request()).unwrap_err();
        assert_eq!(error.to_string(), "server down");
        let boxed: Box<dyn ToolProvider> = Box::new(StaticToolProvider::default());
        assert!(!boxed.is_dynamic());
        assert!(boxed.provide_tools(&request()).unwrap().is_empty());
    }

    #[test]
    fn provider_errors_keep_their_source() {
        let error = ToolProviderError::from_error(std::io::Error::other("disk"));
        let ToolProviderError::Provider(inner) = error;
        assert!(inner.downcast_ref::<std::io::Error>().is_some());
    }
}
