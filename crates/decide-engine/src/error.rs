//! The engine's one error type.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while loading a model or scoring with it.
///
/// Each message is one line that names the file, model or value concerned, so that the command
/// line can print it as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// No folder holds the model; the message says which command fetches it.
    #[error("model '{name}' was not found (looked in {searched}); {hint}")]
    ModelNotFound {
        /// The name or path that was asked for.
        name: String,
        /// The places that were searched, joined for display.
        searched: String,
        /// The command that fetches the model.
        hint: String,
    },
    /// The model folder lacks a file the model needs.
    #[error("{}: missing {file}", dir.display())]
    MissingFile {
        /// The model folder.
        dir: PathBuf,
        /// The file that is missing, relative to the folder.
        file: String,
    },
    /// A file of the model could not be read or parsed.
    #[error("{}: {message}", path.display())]
    BadFile {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The model's architecture or head is not one this engine runs.
    #[error("{}: unsupported model: {message}", dir.display())]
    Unsupported {
        /// The model folder.
        dir: PathBuf,
        /// What is not supported.
        message: String,
    },
    /// The model has no calibration, so its scores cannot be called probabilities.
    #[error("model '{model}' has no calibration: {hint}")]
    Uncalibrated {
        /// The model's name.
        model: String,
        /// How to get one.
        hint: String,
    },
    /// A target recall was asked of a model whose manifest has no conformal table.
    #[error(
        "model {model} has no conformal calibration; run decide calibrate on held-out labelled cases to add one"
    )]
    NoConformal {
        /// The model's name.
        model: String,
    },
    /// A device string that does not parse, or a device this build or machine cannot use.
    #[error("device '{device}': {message}")]
    Device {
        /// The device as given.
        device: String,
        /// Why it cannot be used.
        message: String,
    },
    /// An option with a value out of its range.
    #[error("{option}: {message}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong with the value.
        message: String,
    },
    /// The operation needs another head (for example embeddings from a cross-encoder).
    #[error("model '{model}' is a {head}: {message}")]
    WrongHead {
        /// The model's name.
        model: String,
        /// The head the model has.
        head: String,
        /// What was asked of it.
        message: String,
    },
    /// Tokenization failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Downloading from the hub failed.
    #[error("download of '{model}' failed: {message}")]
    Download {
        /// The model being downloaded.
        model: String,
        /// What failed.
        message: String,
    },
    /// The model computed NaN or infinite outputs: its weights are broken, and no probability
    /// drawn from them would mean anything.
    #[error("model '{model}' computed NaN or infinite outputs: its weights are corrupted; fetch or train it again")]
    NonFinite {
        /// The model's name.
        model: String,
    },
    /// The tensor backend failed.
    #[error("inference failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    pub(crate) fn bad_file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        EngineError::BadFile {
            path: path.into(),
            message: message.to_string(),
        }
    }

    /// A file that a library failed to read, with the first line of its message: candle and
    /// tokenizers add backtraces and hints below it that would break the one-line rule.
    pub(crate) fn unreadable(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Self::bad_file(path, first_line(&e.to_string()))
    }
}

/// `dir/file`, or the error that names the missing file.
pub(crate) fn require(dir: &Path, file: &str) -> Result<PathBuf> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EngineError::MissingFile {
            dir: dir.to_path_buf(),
            file: file.to_string(),
        })
    }
}

/// The first line of a message, trimmed.
pub(crate) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}
