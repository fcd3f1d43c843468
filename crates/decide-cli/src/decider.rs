//! The decision model the global options name: the neural engine, or BM25 (`--model bm25`),
//! which needs no model files.

use std::sync::Arc;

use decide_contract::{DecisionError, DecisionModel, DecisionRequest};
use decide_engine::{Bm25Model, Calibration, Cascade, Conformal, Engine, Scorer, BM25_MODEL_NAME};

/// The neural engine, the lexical baseline, or a cascade of two, behind one interface for the
/// commands. Cloning shares the loaded models.
#[derive(Clone)]
pub enum Decider {
    Engine(Engine),
    Bm25(Bm25Model),
    Cascade {
        cascade: Cascade,
        first: Box<Decider>,
        second: Box<Decider>,
    },
}

impl Decider {
    /// BM25 when `model` names it, else `engine()`.
    pub fn load(
        model: &str,
        engine: impl FnOnce() -> anyhow::Result<Engine>,
    ) -> anyhow::Result<Self> {
        if model == BM25_MODEL_NAME {
            Ok(Self::Bm25(Bm25Model::new()))
        } else {
            Ok(Self::Engine(engine()?))
        }
    }

    /// `second` rescores the `top_k` most probable candidates of `first`.
    pub fn cascade(first: Decider, second: Decider, top_k: usize) -> anyhow::Result<Self> {
        let cascade = Cascade::new(first.decision_model(), second.decision_model(), top_k)?;
        Ok(Self::Cascade {
            cascade,
            first: Box::new(first),
            second: Box::new(second),
        })
    }

    /// For the filter and the router.
    pub fn decision_model(&self) -> Arc<dyn DecisionModel> {
        match self {
            Self::Engine(e) => Arc::new(e.clone()),
            Self::Bm25(m) => Arc::new(m.clone()),
            Self::Cascade { cascade, .. } => Arc::new(cascade.clone()),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Self::Engine(e) => e.info().name.clone(),
            Self::Bm25(_) => BM25_MODEL_NAME.into(),
            Self::Cascade { first, second, .. } => format!("{} → {}", first.name(), second.name()),
        }
    }

    pub fn device(&self) -> String {
        match self {
            Self::Engine(e) => e.info().device.clone(),
            Self::Bm25(_) => "cpu".into(),
            Self::Cascade { first, second, .. } => {
                let (a, b) = (first.device(), second.device());
                if a == b {
                    a
                } else {
                    format!("{a} + {b}")
                }
            }
        }
    }

    /// The calibration decisions use now, if any.
    pub fn calibration(&self) -> Option<Calibration> {
        match self {
            Self::Engine(e) => e.info().calibration,
            Self::Bm25(m) => Some(m.calibration()),
            Self::Cascade { .. } => None,
        }
    }

    /// The conformal table of the model's manifest, which `--target-recall` needs. BM25 has no
    /// manifest, and a cascade's probabilities come from two models: neither has one.
    pub fn conformal(&self) -> Option<&Conformal> {
        match self {
            Self::Engine(e) => e.conformal(),
            Self::Bm25(_) | Self::Cascade { .. } => None,
        }
    }

    /// The conformal table, or an error naming the model and the command that adds one.
    pub fn require_conformal(&self) -> Result<&Conformal, decide_engine::EngineError> {
        self.conformal()
            .ok_or_else(|| decide_engine::EngineError::NoConformal { model: self.name() })
    }

    /// The raw scores behind the yes/no answers of `request`, before calibration.
    pub fn yes_no_scores(
        &self,
        request: &DecisionRequest,
    ) -> Result<Vec<(String, f64)>, DecisionError> {
        match self {
            Self::Engine(e) => e.yes_no_scores(request),
            Self::Bm25(m) => m.yes_no_scores(request),
            Self::Cascade { .. } => Err(DecisionError::UnsupportedFeature(
                "a cascade has two calibrations: calibrate each model alone".into(),
            )),
        }
    }
}
