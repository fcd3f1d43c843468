//! The `DecisionModel` contract: requests, questions, answers, validation and listeners, with no
//! model behind them.
//!
//! A decision model evaluates one input against a set of named, typed questions and returns one
//! typed answer per question, instead of generated text. This crate mirrors LangChain4j's
//! `DecisionModel` API (1.21/1.22) in Rust so that engines, the tool filter, the router and the
//! HTTP server all code against the same small set of types:
//!
//! * [`DecisionRequest`]: a [`DecisionInput`] (plain text or ordered JSON fields), named
//!   [`Question`]s ([`YesNoQuestion`], [`ChoiceQuestion`], [`ScaleQuestion`]) and
//!   [`DecisionRequestParameters`].
//! * [`DecisionResponse`]: one [`Answer`] per question ([`YesNoAnswer`], [`ChoiceAnswer`],
//!   [`ScaleAnswer`] or a refusal), plus the model name and [`TokenUsage`].
//! * [`DecisionModel`]: the trait engines implement, and [`DecisionModelListener`]: observers.
//!
//! **Valid by construction.** Every builder returns a [`Result`] and nothing panics on bad input:
//! a request that exists has a non-blank input, at least one question, unique names and
//! well-formed questions, and every error names the question concerned. Deserialization runs
//! the same checks, so JSON from the network cannot smuggle in an invalid request.
//!
//! **One call path around a provider SPI.** Engines implement
//! [`DecisionModel::do_decide`] (and optionally [`DecisionModel::do_decide_async`]). Callers use
//! [`DecisionModel::decide`] / [`DecisionModel::decide_async`], which apply the model's default
//! parameters (the request's own values win), notify listeners, and [`validate`](fn@validate) the response
//! against the request. Validation is what lets callers trust any model: every question is
//! answered with the right type, choice values and probabilities refer to offered options, and
//! values lie in range. The async path fails with [`DecisionError::AsyncNotSupported`] by default
//! rather than blocking a runtime thread behind the caller's back.
//!
//! **Honest probabilities.** A model that cannot report probabilities leaves them empty instead
//! of inventing them; [`ChoiceAnswer::probability_of`] and [`ChoiceAnswer::margin`] then fail
//! with [`DecisionError::NoProbabilities`] rather than return made-up numbers.
//!
//! **Privacy.** The input is user data: `Debug` on [`DecisionInput`] and [`DecisionRequest`] shows
//! only its size, so requests can be logged freely.
//!
//! [`Conformal`] turns a target recall into a yes/no probability threshold, from the probabilities a
//! model gave the needed candidates of held-out labelled cases (split conformal prediction).
//!
//! [`MockDecisionModel`] is a scriptable model for the tests of code that uses a decision model.
//!
//! ```
//! use decide_contract::{
//!     Answer, ChoiceAnswer, ChoiceQuestion, DecisionModel, DecisionRequest, MockDecisionModel,
//!     YesNoQuestion,
//! };
//!
//! let request = DecisionRequest::builder()
//!     .input("My flight was cancelled, I want my money back")
//!     .question("urgent", YesNoQuestion::new("Does the user need help today?")?)
//!     .question(
//!         "route",
//!         ChoiceQuestion::builder("Which team should handle this?")
//!             .option_with_description("refunds", "Payments and refunds")
//!             .option("bookings")
//!             .build()?,
//!     )
//!     .build()?;
//!
//! let model = MockDecisionModel::always_answers([
//!     ("urgent", Answer::yes_no(0.8)?),
//!     ("route", ChoiceAnswer::from_probabilities([("refunds", 0.9), ("bookings", 0.1)])?.into()),
//! ]);
//! let response = model.decide(&request)?;
//! assert!(response.yes_no("urgent")?.is_yes(0.5));
//! assert_eq!(response.choice("route")?.value(), "refunds");
//! assert!(response.choice("route")?.probability_of("refund").is_err()); // misspelt
//! # Ok::<(), decide_contract::DecisionError>(())
//! ```
#![deny(missing_docs)]

mod conformal;
mod error;
mod listener;
mod mock;
mod model;
mod request;
mod response;
mod serde_util;
mod validate;

pub use conformal::{Conformal, ConformalSource, InvalidTargetRecall};
pub use error::{AnswerKind, BoxError, DecisionError, Result};
pub use listener::{
    Attributes, DecisionModelListener, ErrorContext, ListenerResult, RequestContext,
    ResponseContext,
};
pub use mock::MockDecisionModel;
pub use model::{DecisionFuture, DecisionModel, SelectionHints};
pub use request::{needs_tool_gate, needs_tool_probability, COMPANION_RANKS, COMPANION_SHARE};
pub use request::{
    Candidate, ChoiceOption, ChoiceQuestion, ChoiceQuestionBuilder, DecisionInput, DecisionRequest,
    DecisionRequestBuilder, DecisionRequestParameters, Question, ScaleLevel, ScaleQuestion,
    ScaleQuestionBuilder, YesNoQuestion, YesNoQuestionBuilder, NEEDS_TOOL_QUESTION,
};
pub use response::{
    Answer, ChoiceAnswer, DecisionResponse, DecisionResponseBuilder, ScaleAnswer, TokenUsage,
    YesNoAnswer, TOLERANCE,
};
pub use validate::validate;

/// Re-exported so that users can name the ordered maps of the API without depending on it.
pub use indexmap;
