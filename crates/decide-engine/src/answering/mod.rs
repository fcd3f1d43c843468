//! Answering: what every model of the crate shares between a request and its answers.
//!
//! A request's questions become documents ([`plan`]), a model scores the documents against the
//! input, and the raw scores become calibrated answers ([`respond`]). The models differ only in
//! the middle step, so this layer knows nothing of encoders or BM25: it depends on the contract,
//! [`Calibration`] and the crate's error type alone. [`Scorer`] is what the three models (the encoder,
//! [`Bm25Model`](crate::Bm25Model) and a [`Cascade`] of two) offer the commands that run them.

use std::path::Path;

use decide_contract::{Conformal, DecisionError, DecisionInput, DecisionModel, DecisionRequest};

use crate::calibration::Calibration;
use crate::error::EngineError;
use crate::needs_tool::NeedsTool;

mod cascade;
mod plan;

pub use cascade::{Cascade, DEFAULT_TOP_K};
pub use plan::{candidate_text, served_tool_text, server_label, tool_text, MAX_TEXT_PARAMETERS};
pub(crate) use plan::{plan, respond, yes_no_raw, Plan, Scored};

/// What reports, calibration and `--target-recall` need to know about a [`Scorer`] beyond its
/// answers: plain facts, gathered in one value so that the trait keeps to what models compute
/// and a new fact is a field rather than another method on every model.
#[derive(Debug, Clone)]
pub struct ScorerInfo<'a> {
    /// The model's name, as reports and error messages give it.
    pub name: String,
    /// The device it runs on, as reports give it.
    pub device: String,
    /// The calibration its answers use now; `None` before one is fitted, or when its
    /// probabilities come from more than one.
    pub calibration: Option<Calibration>,
    /// The conformal table of its manifest (see
    /// [`Engine::conformal`](crate::Engine::conformal)); `None` without one.
    pub conformal: Option<&'a Conformal>,
    /// The weight of BM25 in its hybrid scores (0: none).
    pub lexical_weight: f64,
    /// Whether a tool's text carries its parameter names ([`tool_text`]).
    pub tool_parameters: bool,
    /// Whether a tool's text carries its server's name ([`crate::served_tool_text`]).
    pub tool_server: bool,
    /// The folder of the model, where its manifest lives; `None` for a model without files.
    pub model_dir: Option<&'a Path>,
    /// The needs-tool head that answers
    /// [`YesNoQuestion::needs_tool`](decide_contract::YesNoQuestion::needs_tool), with the
    /// threshold of the further tools; `None` for a model without one.
    pub needs_tool: Option<&'a NeedsTool>,
}

impl<'a> ScorerInfo<'a> {
    /// The facts of a model without files, manifest or needs-tool head: no conformal table, no
    /// BM25 term, tool texts without their parameters.
    pub fn new(name: String, device: String, calibration: Option<Calibration>) -> Self {
        Self {
            name,
            device,
            calibration,
            conformal: None,
            lexical_weight: 0.0,
            tool_parameters: false,
            tool_server: false,
            model_dir: None,
            needs_tool: None,
        }
    }

    /// The conformal table, or an error naming the model and the command that adds one.
    pub fn require_conformal(&self) -> Result<&'a Conformal, EngineError> {
        self.conformal.ok_or_else(|| EngineError::NoConformal {
            model: self.name.clone(),
        })
    }
}

/// A decision model whose answers are calibrated raw scores: the facts reports need about it
/// ([`about`](Self::about)), and the numbers behind its answers that calibration and a
/// needs-tool head are fitted on.
pub trait Scorer: DecisionModel {
    /// What reports, calibration and `--target-recall` need to know about the model.
    fn about(&self) -> ScorerInfo<'_>;

    /// What a needs-tool head reads of each input
    /// ([`Engine::conversation_embeddings`](crate::Engine::conversation_embeddings)). Bi-encoders
    /// only: others fail.
    fn conversation_embeddings(
        &self,
        _inputs: &[DecisionInput],
    ) -> Result<Vec<Vec<f64>>, EngineError> {
        Err(EngineError::InvalidOption {
            option: "needs-tool-data",
            message: format!(
                "{} has no conversation embeddings: a needs-tool head needs a bi-encoder",
                self.about().name
            ),
        })
    }

    /// The raw score behind each yes/no answer of `request`, in question order, before
    /// calibration. What `decide calibrate` fits on, so the fit sees exactly the scores
    /// decisions are made from.
    fn yes_no_scores(&self, request: &DecisionRequest)
        -> Result<Vec<(String, f64)>, DecisionError>;
}
