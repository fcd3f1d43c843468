//! The tool-calling agent loop that decide's tool filter and model router serve.
//!
//! An [`Agent`] sends the conversation and the tool specifications to a [`ChatModel`], runs the tools the model
//! asks for, appends the assistant message and the tool results, and calls the model again, until it answers
//! without tool calls or [`AgentBuilder::max_rounds`] is reached ([`AgentError::MaxRoundsReached`]). The LLM is
//! stateless, so the whole conversation is sent every time, as the OpenAI and Ollama transcripts of the user's
//! documents show.
//!
//! # Pieces
//!
//! * **Tools** are plain Rust functions with an attribute: `#[tool("Calculates the length of a string")] fn
//!   string_length(s: String) -> usize` adds `string_length_tool()`, whose specification has the JSON schema of the
//!   parameters derived from their types by `schemars`, with their doc comments as descriptions; `#[tools]` on an
//!   impl block makes its `#[tool]` methods a [`ToolBox`]. By hand: [`Tool::blocking`], [`Tool::from_async`].
//! * **Execution** ([`execute_tool_calls`]): a synchronous tool runs on the blocking pool, never on a runtime worker;
//!   an `async` one runs as a task. The caller's [`InvocationContext`] (user id, tenant, anything) reaches every
//!   call, the chat memory id included. The calls of one turn all start before any is awaited, so they run
//!   concurrently, and their results go back in call order. An error, a panic, invalid arguments or an unknown tool
//!   become the tool's result text (`Error: ...`), so the model can react, and the loop goes on.
//! * **Tools per call**: the agent's own tools are always sent; a [`ToolProvider`] (such as `decide-filter`'s
//!   `FilteringToolProvider`) is asked once per user message, or before every LLM call if it is dynamic, with the
//!   messages so far. Providers are asked on the blocking pool, because the filter runs a model. A tool name that
//!   appears twice is an error: at [`AgentBuilder::build`] for the agent's tools, at the call for a provider's.
//! * **Chat model**: any [`ChatModel`], such as `decide-router`'s `RoutingChatModel` or `decide-llm`'s clients. Its
//!   asynchronous path is used; a model without one (`AsyncNotSupported`) is called on the blocking pool.
//! * **Memory** ([`MessageWindowChatMemory`]): the latest N messages (N ≥ 3) per conversation id in a pluggable
//!   [`ChatMemoryStore`]. The system message is kept; evicting an assistant message that called tools evicts their
//!   results too, so a tool result never loses its call.
//! * **Streaming** ([`Agent::chat_stream`]): with a [`StreamingChatModel`], tokens reach the caller as they arrive;
//!   tool calls that arrive in a stream are executed like any other.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use decide_agent::{tool, Agent, AgentRequest};
//! use decide_chat::{AssistantMessage, ChatMessage, ChatResponse, MockChatModel, ToolCall};
//!
//! /// Calculates the length of a string.
//! #[tool]
//! fn string_length(/** The string to measure */ s: String) -> usize {
//!     s.chars().count()
//! }
//!
//! // A scripted model: calls the tool, then answers with what the tool returned.
//! let model = MockChatModel::answers(|request| {
//!     Ok(match request.messages().last() {
//!         Some(ChatMessage::ToolResult(result)) => ChatResponse::text(format!("{} letters", result.text)),
//!         _ => ChatResponse::new(AssistantMessage {
//!             text: None,
//!             tool_calls: vec![ToolCall::new(Some("c1"), "string_length", r#"{"s": "hello"}"#)],
//!         }),
//!     })
//! });
//! let agent = Agent::builder(Arc::new(model)).tool(string_length_tool()).build()?;
//! let runtime = tokio::runtime::Runtime::new()?;
//! let response = runtime.block_on(agent.chat(AgentRequest::new("How long is 'hello'?")))?;
//! assert_eq!(response.text, "5 letters");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ChatModel`]: decide_chat::ChatModel
//! [`ToolProvider`]: decide_chat::ToolProvider
//! [`InvocationContext`]: decide_chat::InvocationContext
#![deny(missing_docs)]

// The code `#[tool]` generates names `::decide_agent`, which must resolve in this crate's own tests too.
extern crate self as decide_agent;

mod agent;
mod memory;
mod tool;

#[doc(hidden)]
pub mod __private;

#[cfg(test)]
mod tests;

pub use agent::{
    Agent, AgentBuilder, AgentError, AgentEvent, AgentRequest, AgentResponse, AgentStream, Round,
    DEFAULT_MAX_ROUNDS, DEFAULT_MEMORY_ID,
};
pub use decide_chat::InvocationContext;
pub use decide_chat::{ChatStream, ChatStreamEvent, StreamingChatModel};
pub use decide_tool_macro::{tool, tools};
pub use memory::{
    evict, ChatMemoryStore, InMemoryChatMemoryStore, MemoryError, MessageWindowChatMemory,
    MIN_MESSAGES,
};
pub use tool::{execute_tool_calls, Tool, ToolBox, ToolExecution, ToolFuture, ToolOutcome};
