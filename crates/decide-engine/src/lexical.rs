//! Lexical scoring: Okapi BM25 over the candidates of one request, with no weights to load.
//!
//! An embedder knows that "forecast" is near "weather", but it blurs rare, exact words: a file
//! path, `kubectl`, a product name, a tool whose name the user types. BM25 rewards exactly those
//! (rare terms weigh most), so it serves twice:
//!
//! * alone, as [`Bm25Model`]: a [`DecisionModel`] that needs no
//!   model files at all, the baseline every learned model must beat;
//! * fused with the embedder ("hybrid scoring"): the engine adds `lexical_weight · coverage` to
//!   each cosine before calibration (see [`Engine`](crate::Engine)).
//!
//! **The corpus is the request.** Term statistics (document frequencies, average length) come
//! from the candidates of the request being answered: a tool catalogue is exactly the collection
//! whose rare words matter. A request with one candidate still gets a score (every matched word
//! then counts the same).
//!
//! **Coverage, not raw BM25.** Raw BM25 grows with the length of the query, so no threshold or
//! calibration could hold across short and long conversations. [`Bm25Index::coverage`] divides
//! by the most the query could score (each of its words matched with a saturated term
//! frequency), which bounds it to `[0, 1]`: the share of the query's weight that a candidate
//! matches.
//!
//! **Words.** Text is split into lowercase ASCII-alphanumeric words, after breaking
//! `snake_case`, `kebab-case` and `camelCase` apart (`getCurrentWeather` and
//! `get_current_weather` both become `get current weather`), and common English function words
//! are dropped. Other scripts keep their letters as words of their own, split on anything that
//! is not alphanumeric.

use std::collections::HashMap;

use decide_contract::{DecisionError, DecisionModel, DecisionRequest, DecisionResponse};

use crate::answering::{plan, respond, yes_no_raw, Scored, Scorer, ScorerInfo};
use crate::calibration::Calibration;

/// BM25's term-frequency saturation.
pub const K1: f64 = 1.2;
/// BM25's length normalization.
pub const B: f64 = 0.75;

/// Words too common to say anything about which tool is meant.
const STOPWORDS: &[&str] = &[
    "a", "about", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from",
    "how", "i", "in", "is", "it", "me", "my", "of", "on", "or", "please", "that", "the", "this",
    "to", "what", "with", "you", "your",
];

/// The words of `text`, lowercased, identifiers split, stopwords dropped.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev: Option<char> = None;
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if !word.is_empty() {
            let w = std::mem::take(word);
            if !STOPWORDS.contains(&w.as_str()) {
                out.push(w);
            }
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            // A lower-to-upper step starts a new word: getWeather → get weather.
            if c.is_uppercase() && prev.is_some_and(|p| p.is_lowercase()) {
                flush(&mut word, &mut out);
            }
            word.extend(c.to_lowercase());
        } else {
            flush(&mut word, &mut out);
        }
        prev = Some(c);
    }
    flush(&mut word, &mut out);
    out
}

/// BM25 statistics of a small collection of documents (the candidates of one request).
#[derive(Debug, Clone)]
pub struct Bm25Index {
    /// Term frequencies of each document.
    docs: Vec<HashMap<String, u32>>,
    /// Length of each document in words.
    lengths: Vec<f64>,
    /// Documents containing each word.
    df: HashMap<String, u32>,
    avg_length: f64,
}

impl Bm25Index {
    /// Indexes `documents`.
    pub fn new<S: AsRef<str>>(documents: &[S]) -> Self {
        let mut docs = Vec::with_capacity(documents.len());
        let mut lengths = Vec::with_capacity(documents.len());
        let mut df: HashMap<String, u32> = HashMap::new();
        for d in documents {
            let ws = words(d.as_ref());
            lengths.push(ws.len() as f64);
            let mut tf: HashMap<String, u32> = HashMap::new();
            for w in ws {
                *tf.entry(w).or_default() += 1;
            }
            for w in tf.keys() {
                *df.entry(w.clone()).or_default() += 1;
            }
            docs.push(tf);
        }
        let avg_length = if lengths.is_empty() {
            1.0
        } else {
            (lengths.iter().sum::<f64>() / lengths.len() as f64).max(1.0)
        };
        Self {
            docs,
            lengths,
            df,
            avg_length,
        }
    }

    /// The number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether there are no documents.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    fn idf(&self, df: u32) -> f64 {
        let n = self.docs.len() as f64;
        let df = df as f64;
        // The "+1" form (Lucene's) keeps the weight positive for words in most documents.
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// Raw BM25 of every document for `query`, in document order.
    pub fn scores(&self, query: &str) -> Vec<f64> {
        self.scores_and_ceiling(query).0
    }

    /// BM25 of every document divided by the most `query` could score, in `[0, 1]`: the share
    /// of the query's weight a document matches. All zero when no word of the query occurs in
    /// any document.
    pub fn coverage(&self, query: &str) -> Vec<f64> {
        let (scores, ceiling) = self.scores_and_ceiling(query);
        if ceiling <= 0.0 {
            return scores;
        }
        scores.into_iter().map(|s| s / ceiling).collect()
    }

    fn scores_and_ceiling(&self, query: &str) -> (Vec<f64>, f64) {
        let mut query_words = words(query);
        query_words.sort_unstable();
        query_words.dedup();
        let mut scores = vec![0.0; self.docs.len()];
        let mut ceiling = 0.0;
        for w in &query_words {
            let Some(&df) = self.df.get(w) else { continue };
            let idf = self.idf(df);
            // A document's term weight saturates at idf · (k1 + 1).
            ceiling += idf * (K1 + 1.0);
            for (i, tf) in self.docs.iter().enumerate() {
                if let Some(&f) = tf.get(w) {
                    let f = f as f64;
                    let norm = 1.0 - B + B * self.lengths[i] / self.avg_length;
                    scores[i] += idf * f * (K1 + 1.0) / (f + K1 * norm);
                }
            }
        }
        (scores, ceiling)
    }
}

/// The BM25 indexes of the last few catalogues, so that an agent sending the same tools on
/// every call indexes them once: indexing 1,000 descriptions costs milliseconds, comparing them
/// with the cached ones microseconds. Entries are matched on the whole text of every document,
/// never on a hash, so a different catalogue can never reuse another's statistics.
#[derive(Debug, Default)]
pub(crate) struct RecentIndexes {
    entries: std::sync::Mutex<std::collections::VecDeque<(Vec<String>, std::sync::Arc<Bm25Index>)>>,
}

impl RecentIndexes {
    /// How many catalogues are kept (a process typically filters with one or two).
    const CAPACITY: usize = 4;

    /// The index of `documents`, from the cache or built (and cached) now.
    pub(crate) fn get(&self, documents: &[&str]) -> std::sync::Arc<Bm25Index> {
        let same = |cached: &[String]| {
            cached.len() == documents.len() && cached.iter().zip(documents).all(|(a, b)| a == b)
        };
        {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, index)) = entries.iter().find(|(docs, _)| same(docs)) {
                return index.clone();
            }
        }
        // Built outside the lock: two threads may both build it, and both results are equal.
        let index = std::sync::Arc::new(Bm25Index::new(documents));
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if !entries.iter().any(|(docs, _)| same(docs)) {
            if entries.len() >= Self::CAPACITY {
                entries.pop_front();
            }
            let owned = documents.iter().map(|d| (*d).to_string()).collect();
            entries.push_back((owned, index.clone()));
        }
        index
    }
}

/// The text BM25 reads of an input: the last user message when the input is a conversation
/// (earlier turns add words of tools already used), else the whole rendered input.
pub(crate) fn query_text(input: &decide_contract::DecisionInput) -> String {
    input
        .last_user_text()
        .map(str::to_string)
        .unwrap_or_else(|| input.render())
}

/// Fitted by `decide calibrate --model bm25` on the tuning parts (models/calibration/tools.jsonl
/// and crates/decide-eval/data/own/tune.jsonl); see the README.
pub const BM25_CALIBRATION: Calibration = Calibration {
    a: 7.6042,
    b: -4.2651,
};

/// The name [`Bm25Model`] answers to, and what `--model` takes to select it.
pub const BM25_MODEL_NAME: &str = "bm25";

/// BM25 as a decision model: no weights, no device, microseconds per decision.
///
/// The raw score of a candidate is its [`coverage`](Bm25Index::coverage) of the last user
/// message; probabilities come from [`BM25_CALIBRATION`] exactly as the engine's come from its
/// manifest, so the filter and the router can use either unchanged.
#[derive(Debug, Clone)]
pub struct Bm25Model {
    calibration: Calibration,
}

impl Default for Bm25Model {
    fn default() -> Self {
        Self {
            calibration: BM25_CALIBRATION,
        }
    }
}

impl Bm25Model {
    /// The model with its shipped calibration.
    pub fn new() -> Self {
        Self::default()
    }

    /// The model with another calibration (for example one `decide calibrate` just fitted).
    pub fn with_calibration(calibration: Calibration) -> Self {
        Self { calibration }
    }

    /// Its calibration.
    pub fn calibration(&self) -> Calibration {
        self.calibration
    }
}

impl Scorer for Bm25Model {
    fn about(&self) -> ScorerInfo<'_> {
        ScorerInfo::new(BM25_MODEL_NAME.into(), "cpu".into(), Some(self.calibration))
    }

    /// Each document's [`coverage`](Bm25Index::coverage) of the last user message, or with
    /// both criteria the difference of the two.
    fn yes_no_scores(
        &self,
        request: &DecisionRequest,
    ) -> Result<Vec<(String, f64)>, DecisionError> {
        let (docs, plans) = plan(request, false, false);
        let raw = Bm25Index::new(&docs.refs()).coverage(&query_text(request.input()));
        yes_no_raw(request, &plans, &raw)
    }
}

impl DecisionModel for Bm25Model {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        if let Some(asked) = request.model_name() {
            if asked != BM25_MODEL_NAME {
                return Err(DecisionError::UnsupportedFeature(format!(
                    "the request asks for model '{asked}', this is '{BM25_MODEL_NAME}'"
                )));
            }
        }
        let (docs, plans) = plan(request, false, false);
        let query = query_text(request.input());
        let raw = Bm25Index::new(&docs.refs()).coverage(&query);
        respond(
            request,
            &plans,
            // BM25 has no embedding to answer the needs-tool question from.
            Scored {
                raw: &raw,
                needs_tool: None,
            },
            self.calibration,
            BM25_MODEL_NAME,
            words(&query).len(),
        )
    }

    fn default_request_parameters(&self) -> decide_contract::DecisionRequestParameters {
        decide_contract::DecisionRequestParameters::for_model(BM25_MODEL_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decide_contract::{DecisionInput, YesNoQuestion};

    #[test]
    fn words_split_identifiers_and_drop_stopwords() {
        assert_eq!(
            words("getCurrentWeather get_current-weather: What is the weather in Köln?"),
            vec!["get", "current", "weather", "get", "current", "weather", "weather", "köln"]
        );
        assert!(words("  ,,, the a to ").is_empty());
    }

    #[test]
    fn bm25_matches_the_formula() {
        let docs = ["read file contents", "write file", "search the web"];
        let index = Bm25Index::new(&docs);
        // "file": df 2 of 3; avg length (3 + 2 + 2) / 3 ("the" dropped).
        let idf = (1.0f64 + (3.0 - 2.0 + 0.5) / (2.0 + 0.5)).ln();
        let avg = 7.0 / 3.0;
        let expect = |len: f64| idf * (K1 + 1.0) / (1.0 + K1 * (1.0 - B + B * len / avg));
        let s = index.scores("file");
        assert!((s[0] - expect(3.0)).abs() < 1e-12);
        assert!((s[1] - expect(2.0)).abs() < 1e-12);
        assert_eq!(s[2], 0.0);
        // A word no document has adds neither score nor ceiling.
        assert_eq!(index.coverage("file zebra"), index.coverage("file"));
    }

    #[test]
    fn coverage_is_bounded_and_prefers_rare_words() {
        let docs = [
            "read_file: Read the complete contents of a file",
            "write_file: Create a new file or overwrite a file",
            "kubectl_get: List Kubernetes resources with kubectl",
        ];
        let index = Bm25Index::new(&docs);
        let c = index.coverage("run kubectl get pods and read the file");
        assert!(c.iter().all(|v| (0.0..=1.0).contains(v)), "{c:?}");
        assert!(c[2] > c[0] && c[0] > c[1], "{c:?}");
        assert_eq!(index.coverage("nothing matches here"), vec![0.0; 3]);
        assert!(Bm25Index::new::<&str>(&[]).coverage("x").is_empty());
    }

    fn tool_request(text: &str) -> DecisionRequest {
        let mut builder = DecisionRequest::builder().input(DecisionInput::Text(text.into()));
        for (i, (name, description)) in [
            ("get_weather", "Current weather for a city"),
            ("send_email", "Send an email message to a recipient"),
        ]
        .into_iter()
        .enumerate()
        {
            let q = YesNoQuestion::builder(format!("Is {name} needed?"))
                .candidate(name, description)
                .build()
                .unwrap();
            builder = builder.question(format!("tool{i}"), q);
        }
        builder.build().unwrap()
    }

    #[test]
    fn bm25_model_answers_yes_no_questions() {
        let model = Bm25Model::new();
        let response = model
            .decide(&tool_request(
                "send an email to Anna about the weather in Paris",
            ))
            .unwrap();
        let p = |name: &str| response.yes_no(name).unwrap().probability();
        assert!(p("tool1") > p("tool0"), "{response:?}");
        let scores = model
            .yes_no_scores(&tool_request("send an email to Anna"))
            .unwrap();
        assert_eq!(scores[0].1, 0.0);
        assert!(scores[1].1 > 0.0);
        assert_eq!(response.model_name(), Some(BM25_MODEL_NAME));
    }
}
