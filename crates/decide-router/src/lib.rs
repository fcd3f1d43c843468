//! A chat model that sends each request to the model whose route fits it, as a decision model decides.
//!
//! Greetings and short lookups should go to a small, cheap model; multi-step reasoning and code to a large one. A
//! [`RoutingChatModel`] holds named routes, each with a description and a [`ChatModel`], and asks a
//! [`ChatModelRouter`] which route fits each request before any chat model is called. The
//! [`DecisionModelChatModelRouter`] asks a [`DecisionModel`] (the local engine of `decide-engine`, or any other), so
//! the choice is made locally, in milliseconds. This is LangChain4j 1.21's `RoutingChatModel`,
//! `ChatModelRouter` and `DecisionModelChatModelRouter` in Rust.
//!
//! # How a route is chosen
//!
//! [`RoutingChatModel`], for every request:
//!
//! 1. If the request ends with tool results answering tool calls this routing model returned, the request goes back
//!    to the route that asked for the tools, without asking the router: a tool-calling loop stays on one model,
//!    which knows why it called them. The route of each tool call is remembered by call id (the last
//!    [`TOOL_CALL_MEMORY`] calls); results without an id, or with an id it did not produce (a conversation restored
//!    from storage), are routed as any other request.
//! 2. The candidates are the routes whose model supports what the request needs (today: a JSON-schema response
//!    format). If no route declares it, all routes stay candidates and the chosen model accepts or rejects the
//!    request itself.
//! 3. The router chooses among the candidates, or answers "the default route". The default route is used if it is a
//!    candidate, else the first candidate. A route that does not exist is an error naming the available routes; a
//!    route that is not a candidate is an error naming the routes that are.
//! 4. The chosen model answers, and the response carries the route's name in its attributes under
//!    [`ROUTE_ATTRIBUTE`] (`"chat_model_route"`).
//!
//! [`DecisionModelChatModelRouter`], for the candidates it is given:
//!
//! 1. With one candidate, that route, without asking the decision model (step 2 above left only one route that can
//!    handle the request).
//! 2. Without a user message (or with a blank one), the default route, without asking.
//! 3. Otherwise the decision model gets the last user message's text (with `max_messages` above its default of
//!    1, the last `max_messages` messages up to and including it, as they are sent to the chat model, so that a
//!    follow-up such as "yes, go ahead" is read with the turn it answers). Attachments appear as markers such as `[attached image]`, so a route whose description
//!    mentions images can be chosen for them. The question is one choice question named [`QUESTION_NAME`]
//!    (`"route"`) whose options are the routes: a route without description is described by its name, and a route
//!    with several descriptions gives one option per description (`<route>#1`, `<route>#2`, …).
//! 4. Probabilities are summed per route and the most probable route is chosen. If it is less probable than
//!    `min_probability` (unset by default), the default route is chosen instead. `min_probability` needs a model
//!    that reports probabilities; without them routing fails with [`RouterError::NoProbabilities`] whatever the
//!    fallback, because the configuration cannot work. Without `min_probability`, a model that reports no
//!    probabilities decides by the option it picked.
//! 5. If the decision model fails or refuses, the [`Fallback`] applies: by default the default route, with a
//!    warning logged; [`Fallback::Fail`] returns the error.
//!
//! # Asynchronous calls
//!
//! [`RoutingChatModel`]'s `chat_async` routes with [`ChatModelRouter::route_async`] and then calls the chosen model's
//! `chat_async`. The default `route_async` fails, so a closure router cannot route asynchronously, and the decision
//! router's uses the decision model's `decide_async`: a model without an asynchronous path makes `chat_async` fail
//! with `AsyncNotSupported` before any chat model is called. Nothing falls back to blocking a runtime thread.
//!
//! # Design
//!
//! * **Fail at build, not at the first request.** [`RoutingChatModelBuilder::build`] rejects no routes, blank or
//!   duplicate names, blank descriptions, a missing or unknown default route and a missing router, then calls the
//!   router's [`validate`](ChatModelRouter::validate); the decision router rejects routes whose names and
//!   descriptions give the same option twice (a route named `complex#1` next to a route `complex` with two
//!   descriptions). Every error names the option.
//! * **Nothing hidden.** [`DecisionModelChatModelRouter::decide`] returns a [`RouteDecision`] with the reason and
//!   the per-route probabilities; [`ChatModelRouter::route`] is that without the report, so the command line, which
//!   prints the report, and a routing model choose alike. [`DecisionModelChatModelRouter::decision_input`] shows what
//!   the decision model receives.
//! * **One typed input.** [`RoutesSpec`] (a routes file) and [`RouteRequest`] (a `/v1/route` body) are read with
//!   serde, unknown keys refused and every error at its JSON path (`routes[0].descripton: unknown field`), so the
//!   command line and the server accept and refuse the same routes.
//! * **Only common parameters.** Requests may go to different providers, so a [`ChatRequest`] carries only what
//!   every provider understands, and the routing model passes it on unchanged: each model applies its own defaults.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use decide_chat::{ChatModel, ChatRequest, MockChatModel};
//! use decide_contract::{ChoiceAnswer, MockDecisionModel};
//! use decide_router::{DecisionModelChatModelRouter, RoutingChatModel, ROUTE_ATTRIBUTE};
//!
//! let small = Arc::new(MockChatModel::answering("Hi!"));
//! let large = Arc::new(MockChatModel::answering("Here is the refactored code."));
//! // A stand-in for the engine: finds the request complex.
//! let decision_model = MockDecisionModel::always_answers([(
//!     "route",
//!     ChoiceAnswer::from_probabilities([("simple", 0.2), ("complex", 0.8)])?,
//! )]);
//! let model = RoutingChatModel::builder()
//!     .route("simple", "Greetings, short factual questions, simple lookups", small.clone())
//!     .route("complex", "Multi-step reasoning, code, analysis", large.clone())
//!     .router(Arc::new(DecisionModelChatModelRouter::new(Arc::new(decision_model))))
//!     .default_route("complex")
//!     .build()?;
//! let response = model.chat(&ChatRequest::user("Refactor this function to use iterators"))?;
//! assert_eq!(response.message.text.as_deref(), Some("Here is the refactored code."));
//! assert_eq!(response.attribute(ROUTE_ATTRIBUTE), Some(&"complex".into()));
//! assert_eq!((small.call_count(), large.call_count()), (0, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ChatModel`]: decide_chat::ChatModel
//! [`ChatRequest`]: decide_chat::ChatRequest
//! [`DecisionModel`]: decide_contract::DecisionModel
#![deny(missing_docs)]

mod decision;
mod error;
mod route;
mod routing;
mod spec;

#[cfg(test)]
mod tests;

pub use decision::{
    DecisionModelChatModelRouter, DecisionModelChatModelRouterBuilder, Fallback, RouteDecision,
    RouteDecisionFuture, RouteReason, DEFAULT_MAX_MESSAGES, DEFAULT_QUESTION, QUESTION_NAME,
};
pub use error::RouterError;
pub use route::{
    validate_option_names, ChatModelRoute, ChatModelRouter, ChatModelRoutingRequest,
    ChatModelRoutingResult, RouteFuture,
};
pub use routing::{RoutingChatModel, RoutingChatModelBuilder, ROUTE_ATTRIBUTE, TOOL_CALL_MEMORY};
pub use spec::{RouteRequest, RouteResponse, RoutesSpec};
