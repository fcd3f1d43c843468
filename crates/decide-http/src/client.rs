//! [`HttpDecisionModel`]: a [`DecisionModel`] answered by a decision API over HTTP.

use std::time::Duration;

use decide_contract::{
    DecisionError, DecisionFuture, DecisionModel, DecisionRequest, DecisionRequestParameters,
    DecisionResponse,
};

use crate::{openai, systemone, WireError};

/// Which wire format a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    /// The OpenAI Decisions API, `POST {base}/v1/decisions`.
    OpenAiDecisions,
    /// TypeSafe's System One API, `POST {base}/v1/systemone`.
    SystemOne,
}

impl WireFormat {
    fn path(self) -> &'static str {
        match self {
            Self::OpenAiDecisions => "/v1/decisions",
            Self::SystemOne => "/v1/systemone",
        }
    }
}

/// What can go wrong talking to a decision API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error status; the message is the one in its error body.
    #[error("{url}: HTTP {status}: {message}")]
    Status {
        /// The endpoint.
        url: String,
        /// The status code.
        status: u16,
        /// The server's message, or the start of its body.
        message: String,
    },
    /// The server could not be reached, or the connection failed.
    #[error("{url}: {message}")]
    Transport {
        /// The endpoint.
        url: String,
        /// What failed.
        message: String,
    },
    /// The response does not have the format's shape.
    #[error("{url}: bad response: {error}")]
    Response {
        /// The endpoint.
        url: String,
        /// The field and what is wrong with it.
        error: WireError,
    },
}

/// A [`DecisionModel`] that sends every request to a decision API: a local `decide serve`, or
/// any server that speaks the OpenAI Decisions or System One format. An agent written against
/// `DecisionModel` runs unchanged on the embedded engine, a local server or a hosted API.
///
/// Calls are blocking (a small HTTP client, no runtime of its own);
/// [`decide_async`](DecisionModel::decide_async) runs the call on tokio's blocking pool, or on
/// a thread of its own outside a runtime. The response is validated against the request, as
/// for every model.
///
/// ```no_run
/// use decide_contract::{DecisionModel, DecisionRequest, YesNoQuestion};
/// use decide_http::{HttpDecisionModel, WireFormat};
///
/// let model = HttpDecisionModel::builder("http://127.0.0.1:8080")
///     .format(WireFormat::SystemOne)
///     .build();
/// let request = DecisionRequest::builder()
///     .input("Book me a table for two tonight")
///     .question("booking", YesNoQuestion::new("Does the user want a booking?")?)
///     .build()?;
/// let p = model.decide(&request)?.yes_no("booking")?.probability();
/// # Ok::<(), decide_contract::DecisionError>(())
/// ```
#[derive(Clone)]
pub struct HttpDecisionModel {
    agent: ureq::Agent,
    url: String,
    format: WireFormat,
    api_key: Option<String>,
    model: Option<String>,
}

impl std::fmt::Debug for HttpDecisionModel {
    // The API key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDecisionModel")
            .field("url", &self.url)
            .field("format", &self.format)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// Configures an [`HttpDecisionModel`].
#[derive(Debug, Clone)]
pub struct HttpDecisionModelBuilder {
    base_url: String,
    endpoint: Option<String>,
    format: WireFormat,
    api_key: Option<String>,
    model: Option<String>,
    timeout: Duration,
}

impl HttpDecisionModelBuilder {
    /// The wire format (default: System One, which carries yes/no criteria).
    pub fn format(mut self, format: WireFormat) -> Self {
        self.format = format;
        self
    }

    /// The full URL to post to, for servers that mount the API elsewhere
    /// (`https://api.fireworks.ai/inference/v1/systemone`); by default the base URL plus
    /// `/v1/decisions` or `/v1/systemone`.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Sent as `Authorization: Bearer KEY`.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The model to ask for, when the request names none.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// How long one call may take, connection included (default 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The model.
    pub fn build(self) -> HttpDecisionModel {
        let url = self.endpoint.unwrap_or_else(|| {
            format!(
                "{}{}",
                self.base_url.trim_end_matches('/'),
                self.format.path()
            )
        });
        HttpDecisionModel {
            agent: ureq::AgentBuilder::new().timeout(self.timeout).build(),
            url,
            format: self.format,
            api_key: self.api_key,
            model: self.model,
        }
    }
}

impl HttpDecisionModel {
    /// A builder for a server at `base_url` (`http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> HttpDecisionModelBuilder {
        HttpDecisionModelBuilder {
            base_url: base_url.into(),
            endpoint: None,
            format: WireFormat::SystemOne,
            api_key: None,
            model: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn call(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        let model = request.model_name();
        let body = match self.format {
            WireFormat::OpenAiDecisions => openai::request_body(request, model),
            WireFormat::SystemOne => systemone::request_body(request, model),
        };
        let mut call = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            call = call.set("Authorization", &format!("Bearer {key}"));
        }
        let url = self.url.clone();
        let response = match call.send_string(&body.to_string()) {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let message = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(200).collect());
                // The server refused the request itself: that is the caller's error to fix.
                if status == 400 || status == 422 {
                    return Err(DecisionError::InvalidRequest(format!("{url}: {message}")));
                }
                return Err(DecisionError::from_model_error(ClientError::Status {
                    url,
                    status,
                    message,
                }));
            }
            Err(e) => {
                return Err(DecisionError::from_model_error(ClientError::Transport {
                    url,
                    message: e.to_string(),
                }))
            }
        };
        let text = response.into_string().map_err(|e| {
            DecisionError::from_model_error(ClientError::Transport {
                url: url.clone(),
                message: e.to_string(),
            })
        })?;
        let parsed = match self.format {
            WireFormat::OpenAiDecisions => openai::parse_response(text.as_bytes()),
            WireFormat::SystemOne => systemone::parse_response(text.as_bytes()),
        };
        parsed
            .map_err(|error| DecisionError::from_model_error(ClientError::Response { url, error }))
    }
}

impl DecisionModel for HttpDecisionModel {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        self.call(request)
    }

    /// Runs the blocking call off the async runtime's workers.
    fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
        let model = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = move || {
            let _ = tx.send(model.call(&request));
        };
        let spawned = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(job);
                Ok(())
            }
            Err(_) => std::thread::Builder::new()
                .name("decide-http".into())
                .spawn(job)
                .map(|_| ()),
        };
        Box::pin(async move {
            spawned.map_err(DecisionError::from_model_error)?;
            rx.await
                .map_err(|_| DecisionError::model("the HTTP call stopped without an answer"))?
        })
    }

    fn default_request_parameters(&self) -> DecisionRequestParameters {
        match &self.model {
            Some(m) => DecisionRequestParameters::for_model(m.clone()),
            None => DecisionRequestParameters::default(),
        }
    }
}
