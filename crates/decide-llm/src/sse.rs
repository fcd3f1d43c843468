//! Server-sent events and newline-delimited JSON, decoded from body pieces that may split lines anywhere.

/// Decodes the `data` of server-sent events: lines are split across pieces as the network delivers them, an event
/// ends at a blank line, several `data:` lines of one event are joined with newlines, and comments (`:`) and other
/// fields (`event:`, `id:`, `retry:`) are ignored.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    lines: LineSplitter,
    data: Option<String>,
}

impl SseDecoder {
    /// Adds a piece of the body; returns the data of every event it completed.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for line in self.lines.push(bytes) {
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
                continue;
            }
            let Some(value) = line.strip_prefix("data:") else {
                continue;
            };
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        events
    }
}

/// Splits a byte stream into lines (without `\n` or `\r\n`), keeping a partial last line for the next piece.
/// Bytes are kept until a line is complete so that a UTF-8 character split across pieces is not damaged.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Adds a piece; returns the lines it completed.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut lines = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            lines.push(String::from_utf8_lossy(&line).into_owned());
        }
        lines
    }

    /// The partial last line, if the body ended without a newline.
    pub(crate) fn rest(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_are_put_back_together() {
        let body = "data: {\"a\": \"é\"}\r\n\r\n: keep-alive\n\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        let bytes = body.as_bytes();
        // Every split point, including inside the two-byte 'é'.
        for split in 0..bytes.len() {
            let mut decoder = SseDecoder::default();
            let mut events = decoder.push(&bytes[..split]);
            events.extend(decoder.push(&bytes[split..]));
            assert_eq!(
                events,
                ["{\"a\": \"é\"}", "one\ntwo", "[DONE]"],
                "split at {split}"
            );
        }
    }

    #[test]
    fn lines_keep_a_partial_rest() {
        let mut lines = LineSplitter::default();
        assert_eq!(lines.push(b"{\"a\":1}\n{\"b\""), ["{\"a\":1}"]);
        assert_eq!(lines.push(b":2}"), Vec::<String>::new());
        assert_eq!(lines.rest().as_deref(), Some("{\"b\":2}"));
        assert_eq!(lines.rest(), None);
    }
}
