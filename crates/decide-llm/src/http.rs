//! What both clients share: the HTTP configuration, retries, errors, and the bridge from the synchronous
//! `ChatModel::chat` to the asynchronous client.

use std::future::Future;
use std::time::Duration;

use decide_chat::ChatModelError;
use futures_util::StreamExt;
use serde_json::Value;

/// The default timeout of a call without streaming, and of the wait for each piece of a stream.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The default timeout for opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default number of retries after a failed attempt.
pub const DEFAULT_MAX_RETRIES: u32 = 2;
/// The default wait before the first retry; it doubles for each further one.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// Why a call to a chat server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The server answered with an error status; `message` is the server's error message, or its body.
    #[error("{url}: HTTP {status}: {message}")]
    Status {
        /// The URL called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The server's error message.
        message: String,
    },
    /// The server did not answer in time.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL called.
        url: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The request could not be sent or the answer could not be read (connection refused, reset, TLS, …).
    #[error("{url}: {message}")]
    Transport {
        /// The URL called.
        url: String,
        /// What went wrong, with its causes.
        message: String,
    },
    /// The answer is not what the API specifies; the message names the field.
    #[error("{url}: unexpected answer: {message}")]
    Decode {
        /// The URL called.
        url: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The client's configuration is not usable; the message names the option.
    #[error("invalid client configuration: {0}")]
    Config(String),
}

impl LlmError {
    /// Whether another attempt may succeed: timeouts, transport errors, 408, 409, 429 and 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Status { status, .. } => {
                matches!(status, 408 | 409 | 429) || (500..600).contains(status)
            }
            LlmError::Timeout { .. } | LlmError::Transport { .. } => true,
            LlmError::Decode { .. } | LlmError::Config(_) => false,
        }
    }
}

impl From<LlmError> for ChatModelError {
    fn from(error: LlmError) -> Self {
        ChatModelError::from_error(error)
    }
}

/// Connection settings common to both clients.
#[derive(Debug, Clone)]
pub(crate) struct HttpConfig {
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub max_retries: u32,
    pub retry_backoff: Duration,
}

impl HttpConfig {
    pub(crate) fn new(base_url: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), LlmError> {
        let url = reqwest::Url::parse(&self.base_url)
            .map_err(|error| LlmError::Config(format!("base_url '{}': {error}", self.base_url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(LlmError::Config(format!(
                "base_url '{}': the scheme must be http or https",
                self.base_url
            )));
        }
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(LlmError::Config(
                "timeout: must be more than zero".to_owned(),
            ));
        }
        Ok(())
    }

    /// A client with these timeouts. The total timeout is set per request, because a stream may last longer than
    /// any single wait.
    pub(crate) fn client(&self) -> Result<reqwest::Client, LlmError> {
        reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|error| LlmError::Config(format!("HTTP client: {error}")))
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url, path.trim_start_matches('/'))
    }

    /// Posts `body` and returns the response once its status is a success, retrying what may succeed on another
    /// attempt. With `whole_timeout`, the timeout covers the whole exchange including the body the caller reads
    /// next; without, only the wait for the response head (a stream's pieces are timed one by one).
    pub(crate) async fn post(
        &self,
        client: &reqwest::Client,
        url: &str,
        body: &Value,
        whole_timeout: bool,
    ) -> Result<reqwest::Response, LlmError> {
        let mut attempt = 0;
        loop {
            let result = self.post_once(client, url, body, whole_timeout).await;
            match result {
                Err(error) if error.is_retryable() && attempt < self.max_retries => {
                    let wait = self.retry_backoff * 2u32.saturating_pow(attempt);
                    tracing::warn!(%error, attempt, ?wait, "chat request failed; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn post_once(
        &self,
        client: &reqwest::Client,
        url: &str,
        body: &Value,
        whole_timeout: bool,
    ) -> Result<reqwest::Response, LlmError> {
        let mut request = client.post(url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        if whole_timeout {
            request = request.timeout(self.timeout);
        }
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| self.timeout_error(url))?
            .map_err(|error| self.transport_error(url, &error))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = tokio::time::timeout(self.timeout, response.text())
            .await
            .map_err(|_| self.timeout_error(url))?
            .unwrap_or_default();
        Err(LlmError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
            message: error_message(&text),
        })
    }

    pub(crate) fn timeout_error(&self, url: &str) -> LlmError {
        LlmError::Timeout {
            url: url.to_owned(),
            timeout: self.timeout,
        }
    }

    pub(crate) fn transport_error(&self, url: &str, error: &reqwest::Error) -> LlmError {
        if error.is_timeout() {
            return self.timeout_error(url);
        }
        // reqwest's own message is terse ("error sending request"); the causes say what happened.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        LlmError::Transport {
            url: url.to_owned(),
            message,
        }
    }

    /// The whole body of a successful response as JSON.
    pub(crate) async fn json(
        &self,
        url: &str,
        response: reqwest::Response,
    ) -> Result<Value, LlmError> {
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.transport_error(url, &error))?;
        serde_json::from_slice(&bytes).map_err(|error| LlmError::Decode {
            url: url.to_owned(),
            message: format!("the body is not JSON: {error}"),
        })
    }

    /// The body of a successful response, piece by piece, each piece waited for at most the timeout.
    pub(crate) fn chunks(
        &self,
        url: &str,
        response: reqwest::Response,
    ) -> impl futures_util::Stream<Item = Result<bytes::Bytes, LlmError>> + Send + 'static {
        let config = self.clone();
        let url = url.to_owned();
        let body = response.bytes_stream();
        futures_util::stream::unfold(Some(Box::pin(body)), move |state| {
            let config = config.clone();
            let url = url.clone();
            async move {
                let mut body = state?;
                match tokio::time::timeout(config.timeout, body.next()).await {
                    Err(_) => Some((Err(config.timeout_error(&url)), None)),
                    Ok(None) => None,
                    Ok(Some(Err(error))) => Some((Err(config.transport_error(&url, &error)), None)),
                    Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(body))),
                }
            }
        })
    }
}

/// The server's error message: OpenAI's `{"error": {"message"}}`, Ollama's `{"error": "..."}`, or the body.
pub(crate) fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|value| match value.get("error") {
        Some(Value::String(message)) => Some(message.clone()),
        Some(error) => error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned),
        None => None,
    });
    let message = message.unwrap_or_else(|| body.trim().to_owned());
    if message.is_empty() {
        "(no body)".to_owned()
    } else if message.chars().count() > 500 {
        format!("{}…", message.chars().take(500).collect::<String>())
    } else {
        message
    }
}

/// Runs an asynchronous call for the synchronous `ChatModel::chat`: on a thread of its own, with a runtime of its
/// own, so it works from a plain thread, the blocking pool or even a runtime worker (which it blocks, as any
/// synchronous call does) without the "runtime within a runtime" panic.
pub(crate) fn block_on<T: Send>(
    future: impl Future<Output = T> + Send,
) -> Result<T, ChatModelError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|error| ChatModelError::model(format!("runtime: {error}")))?;
                Ok(runtime.block_on(future))
            })
            .join()
            .map_err(|_| ChatModelError::model("the chat call panicked"))?
    })
}
