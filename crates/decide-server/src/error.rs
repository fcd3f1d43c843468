//! The server's own errors (the HTTP error answers are `api_error`'s).

/// What can fail when starting or running the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding, accepting or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The inference thread could not be started.
    #[error("could not start the inference thread: {0}")]
    Thread(std::io::Error),
    /// The configuration is unusable (an empty API key, say).
    #[error("{0}")]
    Config(String),
}
