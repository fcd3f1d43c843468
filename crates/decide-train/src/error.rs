//! What can go wrong while training.

use std::path::{Path, PathBuf};

/// A training error; each names the file, tensor or option concerned.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read or written, or its content is wrong.
    #[error("{}: {message}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The base model lacks a weight the encoder needs.
    #[error("the base model has no tensor '{0}'")]
    MissingTensor(String),
    /// The base model is of a kind training does not handle yet.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The training data cannot be trained on.
    #[error("{0}")]
    BadData(String),
    /// An option is out of range.
    #[error("--{option}: {message}")]
    InvalidOption {
        /// The option, as the command line spells it.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The loss stopped being a finite number (learning rate too high).
    #[error("the loss became {0} at step {1}; try a lower --lr")]
    Diverged(f32, usize),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The engine failed (reading the base model's configuration).
    #[error(transparent)]
    Engine(#[from] decide_engine::EngineError),
}

impl TrainError {
    pub(crate) fn bad_file(path: &Path, message: impl std::fmt::Display) -> Self {
        TrainError::BadFile {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// The result of a training operation.
pub type Result<T> = std::result::Result<T, TrainError>;
