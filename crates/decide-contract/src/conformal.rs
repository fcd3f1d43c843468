//! A miss rate the caller chooses: split conformal prediction over a model's yes/no probabilities.
//!
//! A probability threshold such as 0.5 says nothing about how many needed tools it misses. With a
//! [`Conformal`] table (the calibrated probabilities a model gave the *needed* candidates of held-out
//! labelled cases) a target recall `R` becomes a threshold instead: sort the `n` probabilities
//! ascending, `s_1 <= ... <= s_n`, and take `t = s_k` with `k = floor((1 - R)(n + 1))`; when `k < 1`
//! the table is too small to promise `R` with any threshold above 0, so `t = 0` and every candidate
//! passes. If the needed candidates of new cases are exchangeable with those of the table (cases
//! drawn like the calibration cases, from a model and calibration that did not see them), a needed
//! candidate's probability reaches `t` with probability at least `R`: on average over needed
//! (case, candidate) pairs, which is what a tool filter's recall measures. The guarantee is
//! marginal, not per case, and says nothing about precision: a higher `R` only ever lowers `t`.
//!
//! A table may hold several sources ([`ConformalSource`]: cases of one kind, such as one benchmark
//! or one catalogue), each kept apart, and then the threshold is the lowest of the sources' own:
//! the needed candidates of cases like *each* source's are covered at least `R` of the time
//! (group-conditional, "Mondrian" conformal prediction). One pooled table promises `R` only on
//! average over its pool, which an easy source can meet while a hard one falls short.
//!
//! The type lives in the contract, with no model behind it, so that the engine can read it from a
//! model's manifest and the tool filter can take it without depending on the engine.

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The calibrated probabilities of the needed candidates of labelled cases, kept per source: what
/// turns a target recall into a probability threshold ([`threshold`](Self::threshold)).
///
/// Valid by construction: at least one source, and each source's table is never empty, holds
/// only probabilities in `[0, 1]` and is sorted. Deserializing checks the same, so a hand-edited
/// manifest cannot smuggle in an unsorted table. It reads (and writes) one source as a single
/// table and several as a list of tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Conformal {
    sources: Vec<ConformalSource>,
}

/// One source of a [`Conformal`] table: the sorted calibrated probabilities of the needed
/// candidates of one kind of labelled cases, with how many cases and which data they came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConformalSource {
    needed_probabilities: Vec<f64>,
    cases: usize,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    needed_probabilities: Vec<f64>,
    #[serde(default)]
    cases: usize,
    #[serde(default)]
    source: String,
}

impl RawSource {
    /// The source, or what is wrong with it, naming the field under `at` (`conformal` or
    /// `conformal[i]`).
    fn check(self, at: &str) -> Result<ConformalSource, String> {
        let p = &self.needed_probabilities;
        if p.is_empty() {
            return Err(format!("{at}.needed_probabilities: empty"));
        }
        if let Some(bad) = p.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            return Err(format!(
                "{at}.needed_probabilities: {bad} is not a probability"
            ));
        }
        if let Some(i) = p.windows(2).position(|w| w[0] > w[1]) {
            return Err(format!(
                "{at}.needed_probabilities: not sorted ascending ({} before {})",
                p[i],
                p[i + 1]
            ));
        }
        Ok(ConformalSource {
            needed_probabilities: self.needed_probabilities,
            cases: self.cases,
            source: self.source,
        })
    }
}

impl Serialize for Conformal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.sources.as_slice() {
            [one] => one.serialize(serializer),
            many => many.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Conformal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TableOrList;

        impl<'de> Visitor<'de> for TableOrList {
            type Value = Conformal;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a conformal table, or a list of them (one per source)")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Conformal, A::Error> {
                let raw = RawSource::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let one = raw.check("conformal").map_err(de::Error::custom)?;
                Ok(Conformal { sources: vec![one] })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Conformal, A::Error> {
                let mut sources = Vec::new();
                while let Some(raw) = seq.next_element::<RawSource>()? {
                    let at = format!("conformal[{}]", sources.len());
                    sources.push(raw.check(&at).map_err(de::Error::custom)?);
                }
                if sources.is_empty() {
                    return Err(de::Error::custom("conformal: an empty list of sources"));
                }
                Ok(Conformal { sources })
            }
        }

        deserializer.deserialize_any(TableOrList)
    }
}

/// A target recall outside `(0, 1)`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("must be between 0 and 1 (both excluded), but was {0}")]
pub struct InvalidTargetRecall(pub f64);

impl ConformalSource {
    /// The table of `probabilities` (the needed candidates' calibrated probabilities), sorted and
    /// rounded down to 4 decimals, as a manifest stores them; `None` when there are none or one is
    /// not a probability. Rounding down keeps the guarantee: a stored threshold is never above the
    /// exact one, so it selects at least the same candidates.
    pub fn from_needed(probabilities: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut needed = Vec::new();
        for p in probabilities {
            if !(0.0..=1.0).contains(&p) {
                return None;
            }
            // 0.29 · 1e4 is 2899.999… in binary: the step up keeps a probability that already has 4
            // decimals from losing its last digit, and the comparison keeps the result at or below p.
            let down = (p * 1e4).floor();
            let up = (down + 1.0) / 1e4;
            needed.push(if up <= p { up } else { down / 1e4 });
        }
        if needed.is_empty() {
            return None;
        }
        needed.sort_by(f64::total_cmp);
        Some(Self {
            needed_probabilities: needed,
            cases: 0,
            source: String::new(),
        })
    }

    /// Records how many cases the probabilities came from.
    pub fn with_cases(mut self, cases: usize) -> Self {
        self.cases = cases;
        self
    }

    /// Records which data the probabilities came from (file names), for whoever reads the manifest.
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// The needed candidates' probabilities, sorted ascending.
    pub fn needed_probabilities(&self) -> &[f64] {
        &self.needed_probabilities
    }

    /// How many needed candidates the source holds (`n`).
    pub fn len(&self) -> usize {
        self.needed_probabilities.len()
    }

    /// Always false: a source holds at least one probability. Here because `len` is.
    pub fn is_empty(&self) -> bool {
        self.needed_probabilities.is_empty()
    }

    /// How many cases the probabilities came from (0 when not recorded).
    pub fn cases(&self) -> usize {
        self.cases
    }

    /// Which data the probabilities came from (empty when not recorded).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The smallest rank `k` (1-based, into the sorted probabilities) whose probability is a
    /// threshold with recall at least `target_recall`; 0 when no threshold above 0 is.
    pub fn rank(&self, target_recall: f64) -> Result<usize, InvalidTargetRecall> {
        // NaN fails the range check too.
        if !(target_recall > 0.0 && target_recall < 1.0) {
            return Err(InvalidTargetRecall(target_recall));
        }
        let n = self.needed_probabilities.len();
        // (1 - 0.9) · 10 is 0.999… in binary: without the nudge, R = 0.9 with n = 9 would get k = 0
        // (threshold 0) instead of 1. It is far below the 1 / (n + 1) that moves k for real.
        let k = ((1.0 - target_recall) * (n + 1) as f64 + 1e-9).floor() as usize;
        Ok(k.min(n))
    }

    /// The probability threshold (inclusive) at which the needed candidates of cases like this
    /// source's are selected at least `target_recall` of the time; 0 (every candidate) when the
    /// source is too small for that recall. `target_recall` must lie in `(0, 1)`.
    pub fn threshold(&self, target_recall: f64) -> Result<f64, InvalidTargetRecall> {
        Ok(match self.rank(target_recall)? {
            0 => 0.0,
            k => self.needed_probabilities[k - 1],
        })
    }
}

impl From<ConformalSource> for Conformal {
    fn from(source: ConformalSource) -> Self {
        Self {
            sources: vec![source],
        }
    }
}

impl Conformal {
    /// A table of one source: [`ConformalSource::from_needed`] of `probabilities`.
    pub fn from_needed(probabilities: impl IntoIterator<Item = f64>) -> Option<Self> {
        ConformalSource::from_needed(probabilities).map(Self::from)
    }

    /// A table of several sources, each kept apart; `None` when there are none.
    pub fn from_sources(sources: impl IntoIterator<Item = ConformalSource>) -> Option<Self> {
        let sources: Vec<ConformalSource> = sources.into_iter().collect();
        (!sources.is_empty()).then_some(Self { sources })
    }

    /// The sources, in the order they were given.
    pub fn sources(&self) -> &[ConformalSource] {
        &self.sources
    }

    /// How many needed candidates the table holds, over all its sources.
    pub fn len(&self) -> usize {
        self.sources.iter().map(ConformalSource::len).sum()
    }

    /// Always false: a table holds at least one probability. Here because `len` is.
    pub fn is_empty(&self) -> bool {
        self.sources.iter().all(ConformalSource::is_empty)
    }

    /// How many cases the probabilities came from, over all sources (0 when not recorded).
    pub fn cases(&self) -> usize {
        self.sources.iter().map(ConformalSource::cases).sum()
    }

    /// The sources' data, joined by "; " (empty when none is recorded).
    pub fn source(&self) -> String {
        let named: Vec<&str> = self
            .sources
            .iter()
            .map(ConformalSource::source)
            .filter(|s| !s.is_empty())
            .collect();
        named.join("; ")
    }

    /// The probability threshold (inclusive) at which the needed candidates of cases like each
    /// source's are selected at least `target_recall` of the time: the lowest of the sources'
    /// [`ConformalSource::threshold`]s, so that the set it selects holds each source's set. 0
    /// (every candidate) when a source is too small for that recall. `target_recall` must lie in
    /// `(0, 1)`.
    pub fn threshold(&self, target_recall: f64) -> Result<f64, InvalidTargetRecall> {
        let mut lowest = 1.0f64;
        for source in &self.sources {
            lowest = lowest.min(source.threshold(target_recall)?);
        }
        Ok(lowest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(p: &[f64]) -> ConformalSource {
        ConformalSource::from_needed(p.iter().copied()).unwrap()
    }

    #[test]
    fn the_threshold_is_the_kth_smallest_probability() {
        // n = 19, so n + 1 = 20: R = 0.9 → k = floor(0.1 · 20) = 2, R = 0.95 → k = 1,
        // R = 0.5 → k = 10, R = 0.99 → k = floor(0.2) = 0 → threshold 0.
        let p: Vec<f64> = (1..=19).map(|i| i as f64 / 20.0).rev().collect();
        let t = table(&p);
        assert_eq!(t.needed_probabilities()[0], 0.05);
        assert_eq!(t.rank(0.9), Ok(2));
        assert_eq!(t.threshold(0.9), Ok(0.1));
        assert_eq!(t.threshold(0.95), Ok(0.05));
        assert_eq!(t.threshold(0.5), Ok(0.5));
        assert_eq!(t.threshold(0.99), Ok(0.0));
    }

    #[test]
    fn exact_multiples_are_not_lost_to_binary_fractions() {
        // (1 − 0.9) · (9 + 1) is 0.9999999999999998 in f64; k must still be 1.
        let t = table(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]);
        assert_eq!(t.rank(0.9), Ok(1));
        assert_eq!(t.threshold(0.9), Ok(0.1));
        // (1 − 0.7) · 10 = 3.0000000000000004 → 3, not 4.
        assert_eq!(t.rank(0.7), Ok(3));
    }

    #[test]
    fn tiny_tables_and_recall_close_to_1_pass_everything() {
        let one = table(&[0.8]);
        // n = 1: k = floor((1 − R) · 2) is 0 for every R > 0.5, and 1 (the one probability) below.
        assert_eq!(one.threshold(0.6), Ok(0.0));
        assert_eq!(one.threshold(0.5), Ok(0.8));
        assert_eq!(one.threshold(0.1), Ok(0.8));
        // n = 99: R = 0.99 → k = 1; R = 0.999 → k = 0.
        let p: Vec<f64> = (0..99).map(|i| 0.5 + i as f64 / 1000.0).collect();
        let t = table(&p);
        assert_eq!(t.threshold(0.99), Ok(0.5));
        assert_eq!(t.threshold(0.999), Ok(0.0));
        // R close to 0 takes the largest probability, never past the end.
        assert_eq!(t.rank(1e-12), Ok(99));
        assert_eq!(t.threshold(1e-12), Ok(0.598));
    }

    #[test]
    fn a_higher_target_never_raises_the_threshold() {
        let p: Vec<f64> = (0..37).map(|i| ((i * 7919) % 101) as f64 / 100.0).collect();
        let t = table(&p);
        let mut last = 1.0;
        for r in (1..100).map(|i| i as f64 / 100.0) {
            let now = t.threshold(r).unwrap();
            assert!(now <= last, "R = {r}: {now} > {last}");
            last = now;
        }
    }

    #[test]
    fn targets_outside_0_1_are_refused() {
        let t = table(&[0.5]);
        for r in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
            assert!(t.threshold(r).is_err(), "{r}");
        }
        assert_eq!(
            t.threshold(1.5).unwrap_err().to_string(),
            "must be between 0 and 1 (both excluded), but was 1.5"
        );
    }

    #[test]
    fn from_needed_sorts_rounds_down_and_refuses_non_probabilities() {
        let t = table(&[0.29, 0.123456, 1.0, 0.0]);
        assert_eq!(t.needed_probabilities(), [0.0, 0.1234, 0.29, 1.0]);
        assert_eq!(t.len(), 4);
        assert!(ConformalSource::from_needed([]).is_none());
        assert!(ConformalSource::from_needed([0.5, f64::NAN]).is_none());
        assert!(ConformalSource::from_needed([1.2]).is_none());
        assert!(Conformal::from_needed([1.2]).is_none());
        assert!(Conformal::from_sources([]).is_none());
    }

    #[test]
    fn deserializing_checks_the_table() {
        #[derive(Deserialize)]
        struct Doc {
            conformal: Conformal,
        }
        let parse = |json: &str| serde_json::from_str::<Doc>(json).map(|d| d.conformal);
        let ok = parse(r#"{"conformal": {"needed_probabilities": [0.1, 0.2], "cases": 2, "source": "x.jsonl"}}"#)
            .unwrap();
        assert_eq!((ok.len(), ok.cases()), (2, 2));
        assert_eq!(ok.source(), "x.jsonl");
        for (json, message) in [
            (
                r#"{"needed_probabilities": [0.2, 0.1]}"#,
                "not sorted ascending",
            ),
            (r#"{"needed_probabilities": []}"#, "empty"),
            (
                r#"{"needed_probabilities": [0.1, 2.0]}"#,
                "not a probability",
            ),
            (
                r#"{"needed_probabilities": [0.1], "extra": 1}"#,
                "unknown field",
            ),
        ] {
            let err = parse(&format!(r#"{{"conformal": {json}}}"#))
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{json}: {err}");
        }
        let back: Conformal = serde_json::from_value(serde_json::to_value(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
    }

    fn sources(tables: &[&[f64]]) -> Conformal {
        Conformal::from_sources(tables.iter().enumerate().map(|(i, p)| {
            table(p)
                .with_cases(p.len())
                .with_source(format!("s{i}.jsonl"))
        }))
        .unwrap()
    }

    #[test]
    fn several_sources_take_the_lowest_threshold() {
        // n = 19 each: R = 0.9 → k = 2. The easy source alone would promise 0.9 at 0.6; the
        // hard one needs 0.1.
        let easy: Vec<f64> = (0..19).map(|i| 0.55 + i as f64 / 50.0).collect();
        let hard: Vec<f64> = (1..=19).map(|i| i as f64 / 20.0).collect();
        let both = sources(&[&easy, &hard]);
        assert_eq!(table(&easy).threshold(0.9), Ok(0.57));
        assert_eq!(table(&hard).threshold(0.9), Ok(0.1));
        assert_eq!(both.threshold(0.9), Ok(0.1));
        assert_eq!(both.len(), 38);
        assert_eq!(both.cases(), 38);
        assert_eq!(both.source(), "s0.jsonl; s1.jsonl");
        // One source too small for the recall passes everything, whatever the others say.
        let tiny = sources(&[&easy, &[0.9]]);
        assert_eq!(tiny.threshold(0.9), Ok(0.0));
        assert!(both.threshold(1.0).is_err());
    }

    #[test]
    fn each_source_is_covered_where_a_pooled_table_is_not() {
        // 90 easy needed probabilities and 10 hard ones: pooled, R = 0.9 keeps every easy one
        // and one hard one in ten; kept apart, the hard source is covered too.
        let easy: Vec<f64> = (0..90).map(|i| 0.5 + i as f64 / 200.0).collect();
        let hard: Vec<f64> = (0..10).map(|i| 0.01 + i as f64 / 1000.0).collect();
        let pooled = table(&[easy.clone(), hard.clone()].concat());
        let apart = sources(&[&easy, &hard]);
        let covered =
            |t: f64, p: &[f64]| p.iter().filter(|&&x| x >= t).count() as f64 / p.len() as f64;
        let t = pooled.threshold(0.9).unwrap();
        assert_eq!(covered(t, &hard), 0.1);
        let t = apart.threshold(0.9).unwrap();
        assert!(covered(t, &hard) >= 0.9 && covered(t, &easy) >= 0.9, "{t}");
    }

    #[test]
    fn several_sources_read_and_write_as_a_list() {
        let both = sources(&[&[0.1, 0.2], &[0.3]]);
        let json = serde_json::to_value(&both).unwrap();
        assert!(json.is_array(), "{json}");
        let back: Conformal = serde_json::from_value(json).unwrap();
        assert_eq!(back, both);
        // One source stays a single table, as manifests have always stored it.
        let one: Conformal = table(&[0.5]).into();
        assert!(serde_json::to_value(&one).unwrap().is_object());
        let parse = |json: &str| serde_json::from_str::<Conformal>(json).map_err(|e| e.to_string());
        let err =
            parse(r#"[{"needed_probabilities": [0.1]}, {"needed_probabilities": [0.3, 0.2]}]"#)
                .unwrap_err();
        assert!(
            err.contains("conformal[1].needed_probabilities: not sorted"),
            "{err}"
        );
        let err = parse("[]").unwrap_err();
        assert!(err.contains("an empty list of sources"), "{err}");
        let err = parse("0.5").unwrap_err();
        assert!(
            err.contains("a conformal table, or a list of them"),
            "{err}"
        );
    }
}
