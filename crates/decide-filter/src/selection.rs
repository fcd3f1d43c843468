//! What one selection decided, tool by tool.

use std::fmt;
use std::str::FromStr;

use decide_chat::{ProvidedTool, ToolProviderResult};
use serde::Serialize;

use crate::error::FilterError;

/// What to pass on when the decision model fails or refuses to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Pass on every tool of the wrapped provider, and log a warning: the LLM call then costs more, but the agent
    /// keeps working.
    #[default]
    AllTools,
    /// Pass on only the tools that pass without asking (always visible, always included, already called), and log
    /// a warning.
    NoTools,
    /// Return the decision model's error.
    Fail,
}

impl Fallback {
    /// The name used on the command line: `all-tools`, `no-tools` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::AllTools => "all-tools",
            Fallback::NoTools => "no-tools",
            Fallback::Fail => "fail",
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Fallback {
    type Err = FilterError;

    /// Reads `all-tools`, `no-tools` or `fail`, ignoring case, `-` and `_` (so LangChain4j's `ALL_TOOLS` works too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key: String = s
            .trim()
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect();
        match key.as_str() {
            "alltools" => Ok(Fallback::AllTools),
            "notools" => Ok(Fallback::NoTools),
            "fail" => Ok(Fallback::Fail),
            _ => Err(FilterError::config(
                "fallback",
                format!("{s:?} is not one of all-tools, no-tools, fail"),
            )),
        }
    }
}

/// Why a tool was passed on or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Passed without asking: its search behaviour is `AlwaysVisible`.
    AlwaysVisible,
    /// Passed without asking: named in `always_include`.
    AlwaysIncluded,
    /// Passed without asking: the conversation already called it, and some LLM providers reject requests whose
    /// messages call tools that are not in the request.
    AlreadyCalled,
    /// Passed without asking: the user message has no text to decide on.
    NoText,
    /// A candidate the decision model was asked about.
    Asked,
}

impl Reason {
    /// Whether the tool was passed on without asking the model.
    pub fn is_without_asking(self) -> bool {
        self != Reason::Asked
    }
}

/// The outcome for one tool of the wrapped provider.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDecision {
    /// The tool's name.
    pub name: String,
    /// Why it was passed on or not.
    pub reason: Reason,
    /// The decision model's probability that the tool is useful; only for [`Reason::Asked`] tools whose batch the
    /// model answered, and for [`Reason::AlreadyCalled`] ones when the filter also scores called tools.
    pub probability: Option<f64>,
    /// Whether the tool was passed on.
    pub passed: bool,
}

/// A fallback that was applied, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FallbackUsed {
    /// The strategy applied ([`Fallback::AllTools`] or [`Fallback::NoTools`]; [`Fallback::Fail`] returns an error
    /// instead).
    pub strategy: Fallback,
    /// The decision model's error, or the refusal, as text.
    pub reason: String,
}

/// The result of [`FilteringToolProvider::select`](crate::FilteringToolProvider::select): the tools passed on, and
/// what was decided about each tool of the wrapped provider.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Selection {
    /// The tools passed on, in the wrapped provider's order.
    pub tools: Vec<ProvidedTool>,
    /// One entry per tool of the wrapped provider, in its order.
    pub decisions: Vec<ToolDecision>,
    /// The fallback applied, if the decision model failed or refused.
    pub fallback: Option<FallbackUsed>,
    /// How many requests were sent to the decision model (one per batch; zero when nothing needed deciding).
    pub decision_requests: usize,
    /// With the needs-tool gate, what it decided on; `None` without the gate or when nothing was asked.
    pub gate: Option<Gate>,
}

/// What the needs-tool gate of a [`FilteringToolProvider`](crate::FilteringToolProvider) decided on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gate {
    /// The decision model's answer to whether the conversation needs any tool; `None` when it refused (a model
    /// without a needs-tool head).
    pub answer: Option<f64>,
    /// The probability the gate compared with `min_probability`:
    /// [`needs_tool_probability`](decide_contract::needs_tool_probability) of the answer and the best tool's
    /// probability.
    pub probability: f64,
    /// Whether it reached `min_probability`, so that tools passed.
    pub open: bool,
}

impl Selection {
    /// The names of the tools passed on, in order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(ProvidedTool::name).collect()
    }

    /// The probability of the tool `name`, if the model was asked about it and answered.
    pub fn probability(&self, name: &str) -> Option<f64> {
        self.decisions
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.probability)
    }

    /// The tools the model answered about, with their probabilities, in the wrapped provider's order.
    pub fn scores(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.decisions
            .iter()
            .filter_map(|d| d.probability.map(|p| (d.name.as_str(), p)))
    }

    /// The tools passed on, as a provider result.
    pub fn into_result(self) -> ToolProviderResult {
        ToolProviderResult::new(self.tools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_names_round_trip() {
        for fallback in [Fallback::AllTools, Fallback::NoTools, Fallback::Fail] {
            assert_eq!(fallback.to_string().parse::<Fallback>().unwrap(), fallback);
        }
        assert_eq!("ALL_TOOLS".parse::<Fallback>().unwrap(), Fallback::AllTools);
        assert_eq!(" No-Tools ".parse::<Fallback>().unwrap(), Fallback::NoTools);
        let error = "some".parse::<Fallback>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "fallback: \"some\" is not one of all-tools, no-tools, fail"
        );
        assert_eq!(Fallback::default(), Fallback::AllTools);
    }

    #[test]
    fn reasons_without_asking() {
        assert!(Reason::AlreadyCalled.is_without_asking());
        assert!(!Reason::Asked.is_without_asking());
    }
}
