//! The router's one error type.

use decide_chat::{Capabilities, ChatModelError};
use decide_contract::DecisionError;

/// What can go wrong when building a routing model or a router, or when choosing a route.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// An option of a builder is missing or out of range, or the routes do not fit together; the message starts
    /// with the option's name, so that a configuration file or a command line can point at it.
    #[error("{option}: {message}")]
    InvalidConfig {
        /// The builder option, e.g. `default_route` or `routes`.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The router has no asynchronous path (the default of
    /// [`ChatModelRouter::route_async`](crate::ChatModelRouter::route_async)).
    #[error(
        "{router} does not support asynchronous routing: implement route_async, for example by returning a ready \
         future of route() if route() does not block"
    )]
    AsyncNotSupported {
        /// The router's type name.
        router: String,
    },
    /// The router chose a route the routing model does not have.
    #[error("the router selected the unknown route '{route}'. Available routes: {}", .available.join(", "))]
    UnknownRoute {
        /// The name the router returned.
        route: String,
        /// The routes of the routing model, in order.
        available: Vec<String>,
    },
    /// The router chose a route whose model lacks a capability the request needs.
    #[error(
        "route '{route}' does not support the capabilities the request needs ({required}). Routes that support \
         them: {}", .capable.join(", ")
    )]
    MissingCapabilities {
        /// The route the router chose.
        route: String,
        /// What the request needs.
        required: Capabilities,
        /// The routes whose models support it.
        capable: Vec<String>,
    },
    /// `min_probability` is set but the decision model reported no probabilities to compare with it. This is a
    /// configuration error, so no fallback applies.
    #[error(
        "min_probability is set, but the decision model reported no probabilities; use a model that reports them, \
         or unset min_probability"
    )]
    NoProbabilities,
    /// The decision model failed or refused, with [`Fallback::Fail`](crate::Fallback::Fail), or could not be
    /// called asynchronously; its own error, shown as is.
    #[error(transparent)]
    Decision(DecisionError),
}

impl RouterError {
    pub(crate) fn config(option: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidConfig {
            option,
            message: message.into(),
        }
    }
}

impl From<RouterError> for ChatModelError {
    // Callers of a chat model only know `ChatModelError`. A missing asynchronous path keeps its own variant, so that
    // callers can match it whatever lacks it (router, decision model or chat model); everything else is boxed, so
    // that callers can still downcast it to `RouterError`.
    fn from(error: RouterError) -> Self {
        match error {
            RouterError::AsyncNotSupported { router } => {
                ChatModelError::AsyncNotSupported { model: router }
            }
            RouterError::Decision(DecisionError::AsyncNotSupported { model }) => {
                ChatModelError::AsyncNotSupported { model }
            }
            other => ChatModelError::from_error(other),
        }
    }
}
