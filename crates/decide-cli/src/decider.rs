//! The decision model the global options name: the neural engine, or BM25 (`--model bm25`),
//! which needs no model files.

use std::sync::Arc;

use decide_contract::DecisionModel;
use decide_engine::{Bm25Model, Cascade, Engine, Scorer, BM25_MODEL_NAME};

/// The neural engine, the lexical baseline, or a cascade of two, behind the engine's
/// [`Scorer`] interface for the commands. Cloning shares the loaded models.
#[derive(Clone)]
pub struct Decider(Arc<dyn Scorer>);

impl Decider {
    /// BM25 when `model` names it, else `engine()`.
    pub fn load(
        model: &str,
        engine: impl FnOnce() -> anyhow::Result<Engine>,
    ) -> anyhow::Result<Self> {
        if model == BM25_MODEL_NAME {
            Ok(Self(Arc::new(Bm25Model::new())))
        } else {
            Ok(Self(Arc::new(engine()?)))
        }
    }

    /// `second` rescores the `top_k` most probable candidates of `first`.
    pub fn cascade(first: Decider, second: Decider, top_k: usize) -> anyhow::Result<Self> {
        Ok(Self(Arc::new(Cascade::new(first.0, second.0, top_k)?)))
    }

    /// For the filter and the router.
    pub fn decision_model(&self) -> Arc<dyn DecisionModel> {
        self.0.clone()
    }
}

impl std::ops::Deref for Decider {
    type Target = dyn Scorer;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}
