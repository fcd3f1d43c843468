//! Text to token ids, trimmed to the model's length the way the engine reads it.
//!
//! A model is only ever asked what it was trained on when training and inference tokenize and
//! trim alike, so both go through [`Tokenization`]:
//!
//! * a **query** (a conversation, oldest message first) keeps its end, the latest turns;
//! * a **document** (a tool's or route's text) keeps its start, its name and first words;
//! * a **(query, document) pair**, as a cross-encoder reads it, loses the query's oldest tokens
//!   first; the document is cut only when it alone would crowd the query out of a quarter of
//!   the budget ([`trim_pair`]).
//!
//! Texts are tokenized without special tokens first ([`Tokenization::encode_start`] and
//! [`Tokenization::encode_end`]), so that a query shared by many pairs is tokenized once; the
//! special tokens are added after trimming, within the model's length.
//!
//! Only what can be kept is tokenized: a text is first cut to [`BYTES_PER_TOKEN`] bytes per token
//! of the model's length, at the end it keeps (a 2 MB tool description costs what 16 KB do).

use std::path::{Path, PathBuf};

use crate::backend::TokenRow;

use tokenizers::{Encoding, PostProcessor, Tokenizer, TruncationDirection};

use crate::error::{require, EngineError, Result};

/// How many bytes of a text are tokenized per token of the model's length. Tokens of English
/// and code average 3 to 6 bytes, so the cut is far from what trimming keeps; it only bounds
/// the work and memory a huge text costs.
pub const BYTES_PER_TOKEN: usize = 64;

/// The start of `text`, at most `max_bytes` of it, cut at a character boundary.
fn cut_start(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The end of `text`, at most `max_bytes` of it, cut at a character boundary.
fn cut_end(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut start = text.len() - max_bytes;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A model's tokenizer with the model's length: turns queries, documents and pairs into
/// [`TokenRow`]s that fit it.
///
/// ```no_run
/// # fn main() -> decide_engine::Result<()> {
/// use decide_engine::Tokenization;
/// let tokens = Tokenization::from_dir("models/all-MiniLM-L6-v2".as_ref(), 256)?;
/// let query = tokens.encode_query("user: what is the weather in Lisbon?")?;
/// let pair = tokens.encode_pair("user: what is the weather in Lisbon?", "get_weather")?;
/// assert!(query.len() <= 256 && pair.len() <= 256);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Tokenization {
    tokenizer: Tokenizer,
    max_length: usize,
    /// Special tokens the post-processor adds to one text and to a pair.
    specials: (usize, usize),
}

impl std::fmt::Debug for Tokenization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenization")
            .field("max_length", &self.max_length)
            .finish_non_exhaustive()
    }
}

impl Tokenization {
    /// Loads `tokenizer.json` from a model folder; rows will hold at most `max_length` tokens,
    /// special tokens included.
    pub fn from_dir(dir: &Path, max_length: usize) -> Result<Self> {
        Self::from_file(&require(dir, "tokenizer.json")?, max_length)
    }

    /// Loads a `tokenizer.json` file; rows will hold at most `max_length` tokens, special tokens
    /// included.
    pub fn from_file(path: &Path, max_length: usize) -> Result<Self> {
        let fail = |e: tokenizers::Error| EngineError::unreadable(PathBuf::from(path), e);
        let mut tokenizer = Tokenizer::from_file(path).map_err(fail)?;
        // Tokenizer files often carry a fixed truncation and padding for another runtime; rows
        // are trimmed here and padded by the model, per batch.
        tokenizer.with_truncation(None).map_err(fail)?;
        tokenizer.with_padding(None);
        let specials = tokenizer
            .get_post_processor()
            .map(|p| (p.added_tokens(false), p.added_tokens(true)))
            .unwrap_or((0, 0));
        Ok(Self {
            tokenizer,
            max_length,
            specials,
        })
    }

    /// The same tokenizer with another length.
    pub fn with_max_length(mut self, max_length: usize) -> Self {
        self.max_length = max_length;
        self
    }

    /// The most tokens a row holds, special tokens included.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The underlying Hugging Face tokenizer (truncation and padding off).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A text's tokens without special tokens and untrimmed: the first step of every row, to
    /// be kept when one text goes into many rows.
    pub fn encode(&self, text: &str) -> Result<Encoding> {
        self.tokenizer
            .encode_fast(text, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The bytes of a text worth tokenizing: [`BYTES_PER_TOKEN`] per token of the length.
    fn text_budget(&self) -> usize {
        self.max_length.max(1).saturating_mul(BYTES_PER_TOKEN)
    }

    /// The part of `text` that a row keeping its start can use: what
    /// [`encode_start`](Self::encode_start) tokenizes, so two texts with the same part get the
    /// same row (an embedding cache keys on it, never on a huge text).
    pub fn document_part<'a>(&self, text: &'a str) -> &'a str {
        cut_start(text, self.text_budget())
    }

    /// [`encode`](Self::encode) of the part of `text` a row that keeps its start can use: a
    /// document's or a candidate's.
    pub fn encode_start(&self, text: &str) -> Result<Encoding> {
        self.encode(self.document_part(text))
    }

    /// [`encode`](Self::encode) of the part of `text` a row that keeps its end can use: a
    /// query's (the latest turns).
    pub fn encode_end(&self, text: &str) -> Result<Encoding> {
        self.encode(cut_end(text, self.text_budget()))
    }

    /// A text's token count without special tokens.
    pub fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.encode(text)?.len())
    }

    /// A query alone (as a bi-encoder embeds it): keeps its end, the latest turns.
    pub fn encode_query(&self, text: &str) -> Result<TokenRow> {
        self.query_row(self.encode_end(text)?)
    }

    /// A document alone (as a bi-encoder embeds it): keeps its start.
    pub fn encode_document(&self, text: &str) -> Result<TokenRow> {
        self.document_row(self.encode_start(text)?)
    }

    /// A document alone, as [`encode_document`](Self::encode_document) reads it, and whether
    /// trimming cut it (the text had more tokens than the row holds).
    pub fn encode_document_checked(&self, text: &str) -> Result<(TokenRow, bool)> {
        let enc = self.encode(text)?;
        let cut = enc.len() > self.max_length.saturating_sub(self.specials.0);
        Ok((self.document_row(enc)?, cut))
    }

    /// A (query, document) pair as a cross-encoder reads it, trimmed by [`trim_pair`].
    pub fn encode_pair(&self, query: &str, document: &str) -> Result<TokenRow> {
        self.pair_row(self.encode_end(query)?, self.encode_start(document)?)
    }

    /// [`encode_query`](Self::encode_query) of an [`encode_end`](Self::encode_end)d text.
    pub fn query_row(&self, query: Encoding) -> Result<TokenRow> {
        self.single_row(query, true)
    }

    /// [`encode_document`](Self::encode_document) of an [`encode_start`](Self::encode_start)d
    /// text.
    pub fn document_row(&self, document: Encoding) -> Result<TokenRow> {
        self.single_row(document, false)
    }

    /// [`encode_pair`](Self::encode_pair) of a query [`encode_end`](Self::encode_end)d and a
    /// document [`encode_start`](Self::encode_start)ed.
    pub fn pair_row(&self, mut query: Encoding, mut document: Encoding) -> Result<TokenRow> {
        let budget = self.max_length.saturating_sub(self.specials.1);
        trim_pair(&mut query, &mut document, budget);
        self.finish(query, Some(document))
    }

    /// Token ids back to text, special tokens dropped (for inspecting trimming).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    fn single_row(&self, mut text: Encoding, keep_end: bool) -> Result<TokenRow> {
        let budget = self.max_length.saturating_sub(self.specials.0);
        trim_single(&mut text, budget, keep_end);
        self.finish(text, None)
    }

    /// Adds the special tokens.
    fn finish(&self, first: Encoding, second: Option<Encoding>) -> Result<TokenRow> {
        let enc = self
            .tokenizer
            .post_process(first, second, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(TokenRow {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
        })
    }
}

/// Trims one text's tokens (special tokens not yet added) to `budget`: a query keeps its end
/// (the latest turns), a tool its start. The engine and `decide-train` both trim through this,
/// so a trained model sees what it will be asked.
pub fn trim_single(enc: &mut Encoding, budget: usize, keep_end: bool) {
    if enc.len() > budget {
        let direction = if keep_end {
            TruncationDirection::Left
        } else {
            TruncationDirection::Right
        };
        enc.truncate(budget, 0, direction);
        enc.take_overflowing();
    }
}

/// Trims a (query, candidate) pair (special tokens not yet added) to `budget` tokens as a
/// cross-encoder reads it: the query loses its oldest tokens first; the candidate is cut only
/// when it alone would crowd the query out of its reserved quarter of the budget.
pub fn trim_pair(query: &mut Encoding, candidate: &mut Encoding, budget: usize) {
    if query.len() + candidate.len() <= budget {
        return;
    }
    let reserve = query.len().min(budget / 4);
    let cand_keep = candidate.len().min(budget - reserve);
    let query_keep = query.len().min(budget - cand_keep);
    if candidate.len() > cand_keep {
        candidate.truncate(cand_keep, 0, TruncationDirection::Right);
        candidate.take_overflowing();
    }
    query.truncate(query_keep, 0, TruncationDirection::Left);
    query.take_overflowing();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_keep_whole_characters_at_the_kept_end() {
        let text = "aé€😀".repeat(10);
        for budget in 0..text.len() + 2 {
            let start = cut_start(&text, budget);
            let end = cut_end(&text, budget);
            assert!(start.len() <= budget && text.starts_with(start));
            assert!(end.len() <= budget && text.ends_with(end));
            assert!(budget < 4 || !start.is_empty());
        }
        assert_eq!(cut_start("short", 100), "short");
        assert_eq!(cut_end("short", 100), "short");
    }
}
