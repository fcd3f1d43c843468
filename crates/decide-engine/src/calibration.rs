//! Platt scaling: how a model's raw score becomes a probability.
//!
//! A bi-encoder's cosine or a cross-encoder's logit is a score, not a probability: thresholds
//! mean nothing until it is mapped by `sigmoid(a · score + b)` with `a` and `b` fitted on labelled
//! pairs. Each model carries its own pair in its manifest.

use serde::{Deserialize, Serialize};

/// `P = sigmoid(a · score + b)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Slope: also the inverse temperature of softmaxes over a question's options.
    pub a: f64,
    /// Offset.
    pub b: f64,
}

impl Calibration {
    /// The identity on logits: for a cross-encoder trained with a sigmoid or softmax, its own
    /// output is already a probability.
    pub const IDENTITY: Calibration = Calibration { a: 1.0, b: 0.0 };

    /// The calibrated log-odds of a raw score.
    pub fn logit(&self, score: f64) -> f64 {
        self.a * score + self.b
    }

    /// The probability of a raw score.
    pub fn probability(&self, score: f64) -> f64 {
        sigmoid(self.logit(score))
    }

    /// Fits `a` and `b` by maximum likelihood (Newton's method) with Platt's smoothed targets,
    /// which keep the fit finite when the classes separate perfectly. Returns `None` without
    /// both positive and negative examples.
    pub fn fit(scores: &[f64], labels: &[bool]) -> Option<Calibration> {
        let positives = labels.iter().filter(|l| **l).count() as f64;
        let negatives = labels.len() as f64 - positives;
        if scores.len() != labels.len() || positives == 0.0 || negatives == 0.0 {
            return None;
        }
        let hi = (positives + 1.0) / (positives + 2.0);
        let lo = 1.0 / (negatives + 2.0);
        let targets: Vec<f64> = labels.iter().map(|&l| if l { hi } else { lo }).collect();
        // Cross-entropy against the smoothed targets, computed from the logit for stability.
        let loss = |a: f64, b: f64| -> f64 {
            scores
                .iter()
                .zip(&targets)
                .map(|(s, t)| {
                    let z = a * s + b;
                    // log(1 + e^z) − t·z
                    z.max(0.0) + (-z.abs()).exp().ln_1p() - t * z
                })
                .sum()
        };
        let (mut a, mut b) = (0.0f64, ((positives + 1.0) / (negatives + 1.0)).ln());
        for _ in 0..100 {
            // Gradient and Hessian of the negative log-likelihood, with a tiny ridge so the
            // Hessian stays invertible.
            let (mut ga, mut gb, mut haa, mut hab, mut hbb) = (0.0, 0.0, 1e-9, 0.0, 1e-9);
            for (s, t) in scores.iter().zip(&targets) {
                let p = sigmoid(a * s + b);
                let d = p - t;
                let w = (p * (1.0 - p)).max(1e-12);
                ga += d * s;
                gb += d;
                haa += w * s * s;
                hab += w * s;
                hbb += w;
            }
            let det = haa * hbb - hab * hab;
            if det.abs() < 1e-18 {
                break;
            }
            let da = (hbb * ga - hab * gb) / det;
            let db = (haa * gb - hab * ga) / det;
            // A full Newton step can overshoot when many scores sit on one value (BM25's zeros):
            // halve it until the loss goes down.
            let current = loss(a, b);
            let mut step = 1.0;
            while step > 1e-10 && loss(a - step * da, b - step * db) > current {
                step /= 2.0;
            }
            a -= step * da;
            b -= step * db;
            if (step * da).abs() < 1e-10 && (step * db).abs() < 1e-10 {
                break;
            }
        }
        (a.is_finite() && b.is_finite()).then_some(Calibration { a, b })
    }
}

/// The logistic function, stable for large magnitudes.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Softmax of `logits`, stable for large magnitudes.
pub fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_and_softmax_are_stable() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!(sigmoid(1000.0) <= 1.0 && sigmoid(-1000.0) >= 0.0);
        let p = softmax(&[1000.0, 1000.0, -1000.0]);
        assert!((p[0] - 0.5).abs() < 1e-12 && p[2] < 1e-12);
    }

    #[test]
    fn fit_recovers_a_known_curve() {
        // Labels drawn deterministically from P = sigmoid(8 s - 3): the fit must land near it.
        let truth = Calibration { a: 8.0, b: -3.0 };
        let mut scores = Vec::new();
        let mut labels = Vec::new();
        for i in 0..2000 {
            let s = (i % 100) as f64 / 100.0;
            let p = truth.probability(s);
            // A low-discrepancy sequence stands in for random draws.
            let u = ((i as f64) * 0.618_033_988_75).fract();
            scores.push(s);
            labels.push(u < p);
        }
        let fit = Calibration::fit(&scores, &labels).unwrap();
        assert!((fit.a - truth.a).abs() < 1.0, "{fit:?}");
        assert!((fit.b - truth.b).abs() < 0.5, "{fit:?}");
    }

    #[test]
    fn fit_needs_both_classes() {
        assert!(Calibration::fit(&[0.1, 0.2], &[true, true]).is_none());
        assert!(Calibration::fit(&[0.1], &[true, false]).is_none());
        let sep = Calibration::fit(&[0.0, 0.1, 0.9, 1.0], &[false, false, true, true]).unwrap();
        assert!(sep.a > 0.0 && sep.a.is_finite());
    }

    #[test]
    fn fit_converges_when_most_scores_tie_at_zero() {
        // BM25's shape: most pairs share no word with the query and score exactly 0.
        let mut scores = vec![0.0; 4000];
        let mut labels = vec![false; 4000];
        for i in 0..200 {
            let s = (i % 20) as f64 / 20.0;
            scores.push(s);
            labels.push(s > 0.4 || i % 7 == 0);
        }
        for _ in 0..40 {
            scores.push(0.0);
            labels.push(true);
        }
        let fit = Calibration::fit(&scores, &labels).unwrap();
        assert!(fit.a > 0.0 && fit.a < 100.0, "{fit:?}");
        // The tied mass at 0 is about 1% positive: the fit must say so there.
        let p0 = fit.probability(0.0);
        assert!(p0 > 0.002 && p0 < 0.05, "{fit:?} → P(0) = {p0}");
    }
}
