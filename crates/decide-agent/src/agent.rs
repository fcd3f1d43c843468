//! The agent: the tool-calling loop around a chat model.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use decide_chat::{
    ChatMessage, ChatModel, ChatModelError, ChatRequest, ChatResponse, ChatStreamEvent,
    InvocationContext, StreamingChatModel, ToolProvider, ToolProviderError, ToolProviderRequest,
    ToolSpecification, UserMessage,
};
use futures_core::Stream;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::memory::{MemoryError, MessageWindowChatMemory};
use crate::tool::{execute_tool_calls, Tool, ToolBox, ToolExecution};

/// The default [`AgentBuilder::max_rounds`]: LLM calls per user message.
pub const DEFAULT_MAX_ROUNDS: usize = 10;

/// The memory id used when neither the request nor its context names one.
pub const DEFAULT_MEMORY_ID: &str = "default";

/// Why an agent could not be built or could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// Two tools have the same name: the LLM calls tools by name, so it could not say which it means.
    #[error("duplicate tool name '{name}': {detail}")]
    DuplicateTool {
        /// The name.
        name: String,
        /// Where the two tools come from.
        detail: String,
    },
    /// The agent's configuration is not usable; the message names the option.
    #[error("invalid agent configuration: {0}")]
    InvalidConfiguration(String),
    /// The LLM still asked for tools after the last allowed round.
    #[error(
        "the LLM still called tools after {max_rounds} rounds (last: {last_calls}); raise max_rounds or check \
         the tools"
    )]
    MaxRoundsReached {
        /// The limit.
        max_rounds: usize,
        /// The tools of the last round's calls, comma-separated.
        last_calls: String,
    },
    /// The chat model failed.
    #[error("chat model: {0}")]
    ChatModel(#[from] ChatModelError),
    /// The tool provider failed.
    #[error("tool provider: {0}")]
    ToolProvider(#[from] ToolProviderError),
    /// The chat memory failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A task of the agent (the provider on the blocking pool, the streaming loop) panicked or was cancelled.
    #[error("agent task failed: {0}")]
    Task(String),
}

/// One user message for an agent, with the conversation it belongs to and the caller's context.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRequest {
    message: UserMessage,
    memory_id: Option<String>,
    context: InvocationContext,
}

impl AgentRequest {
    /// A plain text user message.
    pub fn new(text: impl Into<String>) -> Self {
        Self::from_message(UserMessage::new(text))
    }

    /// A user message with any content.
    pub fn from_message(message: UserMessage) -> Self {
        Self {
            message,
            memory_id: None,
            context: InvocationContext::default(),
        }
    }

    /// The conversation this message belongs to; default: the context's chat memory id, else
    /// [`DEFAULT_MEMORY_ID`].
    pub fn memory_id(mut self, id: impl Into<String>) -> Self {
        self.memory_id = Some(id.into());
        self
    }

    /// The caller's context (user id, tenant, …), passed to the tool provider and to every tool call.
    pub fn context(mut self, context: InvocationContext) -> Self {
        self.context = context;
        self
    }
}

/// One LLM call of a turn: the tools it was sent, what it answered, and the tool calls it led to.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The names of the tools sent with the call, in the order sent.
    pub tools: Vec<String>,
    /// The model's response (its attributes say, for instance, which route the router chose).
    pub response: ChatResponse,
    /// The tool calls of the response, executed, in call order.
    pub executions: Vec<ToolExecution>,
}

/// The answer to one user message.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentResponse {
    /// The final answer's text (empty if the model answered without text).
    pub text: String,
    /// Every LLM call of the turn, in order; the last one has no tool calls.
    pub rounds: Vec<Round>,
    /// The messages the turn added to the conversation: the user message, the assistant messages and the tool
    /// results.
    pub messages: Vec<ChatMessage>,
}

impl AgentResponse {
    /// The last LLM response.
    pub fn response(&self) -> Option<&ChatResponse> {
        self.rounds.last().map(|round| &round.response)
    }

    /// Every tool execution of the turn, in order.
    pub fn tool_executions(&self) -> impl Iterator<Item = &ToolExecution> {
        self.rounds.iter().flat_map(|round| round.executions.iter())
    }
}

/// One event of a streamed agent turn.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// A piece of the answer's text, as the LLM produced it.
    Token(String),
    /// A tool call was executed.
    ToolExecuted(ToolExecution),
    /// The turn is over; the last event.
    Done(AgentResponse),
}

/// The stream of a streamed agent turn.
pub type AgentStream = Pin<Box<dyn Stream<Item = Result<AgentEvent, AgentError>> + Send>>;

/// Sampling parameters for every LLM call of the agent.
#[derive(Debug, Clone, Default, PartialEq)]
struct Parameters {
    model_name: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<u32>,
}

/// An agent: sends the conversation and the tools to a chat model, runs the tools it calls, sends the results back,
/// and repeats until the model answers.
///
/// Cheap to clone: everything is shared.
#[derive(Clone)]
pub struct Agent {
    chat_model: Arc<dyn ChatModel>,
    streaming_model: Option<Arc<dyn StreamingChatModel>>,
    system_message: Option<String>,
    tools: Arc<Vec<Tool>>,
    tool_provider: Option<Arc<dyn ToolProvider>>,
    memory: Option<MessageWindowChatMemory>,
    max_rounds: usize,
    parameters: Parameters,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("chat_model", &self.chat_model.model_name())
            .field("streaming", &self.streaming_model.is_some())
            .field("system_message", &self.system_message)
            .field(
                "tools",
                &self.tools.iter().map(Tool::name).collect::<Vec<_>>(),
            )
            .field("tool_provider", &self.tool_provider.is_some())
            .field("memory", &self.memory)
            .field("max_rounds", &self.max_rounds)
            .finish()
    }
}

impl Agent {
    /// Starts an agent around `chat_model` (a client, or the model router).
    pub fn builder(chat_model: Arc<dyn ChatModel>) -> AgentBuilder {
        AgentBuilder {
            chat_model,
            streaming_model: None,
            system_message: None,
            tools: Vec::new(),
            tool_provider: None,
            memory: None,
            max_rounds: DEFAULT_MAX_ROUNDS,
            parameters: Parameters::default(),
        }
    }

    /// The tools configured on the agent, in order.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The chat memory, if any.
    pub fn memory(&self) -> Option<&MessageWindowChatMemory> {
        self.memory.as_ref()
    }

    /// Answers one user message, running the tools the model calls on the way.
    pub async fn chat(&self, request: AgentRequest) -> Result<AgentResponse, AgentError> {
        self.run(request, None).await
    }

    /// Answers one user message as a stream: tokens as they arrive (with a streaming model; else the answer as one
    /// token), an event per executed tool call, and the response last.
    ///
    /// The turn runs as a task of the current Tokio runtime; dropping the stream lets it finish without anyone
    /// listening.
    pub fn chat_stream(&self, request: AgentRequest) -> AgentStream {
        let (sender, receiver) = mpsc::unbounded_channel();
        let agent = self.clone();
        let task = tokio::spawn(async move {
            let result = agent.run(request, Some(&sender)).await;
            let _ = sender.send(result.map(AgentEvent::Done));
        });
        let events = futures_util::stream::unfold(
            (receiver, Some(task)),
            |(mut receiver, task)| async move {
                match receiver.recv().await {
                    Some(event) => Some((event, (receiver, task))),
                    None => {
                        // The loop ends with a Done or an error, so the channel closes early only if the task died.
                        let error = match task?.await {
                            Err(error) => AgentError::Task(error.to_string()),
                            Ok(()) => return None,
                        };
                        Some((Err(error), (receiver, None)))
                    }
                }
            },
        );
        Box::pin(events)
    }

    async fn run(
        &self,
        request: AgentRequest,
        events: Option<&mpsc::UnboundedSender<Result<AgentEvent, AgentError>>>,
    ) -> Result<AgentResponse, AgentError> {
        let AgentRequest {
            message,
            memory_id,
            mut context,
        } = request;
        let memory_id = memory_id
            .or_else(|| context.chat_memory_id.clone())
            .unwrap_or_else(|| DEFAULT_MEMORY_ID.to_owned());
        context.chat_memory_id = Some(memory_id.clone());

        let mut conversation = Conversation::start(self.memory.clone(), memory_id)?;
        if let Some(system) = &self.system_message {
            conversation.add(ChatMessage::system(system.clone()), false)?;
        }
        conversation.add(ChatMessage::User(message.clone()), true)?;

        let mut provided: Option<Vec<Tool>> = None;
        let mut rounds: Vec<Round> = Vec::new();
        for round in 0..self.max_rounds {
            let provider_dynamic = self.tool_provider.as_ref().is_some_and(|p| p.is_dynamic());
            if provided.is_none() || provider_dynamic {
                provided = Some(
                    self.provided_tools(&message, conversation.messages()?, &context)
                        .await?,
                );
            }
            let tools = self.tools_for_call(provided.as_deref().unwrap_or_default())?;
            let specifications: Vec<ToolSpecification> =
                tools.iter().map(|t| t.specification().clone()).collect();
            let names = specifications.iter().map(|s| s.name.clone()).collect();
            let chat_request = self.chat_request(conversation.messages()?, specifications)?;
            let response = self.call_model(chat_request, events).await?;
            conversation.add(ChatMessage::Assistant(response.message.clone()), true)?;
            let calls = response.message.tool_calls.clone();
            if calls.is_empty() {
                let text = response.message.text.clone().unwrap_or_default();
                rounds.push(Round {
                    tools: names,
                    response,
                    executions: Vec::new(),
                });
                return Ok(AgentResponse {
                    text,
                    rounds,
                    messages: conversation.added,
                });
            }
            tracing::debug!(round, calls = calls.len(), "executing tool calls");
            let by_name: HashMap<String, Tool> = tools
                .into_iter()
                .map(|tool| (tool.name().to_owned(), tool))
                .collect();
            let executions = execute_tool_calls(&calls, &by_name, &context).await;
            for execution in &executions {
                if let Some(events) = events {
                    let _ = events.send(Ok(AgentEvent::ToolExecuted(execution.clone())));
                }
                conversation.add(ChatMessage::ToolResult(execution.result_message()), true)?;
            }
            rounds.push(Round {
                tools: names,
                response,
                executions,
            });
        }
        let last_calls = rounds
            .last()
            .map(|round| {
                let names: Vec<&str> = round
                    .executions
                    .iter()
                    .map(|e| e.call.name.as_str())
                    .collect();
                names.join(", ")
            })
            .unwrap_or_default();
        Err(AgentError::MaxRoundsReached {
            max_rounds: self.max_rounds,
            last_calls,
        })
    }

    /// The provider's tools for this call, asked on the blocking pool: a filtering provider runs a model.
    async fn provided_tools(
        &self,
        message: &UserMessage,
        messages: Vec<ChatMessage>,
        context: &InvocationContext,
    ) -> Result<Vec<Tool>, AgentError> {
        let Some(provider) = &self.tool_provider else {
            return Ok(Vec::new());
        };
        let request = ToolProviderRequest::builder(message.clone())
            .messages(messages)
            .invocation_context(context.clone())
            .build();
        let provider = Arc::clone(provider);
        let result = tokio::task::spawn_blocking(move || provider.provide_tools(&request))
            .await
            .map_err(|error| AgentError::Task(format!("tool provider: {error}")))??;
        Ok(result
            .tools
            .into_iter()
            .filter_map(|tool| {
                let name = tool.name().to_owned();
                let tool = Tool::from_provided(tool);
                if tool.is_none() {
                    tracing::warn!(tool = %name, "the provider's tool has no executor; not sent");
                }
                tool
            })
            .collect())
    }

    /// The agent's own tools, then the provider's; a name in both is an error.
    fn tools_for_call(&self, provided: &[Tool]) -> Result<Vec<Tool>, AgentError> {
        let mut tools: Vec<Tool> = self.tools.to_vec();
        for tool in provided {
            if tools.iter().any(|t| t.name() == tool.name()) {
                return Err(AgentError::DuplicateTool {
                    name: tool.name().to_owned(),
                    detail: "the tool provider hands out a tool with the name of another tool"
                        .into(),
                });
            }
            tools.push(tool.clone());
        }
        Ok(tools)
    }

    fn chat_request(
        &self,
        messages: Vec<ChatMessage>,
        tools: Vec<ToolSpecification>,
    ) -> Result<ChatRequest, AgentError> {
        let mut builder = ChatRequest::builder().messages(messages).tools(tools);
        let parameters = &self.parameters;
        if let Some(name) = &parameters.model_name {
            builder = builder.model_name(name.clone());
        }
        if let Some(t) = parameters.temperature {
            builder = builder.temperature(t);
        }
        if let Some(p) = parameters.top_p {
            builder = builder.top_p(p);
        }
        if let Some(m) = parameters.max_output_tokens {
            builder = builder.max_output_tokens(m);
        }
        Ok(builder.build()?)
    }

    /// One LLM call. Streamed when streaming to a caller with a streaming model; otherwise the model's asynchronous
    /// path, or its synchronous one on the blocking pool for a model without one (the router over a decision model
    /// that only decides synchronously).
    async fn call_model(
        &self,
        request: ChatRequest,
        events: Option<&mpsc::UnboundedSender<Result<AgentEvent, AgentError>>>,
    ) -> Result<ChatResponse, AgentError> {
        if let (Some(events), Some(model)) = (events, &self.streaming_model) {
            let mut stream = model.chat_stream(request);
            while let Some(event) = stream.next().await {
                match event? {
                    ChatStreamEvent::Token(token) => {
                        let _ = events.send(Ok(AgentEvent::Token(token)));
                    }
                    ChatStreamEvent::Response(response) => return Ok(response),
                }
            }
            return Err(AgentError::ChatModel(ChatModelError::model(
                "the stream ended without a response",
            )));
        }
        let response = match self.chat_model.chat_async(request.clone()).await {
            Err(ChatModelError::AsyncNotSupported { .. }) => {
                let model = Arc::clone(&self.chat_model);
                tokio::task::spawn_blocking(move || model.chat(&request))
                    .await
                    .map_err(|error| AgentError::Task(format!("chat model: {error}")))??
            }
            other => other?,
        };
        if let Some(events) = events {
            if response.message.tool_calls.is_empty() {
                if let Some(text) = response.message.text.as_ref().filter(|t| !t.is_empty()) {
                    let _ = events.send(Ok(AgentEvent::Token(text.clone())));
                }
            }
        }
        Ok(response)
    }
}

/// The messages of one turn: in the chat memory when the agent has one, else kept for the turn only.
struct Conversation {
    memory: Option<MessageWindowChatMemory>,
    memory_id: String,
    local: Vec<ChatMessage>,
    added: Vec<ChatMessage>,
}

impl Conversation {
    fn start(
        memory: Option<MessageWindowChatMemory>,
        memory_id: String,
    ) -> Result<Self, MemoryError> {
        Ok(Self {
            memory,
            memory_id,
            local: Vec::new(),
            added: Vec::new(),
        })
    }

    fn add(&mut self, message: ChatMessage, record: bool) -> Result<(), MemoryError> {
        if record {
            self.added.push(message.clone());
        }
        match &self.memory {
            Some(memory) => memory.add(&self.memory_id, message),
            None => {
                self.local.push(message);
                Ok(())
            }
        }
    }

    fn messages(&self) -> Result<Vec<ChatMessage>, MemoryError> {
        match &self.memory {
            Some(memory) => memory.messages(&self.memory_id),
            None => Ok(self.local.clone()),
        }
    }
}

/// Builds an [`Agent`]; every check happens in [`build`](Self::build).
pub struct AgentBuilder {
    chat_model: Arc<dyn ChatModel>,
    streaming_model: Option<Arc<dyn StreamingChatModel>>,
    system_message: Option<String>,
    tools: Vec<Tool>,
    tool_provider: Option<Arc<dyn ToolProvider>>,
    memory: Option<MessageWindowChatMemory>,
    max_rounds: usize,
    parameters: Parameters,
}

impl AgentBuilder {
    /// The model that streams when the agent is asked to stream ([`Agent::chat_stream`]); usually the same client
    /// as the chat model.
    pub fn streaming_chat_model(mut self, model: Arc<dyn StreamingChatModel>) -> Self {
        self.streaming_model = Some(model);
        self
    }

    /// The system message, first in every request.
    pub fn system_message(mut self, text: impl Into<String>) -> Self {
        self.system_message = Some(text.into());
        self
    }

    /// One more tool, always sent.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// More tools, always sent.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// The `#[tool]` methods of a `#[tools]` type, always sent.
    pub fn tool_box<T: ToolBox>(self, tool_box: Arc<T>) -> Self {
        self.tools(tool_box.into_tools())
    }

    /// A provider asked for more tools: once per user message, or before every LLM call if it is dynamic.
    pub fn tool_provider(mut self, provider: Arc<dyn ToolProvider>) -> Self {
        self.tool_provider = Some(provider);
        self
    }

    /// The chat memory; without one, each user message is a conversation of its own.
    pub fn chat_memory(mut self, memory: MessageWindowChatMemory) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The most LLM calls per user message (default [`DEFAULT_MAX_ROUNDS`]); at least 1.
    pub fn max_rounds(mut self, max_rounds: usize) -> Self {
        self.max_rounds = max_rounds;
        self
    }

    /// The model name sent with every request, for providers that serve several.
    pub fn model_name(mut self, name: impl Into<String>) -> Self {
        self.parameters.model_name = Some(name.into());
        self
    }

    /// The sampling temperature of every request.
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.parameters.temperature = Some(temperature);
        self
    }

    /// The nucleus-sampling mass of every request.
    pub fn top_p(mut self, top_p: f64) -> Self {
        self.parameters.top_p = Some(top_p);
        self
    }

    /// The most tokens of every reply.
    pub fn max_output_tokens(mut self, max: u32) -> Self {
        self.parameters.max_output_tokens = Some(max);
        self
    }

    /// Checks the configuration: unique tool names, at least one round, sampling parameters in range.
    pub fn build(self) -> Result<Agent, AgentError> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (index, tool) in self.tools.iter().enumerate() {
            if tool.name().trim().is_empty() {
                return Err(AgentError::InvalidConfiguration(format!(
                    "tools[{index}]: a tool name cannot be blank"
                )));
            }
            if let Some(first) = seen.insert(tool.name(), index) {
                return Err(AgentError::DuplicateTool {
                    name: tool.name().to_owned(),
                    detail: format!("tools[{first}] and tools[{index}] have it"),
                });
            }
        }
        if self.max_rounds == 0 {
            return Err(AgentError::InvalidConfiguration(
                "max_rounds: must be at least 1".into(),
            ));
        }
        let agent = Agent {
            chat_model: self.chat_model,
            streaming_model: self.streaming_model,
            system_message: self.system_message,
            tools: Arc::new(self.tools),
            tool_provider: self.tool_provider,
            memory: self.memory,
            max_rounds: self.max_rounds,
            parameters: self.parameters,
        };
        // Checks the sampling parameters once, here, rather than at the first message.
        agent
            .chat_request(vec![ChatMessage::user("check")], Vec::new())
            .map_err(|error| AgentError::InvalidConfiguration(error.to_string()))?;
        Ok(agent)
    }
}
