//! # decide-train
//!
//! Fine-tunes a decide bi-encoder on labelled cases (which tools a conversation needed), on the
//! CPU or a GPU, without Python, and writes a model folder that `--model DIR` loads like any
//! other.
//!
//! ## Design
//!
//! * **A differentiable BERT** ([`model`](crate::model)): the engine's inference path uses
//!   fused LayerNorm / softmax ops (and its own CPU kernels) that have no backward, so stock
//!   candle BERT gets no gradients. Training runs its own forward from basic ops over
//!   [`candle_core::Var`]s loaded from the base model's safetensors, with real dropout; the
//!   saved weights keep the bare sentence-transformers names, which the engine reads unchanged.
//! * **Loss**: multiple-negatives ranking (sentence-transformers' `MultipleNegativesRankingLoss`):
//!   for each (query, needed tool) pair of a batch, a softmax over `scale · cosine` against every
//!   tool of the batch plus one hard negative per pair, drawn from the tools the current model
//!   ranks highest among those the case did not need (re-mined at the start of every epoch).
//!   A tool that the query also needs is masked out rather than counted as a negative.
//! * **Optimiser**: AdamW, linear warm-up then linear decay to zero, gradients clipped by their
//!   global norm.
//! * **Determinism**: shuffles, hard-negative draws and dropout masks come from one seeded
//!   generator, so the same seed and data give the same weights.
//!
//! The command (`decide train`) reads and checks the data, drives epochs, evaluates, keeps the
//! best epoch and fits the calibration; this crate holds the model, the loss and the folder
//! writing.
#![deny(missing_docs)]

mod error;
mod model;
mod trainer;

pub use error::{Result, TrainError};
pub use trainer::{
    file_sha256, write_manifest, Example, ExampleSource, ExampleSpool, Hyper, ModelMeta,
    StepReport, TrainData, TrainHead, Trainer,
};
