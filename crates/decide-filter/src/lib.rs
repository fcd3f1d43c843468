//! A tool provider that passes on only the tools a conversation needs, as a decision model decides.
//!
//! An agent connected to an MCP server with 80 tools sends all 80 schemas to the LLM on every call. A
//! [`FilteringToolProvider`] wraps any [`ToolProvider`] and, before the LLM call, asks a [`DecisionModel`] (the local
//! engine of `decide-engine`, or any other) which of its tools are relevant to the conversation, so requests stay
//! small and the LLM chooses better. It is LangChain4j's `DecisionModelFilteringToolProvider` in Rust, with the
//! later behaviour its documentation describes (system messages, tool traffic, ten messages, shortened texts).
//!
//! # How tools are selected
//!
//! 1. The wrapped provider is asked for its tools. With none, nothing else happens.
//! 2. The [decision input](FilteringToolProvider::decision_input) is built from the conversation: the system
//!    messages and the latest `max_messages` (default 10) other messages, tool calls and tool results included, so
//!    that a follow-up such as "do the same for Berlin" still selects the tools of the earlier turn. The user message
//!    is the one the user sent, before retrieved content or format instructions were added; previous messages are
//!    used as stored, and only when the caller passed them. If the user message has no text (an image alone), every
//!    tool is passed on and the model is not called: there is nothing to decide on.
//! 3. Tools whose search behaviour is `AlwaysVisible`, tools named in `always_include` and tools the conversation
//!    already called pass without asking (some LLM providers reject requests whose messages call tools that are not
//!    in the request). Tools configured directly on an agent never come through the provider, so they are never
//!    filtered either.
//! 4. The other tools are the candidates. With none, the model is not called. Otherwise they are asked about in
//!    batches of `max_tools_per_decision_request` (default: all in one request), each batch with the whole
//!    conversation: one yes/no question per tool, named `tool0`, `tool1`, …, whose text comes from the question
//!    template and whose *candidate* is the tool's name and description, so an engine can score the tool itself.
//! 5. Every candidate whose probability reaches `min_probability` (default 0.5, inclusive) passes; `max_results`
//!    optionally keeps only the most probable of them. Instead of a probability, `target_recall` takes a recall
//!    and the model's [`Conformal`](decide_contract::Conformal) table (see
//!    [`FilteringToolProviderBuilder::target_recall`]): the threshold is then the one at which the needed tools of
//!    the table's held-out cases were found that share of the time. With the needs-tool gate
//!    ([`FilteringToolProviderBuilder::needs_tool_gate`]), the first request also asks whether the conversation
//!    needs any tool at all ([`YesNoQuestion::needs_tool`](decide_contract::YesNoQuestion::needs_tool)), and the
//!    rule is two-step: nothing passes unless [`needs_tool_probability`](decide_contract::needs_tool_probability)
//!    of that answer and the best candidate's probability reaches `min_probability`; then the best candidate passes,
//!    and every candidate reaching the lower `companion_min_probability` or, among the next most probable, a share
//!    of the best one's ([`needs_tool_gate`](decide_contract::needs_tool_gate)). The gate is on by default when the
//!    decision model says it has a needs-tool head
//!    ([`selection_hints`](decide_contract::DecisionModel::selection_hints)) and no target recall is set, so
//!    the builder selects as `decide select` and `/v1/select` do; the model also gives the conformal table a
//!    [`FilterOptions`] target recall reads. The result keeps the wrapped provider's order, which keeps the LLM
//!    provider's prompt cache warm when the selection does not change.
//! 6. If the model fails, or refuses to answer a question, the [`Fallback`] applies: by default every tool is passed
//!    on and a warning is logged; [`Fallback::NoTools`] passes on only the tools of step 3, and [`Fallback::Fail`]
//!    returns the model's error.
//!
//! A dynamic wrapped provider makes the filter dynamic, so an agent asks it again before each LLM call of the
//! tool-calling loop; the decision then also sees the calls and results of the earlier rounds.
//!
//! # Design
//!
//! * **One code path.** [`FilteringToolProvider::select`] returns a [`Selection`] that says, for every tool, why it
//!   was passed on or not and with which probability; [`ToolProvider::provide_tools`] is `select` without the
//!   report, so the command line, which prints the report, and an agent get the same answer.
//! * **Nothing hidden.** [`FilteringToolProvider::decision_input`] and [`FilteringToolProvider::decision_requests`]
//!   are public: what the model receives can be inspected and tested.
//! * **Fail at build, not at the first message.** Every option is checked by
//!   [`FilteringToolProviderBuilder::build`], including the question template, and the error names the option.
//! * **One typed input.** [`SelectRequest`] is what `/v1/select` reads and [`FilterOptions`] what every front end
//!   sets: read with serde, unknown keys refused, errors at their JSON path, so the server and the command line set
//!   the filter up alike.
//! * **No state.** The filter keeps no cache between calls: the wrapped provider's tools and the conversation can
//!   change between any two calls, and the engine already caches what is expensive (tool embeddings).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use decide_chat::{StaticToolProvider, ToolProvider, ToolProviderRequest, ToolSpecification, UserMessage};
//! use decide_contract::MockDecisionModel;
//! use decide_filter::FilteringToolProvider;
//!
//! let tools = StaticToolProvider::from_specifications([
//!     ToolSpecification::new("send_email").with_description("Send an email"),
//!     ToolSpecification::new("get_weather").with_description("Current weather for a city"),
//! ]);
//! // A stand-in for the engine: finds only the weather tool relevant.
//! let model = MockDecisionModel::answers_yes_no(|q| match q.candidate() {
//!     Some(c) if c.name == "get_weather" => 0.9,
//!     _ => 0.1,
//! });
//! let filter = FilteringToolProvider::builder()
//!     .tool_provider(Arc::new(tools))
//!     .decision_model(Arc::new(model))
//!     .build()?;
//! let request = ToolProviderRequest::builder(UserMessage::new("Will it rain in Paris?")).build();
//! let selection = filter.select(&request)?;
//! assert_eq!(selection.names(), ["get_weather"]);
//! assert_eq!(selection.probability("send_email"), Some(0.1));
//! assert_eq!(filter.provide_tools(&request)?.names(), ["get_weather"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ToolProvider`]: decide_chat::ToolProvider
//! [`ToolProvider::provide_tools`]: decide_chat::ToolProvider::provide_tools
//! [`DecisionModel`]: decide_contract::DecisionModel
#![deny(missing_docs)]

mod error;
mod filter;
mod request;
mod search;
mod selection;
mod template;

#[cfg(test)]
mod tests;

pub use error::FilterError;
pub use filter::{
    FilteringToolProvider, FilteringToolProviderBuilder, DEFAULT_MAX_MESSAGES,
    DEFAULT_MAX_MESSAGE_LENGTH, DEFAULT_MIN_PROBABILITY,
};
pub use request::{provider_request, FilterOptions, ScoredTool, SelectRequest, SelectResponse};
pub use search::{ranked, search_filter, SearchProvider, ToolSearchCall, DEFAULT_SEARCH_RESULTS};
pub use selection::{Fallback, FallbackUsed, Gate, Reason, Selection, ToolDecision};
pub use template::{QuestionTemplate, DEFAULT_QUESTION_TEMPLATE};
