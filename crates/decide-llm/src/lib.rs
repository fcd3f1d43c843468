//! Chat model clients for decide's agent: the OpenAI-compatible chat completions API and Ollama's native
//! `/api/chat`.
//!
//! Both implement [`ChatModel`](decide_chat::ChatModel) (so the model router can route between them and the agent
//! can call them) and [`StreamingChatModel`](decide_chat::StreamingChatModel) (so the agent can stream answers).
//!
//! * [`OpenAiChatModel`] speaks `POST {base_url}/chat/completions`: OpenAI, vLLM, llama.cpp's server, LM Studio and
//!   Ollama's `/v1` endpoint. Tools go as `tools`, calls come back as `tool_calls` (the legacy `function_call` is
//!   read too), and streaming is server-sent events whose tool-call fragments are assembled by index.
//! * [`OllamaChatModel`] speaks Ollama's `POST {base_url}/api/chat`: tool-call arguments are JSON objects, tool
//!   results carry `tool_call_id`, streaming is newline-delimited JSON, sampling parameters go in `options`.
//!
//! # Design
//!
//! * **Only what is set is sent.** The request JSON carries the model, the messages, the tools and the parameters
//!   the [`ChatRequest`](decide_chat::ChatRequest) or the builder set; the server's defaults apply to everything
//!   else, so one request works against servers that support different parameter sets. The bodies match the
//!   recorded transcripts of LangChain4j and LangChain examples field for field (modulo the newer `tools` wire format); the tests replay
//!   them against a local fake server.
//! * **Retries where they can help.** Timeouts, transport errors, 408, 409, 429 and 5xx are retried with
//!   exponential backoff ([`LlmError::is_retryable`]); a stream only before its first byte, since a retried stream
//!   would repeat tokens the caller already has. A stream's pieces are each waited for at most the timeout, so a
//!   server that stops mid-answer gives an error, not a hang.
//! * **Asynchronous first.** `chat_async` and `chat_stream` use a shared connection pool on the caller's runtime;
//!   the synchronous `chat` runs the same code on a thread and runtime of its own with a client of its own, because
//!   connections pooled by one runtime cannot be used from another.
//! * **Errors name the URL and the server's message** ([`LlmError`]), and a malformed answer names the field.
#![deny(missing_docs)]

mod http;
mod ollama;
mod openai;
mod sse;

pub use http::{
    LlmError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RETRIES, DEFAULT_RETRY_BACKOFF, DEFAULT_TIMEOUT,
};
pub use ollama::{OllamaChatModel, OllamaChatModelBuilder, DEFAULT_OLLAMA_URL};
pub use openai::{
    parse_response, OpenAiChatModel, OpenAiChatModelBuilder, FINISH_REASON_ATTRIBUTE,
};
