//! The filter's one error type.

use decide_chat::ToolProviderError;
use decide_contract::DecisionError;

/// What can go wrong when building the filter or selecting tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// An option of the builder is missing or out of range; the message starts with the option's name, so that a
    /// configuration file or a command line can point at it.
    #[error("{option}: {message}")]
    InvalidConfig {
        /// The builder option, e.g. `min_probability`.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The wrapped provider could not hand out its tools: there is nothing to filter, so no fallback applies.
    #[error(transparent)]
    Provider(#[from] ToolProviderError),
    /// The decision model failed or refused, with [`Fallback::Fail`](crate::Fallback::Fail); its own error, shown as
    /// is.
    #[error(transparent)]
    Decision(DecisionError),
}

impl FilterError {
    pub(crate) fn config(option: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidConfig {
            option,
            message: message.into(),
        }
    }
}

impl From<FilterError> for ToolProviderError {
    // The agent loop only knows `ToolProviderError`; the wrapped provider's error is passed through unchanged and
    // the decision model's is boxed, so callers can still downcast it to `DecisionError`.
    fn from(error: FilterError) -> Self {
        match error {
            FilterError::Provider(error) => error,
            FilterError::Decision(error) => ToolProviderError::from_error(error),
            other => ToolProviderError::from_error(other),
        }
    }
}
