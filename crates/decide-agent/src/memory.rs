//! Chat memory: a window of messages per conversation id, in a pluggable store.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use decide_chat::BoxError;
use decide_chat::ChatMessage;

/// The fewest messages a window may hold: a user message, the assistant's tool call and the tool's result must fit,
/// or the LLM would never see the result of the call it just made.
pub const MIN_MESSAGES: usize = 3;

/// Why a memory store failed.
#[derive(Debug, thiserror::Error)]
#[error("chat memory store: {0}")]
pub struct MemoryError(#[source] pub BoxError);

impl MemoryError {
    /// An error that only has a message.
    pub fn message(message: impl Into<String>) -> Self {
        Self(message.into().into())
    }
}

/// Where the messages of each conversation are kept: an in-process map, a database, a cache.
///
/// The window logic lives in [`MessageWindowChatMemory`], so a store only reads and writes whole lists. The agent
/// calls it from its own task, so a store that does I/O should be quick or keep a local cache.
pub trait ChatMemoryStore: Send + Sync {
    /// The messages of conversation `memory_id`, oldest first; empty for an unknown id.
    fn get_messages(&self, memory_id: &str) -> Result<Vec<ChatMessage>, MemoryError>;
    /// Replaces the messages of conversation `memory_id`.
    fn update_messages(
        &self,
        memory_id: &str,
        messages: Vec<ChatMessage>,
    ) -> Result<(), MemoryError>;
    /// Forgets conversation `memory_id`.
    fn delete_messages(&self, memory_id: &str) -> Result<(), MemoryError>;
}

/// A store in a map in memory, lost when the process ends.
#[derive(Debug, Default)]
pub struct InMemoryChatMemoryStore {
    conversations: Mutex<HashMap<String, Vec<ChatMessage>>>,
}

impl InMemoryChatMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<ChatMessage>>> {
        // The map is replaced whole under the lock, so a panic elsewhere cannot leave it half-written.
        self.conversations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl ChatMemoryStore for InMemoryChatMemoryStore {
    fn get_messages(&self, memory_id: &str) -> Result<Vec<ChatMessage>, MemoryError> {
        Ok(self.map().get(memory_id).cloned().unwrap_or_default())
    }

    fn update_messages(
        &self,
        memory_id: &str,
        messages: Vec<ChatMessage>,
    ) -> Result<(), MemoryError> {
        self.map().insert(memory_id.to_owned(), messages);
        Ok(())
    }

    fn delete_messages(&self, memory_id: &str) -> Result<(), MemoryError> {
        self.map().remove(memory_id);
        Ok(())
    }
}

/// Keeps the latest `max_messages` messages of each conversation, as LangChain4j's `MessageWindowChatMemory`.
///
/// * The system message is kept first and never evicted; adding a different one replaces it.
/// * When the window is full, the oldest other message goes. If it is an assistant message that called tools, the
///   results of those calls go with it, and a tool result left at the front is removed too: a result without its
///   call makes most chat APIs reject the request.
/// * Size the window for the traffic of the largest turn (its user message, every round's calls and results): a
///   smaller one evicts the turn's own user message, or even a call with its results, before the LLM has answered,
///   exactly as LangChain4j's window does. 3 is the least that works with one call per round.
#[derive(Clone)]
pub struct MessageWindowChatMemory {
    max_messages: usize,
    store: Arc<dyn ChatMemoryStore>,
}

impl MessageWindowChatMemory {
    /// A window of `max_messages` (at least [`MIN_MESSAGES`]) in an [`InMemoryChatMemoryStore`]; `None` if the window
    /// is too small.
    pub fn new(max_messages: usize) -> Option<Self> {
        Self::with_store(max_messages, Arc::new(InMemoryChatMemoryStore::new()))
    }

    /// A window of `max_messages` (at least [`MIN_MESSAGES`]) in `store`; `None` if the window is too small.
    pub fn with_store(max_messages: usize, store: Arc<dyn ChatMemoryStore>) -> Option<Self> {
        (max_messages >= MIN_MESSAGES).then_some(Self {
            max_messages,
            store,
        })
    }

    /// The window size.
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// The messages of conversation `memory_id`, oldest first.
    pub fn messages(&self, memory_id: &str) -> Result<Vec<ChatMessage>, MemoryError> {
        self.store.get_messages(memory_id)
    }

    /// Adds `message` to conversation `memory_id` and evicts what no longer fits.
    pub fn add(&self, memory_id: &str, message: ChatMessage) -> Result<(), MemoryError> {
        let mut messages = self.store.get_messages(memory_id)?;
        push(&mut messages, message);
        evict(&mut messages, self.max_messages);
        self.store.update_messages(memory_id, messages)
    }

    /// Forgets conversation `memory_id`.
    pub fn clear(&self, memory_id: &str) -> Result<(), MemoryError> {
        self.store.delete_messages(memory_id)
    }
}

impl fmt::Debug for MessageWindowChatMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageWindowChatMemory")
            .field("max_messages", &self.max_messages)
            .finish_non_exhaustive()
    }
}

/// Appends `message`; a system message replaces the stored one at the front (or is skipped if it is the same).
fn push(messages: &mut Vec<ChatMessage>, message: ChatMessage) {
    if let ChatMessage::System(_) = &message {
        if let Some(index) = messages
            .iter()
            .position(|m| matches!(m, ChatMessage::System(_)))
        {
            if messages[index] == message {
                return;
            }
            messages.remove(index);
        }
        messages.insert(0, message);
        return;
    }
    messages.push(message);
}

/// Evicts the oldest non-system messages until at most `max_messages` remain, never leaving a tool result whose
/// call was evicted.
pub fn evict(messages: &mut Vec<ChatMessage>, max_messages: usize) {
    let first_other = |messages: &[ChatMessage]| {
        messages
            .iter()
            .position(|m| !matches!(m, ChatMessage::System(_)))
    };
    while messages.len() > max_messages {
        let Some(index) = first_other(messages) else {
            break;
        };
        messages.remove(index);
        // The results of the evicted calls, or results already orphaned, now lead the conversation.
        while index < messages.len() && matches!(messages[index], ChatMessage::ToolResult(_)) {
            messages.remove(index);
        }
    }
}
