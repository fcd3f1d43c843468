//! Streaming chat models: tokens as they arrive, then the complete response. Beside
//! [`ChatModel`](crate::ChatModel), with the same request and response types.

use std::pin::Pin;
use std::sync::Arc;

use futures_core::Stream;

use crate::chat_model::{ChatModelError, ChatRequest, ChatResponse};

/// One event of a streamed chat call.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatStreamEvent {
    /// A piece of the reply's text, as it arrived.
    Token(String),
    /// The complete response: the text of every token, and the tool calls, assembled from their fragments. Always
    /// the last event of a stream that did not fail.
    Response(ChatResponse),
}

/// The stream of a streamed chat call.
pub type ChatStream =
    Pin<Box<dyn Stream<Item = Result<ChatStreamEvent, ChatModelError>> + Send + 'static>>;

/// A chat model that can stream its reply.
///
/// Separate from [`ChatModel`](crate::ChatModel) because decorators such as the model router are not
/// streaming: an agent streams only when it is given a streaming model.
pub trait StreamingChatModel: Send + Sync {
    /// Streams the reply to `request`: [`ChatStreamEvent::Token`]s, then one [`ChatStreamEvent::Response`].
    fn chat_stream(&self, request: ChatRequest) -> ChatStream;
}

impl<T: StreamingChatModel + ?Sized> StreamingChatModel for Arc<T> {
    fn chat_stream(&self, request: ChatRequest) -> ChatStream {
        (**self).chat_stream(request)
    }
}

impl<T: StreamingChatModel + ?Sized> StreamingChatModel for Box<T> {
    fn chat_stream(&self, request: ChatRequest) -> ChatStream {
        (**self).chat_stream(request)
    }
}
