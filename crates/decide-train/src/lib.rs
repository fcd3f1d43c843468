//! # decide-train
//!
//! Fine-tunes a decide bi-encoder, or a cross-encoder on the same trunk, on labelled cases
//! (which tools a conversation needed), on the CPU or a GPU, without Python, and writes a model
//! folder that `--model DIR` (or `--rerank DIR` for a cross-encoder) loads like any other.
//!
//! ## Design
//!
//! * **A differentiable BERT** (module `model`): the engine's inference path uses
//!   fused LayerNorm / softmax ops (and its own CPU kernels) that have no backward, so stock
//!   candle BERT gets no gradients. Training runs its own forward from basic ops over
//!   [`candle_core::Var`]s loaded from the base model's safetensors, with real dropout; the
//!   saved weights keep the bare sentence-transformers names, which the engine reads unchanged.
//! * **Loss**: multiple-negatives ranking (sentence-transformers' `MultipleNegativesRankingLoss`):
//!   for each (query, needed tool) pair of a batch, a softmax over `scale · cosine` against every
//!   tool of the batch plus one hard negative per pair, drawn from the tools the current model
//!   ranks highest among those the case did not need (re-mined at the start of every epoch).
//!   A tool that the query also needs is masked out rather than counted as a negative.
//! * **Cross-encoder** ([`TrainHead::CrossEncoder`]): the same trunk reads (conversation,
//!   tool) pairs with token types, BERT's pooler (dense + tanh on the first token) and a
//!   one-logit classifier on top, initialised when the base has none. Binary cross-entropy:
//!   each needed tool against one of the case's hard negatives and one random unneeded tool.
//!   Hard negatives are mined once, with the base's embeddings: the shortlist it will rerank.
//!   Pairs are trimmed exactly as the engine trims them.
//! * **Memory**: the cases are read through [`ExampleSource`]; [`ExampleSpool`] writes them
//!   to a scratch file as the data is read and reads a batch's back by offset, so a run keeps
//!   an offset, its pairs and its hard-negative pool per case in memory, not the texts.
//! * **Optimiser**: AdamW, linear warm-up then linear decay to zero, gradients clipped by their
//!   global norm.
//! * **Fused CPU ops** (modules `fused` and `attention`): on the CPU the LayerNorms, GELU and
//!   each layer's whole attention (heads, masked softmax, dropout and both products) are single
//!   ops with their own backward, tested against the basic ops other devices run.
//! * **bf16 on AMX** ([`Trainer::on_tiles`]): on a CPU with AMX the linear layers' products,
//!   forward and backward, can run in bf16 on the tiles (module `tiles`), with f32 weights,
//!   gradients and optimiser state; the rest of the graph stays f32.
//! * **Determinism**: shuffles, hard-negative draws and dropout masks come from one seeded
//!   generator, so the same seed and data give the same weights.
//!
//! The crate's modules follow its jobs: `config` (the hyper-parameters and head), `data` (the
//! cases and the texts as token rows; all tokenizing and trimming is there), `model` (the
//! differentiable encoder; its CPU ops with their own backward in `fused` and `attention`, its
//! linear layers on AMX tiles in `tiles`), `trainer` (an epoch: mining, steps, the frozen
//! layers' cache), `run` (the whole run: epochs, checkpoints, the calibration fit, the best epoch
//! kept, patience) and `export` (the model folder and its manifest, written through [`decide_engine::Manifest`]).
//!
//! The command (`decide train`) reads and checks the data and, through a [`RunObserver`],
//! scores the held-out cases for each checkpoint's calibration, measures it, shows the progress
//! and stops the run on Ctrl-C; this crate holds the model, the loss, the run and the folder
//! writing.
#![deny(missing_docs)]

mod attention;
mod config;
mod data;
mod error;
mod export;
mod fused;
mod model;
mod run;
mod tiles;
mod trainer;

pub use config::{Hyper, TrainHead};
pub use data::{Example, ExampleSource, ExampleSpool, TrainData};
pub use error::{Result, TrainError};
pub use export::{write_manifest, written_by_train, ModelMeta};
pub use run::{beside, EpochEnd, Outcome, RunObserver, Schedule, StepProgress};
pub use trainer::{StepReport, Trainer};
