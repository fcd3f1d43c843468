//! A stdio server's process and what it writes, read under the transport's limit on one message
//! with an answer to the request whose answer was over it.
//!
//! rmcp drops a line longer than [`MAX_MESSAGE_BYTES`] (so that a server that never writes a
//! newline cannot grow the reader's buffer without bound) and says nothing to the request that
//! line answered, which then waits for its timeout. Between the server and rmcp, this relay
//! passes every byte through unchanged and follows the top level of each line as it goes: when
//! a line is over the limit and is an answer (an `id`, no `method`), a JSON-RPC error for that
//! `id` follows it, which rmcp hands to the waiting request. The server stays up.

use std::process::Stdio;

use rmcp::model::ErrorData;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

/// The most bytes one message may take, over stdio (a line, its newline included) and over
/// HTTP (a request body): rmcp's own limit on a line, which matches its HTTP client's on one
/// event, so that what one transport carries the other does too.
pub const MAX_MESSAGE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// The key of the error's `data` that marks an answer over [`MAX_MESSAGE_BYTES`]:
/// `{"bytes": N, "limitBytes": MAX_MESSAGE_BYTES}`.
const TOO_LARGE: &str = "messageTooLarge";

/// How much the relay reads from the server at once.
const CHUNK: usize = 64 * 1024;

/// The server's process and the relay from its output; dropping it kills the process (a process
/// group of its own is the caller's to kill) and stops the relay.
pub(crate) struct Child {
    process: Box<dyn process_wrap::tokio::ChildWrapper>,
    relay: JoinHandle<()>,
}

impl Child {
    /// The process id, while it runs.
    pub(crate) fn id(&self) -> Option<u32> {
        self.process.id()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.relay.abort();
        // A server that ignores its closed input must not outlive the session; tokio reaps it.
        let _ = self.process.start_kill();
    }
}

/// Starts `process` with piped input and output (its errors go to ours) and returns it with the
/// transport rmcp reads and writes: the relayed output and the process's input.
pub(crate) fn spawn(
    process: process_wrap::tokio::CommandWrap,
) -> std::io::Result<(Child, (DuplexStream, ChildStdin))> {
    let mut process = process;
    process
        .command_mut()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = process.spawn()?;
    let input = child
        .stdin()
        .take()
        .ok_or_else(|| std::io::Error::other("the server's input is not a pipe"))?;
    let output = child
        .stdout()
        .take()
        .ok_or_else(|| std::io::Error::other("the server's output is not a pipe"))?;
    let (read, write) = tokio::io::duplex(CHUNK);
    let relay = tokio::spawn(relay(output, write, MAX_MESSAGE_BYTES));
    Ok((
        Child {
            process: child,
            relay,
        },
        (read, input),
    ))
}

/// Copies `from` to `to` until either closes, and after each line over `limit` (its newline
/// included, as rmcp counts) that answers a request, a line with the error for that request.
async fn relay(mut from: ChildStdout, mut to: DuplexStream, limit: usize) {
    let mut buffer = vec![0; CHUNK];
    let mut line = Line::default();
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut chunk = &buffer[..read];
        while !chunk.is_empty() {
            let end = chunk.iter().position(|b| *b == b'\n').map(|i| i + 1);
            let piece = &chunk[..end.unwrap_or(chunk.len())];
            line.feed(piece);
            if to.write_all(piece).await.is_err() {
                return;
            }
            chunk = &chunk[piece.len()..];
            if end.is_none() {
                continue;
            }
            let ended = std::mem::take(&mut line);
            if ended.bytes <= limit {
                continue;
            }
            match ended.answer_id() {
                Some(id) => {
                    let mut error = too_large(id, ended.bytes, limit).to_string();
                    error.push('\n');
                    if to.write_all(error.as_bytes()).await.is_err() {
                        return;
                    }
                }
                None => tracing::warn!(
                    bytes = ended.bytes,
                    limit,
                    "an MCP server sent a message over the limit that answers no request; dropped"
                ),
            }
        }
    }
}

/// The JSON-RPC error answering request `id` in place of an answer of `bytes` bytes.
fn too_large(id: Value, bytes: usize, limit: usize) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": rmcp::model::ErrorCode::INTERNAL_ERROR.0,
            "message": format!(
                "the answer is {bytes} bytes, over the limit of {} MiB on one message",
                limit >> 20
            ),
            "data": {TOO_LARGE: {"bytes": bytes, "limitBytes": limit}},
        },
    })
}

/// When `error` stands for an answer over the limit: its size and the limit, in bytes.
pub(crate) fn too_large_answer(error: &ErrorData) -> Option<(usize, usize)> {
    let data = error.data.as_ref()?.get(TOO_LARGE)?;
    let bytes = data.get("bytes")?.as_u64()?;
    let limit = data.get("limitBytes")?.as_u64()?;
    Some((usize::try_from(bytes).ok()?, usize::try_from(limit).ok()?))
}

/// The longest `id` kept: ids are short numbers or strings, anything longer is not kept whole.
const MAX_ID_BYTES: usize = 256;

/// What the relay learns of one line of JSON text as it passes, byte by byte and keeping only
/// a few bytes: its length, and of its top-level object the raw `id` and whether it has a
/// `method` (a request or a notification rather than an answer).
#[derive(Default)]
struct Line {
    bytes: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1: the next string is a key.
    expect_key: bool,
    /// Reading a top-level key.
    in_key: bool,
    key: Vec<u8>,
    /// The top-level key whose value comes next.
    last_key: Vec<u8>,
    /// Reading the top-level `id`'s value.
    in_id: bool,
    id: Option<Vec<u8>>,
    has_method: bool,
}

impl Line {
    fn feed(&mut self, piece: &[u8]) {
        self.bytes += piece.len();
        for &b in piece {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_id && !(self.depth == 1 && !self.in_string && matches!(b, b',' | b'}')) {
            if let Some(id) = self.id.as_mut().filter(|id| id.len() <= MAX_ID_BYTES) {
                if self.in_string || !b.is_ascii_whitespace() {
                    id.push(b);
                }
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    self.last_key = std::mem::take(&mut self.key);
                    return;
                }
            }
            if self.in_key && self.key.len() <= 16 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.in_key = true;
                    self.expect_key = false;
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                }
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.in_id = false;
                }
            }
            b':' if self.depth == 1 => match self.last_key.as_slice() {
                b"id" => {
                    self.in_id = true;
                    self.id = Some(Vec::new());
                }
                b"method" => self.has_method = true,
                _ => {}
            },
            b',' if self.depth == 1 => {
                self.in_id = false;
                self.expect_key = true;
            }
            _ => {}
        }
    }

    /// The `id` of an answer (a top-level object with an `id` that is a string or an integer,
    /// and no `method`).
    fn answer_id(&self) -> Option<Value> {
        if self.has_method {
            return None;
        }
        let id: Value = serde_json::from_slice(self.id.as_deref()?).ok()?;
        (id.is_string() || id.is_i64() || id.is_u64()).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Line {
        let mut line = Line::default();
        // In pieces, as reads cut it.
        for piece in text.as_bytes().chunks(3) {
            line.feed(piece);
        }
        line
    }

    #[test]
    fn the_id_of_an_answer_is_found_wherever_the_server_puts_it() {
        let big = "x".repeat(1000);
        for (text, id) in [
            (
                format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"text":"{big}"}}}}"#),
                json!(7),
            ),
            // The TypeScript SDK writes the result first.
            (
                format!(
                    r#"{{"result": {{"id": 1, "t": "{big}\"}}"}}, "jsonrpc": "2.0", "id": "a\"b" }}"#
                ),
                json!("a\"b"),
            ),
        ] {
            assert_eq!(scan(&text).answer_id(), Some(id), "{text}");
        }
        for text in [
            r#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"id":4}}"#,
            r#"{"jsonrpc":"2.0","id":{"x":1},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
            r#"[{"id":1}]"#,
            "not json at all",
        ] {
            assert_eq!(scan(text).answer_id(), None, "{text}");
        }
    }

    #[test]
    fn the_error_in_place_of_an_answer_says_how_large_it_was() {
        let line = too_large(json!(9), 17_000_000, MAX_MESSAGE_BYTES);
        let error: ErrorData = serde_json::from_value(line["error"].clone()).unwrap();
        assert_eq!(
            error.message,
            "the answer is 17000000 bytes, over the limit of 16 MiB on one message"
        );
        assert_eq!(
            too_large_answer(&error),
            Some((17_000_000, MAX_MESSAGE_BYTES))
        );
    }
}
