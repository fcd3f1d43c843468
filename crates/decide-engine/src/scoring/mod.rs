//! Scoring: a loaded model and its tokenizer turn (query, candidate) pairs into raw scores.
//!
//! Every score goes the same three steps ([`staged`]): stage (tokenize, look up cached
//! embeddings), forward (the rows through the [`Backend`]) and finish (the rows' outputs back
//! into scores: cosines, or logits). [`decision`] runs them for a whole
//! [`DecisionRequest`](decide_contract::DecisionRequest).

use std::borrow::Borrow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::Device;
use decide_contract::{Conformal, DecisionInput};

use crate::backend::TokenRow;
use crate::backend::{Backend, RowRef};
use crate::calibration::Calibration;
use crate::error::{EngineError, Result};
use crate::lexical::RecentIndexes;
use crate::needs_tool::NeedsTool;
use crate::registry::HeadName;
use crate::tokenize::Tokenization;
use staged::EncodedRow;

mod builder;
mod cache;
pub(crate) mod decision;
pub(crate) mod staged;

pub use builder::{
    EngineBuilder, DEFAULT_CACHE_BYTES, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH_TOKENS,
};
use cache::EmbeddingCache;

/// What kind of number a model's raw score is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreKind {
    /// Cosine similarity of two embeddings (bi-encoder).
    Cosine,
    /// The logit of a one-label cross-encoder (or label 1 against label 0 of a two-label one).
    Logit,
    /// The log-odds of the `entailment` label of an NLI cross-encoder.
    Entailment,
}

/// What was loaded, for reports.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The model's name.
    pub name: String,
    /// Its Hugging Face id, when its manifest names one.
    pub hf_id: Option<String>,
    /// Its folder.
    pub dir: PathBuf,
    /// `bert` or `roberta`.
    pub architecture: String,
    /// The head.
    pub head: HeadName,
    /// What the raw scores are.
    pub score_kind: ScoreKind,
    /// The longest input in tokens.
    pub max_length: usize,
    /// The device it runs on.
    pub device: String,
    /// The precision.
    pub dtype: String,
    /// The calibration, if any.
    pub calibration: Option<Calibration>,
    /// The weight of BM25 in hybrid scoring; 0 for the model alone.
    pub lexical_weight: f64,
    /// Whether a tool's text carries its parameter names ([`crate::tool_text`]).
    pub tool_parameters: bool,
    /// Whether a tool's text carries its server's name ([`crate::served_tool_text`]).
    pub tool_server: bool,
    /// The manifest's conformal table (see [`Engine::conformal`]), if it has one and it holds
    /// for the calibration and lexical weight in use.
    pub conformal: Option<Conformal>,
    /// The manifest's needs-tool head (bi-encoders only), if it has one.
    pub needs_tool: Option<NeedsTool>,
}

/// Raw scores of candidates against one query, in the candidates' order.
#[derive(Debug, Clone)]
pub struct Scores {
    /// One raw score per candidate.
    pub raw: Vec<f64>,
    /// Tokens that went through the model for them (cached embeddings cost none).
    pub tokens: usize,
    /// A bi-encoder's embedding of the query (of a conversation, its first view: the whole
    /// conversation), which the needs-tool head reads; `None` for a cross-encoder or without
    /// candidates.
    pub query: Option<Vec<f32>>,
    /// A bi-encoder's embedding of the conversation's last user message alone, when that is a
    /// view of its own (the conversation has more than that message).
    pub last_message: Option<Vec<f32>>,
}

/// A loaded model that scores (query, candidate) pairs in batched forward passes.
///
/// Cheap to clone (the model is shared) and safe to use from many threads.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.info.name)
            .field("head", &self.inner.info.head)
            .field("device", &self.inner.info.device)
            .finish()
    }
}

/// What an engine holds; shared by its clones.
pub(crate) struct Inner {
    pub(crate) info: ModelInfo,
    pub(crate) tokens: Tokenization,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) max_batch_tokens: usize,
    entailment_index: usize,
    pub(crate) cache: Mutex<EmbeddingCache>,
    pub(crate) lexical: RecentIndexes,
}

impl Engine {
    /// What was loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// The tokenizer's token count of a text (no special tokens), for usage reports.
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        self.inner.tokens.count_tokens(text)
    }

    /// The raw score of each candidate against `query`, in the candidates' order: all pairs in
    /// batched forward passes, the query tokenized once.
    ///
    /// For a bi-encoder the score is the cosine of the embeddings (the query trimmed from its
    /// oldest end, the candidates' embeddings cached); for a cross-encoder, the logit (or the
    /// entailment log-odds of an NLI model).
    pub fn score(&self, query: &str, candidates: &[&str]) -> Result<Scores> {
        let staged = self.stage_query(query, candidates)?;
        self.complete(staged)
    }

    pub(crate) fn logit_score(&self, logits: &[f32]) -> f64 {
        let l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        match (self.inner.info.score_kind, l.len()) {
            (ScoreKind::Logit, 1) => l[0],
            (ScoreKind::Logit, _) => l[1] - l[0],
            (_, _) => {
                // log p_e - log(1 - p_e) = l_e - logsumexp(l_j, j ≠ e)
                let e = self.inner.entailment_index;
                let others: Vec<f64> = l
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != e)
                    .map(|(_, &x)| x)
                    .collect();
                let max = others.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + others.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                l[e] - lse
            }
        }
    }

    /// Sentence embeddings of `texts`, as sentence-transformers computes them (inputs longer
    /// than the model's length lose their end). Bi-encoders only.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let rows: Vec<EncodedRow> = self
            .stage_embeddings(texts)?
            .into_iter()
            .map(|e| e.row)
            .collect();
        self.forward_rows(&rows)
    }

    /// What the needs-tool head reads of each decision input, as a decision embeds it: the whole
    /// conversation (trimmed from its oldest end) and, when it has more than that, its last user
    /// message alone; see [`NeedsTool::features`]. What [`NeedsTool::fit`] is fitted on.
    /// Bi-encoders only.
    pub fn conversation_embeddings(&self, inputs: &[DecisionInput]) -> Result<Vec<Vec<f64>>> {
        let mut rows = Vec::new();
        let mut counts = Vec::with_capacity(inputs.len());
        for input in inputs {
            let staged = self.stage_conversation(input)?.take_rows();
            counts.push(staged.len());
            rows.extend(staged);
        }
        let mut outputs = self.forward_rows(&rows)?.into_iter();
        counts
            .into_iter()
            .map(|n| {
                let views: Vec<Vec<f32>> = outputs.by_ref().take(n).collect();
                let (whole, last) = (&views[0], views.get(1).map(Vec::as_slice));
                NeedsTool::features(whole, last).ok_or_else(|| EngineError::NonFinite {
                    model: self.inner.info.name.clone(),
                })
            })
            .collect()
    }

    /// The manifest's needs-tool head, if the model has one ([`ModelInfo::needs_tool`]).
    pub fn needs_tool(&self) -> Option<&NeedsTool> {
        self.inner.info.needs_tool.as_ref()
    }

    /// The classifier's logits for each (query, document) pair. Cross-encoders only.
    pub fn classify_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Vec<f32>>> {
        if self.inner.info.head != HeadName::CrossEncoder {
            return Err(self.wrong_head("pair logits need a cross-encoder"));
        }
        let rows = pairs
            .iter()
            .map(|(q, d)| self.inner.tokens.encode_pair(q, d))
            .collect::<Result<Vec<_>>>()?;
        self.run(&rows)
    }

    /// The token ids of a (query, candidate) pair after trimming, as the model sees them.
    pub fn pair_token_ids(&self, query: &str, candidate: &str) -> Result<Vec<u32>> {
        Ok(self.inner.tokens.encode_pair(query, candidate)?.ids)
    }

    /// Decodes token ids back to text (special tokens dropped), for inspecting trimming.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.tokens.decode(ids)
    }

    /// The number of candidate embeddings in the cache.
    pub fn cached_embeddings(&self) -> usize {
        self.inner.cache.lock().map(|c| c.len()).unwrap_or_default()
    }

    /// Runs rows through the backend: one output vector per row, in the rows' order.
    pub(crate) fn run<R: Borrow<TokenRow>>(&self, rows: &[R]) -> Result<Vec<Vec<f32>>> {
        let rows: Vec<RowRef<'_>> = rows.iter().map(|r| r.borrow().as_row()).collect();
        let outputs = self.inner.backend.forward(&rows)?;
        if outputs.iter().flatten().any(|x| !x.is_finite()) {
            return Err(EngineError::NonFinite {
                model: self.inner.info.name.clone(),
            });
        }
        Ok(outputs)
    }

    fn wrong_head(&self, message: &str) -> EngineError {
        EngineError::WrongHead {
            model: self.inner.info.name.clone(),
            head: self.inner.info.head.as_str().into(),
            message: message.into(),
        }
    }

    /// The weight of BM25 in hybrid scoring (0: the model alone).
    pub fn lexical_weight(&self) -> f64 {
        self.inner.info.lexical_weight
    }

    /// Whether a tool's text carries its parameter names ([`crate::tool_text`]): the
    /// manifest's `[scoring] tool_parameters` unless [`EngineBuilder::tool_parameters`] said.
    pub fn tool_parameters(&self) -> bool {
        self.inner.info.tool_parameters
    }

    /// Whether a tool's text carries its server's name ([`crate::served_tool_text`]): the
    /// manifest's `[scoring] tool_server` unless [`EngineBuilder::tool_server`] said.
    pub fn tool_server(&self) -> bool {
        self.inner.info.tool_server
    }

    /// The conformal table of the manifest (`[conformal]`, written by `decide calibrate`): the
    /// probabilities of the needed tools of held-out cases, which turn a target recall into a
    /// threshold ([`Conformal::threshold`]). `None` when the manifest has none, or when
    /// [`EngineBuilder::calibration`], [`EngineBuilder::lexical_weight`] or
    /// [`EngineBuilder::tool_parameters`] or [`EngineBuilder::tool_server`] changed the
    /// probabilities it was computed for.
    pub fn conformal(&self) -> Option<&Conformal> {
        self.inner.info.conformal.as_ref()
    }

    /// The conformal table ([`conformal`](Self::conformal)), or an error naming the model and
    /// the command that adds one.
    pub fn require_conformal(&self) -> Result<&Conformal> {
        self.conformal().ok_or_else(|| EngineError::NoConformal {
            model: self.inner.info.name.clone(),
        })
    }

    /// The calibration, or an error naming the model when it has none.
    pub fn calibration(&self) -> Result<Calibration> {
        self.inner
            .info
            .calibration
            .ok_or_else(|| EngineError::Uncalibrated {
                model: self.inner.info.name.clone(),
                hint: "fit one with `decide calibrate`".into(),
            })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        self.inner.backend.device()
    }

    /// The token budget of one forward pass (rows × longest row).
    pub fn max_batch_tokens(&self) -> usize {
        self.inner.max_batch_tokens
    }
}
