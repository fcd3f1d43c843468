//! Quality metrics of tool selection over scored cases: no model, only arithmetic.
//!
//! A decision model that is fast but wrong is worse than none, so its quality has to be measured the same way for
//! every variant tried. This crate takes what a tool filter produced for each labelled case — the probability of
//! every candidate tool, how long the decision took, how many (conversation, tool) pairs the model scored — and
//! computes a [`Report`]. It knows nothing of models or files: `decide eval` runs the filter and hands the results
//! here, and the metrics can be checked by hand on a few numbers (see the unit tests).
//!
//! # Input
//!
//! One [`ScoredCase`] per labelled case:
//!
//! * `expected`: the names of the tools the case needs; empty for a *no-tool case* (small talk, a question the LLM
//!   answers alone). Every name must be one of the candidates, and none may be repeated.
//! * `candidates`: every tool of the case's catalogue, in catalogue order, each with a probability in `[0, 1]`.
//!   **A tool that passed without asking the model** (always visible, always included, already called, or a user
//!   message without text) is marked [`passed_without_asking`](Candidate::passed_without_asking). It keeps the
//!   model's probability when the model scored it anyway (`decide eval` scores called tools, so that they rank
//!   as the model ranks them, not first because the conversation called them), and **counts as probability
//!   1.0** when it was not scored: then it is selected at any threshold, ranks first, and enters the
//!   calibration error as a confident prediction.
//! * `latency_ms`: the time of the whole decision for the case, in milliseconds.
//! * `pairs`: how many (conversation, tool) pairs the model scored for the case (tools passed without asking
//!   count only when they were scored).
//!
//! # Metrics
//!
//! All metrics are computed exactly as below; a metric whose denominator is empty is `None` (`null` in JSON),
//! never NaN.
//!
//! * **Ranking** of a case: the candidates by probability, highest first; candidates with equal probabilities keep
//!   the catalogue order (the earlier tool ranks higher). The order is total and does not depend on sort stability,
//!   so the same input always gives the same ranks. See [`ranking`].
//! * **top-1 accuracy**: over the cases with exactly one expected tool, the share whose first-ranked candidate is
//!   that tool.
//! * **recall@k** (k = 1, 3, 5, 10): over the cases with at least one expected tool, the mean of
//!   |expected ∩ top k| / |expected|, where top k is the first k ranked candidates (all of them when the catalogue
//!   has fewer than k).
//! * **MRR**: over the cases with at least one expected tool, the mean of 1 / rank of the best-ranked expected tool
//!   (ranks start at 1).
//! * **Selected set** at the threshold `t`: the candidates with probability ≥ `t` (inclusive, as the filter's
//!   `min_probability`). With the needs-tool gate ([`Rule::Gate`], as the filter's `needs_tool_gate`): nothing
//!   unless [`needs_tool_probability`](decide_contract::needs_tool_probability) of the case's
//!   [`needs_tool`](ScoredCase::needs_tool) answer and the probability of its best candidate asked about (the
//!   first-ranked of those not passed without asking) reaches `t`; then that candidate and every candidate whose
//!   probability reaches the companion threshold.
//!   * **precision**: micro-averaged over all (case, tool) pairs, TP / (TP + FP), where TP counts selected expected
//!     tools and FP selected tools that were not expected; `None` when nothing was selected in any case.
//!   * **recall**: micro-averaged, TP / (TP + FN), where FN counts expected tools that were not selected; `None`
//!     when no case expects a tool.
//!   * **cases with every needed tool selected**: over the cases with at least one expected tool, the share whose
//!     selected set holds all of them: what an agent needs to finish a task, where recall counts tools, not cases.
//!   * **no-tool cases with nothing selected**: over the cases with no expected tool, the share whose selected set
//!     is empty.
//!   * **tools selected per case**: the mean number of tools the filter passes on per case: the selected set plus
//!     the tools passed without asking.
//! * **Expected calibration error** (ECE): every (case, tool) pair is a prediction `p` with the label 1 if the tool
//!   was expected and 0 otherwise. The pairs fall into 10 equal-width bins by `p`: bin `b` = min(⌊10·p⌋, 9), so
//!   bin `b` holds `[b/10, (b+1)/10)` and the last bin also holds 1.0. ECE = Σ over non-empty bins of
//!   (n_b / N) · |mean p in b − mean label in b|, which equals Σ_b |Σ p − Σ label| / N over the N pairs.
//! * **Latency** p50 and p95 per decision, by the nearest-rank method: with the N case latencies sorted ascending,
//!   the q-th percentile is the value at 1-based rank ⌈q·N/100⌉ (at least 1), computed in integers so that no
//!   rounding moves it.
//! * **Pairs per second**: the total of `pairs` over all cases divided by the total of the case latencies in
//!   seconds; `None` when the total latency is zero.
//!
//! # Seen and unseen tools
//!
//! After fine-tuning, the question is how much of a gain comes from tools the training data named. [`split_by_seen`]
//! takes the names of the tools seen in training and splits the needed (case, tool) pairs of the evaluated cases
//! into *seen* (the tool is among those names) and *unseen*; for each group, over its needed pairs (each pair
//! counts once, so these are micro-averages, unlike the per-case means above):
//!
//! * **needed**: the number of needed (case, tool) pairs in the group.
//! * **recall@k** (k = 5, 10): the share of those pairs whose tool ranks among the first k of its case.
//! * **MRR**: the mean of 1 / rank of each pair's tool in its case (every needed tool counts, not only the
//!   best-ranked one of a case).
//!
//! A group without needed pairs has `None` for its recall and MRR.
//!
//! # Example
//!
//! ```
//! use decide_eval::{evaluate, Candidate, ScoredCase};
//!
//! let cases = [
//!     ScoredCase::new(
//!         ["get_forecast"],
//!         [Candidate::new("get_forecast", 0.9), Candidate::new("send_email", 0.2)],
//!         12.0,
//!         2,
//!     ),
//!     // A no-tool case: nothing should be selected.
//!     ScoredCase::new(
//!         Vec::<String>::new(),
//!         [Candidate::new("get_forecast", 0.1), Candidate::new("send_email", 0.3)],
//!         8.0,
//!         2,
//!     ),
//! ];
//! let report = evaluate(&cases, 0.5)?;
//! assert_eq!(report.top1_accuracy, Some(1.0));
//! assert_eq!(report.no_tool_none_selected, Some(1.0));
//! assert_eq!(report.pairs_per_second, Some(200.0)); // 4 pairs in 20 ms
//! # Ok::<(), decide_eval::EvalError>(())
//! ```
#![deny(missing_docs)]

use std::collections::HashSet;

use decide_contract::needs_tool_gate;
use serde::Serialize;

#[cfg(test)]
mod tests;

/// The cut-offs of recall@k in a [`Report`].
pub const RECALL_AT: [usize; 4] = [1, 3, 5, 10];

/// The number of equal-width bins of the expected calibration error.
pub const CALIBRATION_BINS: usize = 10;

/// How well probabilities match outcomes: (probability, outcome) pairs in
/// [`CALIBRATION_BINS`] equal-width bins, and the expected calibration error over them. What a
/// reliability plot draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reliability {
    /// Per bin `b` (probabilities in `[b/10, (b+1)/10)`, the last bin also holding 1.0): pairs,
    /// their mean probability and the share of them that were positive (both 0 when empty).
    pub bins: Vec<ReliabilityBin>,
    /// Expected calibration error: Σ over bins of (pairs in bin / all pairs) · |mean
    /// probability − share positive|; 0 without pairs.
    pub ece: f64,
}

/// One bin of a [`Reliability`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReliabilityBin {
    /// Pairs in the bin.
    pub count: usize,
    /// Their mean probability.
    pub mean_probability: f64,
    /// The share of them that were positive.
    pub positive_rate: f64,
}

impl Reliability {
    /// Bins `pairs` of (probability, outcome).
    pub fn new(pairs: impl IntoIterator<Item = (f64, bool)>) -> Self {
        // Per bin: pairs, sum of probabilities, sum of labels.
        let mut sums = [(0usize, 0.0f64, 0.0f64); CALIBRATION_BINS];
        for (p, label) in pairs {
            let bin =
                ((p * CALIBRATION_BINS as f64).floor().max(0.0) as usize).min(CALIBRATION_BINS - 1);
            sums[bin].0 += 1;
            sums[bin].1 += p;
            sums[bin].2 += if label { 1.0 } else { 0.0 };
        }
        let all: usize = sums.iter().map(|b| b.0).sum();
        // n_b/N · |Σp/n_b − Σy/n_b| = |Σp − Σy| / N: no division by an empty bin.
        let ece = if all == 0 {
            0.0
        } else {
            sums.iter().map(|b| (b.1 - b.2).abs()).sum::<f64>() / all as f64
        };
        let bins = sums
            .iter()
            .map(|&(n, p, y)| ReliabilityBin {
                count: n,
                mean_probability: if n == 0 { 0.0 } else { p / n as f64 },
                positive_rate: if n == 0 { 0.0 } else { y / n as f64 },
            })
            .collect();
        Self { bins, ece }
    }
}

/// One tool of a case's catalogue and its probability of being needed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The tool's name, unique within the case.
    pub name: String,
    /// The probability that the case needs the tool, in `[0, 1]`: the model's, or 1.0 for a tool that passed
    /// without asking and was not scored.
    pub probability: f64,
    /// Whether the filter passes the tool whatever its probability (always visible, always included, already
    /// called): it counts in the tools selected per case, and nowhere else.
    pub passed_without_asking: bool,
}

impl Candidate {
    /// A candidate named `name` with probability `probability`.
    pub fn new(name: impl Into<String>, probability: f64) -> Self {
        Self {
            name: name.into(),
            probability,
            passed_without_asking: false,
        }
    }

    /// A candidate the filter passes whatever its probability, which is the model's when it was scored and 1.0
    /// when it was not.
    pub fn passed(name: impl Into<String>, probability: f64) -> Self {
        Self {
            passed_without_asking: true,
            ..Self::new(name, probability)
        }
    }
}

/// What a tool filter produced for one labelled case.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredCase {
    /// The tools the case needs; empty for a no-tool case.
    pub expected: Vec<String>,
    /// Every tool of the case's catalogue, in catalogue order (which breaks ranking ties).
    pub candidates: Vec<Candidate>,
    /// How long the decision took, in milliseconds.
    pub latency_ms: f64,
    /// How many (conversation, tool) pairs the model scored.
    pub pairs: usize,
    /// The model's answer to whether the conversation needs any tool, which [`Rule::Gate`] reads; `None` when it
    /// was not asked or the model refused.
    pub needs_tool: Option<f64>,
}

/// How the selected set of a case is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The candidates whose probability reaches the threshold.
    Threshold(f64),
    /// The needs-tool gate at `min_probability`, then the best candidate and those reaching
    /// `companion_min_probability`; see the [crate documentation](crate).
    Gate {
        /// The threshold of the gate's probability.
        min_probability: f64,
        /// The threshold of the further candidates once the gate is open.
        companion_min_probability: f64,
    },
}

impl Rule {
    fn threshold(self) -> f64 {
        match self {
            Rule::Threshold(t) => t,
            Rule::Gate {
                min_probability, ..
            } => min_probability,
        }
    }

    /// Whether each candidate of `case` is selected, in candidate order; `order` is the case's [`ranking`].
    fn select(self, case: &ScoredCase, order: &[usize]) -> Vec<bool> {
        match self {
            Rule::Threshold(t) => case.candidates.iter().map(|c| c.probability >= t).collect(),
            Rule::Gate {
                min_probability,
                companion_min_probability,
            } => {
                let Some(&best) = order
                    .iter()
                    .find(|&&i| !case.candidates[i].passed_without_asking)
                else {
                    return vec![false; case.candidates.len()];
                };
                let probabilities: Vec<f64> =
                    case.candidates.iter().map(|c| c.probability).collect();
                needs_tool_gate(
                    case.needs_tool,
                    &probabilities,
                    best,
                    min_probability,
                    companion_min_probability,
                )
                .1
            }
        }
    }
}

impl ScoredCase {
    /// The names of the tools `rule` passes on for this case, those passed without asking included, in
    /// catalogue order: what the filter would hand the LLM.
    pub fn passed(&self, rule: Rule) -> Vec<&str> {
        let order = ranking(&self.candidates);
        self.candidates
            .iter()
            .zip(rule.select(self, &order))
            .filter(|(c, selected)| *selected || c.passed_without_asking)
            .map(|(c, _)| c.name.as_str())
            .collect()
    }

    /// A case from its expected tool names, its candidates in catalogue order, its latency and its scored pairs.
    pub fn new<E, C>(expected: E, candidates: C, latency_ms: f64, pairs: usize) -> Self
    where
        E: IntoIterator,
        E::Item: Into<String>,
        C: IntoIterator<Item = Candidate>,
    {
        Self {
            expected: expected.into_iter().map(Into::into).collect(),
            candidates: candidates.into_iter().collect(),
            latency_ms,
            pairs,
            needs_tool: None,
        }
    }

    /// The case with the model's answer to whether its conversation needs any tool.
    pub fn with_needs_tool(mut self, answer: Option<f64>) -> Self {
        self.needs_tool = answer;
        self
    }

    /// Checks the case on its own, so that a caller reading cases one by one can name the bad one where it read
    /// it; [`evaluate`] runs the same check on every case.
    pub fn check(&self) -> Result<(), CaseError> {
        if self.candidates.is_empty() {
            return Err(CaseError::NoCandidates);
        }
        let mut names = HashSet::with_capacity(self.candidates.len());
        for c in &self.candidates {
            if !names.insert(c.name.as_str()) {
                return Err(CaseError::DuplicateCandidate(c.name.clone()));
            }
            // NaN fails the range check too, so no metric can become NaN.
            if !(0.0..=1.0).contains(&c.probability) {
                return Err(CaseError::InvalidProbability {
                    tool: c.name.clone(),
                    probability: c.probability,
                });
            }
        }
        let mut expected = HashSet::with_capacity(self.expected.len());
        for name in &self.expected {
            if !names.contains(name.as_str()) {
                return Err(CaseError::UnknownExpected(name.clone()));
            }
            // A repeated name would count one tool twice in recall and in the single-tool cases.
            if !expected.insert(name.as_str()) {
                return Err(CaseError::DuplicateExpected(name.clone()));
            }
        }
        if !(self.latency_ms.is_finite() && self.latency_ms >= 0.0) {
            return Err(CaseError::InvalidLatency(self.latency_ms));
        }
        Ok(())
    }

    fn is_expected(&self, name: &str) -> bool {
        self.expected.iter().any(|e| e == name)
    }
}

/// Why a [`ScoredCase`] cannot be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CaseError {
    /// The case has no candidate tools, so nothing can be ranked.
    #[error("no candidate tools")]
    NoCandidates,
    /// Two candidates have the same name, so the expected tools would be ambiguous.
    #[error("candidate \"{0}\" appears twice")]
    DuplicateCandidate(String),
    /// A probability is NaN or outside `[0, 1]`.
    #[error("tool \"{tool}\": probability {probability} is not in [0, 1]")]
    InvalidProbability {
        /// The candidate's name.
        tool: String,
        /// The probability given.
        probability: f64,
    },
    /// An expected tool is not among the candidates.
    #[error("expected tool \"{0}\" is not a candidate")]
    UnknownExpected(String),
    /// An expected tool is named twice.
    #[error("expected tool \"{0}\" is named twice")]
    DuplicateExpected(String),
    /// The latency is negative, infinite or NaN.
    #[error("latency {0} ms is not a finite, non-negative number")]
    InvalidLatency(f64),
}

/// Why a set of cases cannot be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// There are no cases: every metric would be undefined.
    #[error("no cases to evaluate")]
    NoCases,
    /// The threshold is NaN or outside `[0, 1]`.
    #[error("threshold {0} is not in [0, 1]")]
    InvalidThreshold(f64),
    /// One case is invalid.
    #[error("case {index}: {error}")]
    Case {
        /// The case's 0-based position in the input.
        index: usize,
        /// What is wrong with it (in the message, not as a source, so a printed error chain shows it once).
        error: CaseError,
    },
}

/// The quality of a tool selection over a set of cases; see the [crate documentation](crate) for the exact
/// definitions. A metric whose denominator is empty is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The number of cases.
    pub cases: usize,
    /// The cases with exactly one expected tool (top-1 accuracy's denominator).
    pub single_tool_cases: usize,
    /// The cases with at least one expected tool (recall@k's and MRR's denominator).
    pub tool_cases: usize,
    /// The cases with no expected tool.
    pub no_tool_cases: usize,
    /// The (conversation, tool) pairs scored, over all cases.
    pub pairs: usize,
    /// The threshold the selected set was taken at (inclusive); with the needs-tool gate, the gate's.
    pub threshold: f64,
    /// With the needs-tool gate, the threshold of the further tools once the gate is open.
    pub companion_min_probability: Option<f64>,
    /// Share of single-tool cases whose first-ranked tool is the expected one.
    pub top1_accuracy: Option<f64>,
    /// Mean share of the expected tools among the first ranked tool.
    pub recall_at_1: Option<f64>,
    /// Mean share of the expected tools among the first 3 ranked tools.
    pub recall_at_3: Option<f64>,
    /// Mean share of the expected tools among the first 5 ranked tools.
    pub recall_at_5: Option<f64>,
    /// Mean share of the expected tools among the first 10 ranked tools.
    pub recall_at_10: Option<f64>,
    /// Mean reciprocal rank of the best-ranked expected tool.
    pub mrr: Option<f64>,
    /// Share of the selected (case, tool) pairs that were expected.
    pub precision: Option<f64>,
    /// Share of the expected (case, tool) pairs that were selected.
    pub recall: Option<f64>,
    /// Share of the cases with at least one expected tool whose every expected tool was selected.
    pub all_needed_selected: Option<f64>,
    /// Share of the no-tool cases where nothing was selected.
    pub no_tool_none_selected: Option<f64>,
    /// Mean number of tools selected per case (those passed without asking included): what the
    /// selection costs in the LLM's context.
    pub mean_selected: f64,
    /// Expected calibration error over all (case, tool) pairs, 10 equal-width bins.
    pub ece: f64,
    /// Median decision latency (nearest rank), in milliseconds.
    pub latency_p50_ms: f64,
    /// 95th percentile of the decision latency (nearest rank), in milliseconds.
    pub latency_p95_ms: f64,
    /// Pairs scored per second of decision time.
    pub pairs_per_second: Option<f64>,
}

/// The candidates' indices in rank order: probability descending, and among equal probabilities the catalogue
/// order (lower index first).
pub fn ranking(candidates: &[Candidate]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    // The index comparison makes the order total, so the result does not depend on how the sort treats ties.
    order.sort_by(|&a, &b| {
        candidates[b]
            .probability
            .total_cmp(&candidates[a].probability)
            .then(a.cmp(&b))
    });
    order
}

/// A mean that is `None`, not NaN, over an empty set.
fn share(numerator: f64, denominator: usize) -> Option<f64> {
    (denominator > 0).then(|| numerator / denominator as f64)
}

/// The nearest-rank percentile `percent` of `sorted` (ascending, not empty).
fn nearest_rank(sorted: &[f64], percent: usize) -> f64 {
    // ⌈percent·N/100⌉ in integers: in floating point, 0.95·20 may land just above 19 and pick rank 20.
    let rank = (percent * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// Computes every metric of `cases`, selecting the tools whose probability reaches `threshold`.
///
/// Fails on an empty input, a threshold outside `[0, 1]`, or a case that fails [`ScoredCase::check`].
pub fn evaluate(cases: &[ScoredCase], threshold: f64) -> Result<Report, EvalError> {
    evaluate_with(cases, Rule::Threshold(threshold))
}

/// Computes every metric of `cases`, selecting by `rule`.
///
/// Fails on an empty input, a threshold outside `[0, 1]`, or a case that fails [`ScoredCase::check`].
pub fn evaluate_with(cases: &[ScoredCase], rule: Rule) -> Result<Report, EvalError> {
    if cases.is_empty() {
        return Err(EvalError::NoCases);
    }
    let threshold = rule.threshold();
    let companion = match rule {
        Rule::Gate {
            companion_min_probability,
            ..
        } => Some(companion_min_probability),
        Rule::Threshold(_) => None,
    };
    for t in std::iter::once(threshold).chain(companion) {
        if !(0.0..=1.0).contains(&t) {
            return Err(EvalError::InvalidThreshold(t));
        }
    }
    for (index, case) in cases.iter().enumerate() {
        case.check()
            .map_err(|error| EvalError::Case { index, error })?;
    }

    let mut single_tool_cases = 0;
    let mut top1_hits = 0.0;
    let mut tool_cases = 0;
    let mut recall_sums = [0.0; RECALL_AT.len()];
    let mut reciprocal_ranks = 0.0;
    let (mut true_pos, mut false_pos, mut false_neg) = (0usize, 0usize, 0usize);
    let mut no_tool_cases = 0;
    let mut no_tool_empty = 0.0;
    let mut all_needed = 0.0;
    let mut selected_total = 0usize;
    let mut calibration_pairs = Vec::new();
    let mut pairs_total = 0;
    let mut latencies = Vec::with_capacity(cases.len());

    for case in cases {
        let order = ranking(&case.candidates);
        let expected = case.expected.len();
        if expected == 1 {
            single_tool_cases += 1;
            if case.is_expected(&case.candidates[order[0]].name) {
                top1_hits += 1.0;
            }
        }
        if expected > 0 {
            tool_cases += 1;
            for (sum, &k) in recall_sums.iter_mut().zip(&RECALL_AT) {
                let found = order
                    .iter()
                    .take(k)
                    .filter(|&&i| case.is_expected(&case.candidates[i].name))
                    .count();
                *sum += found as f64 / expected as f64;
            }
            // check() guarantees every expected tool is a candidate, so one is always found.
            if let Some(rank) = order
                .iter()
                .position(|&i| case.is_expected(&case.candidates[i].name))
            {
                reciprocal_ranks += 1.0 / (rank + 1) as f64;
            }
        } else {
            no_tool_cases += 1;
        }

        let mut selected_any = false;
        let mut missed = false;
        for (c, selected) in case.candidates.iter().zip(rule.select(case, &order)) {
            let label = case.is_expected(&c.name);
            selected_any |= selected;
            selected_total += usize::from(selected || c.passed_without_asking);
            match (selected, label) {
                (true, true) => true_pos += 1,
                (true, false) => false_pos += 1,
                (false, true) => {
                    false_neg += 1;
                    missed = true;
                }
                (false, false) => {}
            }
            calibration_pairs.push((c.probability, label));
        }
        if expected == 0 && !selected_any {
            no_tool_empty += 1.0;
        }
        if expected > 0 && !missed {
            all_needed += 1.0;
        }
        pairs_total += case.pairs;
        latencies.push(case.latency_ms);
    }

    let ece = Reliability::new(calibration_pairs).ece;
    latencies.sort_by(f64::total_cmp);
    let total_ms = latencies.iter().sum::<f64>();
    let recall_at = |i: usize| share(recall_sums[i], tool_cases);

    Ok(Report {
        cases: cases.len(),
        single_tool_cases,
        tool_cases,
        no_tool_cases,
        pairs: pairs_total,
        threshold,
        companion_min_probability: companion,
        top1_accuracy: share(top1_hits, single_tool_cases),
        recall_at_1: recall_at(0),
        recall_at_3: recall_at(1),
        recall_at_5: recall_at(2),
        recall_at_10: recall_at(3),
        mrr: share(reciprocal_ranks, tool_cases),
        precision: share(true_pos as f64, true_pos + false_pos),
        recall: share(true_pos as f64, true_pos + false_neg),
        all_needed_selected: share(all_needed, tool_cases),
        no_tool_none_selected: share(no_tool_empty, no_tool_cases),
        mean_selected: selected_total as f64 / cases.len() as f64,
        ece,
        latency_p50_ms: nearest_rank(&latencies, 50),
        latency_p95_ms: nearest_rank(&latencies, 95),
        // pairs / (ms / 1000), multiplied out so that round figures stay exact.
        pairs_per_second: (total_ms > 0.0).then(|| pairs_total as f64 * 1000.0 / total_ms),
    })
}

/// How the needed tools of one group of (case, tool) pairs rank in their cases; see
/// [Seen and unseen tools](crate#seen-and-unseen-tools). A metric of an empty group is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NeededRanks {
    /// The needed (case, tool) pairs in the group.
    pub needed: usize,
    /// Share of those pairs whose tool ranks among the first 5 of its case.
    pub recall_at_5: Option<f64>,
    /// Share of those pairs whose tool ranks among the first 10 of its case.
    pub recall_at_10: Option<f64>,
    /// Mean of 1 / rank of each pair's tool.
    pub mrr: Option<f64>,
}

/// The needed (case, tool) pairs split by whether the tool was seen in training: what [`split_by_seen`] returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeenSplit {
    /// The pairs whose tool is among the seen names.
    pub seen: NeededRanks,
    /// The pairs whose tool is not.
    pub unseen: NeededRanks,
}

/// Running sums of one group: pairs, hits at 5 and 10, reciprocal ranks.
#[derive(Default)]
struct RankSums {
    needed: usize,
    at_5: usize,
    at_10: usize,
    reciprocal: f64,
}

impl RankSums {
    fn add(&mut self, rank: usize) {
        self.needed += 1;
        self.at_5 += usize::from(rank <= 5);
        self.at_10 += usize::from(rank <= 10);
        self.reciprocal += 1.0 / rank as f64;
    }

    fn finish(&self) -> NeededRanks {
        NeededRanks {
            needed: self.needed,
            recall_at_5: share(self.at_5 as f64, self.needed),
            recall_at_10: share(self.at_10 as f64, self.needed),
            mrr: share(self.reciprocal, self.needed),
        }
    }
}

/// Splits the needed (case, tool) pairs of `cases` into those whose tool is in `seen` (named in the training data)
/// and the rest, and measures how each group ranks; see [Seen and unseen tools](crate#seen-and-unseen-tools).
///
/// Cases rank as in [`evaluate`]. Fails on a case that fails [`ScoredCase::check`]; no cases, or no needed tools,
/// give two empty groups.
pub fn split_by_seen(cases: &[ScoredCase], seen: &HashSet<String>) -> Result<SeenSplit, EvalError> {
    let (mut in_seen, mut in_unseen) = (RankSums::default(), RankSums::default());
    for (index, case) in cases.iter().enumerate() {
        case.check()
            .map_err(|error| EvalError::Case { index, error })?;
        if case.expected.is_empty() {
            continue;
        }
        for (position, &i) in ranking(&case.candidates).iter().enumerate() {
            let name = &case.candidates[i].name;
            if case.is_expected(name) {
                let group = if seen.contains(name) {
                    &mut in_seen
                } else {
                    &mut in_unseen
                };
                group.add(position + 1);
            }
        }
    }
    Ok(SeenSplit {
        seen: in_seen.finish(),
        unseen: in_unseen.finish(),
    })
}
