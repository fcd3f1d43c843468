//! Scoring in three steps: stage (tokenize, look up cached embeddings), forward (the rows
//! through the model) and finish (rows' outputs back into scores).
//!
//! [`Engine::score`] and the [`DecisionModel`](decide_contract::DecisionModel) impl run the
//! three steps back to back. A server that batches across requests runs the middle step
//! itself, for the rows of many requests at once: it takes each request's rows
//! ([`StagedDecision::take_rows`]), runs them together under the token budget
//! ([`Engine::forward_rows`]), and hands every request its own outputs back
//! ([`StagedDecision::finish`]). Because the engine's own path is the same three steps, a
//! batched answer equals the one-request answer up to float summation order.

use std::collections::HashMap;
use std::sync::Arc;

use decide_contract::DecisionInput;

use super::cache::cosine;
use super::{Engine, Scores};
use crate::backend::TokenRow;
use crate::error::{EngineError, Result};
use crate::registry::HeadName;

/// One tokenized row (a text, or a query-candidate pair), ready for the model.
// No `Debug`: token ids decode back to the user's text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EncodedRow(TokenRow);

impl std::borrow::Borrow<TokenRow> for EncodedRow {
    fn borrow(&self) -> &TokenRow {
        &self.0
    }
}

impl EncodedRow {
    /// Its length in tokens, special tokens included: what it costs in a batch.
    pub fn len(&self) -> usize {
        self.0.ids.len()
    }

    /// Whether it has no token (never the case for a staged row).
    pub fn is_empty(&self) -> bool {
        self.0.ids.is_empty()
    }
}

/// How a staged scoring turns its rows' outputs into scores.
enum Finish {
    /// No candidates: nothing to run.
    Empty,
    /// One cross-encoder pair per candidate.
    Cross,
    /// Bi-encoder: `views` query rows first, then one row per candidate missing from the cache.
    Bi {
        views: usize,
        /// Which view is the last user message alone, when it is one of its own.
        last_view: Option<usize>,
        candidates: Vec<String>,
        cached: Vec<Option<Arc<[f32]>>>,
        missing: Vec<String>,
    },
}

/// One text to embed, tokenized as [`Engine::embed`] reads it; see [`Engine::stage_embeddings`].
pub struct EmbeddingRow {
    /// The row for the model; its output is the text's embedding.
    pub row: EncodedRow,
    /// Whether the text was longer than the model reads and lost its end.
    pub truncated: bool,
}

/// The candidates of one query, tokenized and waiting for the model; see
/// [`Engine::stage_scores`].
pub struct StagedScores {
    rows: Vec<EncodedRow>,
    expected: usize,
    tokens: usize,
    finish: Finish,
}

impl StagedScores {
    /// The rows still held (all of them until [`take_rows`](Self::take_rows)).
    pub fn rows(&self) -> &[EncodedRow] {
        &self.rows
    }

    /// Takes the rows out, to run them elsewhere; the outputs go back to
    /// [`Engine::finish_scores`] in the same order.
    pub fn take_rows(&mut self) -> Vec<EncodedRow> {
        std::mem::take(&mut self.rows)
    }
}

impl Engine {
    /// Stages the scoring of `candidates` against a decision input: what [`DecisionModel`]
    /// answers use.
    ///
    /// A bi-encoder embeds several views of a conversation, the whole (trimmed from its oldest
    /// end), the last user message alone and, when that message asks for several things, each
    /// of its [clauses](clauses), and takes the best cosine of them: one vector for a long
    /// history dilutes the request ("email it to Anna") with the earlier turns, the last message
    /// alone misses what a follow-up ("do the same for Berlin") refers to, and one vector for
    /// two requests ("do the same for Berlin and email it to Anna") sits between their tools.
    ///
    /// [`DecisionModel`]: decide_contract::DecisionModel
    pub(crate) fn stage_input(
        &self,
        input: &DecisionInput,
        candidates: &[&str],
    ) -> Result<StagedScores> {
        let full = input.render();
        match (self.inner.info.head, input.last_user_text()) {
            (HeadName::BiEncoder, Some(last)) if !candidates.is_empty() => {
                let mut views: Vec<&str> = vec![&full];
                let last_view = last_message_view(&full, input).map(|alone| {
                    views.push(alone);
                    1
                });
                let parts = clauses(last);
                if parts.len() > 1 {
                    views.extend(parts);
                }
                if views.len() > 1 {
                    self.stage_bi(&views, last_view, candidates)
                } else {
                    self.stage_query(&full, candidates)
                }
            }
            _ => self.stage_query(&full, candidates),
        }
    }

    /// Stages the embedding of a decision input's whole conversation alone, as the first view of
    /// [`stage_input`](Self::stage_input) embeds it: what the needs-tool head reads when a
    /// request asks about no candidate. Bi-encoders only.
    pub(crate) fn stage_conversation(&self, input: &DecisionInput) -> Result<StagedScores> {
        if self.inner.info.head != HeadName::BiEncoder {
            return Err(self.wrong_head("a conversation's embedding needs a bi-encoder"));
        }
        let full = input.render();
        match last_message_view(&full, input) {
            Some(last) => self.stage_bi(&[&full, last], Some(1), &[]),
            None => self.stage_bi(&[&full], None, &[]),
        }
    }

    /// Stages the texts of [`embed`](Self::embed) without running the model: one row per text,
    /// whose output ([`forward_rows`](Self::forward_rows)) is its embedding. Bi-encoders only.
    pub fn stage_embeddings(&self, texts: &[&str]) -> Result<Vec<EmbeddingRow>> {
        if self.inner.info.head != HeadName::BiEncoder {
            return Err(self.wrong_head("embeddings need a bi-encoder"));
        }
        texts
            .iter()
            .map(|t| {
                let (row, truncated) = self.inner.tokens.encode_document_checked(t)?;
                Ok(EmbeddingRow {
                    row: EncodedRow(row),
                    truncated,
                })
            })
            .collect()
    }

    /// Stages [`score`](Self::score) without running the model: run the rows
    /// ([`StagedScores::take_rows`]) through [`forward_rows`](Self::forward_rows), alone or
    /// with other requests' rows, then [`finish_scores`](Self::finish_scores).
    pub fn stage_scores(&self, query: &str, candidates: &[&str]) -> Result<StagedScores> {
        self.stage_query(query, candidates)
    }

    /// Stages the scoring of `candidates` against one query, as [`score`](Self::score) does.
    pub(crate) fn stage_query(&self, query: &str, candidates: &[&str]) -> Result<StagedScores> {
        if candidates.is_empty() {
            return Ok(StagedScores {
                rows: Vec::new(),
                expected: 0,
                tokens: 0,
                finish: Finish::Empty,
            });
        }
        match self.inner.info.head {
            HeadName::BiEncoder => self.stage_bi(&[query], None, candidates),
            HeadName::CrossEncoder => {
                let tokens = &self.inner.tokens;
                let q = tokens.encode_end(query)?;
                let rows = candidates
                    .iter()
                    .map(|c| {
                        tokens
                            .pair_row(q.clone(), tokens.encode_start(c)?)
                            .map(EncodedRow)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(StagedScores {
                    expected: rows.len(),
                    tokens: rows.iter().map(EncodedRow::len).sum(),
                    rows,
                    finish: Finish::Cross,
                })
            }
        }
    }

    fn stage_bi(
        &self,
        views: &[&str],
        last_view: Option<usize>,
        candidates: &[&str],
    ) -> Result<StagedScores> {
        let tokens = &self.inner.tokens;
        // Only the part of a text the model reads is kept, copied and cached.
        let candidates: Vec<&str> = candidates.iter().map(|c| tokens.document_part(c)).collect();
        let candidates = candidates.as_slice();
        let mut rows = views
            .iter()
            .map(|v| tokens.encode_query(v).map(EncodedRow))
            .collect::<Result<Vec<_>>>()?;
        let cached: Vec<Option<Arc<[f32]>>> = {
            let cache = self.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
            candidates.iter().map(|c| cache.get(c)).collect()
        };
        // Candidates not in the cache go through the model with the query; a text repeated
        // within the request is embedded once.
        let mut missing: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (c, v) in candidates.iter().zip(&cached) {
            if v.is_none() && seen.insert(*c) {
                missing.push((*c).to_string());
            }
        }
        for c in &missing {
            rows.push(EncodedRow(tokens.encode_document(c)?));
        }
        Ok(StagedScores {
            expected: rows.len(),
            tokens: rows.iter().map(EncodedRow::len).sum(),
            rows,
            finish: Finish::Bi {
                views: views.len(),
                last_view,
                candidates: candidates.iter().map(|c| (*c).to_string()).collect(),
                cached,
                missing,
            },
        })
    }

    /// Runs rows through the model in token-budgeted, length-sorted batches and returns one
    /// output vector per row, in the rows' order. Rows of different requests may share a call.
    pub fn forward_rows(&self, rows: &[EncodedRow]) -> Result<Vec<Vec<f32>>> {
        self.run(rows)
    }

    /// Turns the outputs of a staged scoring's rows (in the order they were staged) into
    /// scores, and caches a bi-encoder's fresh candidate embeddings.
    pub fn finish_scores(&self, staged: StagedScores, outputs: Vec<Vec<f32>>) -> Result<Scores> {
        if outputs.len() != staged.expected {
            return Err(EngineError::Tokenizer(format!(
                "{} outputs for {} staged rows",
                outputs.len(),
                staged.expected
            )));
        }
        // Tokens that went through the model: every staged row (cached embeddings cost none).
        let tokens = staged.tokens;
        match staged.finish {
            Finish::Empty => Ok(Scores {
                raw: Vec::new(),
                tokens: 0,
                query: None,
                last_message: None,
            }),
            Finish::Cross => Ok(Scores {
                raw: outputs.iter().map(|l| self.logit_score(l)).collect(),
                tokens,
                query: None,
                last_message: None,
            }),
            Finish::Bi {
                views,
                last_view,
                candidates,
                mut cached,
                missing,
            } => {
                let mut out = outputs.into_iter();
                let queries: Vec<Vec<f32>> = out.by_ref().take(views).collect();
                let fresh: HashMap<&str, Arc<[f32]>> = missing
                    .iter()
                    .zip(out)
                    .map(|(c, v)| (c.as_str(), Arc::from(v)))
                    .collect();
                {
                    let mut cache = self.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
                    for (c, v) in &fresh {
                        cache.insert((*c).to_string(), v.clone());
                    }
                }
                for (c, v) in candidates.iter().zip(cached.iter_mut()) {
                    if v.is_none() {
                        *v = fresh.get(c.as_str()).cloned();
                    }
                }
                let raw = cached
                    .iter()
                    .map(|v| {
                        let v = v.as_deref().unwrap_or(&[]);
                        queries
                            .iter()
                            .map(|q| cosine(q, v))
                            .fold(f64::NEG_INFINITY, f64::max)
                    })
                    .collect();
                let mut queries = queries;
                let last_message = last_view.and_then(|i| queries.get_mut(i).map(std::mem::take));
                let query = queries.into_iter().next();
                Ok(Scores {
                    raw,
                    tokens,
                    query,
                    last_message,
                })
            }
        }
    }

    /// Stage, forward and finish in one go: the one-request path.
    pub(crate) fn complete(&self, mut staged: StagedScores) -> Result<Scores> {
        let rows = staged.take_rows();
        let outputs = self.forward_rows(&rows)?;
        self.finish_scores(staged, outputs)
    }
}

/// The last user message of `input` as a view of its own, when it is not the whole of `full`
/// (the input rendered): the one rule by which a decision and the needs-tool head's fitting embed
/// it apart.
fn last_message_view<'a>(full: &str, input: &'a DecisionInput) -> Option<&'a str> {
    input
        .last_user_text()
        .filter(|last| last.trim() != full.trim())
}

/// The clauses of a request: its sentences, and within them the parts joined by "and" or "then",
/// each of at least three words (shorter parts, "and Paris", are objects of another clause, not
/// requests). Splitting is on words and punctuation alone, so it knows no language but English.
pub(crate) fn clauses(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for sentence in sentences(text) {
        let mut rest = sentence;
        loop {
            let cut = [" and then ", " and ", " then ", ", then "]
                .iter()
                .filter_map(|sep| rest.find(sep).map(|at| (at, sep.len())))
                // The longest separator at the first place: " and then " over " and ".
                .min_by_key(|&(at, len)| (at, std::cmp::Reverse(len)));
            let (part, next) = match cut {
                Some((at, len)) => (&rest[..at], Some(&rest[at + len..])),
                None => (rest, None),
            };
            if part.split_whitespace().count() >= 3 {
                out.push(part.trim());
            }
            match next {
                Some(n) => rest = n,
                None => break,
            }
        }
    }
    out
}

/// The sentences of a text: cut at a line break, and at `.`, `?`, `!` or `;` followed by a space
/// or the end, so that a file name (`package.json`), a version (`3.2.0`) or a URL stays whole.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let ends = match c {
            '\n' => true,
            '.' | '?' | '!' | ';' => chars.peek().is_none_or(|(_, next)| next.is_whitespace()),
            _ => false,
        };
        if ends {
            out.push(&text[start..at]);
            start = at + c.len_utf8();
        }
    }
    out.push(&text[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::clauses;

    #[test]
    fn a_request_splits_into_its_clauses() {
        assert_eq!(
            clauses("Do the same for Berlin and email it to Anna"),
            ["Do the same for Berlin", "email it to Anna"]
        );
        assert_eq!(
            clauses("Check the forecast. Then post it in #general; thanks!"),
            ["Check the forecast", "Then post it in #general"]
        );
        assert_eq!(
            clauses("read the log and then open an issue for the crash"),
            ["read the log", "open an issue for the crash"]
        );
    }

    #[test]
    fn short_parts_and_single_requests_stay_whole() {
        // "and Paris" names a second object, not a second request.
        assert_eq!(
            clauses("What is the weather in Rome and Paris?"),
            ["What is the weather in Rome"]
        );
        assert_eq!(clauses("Is it going to snow?"), ["Is it going to snow"]);
        // A file name, a version and a URL are not sentence ends; "Read package.json" has two
        // words, so it is taken for an object, not a request.
        assert_eq!(
            clauses("Read package.json and tsconfig.json in /srv/web and tell me the target"),
            ["tsconfig.json in /srv/web", "tell me the target"]
        );
        assert_eq!(
            clauses("Post 'v3.2.0 is out' and then open https://example.com/notes.html now"),
            [
                "Post 'v3.2.0 is out'",
                "open https://example.com/notes.html now"
            ]
        );
        assert!(clauses("hi").is_empty());
        assert!(clauses("").is_empty());
    }
}
