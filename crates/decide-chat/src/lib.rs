//! Conversation and tool-specification types shared across `decide`, with parsers for the JSON formats users have.
//!
//! Every part of the project looks at the same two things: a conversation (what the user and the assistant said,
//! which tools were called and what they returned) and a list of tools. The command line reads them from files, the
//! tool-filtering provider and the model router render them for a decision model, and the agent loop sends them to
//! a chat model. This crate is the one definition all of them share.
//!
//! # Design
//!
//! * **LangChain4j's model, Rust's shapes.** [`ChatMessage`] mirrors LangChain4j's `SystemMessage`, `UserMessage`,
//!   `AiMessage` and `ToolExecutionResultMessage` as one enum, and [`ToolSpecification`] mirrors its
//!   `ToolSpecification` with the [`SearchBehavior`] metadata. Keeping the same concepts means the rendering rules of
//!   LangChain4j's `DecisionModelInputUtils` carry over word for word, and so do its tests.
//! * **Payloads kept, kinds typed.** A decision model only needs to know that a user attached an image, so a user
//!   message is a list of [`Content`] parts whose *kind* is typed, while URLs, data and file ids are kept as the JSON
//!   gave them. Tool-call arguments stay raw JSON text and parameter schemas stay [`serde_json::Value`]s, so nothing
//!   is lost when a conversation is passed on to a chat model ([`ChatMessage::to_openai_json`]).
//! * **Rendering is separate from the types.** [`decision_messages`] turns a conversation into the
//!   `{"role","text"}` list decision models read; [`RenderOptions`] choose between LangChain4j 1.21.0's behaviour
//!   (user and assistant text only) and its later one (system messages, tool calls and results, shortened texts).
//! * **Parsers name the problem.** [`parse_messages`] and [`parse_tools`] accept the shapes found in the wild (OpenAI
//!   chat requests, bare tool arrays, MCP `tools/list` results and whole JSON-RPC responses) and reject anything else
//!   with a one-line [`ParseError`] naming the JSON path, e.g. `tools[3].function.name: missing`. They never panic:
//!   the input is whatever a user pointed the command line at. Typed request bodies read through [`from_value`] or
//!   [`from_slice`] get errors of the same shape, and [`messages_field`] and [`tools_field`] read their conversation.
//! * **One tool-provider interface.** [`ToolProvider`] (LangChain4j's `ToolProvider`) is how an agent gets its tools
//!   before an LLM call; the decision-model filter wraps one and is one, and the agent loop will ask them, so the
//!   trait and its request and result types live here with the conversation they describe.
//! * **One chat-model interface.** [`ChatModel`] (LangChain4j's `ChatModel`) is what the model router decorates and
//!   the agent loop calls: a [`ChatRequest`] (messages, tools, [`ResponseFormat`], common parameters), a
//!   [`ChatResponse`] with free-form attributes, and the [`Capabilities`] a router checks before choosing a model.
//!   [`MockChatModel`] is its test double, public so that other crates' tests can use it. [`StreamingChatModel`]
//!   (LangChain4j's `StreamingChatModel`, kept beside `ChatModel` there too) streams the reply as [`ChatStreamEvent`]s
//!   for the same request: the LLM clients implement both, and the agent loop streams through it.
//!
//! # Example
//!
//! ```
//! use decide_chat::{decision_messages, parse_messages_str, parse_tools_str, RenderOptions};
//!
//! let conversation = parse_messages_str(r#"[
//!     {"role": "user", "content": "Weather in Paris?"},
//!     {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
//!         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
//!     {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
//!     {"role": "user", "content": "Do the same for Berlin"}
//! ]"#)?;
//! let options = RenderOptions { include_tools: true, ..RenderOptions::default() };
//! let texts: Vec<_> = decision_messages(&conversation, &options)
//!     .into_iter()
//!     .map(|m| format!("{}: {}", m.role, m.text))
//!     .collect();
//! assert_eq!(texts, [
//!     "user: Weather in Paris?",
//!     r#"assistant: called get_weather({"city":"Paris"})"#,
//!     "tool: get_weather returned: sunny",
//!     "user: Do the same for Berlin",
//! ]);
//!
//! let error = parse_tools_str(r#"{"tools": [{"name": "a"}, {"description": "no name"}]}"#).unwrap_err();
//! assert_eq!(error.to_string(), "tools[1].name: missing");
//! # Ok::<(), decide_chat::ParseError>(())
//! ```

#![deny(missing_docs)]

mod chat_model;
mod error;
mod message;
mod parse;
mod provider;
mod render;
mod streaming_chat_model;
mod tool;

pub use chat_model::{
    Capabilities, ChatFuture, ChatModel, ChatModelError, ChatRequest, ChatRequestBuilder,
    ChatResponse, ChatTokenUsage, MockChatModel, ResponseFormat,
};
/// Public for the workspace's crates, which word their JSON errors alike; not part of the API.
#[doc(hidden)]
pub use error::type_name;
pub use error::ParseError;
pub use message::{
    to_openai_json, AssistantMessage, ChatMessage, Content, FileRef, SystemMessage, ToolCall,
    ToolResultMessage, UserMessage,
};
pub use parse::{
    conversation, from_slice, from_value, messages_field, parse_messages, parse_messages_str,
    parse_tools, parse_tools_str, parse_tools_where, tools_field,
};
pub use provider::{
    BoxError, InvocationContext, ProvidedTool, StaticToolProvider, ToolExecutionError,
    ToolExecutor, ToolProvider, ToolProviderError, ToolProviderRequest, ToolProviderRequestBuilder,
    ToolProviderResult,
};
pub use render::{
    decision_fields, decision_messages, shorten, DecisionMessage, RenderOptions, ELISION_MARKER,
};
pub use streaming_chat_model::{ChatStream, ChatStreamEvent, StreamingChatModel};
pub use tool::{SearchBehavior, ToolSpecification, METADATA_SEARCH_BEHAVIOR, METADATA_SERVER};
