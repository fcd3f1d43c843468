//! The one error type of the contract.

use std::fmt;

/// A boxed error from an engine, a provider or a listener.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong when building, answering or reading a decision.
///
/// Callers usually only need to tell three cases apart: the request was wrong
/// ([`InvalidRequest`](Self::InvalidRequest), fix the caller), the model misbehaved
/// ([`InvalidResponse`](Self::InvalidResponse), [`Model`](Self::Model)), or the
/// model cannot do what was asked ([`AsyncNotSupported`](Self::AsyncNotSupported),
/// [`UnsupportedFeature`](Self::UnsupportedFeature)). Gates should usually fail
/// closed on any of them; routers can fall back to a default.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// A request, question or input could not be built.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// The model's response does not match the request, or an answer holds a value out of range.
    #[error("invalid response: {0}")]
    InvalidResponse(String),

    /// The model has no asynchronous path; call [`decide`](crate::DecisionModel::decide) instead.
    #[error("{model} does not support asynchronous calls")]
    AsyncNotSupported {
        /// The model's name, or its type name when it has none.
        model: String,
    },

    /// The model cannot handle a question type, an input type or an option of the request.
    #[error("unsupported: {0}")]
    UnsupportedFeature(String),

    /// The engine's or provider's own error, shown as is; downcast it to inspect it.
    #[error(transparent)]
    Model(BoxError),

    /// [`DecisionResponse::answer`](crate::DecisionResponse::answer) was asked for a name that has no answer.
    #[error("no answer named '{name}' (available: {})", list(.available))]
    UnknownAnswer {
        /// The name asked for.
        name: String,
        /// The names that do have answers, in order.
        available: Vec<String>,
    },

    /// A typed accessor such as [`DecisionResponse::yes_no`](crate::DecisionResponse::yes_no) found another kind of answer.
    #[error("answer '{name}' is a {actual} answer, not a {expected} answer")]
    WrongAnswerType {
        /// The answer's name.
        name: String,
        /// The kind the accessor reads.
        expected: AnswerKind,
        /// The kind the response holds.
        actual: AnswerKind,
    },

    /// A typed accessor found a refusal: the model declined to answer that question.
    #[error("question '{name}' was refused{}", reason_suffix(.reason))]
    Refused {
        /// The question's name.
        name: String,
        /// The model's reason, when it gave one.
        reason: Option<String>,
    },

    /// [`ChoiceAnswer::probability_of`](crate::ChoiceAnswer::probability_of) was asked about an option
    /// the question did not offer, usually a misspelling.
    #[error("option '{option}' was not offered (options: {})", list(.offered))]
    UnknownOption {
        /// The option asked about.
        option: String,
        /// The options the question offered.
        offered: Vec<String>,
    },

    /// The answer carries no probabilities, so nothing derived from them can be computed.
    #[error("the model did not report probabilities")]
    NoProbabilities,
}

/// The crate's result type.
pub type Result<T, E = DecisionError> = std::result::Result<T, E>;

impl DecisionError {
    /// A [`Model`](Self::Model) error that only has a message.
    pub fn model(message: impl Into<String>) -> Self {
        Self::Model(message.into().into())
    }

    /// Wraps an engine's or provider's own error as [`Model`](Self::Model).
    pub fn from_model_error(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Model(Box::new(error))
    }
}

/// The kind of an [`Answer`](crate::Answer), named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnswerKind {
    /// A [`YesNoAnswer`](crate::YesNoAnswer).
    YesNo,
    /// A [`ChoiceAnswer`](crate::ChoiceAnswer).
    Choice,
    /// A [`ScaleAnswer`](crate::ScaleAnswer).
    Scale,
    /// A refusal.
    Refusal,
}

impl fmt::Display for AnswerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::YesNo => "yes/no",
            Self::Choice => "choice",
            Self::Scale => "scale",
            Self::Refusal => "refusal",
        })
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_well() {
        assert_eq!(
            DecisionError::InvalidRequest("question 'a': x".into()).to_string(),
            "invalid request: question 'a': x"
        );
        assert_eq!(
            DecisionError::AsyncNotSupported { model: "m".into() }.to_string(),
            "m does not support asynchronous calls"
        );
        assert_eq!(
            DecisionError::model("boom").to_string(),
            "boom",
            "a provider's message is passed through untouched"
        );
        assert_eq!(
            DecisionError::UnknownAnswer {
                name: "x".into(),
                available: vec!["a".into(), "b".into()]
            }
            .to_string(),
            "no answer named 'x' (available: a, b)"
        );
        assert_eq!(
            DecisionError::WrongAnswerType {
                name: "x".into(),
                expected: AnswerKind::YesNo,
                actual: AnswerKind::Choice
            }
            .to_string(),
            "answer 'x' is a choice answer, not a yes/no answer"
        );
    }

    #[test]
    fn refusal_message_includes_reason_only_when_given() {
        let without = DecisionError::Refused {
            name: "q".into(),
            reason: None,
        };
        let with = DecisionError::Refused {
            name: "q".into(),
            reason: Some("policy".into()),
        };
        assert_eq!(without.to_string(), "question 'q' was refused");
        assert_eq!(with.to_string(), "question 'q' was refused: policy");
    }

    #[test]
    fn model_error_keeps_its_source() {
        let io = std::io::Error::other("disk");
        let err = DecisionError::from_model_error(io);
        match err {
            DecisionError::Model(inner) => {
                assert!(inner.downcast_ref::<std::io::Error>().is_some())
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
