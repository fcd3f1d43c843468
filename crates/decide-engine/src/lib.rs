//! # decide-engine
//!
//! A candle engine that answers [`DecisionModel`](decide_contract::DecisionModel) requests
//! offline, in milliseconds, with a small local encoder.
//!
//! ## How a decision becomes a forward pass
//!
//! Every question of a request is turned into (query, document) pairs: the query is the
//! request's input rendered as text (the conversation, oldest message first), the document is
//! what the question is about: the candidate it carries (a tool's or route's name and
//! description), else its yes-when / no-when criteria, else its own text. All pairs of a
//! request are scored in one batched call ([`Engine::score`]), then aggregated:
//!
//! * yes/no: `P(yes) = sigmoid(a·s + b)`; with both yes-when and no-when,
//!   `sigmoid(a·(s_yes − s_no))`;
//! * choice: a softmax over `a·s` of the options (the slope `a` is the inverse temperature);
//! * scale: the same softmax over the levels, and the expected level index as the mean.
//!
//! `a` and `b` are the model's [`Calibration`] (Platt scaling, stored in its manifest):
//! nothing uncalibrated is called a probability. A manifest may also carry a [`Conformal`]
//! table, the probabilities of the needed tools of held-out cases, which turns a recall the
//! caller chooses into a threshold ([`Engine::conformal`]).
//!
//! ## Two heads
//!
//! * **Bi-encoder** (the default, `decide-tools-minilm`: all-MiniLM-L6-v2 trained to select tools): conversation and
//!   candidates are embedded separately and compared by cosine. Candidate embeddings are cached,
//!   so a repeated tool set costs one forward pass, for the conversation.
//! * **Cross-encoder** (BERT / MiniLM / XLM-RoBERTa sequence classifiers such as the
//!   bge-reranker family): each pair is read together; the score is the relevance logit, or the
//!   entailment log-odds of an NLI model.
//!
//! ## Batching and trimming
//!
//! The conversation is tokenized once. A pair longer than the model allows loses the oldest
//! tokens of the conversation first; the candidate is cut only when it alone would crowd the
//! conversation out of a quarter of the budget. Pairs are sorted by length and cut into batches
//! of at most `max_batch_tokens` padded tokens; results come back in input order, equal to
//! one-by-one scoring. [`Tokenization`] holds the trimming rules, for the trainer too.
//!
//! ## Models
//!
//! [`resolve`] finds a model offline (a folder, `models/<name>/`, or the Hugging Face cache)
//! and never downloads; `decide models pull` (the `hub` feature) does. A model's folder is
//! described by its [`Manifest`].
//!
//! ## Devices
//!
//! CPU by default; the `cuda` and `metal` features compile candle's backends in, and
//! [`DeviceSpec`] picks one at run time. A backend that is not compiled in is an error, never a
//! silent fallback.
//!
//! On the CPU in f32 the encoder runs as fused candle custom ops (`backend/kernels.rs`, the
//! crate's only `unsafe` module besides the memory-mapped weights): five ops per layer instead
//! of about twenty, GEMMs through `gemm`'s AVX-512 kernels, attention per sequence and block of
//! query rows in parallel without transposes, bias/GELU and residual/LayerNorm fused into the
//! GEMM write-back.
//! The instruction set is detected at run time and chosen at load time ([`CpuKernels`] can only
//! lower it); [`CpuKernels::Stock`] runs candle's own ops, the reference the fused path is tested
//! against. Other devices and dtypes always run candle's ops.
//!
//! ## Layers
//!
//! From the bottom up; each uses only the ones before it:
//!
//! * `backend`: the model behind a forward interface over token rows: `config.json`, the
//!   device, the weights, the encoder and its kernels, batching and packing;
//! * `tokenize`: text to token rows ([`Tokenization`]), trimmed to the model's length;
//! * `registry`: models on disk: the [`Manifest`] and offline resolution ([`resolve`]);
//! * `answering`: from a request to documents and from their raw scores to calibrated
//!   answers, shared by every model through [`Scorer`], and the [`Cascade`] of two; it depends
//!   on the contract, [`Calibration`] and [`EngineError`] alone;
//! * `lexical`: BM25, alone ([`Bm25Model`]) and as the engine's hybrid term ([`Bm25Index`]);
//! * `scoring`: the [`Engine`]: stage (tokenize, look up cached embeddings), forward, finish
//!   (cosines or logits) for any query and candidates, and for a whole decision.
#![deny(missing_docs)]

mod answering;
mod backend;
#[doc(hidden)]
pub mod bench;
mod calibration;
mod error;
mod lexical;
mod needs_tool;
#[cfg(feature = "hub")]
mod pull;
mod registry;
mod scoring;
mod tokenize;

pub use answering::{
    candidate_text, served_tool_text, server_label, tool_text, Cascade, Scorer, ScorerInfo,
    DEFAULT_TOP_K, MAX_TEXT_PARAMETERS,
};
pub use backend::config::{Activation, EncoderConfig, Family};
pub use backend::device::{CpuKernels, DeviceSpec, Precision};
pub use backend::{Bf16Tiles, TokenRow};
pub use calibration::{sigmoid, softmax, Calibration};
/// The manifest's `[conformal]` table; defined in the contract so that the tool filter can take it
/// without depending on the engine.
pub use decide_contract::Conformal;
pub use error::{EngineError, Result};
pub use lexical::{Bm25Index, Bm25Model, BM25_CALIBRATION, BM25_MODEL_NAME};
pub use needs_tool::NeedsTool;
#[cfg(feature = "hub")]
pub use pull::pull;
pub use registry::{
    conformal_toml, file_sha256, resolve, Build, HeadName, Manifest, ModelLocation, Scoring,
    BASE_MODEL, DEFAULT_MODEL,
};
pub use scoring::decision::StagedDecision;
pub use scoring::staged::{EmbeddingRow, EncodedRow, StagedScores};
pub use scoring::{
    Engine, EngineBuilder, ModelInfo, ScoreKind, Scores, DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH_TOKENS,
};
pub use tokenize::{trim_pair, trim_single, Tokenization};
