//! The needs-tool head: whether a conversation needs any tool at all, from its embedding alone.
//!
//! A tool's probability says how likely that one tool is needed; it cannot say that nothing is.
//! "Make that a table" after a tool result, or "thanks!", still finds a tool whose description
//! is near the conversation, and the best tool of a request that does need one is often below
//! 0.5 when the user wrote it tersely. So the probabilities alone trade the needed tools against
//! the no-tool cases at one threshold. The head is a logistic regression on two normalized
//! embeddings a decision computes anyway: the whole conversation's and the last user message's
//! alone ([`NeedsTool::features`]); the first reads what a follow-up refers to, the second what
//! is asked now, which the whole dilutes after long tool results. It is fitted by
//! `decide calibrate --needs-tool-data` on conversations labelled with and without tools, and
//! stored in the manifest's `[needs_tool]` table with the threshold the filter passes the
//! further tools at once the conversation needs one (see `decide_filter`'s gate).
//!
//! It answers [`YesNoQuestion::needs_tool`](decide_contract::YesNoQuestion::needs_tool).

use serde::{Deserialize, Serialize};

use crate::calibration::sigmoid;

/// Full-batch gradient steps of [`NeedsTool::fit`]: enough for the loss to settle on thousands
/// of 384-wide embeddings, and a fixed count keeps the fit the same bit for bit.
const STEPS: usize = 3000;
/// The step size on standardized inputs.
const STEP_SIZE: f64 = 0.5;
/// The L2 penalty on the standardized weights: a few thousand conversations over 768 inputs
/// would otherwise learn their wording.
const L2: f64 = 0.03;

/// A manifest's `[needs_tool]` table: the head and the threshold of the further tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeedsTool {
    /// One weight per input of [`features`](Self::features): twice the embedding's width.
    pub weights: Vec<f64>,
    /// The offset of the logit.
    pub bias: f64,
    /// The probability at which a tool passes once the conversation needs a tool (the best
    /// tool passes then whatever its probability).
    pub companion_min_probability: f64,
    /// The files the head was fitted on.
    pub source: String,
    /// How many distinct conversations it was fitted on.
    pub cases: usize,
}

impl NeedsTool {
    /// Checks the table against a model whose embeddings have `dims` dimensions; the error
    /// names the field.
    pub fn check(&self, dims: usize) -> Result<(), String> {
        if self.weights.len() != 2 * dims {
            return Err(format!(
                "[needs_tool] weights: {} of them, but a model of {dims} dimensions needs {} (two views)",
                self.weights.len(),
                2 * dims
            ));
        }
        if self.weights.iter().any(|w| !w.is_finite()) || !self.bias.is_finite() {
            return Err("[needs_tool] weights and bias must be finite numbers".into());
        }
        if !(0.0..=1.0).contains(&self.companion_min_probability) {
            return Err(format!(
                "[needs_tool] companion_min_probability: {} is not in [0, 1]",
                self.companion_min_probability
            ));
        }
        Ok(())
    }

    /// The head as a manifest stores it: weights and bias to six decimals, the companion
    /// threshold to four.
    pub fn rounded(&self) -> NeedsTool {
        let round = |x: f64, scale: f64| (x * scale).round() / scale;
        NeedsTool {
            weights: self.weights.iter().map(|w| round(*w, 1e6)).collect(),
            bias: round(self.bias, 1e6),
            companion_min_probability: round(self.companion_min_probability, 1e4),
            source: self.source.clone(),
            cases: self.cases,
        }
    }

    /// What the head reads: the whole conversation's embedding and the last user message's,
    /// each normalized (so their lengths do not matter), one after the other. A conversation
    /// that is its last user message alone has one embedding, read twice. `None` for a zero or
    /// non-finite vector, or two of different widths.
    pub fn features(whole: &[f32], last_message: Option<&[f32]>) -> Option<Vec<f64>> {
        let last = last_message.unwrap_or(whole);
        if last.len() != whole.len() {
            return None;
        }
        let mut out = Vec::with_capacity(2 * whole.len());
        for view in [whole, last] {
            let norm = view
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            if norm == 0.0 || !norm.is_finite() {
                return None;
            }
            out.extend(view.iter().map(|&x| f64::from(x) / norm));
        }
        Some(out)
    }

    /// The probability that the conversation needs a tool, from its [`features`](Self::features);
    /// `None` when they cannot be formed or are not as wide as the head.
    pub fn probability(&self, whole: &[f32], last_message: Option<&[f32]>) -> Option<f64> {
        let features = Self::features(whole, last_message)?;
        self.probability_of(&features)
    }

    /// The probability from [`features`](Self::features) already formed; `None` for a row not as
    /// wide as the head.
    pub fn probability_of(&self, features: &[f64]) -> Option<f64> {
        if features.len() != self.weights.len() {
            return None;
        }
        let z: f64 = self.weights.iter().zip(features).map(|(w, x)| w * x).sum();
        Some(sigmoid(z + self.bias))
    }

    /// Fits the head on conversations' [`features`](Self::features) and whether each needs a
    /// tool: logistic regression on the features standardized per input, the two classes
    /// weighted to count the same (the share of no-tool conversations in training data says
    /// nothing of a user's), by a fixed number (`STEPS`) of full-batch gradient steps from zero.
    /// The standardization is folded into the weights, so the head reads features as they come.
    /// `None` without both kinds of conversation or with rows of unequal width.
    pub fn fit(
        rows: &[Vec<f64>],
        needs_tool: &[bool],
        companion_min_probability: f64,
        source: String,
    ) -> Option<NeedsTool> {
        let n = rows.len();
        let dims = rows.first()?.len();
        let positives = needs_tool.iter().filter(|&&y| y).count();
        if n != needs_tool.len()
            || positives == 0
            || positives == n
            || dims == 0
            || rows.iter().any(|e| e.len() != dims)
        {
            return None;
        }
        let mut mean = vec![0.0f64; dims];
        for r in rows {
            for (m, x) in mean.iter_mut().zip(r) {
                *m += x / n as f64;
            }
        }
        let mut sd = vec![0.0f64; dims];
        for r in rows {
            for ((s, x), m) in sd.iter_mut().zip(r).zip(&mean) {
                *s += (x - m) * (x - m) / n as f64;
            }
        }
        for s in &mut sd {
            *s = s.sqrt() + 1e-6;
        }
        let standard: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                r.iter()
                    .zip(&mean)
                    .zip(&sd)
                    .map(|((x, m), s)| (x - m) / s)
                    .collect()
            })
            .collect();
        let share_negative = (n - positives) as f64 / n as f64;
        let sample_weight = |y: bool| {
            if y {
                2.0 * share_negative
            } else {
                2.0 * (1.0 - share_negative)
            }
        };
        let (mut w, mut b) = (vec![0.0; dims], 0.0);
        let mut grad = vec![0.0; dims];
        for _ in 0..STEPS {
            grad.iter_mut().for_each(|g| *g = 0.0);
            let mut grad_b = 0.0;
            for (x, &y) in standard.iter().zip(needs_tool) {
                let z: f64 = x.iter().zip(&w).map(|(x, w)| x * w).sum::<f64>() + b;
                let d = (sigmoid(z) - f64::from(u8::from(y))) * sample_weight(y);
                for (g, x) in grad.iter_mut().zip(x) {
                    *g += d * x;
                }
                grad_b += d;
            }
            for (w, g) in w.iter_mut().zip(&grad) {
                *w -= STEP_SIZE * (g / n as f64 + L2 * *w);
            }
            b -= STEP_SIZE * grad_b / n as f64;
        }
        let weights: Vec<f64> = w.iter().zip(&sd).map(|(w, s)| w / s).collect();
        let bias = b - weights.iter().zip(&mean).map(|(w, m)| w * m).sum::<f64>();
        Some(NeedsTool {
            weights,
            bias,
            companion_min_probability,
            source,
            cases: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conversations whose first input points one way when they need a tool and the other way
    /// when they do not, with a second input of noise.
    fn separable() -> (Vec<Vec<f64>>, Vec<bool>) {
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for i in 0..40 {
            let needs = i % 4 != 0;
            let noise = (i as f64 * 0.37).sin();
            rows.push(vec![if needs { 1.0 } else { -1.0 }, noise, 0.5]);
            labels.push(needs);
        }
        (rows, labels)
    }

    #[test]
    fn the_fit_separates_what_separates_and_keeps_the_companion_threshold() {
        let (rows, labels) = separable();
        let head = NeedsTool::fit(&rows, &labels, 0.2, "cases.jsonl".into()).unwrap();
        assert_eq!(head.cases, 40);
        assert_eq!(head.companion_min_probability, 0.2);
        assert!(head.probability_of(&[1.0, 0.0, 0.5]).unwrap() > 0.9);
        assert!(head.probability_of(&[-1.0, 0.0, 0.5]).unwrap() < 0.1);
        assert_eq!(head.probability_of(&[1.0, 0.0]), None);
    }

    #[test]
    fn the_same_cases_give_the_same_head_bit_for_bit() {
        let (rows, labels) = separable();
        let a = NeedsTool::fit(&rows, &labels, 0.2, "x".into()).unwrap();
        let b = NeedsTool::fit(&rows, &labels, 0.2, "x".into()).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn the_features_are_both_views_normalized_and_one_view_is_read_twice() {
        let f = NeedsTool::features(&[3.0, 4.0], Some(&[0.0, 2.0])).unwrap();
        assert_eq!(f, [0.6, 0.8, 0.0, 1.0]);
        let alone = NeedsTool::features(&[3.0, 4.0], None).unwrap();
        assert_eq!(alone, [0.6, 0.8, 0.6, 0.8]);
        // An embedding's length does not matter.
        let longer = NeedsTool::features(&[30.0, 40.0], None).unwrap();
        assert!(alone
            .iter()
            .zip(&longer)
            .all(|(a, b)| (a - b).abs() < 1e-12));
        assert_eq!(NeedsTool::features(&[0.0, 0.0], None), None);
        assert_eq!(NeedsTool::features(&[1.0, 0.0], Some(&[1.0])), None);
    }

    #[test]
    fn one_kind_of_conversation_alone_fits_nothing() {
        let (rows, _) = separable();
        assert!(NeedsTool::fit(&rows, &[true; 40], 0.2, "x".into()).is_none());
        assert!(NeedsTool::fit(&[], &[], 0.2, "x".into()).is_none());
        let ragged = vec![vec![1.0, 0.0], vec![0.0]];
        assert!(NeedsTool::fit(&ragged, &[true, false], 0.2, "x".into()).is_none());
    }

    #[test]
    fn a_table_of_the_wrong_width_or_range_is_named() {
        let (rows, labels) = separable();
        let rows: Vec<Vec<f64>> = rows.into_iter().map(|r| [r.clone(), r].concat()).collect();
        let head = NeedsTool::fit(&rows, &labels, 0.2, "x".into()).unwrap();
        assert!(head.check(3).is_ok());
        assert!(head
            .check(384)
            .unwrap_err()
            .contains("[needs_tool] weights"));
        let wrong = NeedsTool {
            companion_min_probability: 1.5,
            ..head
        };
        assert!(wrong
            .check(3)
            .unwrap_err()
            .contains("companion_min_probability"));
    }
}
