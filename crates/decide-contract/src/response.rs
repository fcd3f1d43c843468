//! What a model answers: one typed answer per question, plus metadata.

use std::ops::{Add, AddAssign};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::error::{AnswerKind, DecisionError, Result};
use crate::serde_util::ordered_entries;

/// How far outside its range a value may drift (float rounding in a softmax, say) and still be
/// clamped instead of rejected.
pub const TOLERANCE: f64 = 1e-6;

/// `value` clamped into `[low, high]` when it is within [`TOLERANCE`] of it, otherwise a message.
pub(crate) fn clamp_into(value: f64, low: f64, high: f64, what: &str) -> Result<f64, String> {
    if value.is_nan() || value < low - TOLERANCE || value > high + TOLERANCE {
        return Err(format!("{what} {value} is outside [{low}, {high}]"));
    }
    Ok(value.clamp(low, high))
}

fn unit(value: f64, what: &str) -> Result<f64> {
    clamp_into(value, 0.0, 1.0, what).map_err(DecisionError::InvalidResponse)
}

/// The answer to a [`YesNoQuestion`](crate::YesNoQuestion): the probability of "yes".
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawYesNoAnswer")]
pub struct YesNoAnswer {
    pub(crate) probability: f64,
}

impl YesNoAnswer {
    /// An answer with P(yes) = `probability`, which must lie in [0, 1]; values within
    /// [`TOLERANCE`] of it are clamped, anything else (NaN included) is rejected.
    pub fn new(probability: f64) -> Result<Self> {
        Ok(Self {
            probability: unit(probability, "probability")?,
        })
    }

    /// P(yes), in [0, 1].
    pub fn probability(&self) -> f64 {
        self.probability
    }

    /// Whether P(yes) reaches `threshold`.
    pub fn is_yes(&self, threshold: f64) -> bool {
        self.probability >= threshold
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawYesNoAnswer {
    probability: f64,
}

impl TryFrom<RawYesNoAnswer> for YesNoAnswer {
    type Error = DecisionError;

    fn try_from(raw: RawYesNoAnswer) -> Result<Self> {
        Self::new(raw.probability)
    }
}

/// The answer to a [`ChoiceQuestion`](crate::ChoiceQuestion).
///
/// `probabilities` may be empty: a model that cannot report them leaves them out instead of
/// inventing values, and everything derived from them then fails with
/// [`DecisionError::NoProbabilities`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawChoiceAnswer")]
pub struct ChoiceAnswer {
    pub(crate) value: String,
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    pub(crate) probabilities: IndexMap<String, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) confidence: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) options: Vec<String>,
}

impl ChoiceAnswer {
    /// An answer that picks `value`, without probabilities.
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            probabilities: IndexMap::new(),
            confidence: None,
            options: Vec::new(),
        }
    }

    /// An answer that picks the most probable option (the first one on a tie).
    pub fn from_probabilities<I, S>(probabilities: I) -> Result<Self>
    where
        I: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        let probabilities = checked_probabilities(probabilities)?;
        let value = probabilities
            .iter()
            .fold(None::<(&String, f64)>, |best, (name, &p)| match best {
                Some((_, best_p)) if best_p >= p => best,
                _ => Some((name, p)),
            })
            .map(|(name, _)| name.clone())
            .ok_or_else(|| {
                DecisionError::InvalidResponse("a choice needs at least one probability".into())
            })?;
        Ok(Self {
            probabilities,
            ..Self::new(value)
        })
    }

    /// This answer with these probabilities, keyed by option; each must lie in [0, 1] (see
    /// [`YesNoAnswer::new`] for the tolerance) and no option may appear twice.
    pub fn with_probabilities<I, S>(mut self, probabilities: I) -> Result<Self>
    where
        I: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        self.probabilities = checked_probabilities(probabilities)?;
        Ok(self)
    }

    /// This answer with a confidence in [0, 1]; its formula is up to the model.
    pub fn with_confidence(mut self, confidence: f64) -> Result<Self> {
        self.confidence = Some(unit(confidence, "confidence")?);
        Ok(self)
    }

    /// The chosen option's name.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The reported probabilities by option, in the model's order; empty when not reported.
    pub fn probabilities(&self) -> &IndexMap<String, f64> {
        &self.probabilities
    }

    /// The model's confidence, if it reports one.
    pub fn confidence(&self) -> Option<f64> {
        self.confidence
    }

    /// The options the question offered, filled in by [`validate`](fn@crate::validate); empty on an
    /// answer that was never validated.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The probability of `option`: 0 for an offered option the model did not report.
    ///
    /// Fails with [`DecisionError::UnknownOption`] for an option the question did not offer
    /// (on an answer that was never validated, the offered options are taken to be the chosen
    /// value and the reported ones), and with [`DecisionError::NoProbabilities`] when the model
    /// reported none.
    pub fn probability_of(&self, option: &str) -> Result<f64> {
        let offered = if self.options.is_empty() {
            option == self.value || self.probabilities.contains_key(option)
        } else {
            self.options.iter().any(|o| o == option)
        };
        if !offered {
            let offered = if self.options.is_empty() {
                std::iter::once(self.value.clone())
                    .chain(
                        self.probabilities
                            .keys()
                            .filter(|k| **k != self.value)
                            .cloned(),
                    )
                    .collect()
            } else {
                self.options.clone()
            };
            return Err(DecisionError::UnknownOption {
                option: option.to_owned(),
                offered,
            });
        }
        if self.probabilities.is_empty() {
            return Err(DecisionError::NoProbabilities);
        }
        Ok(self.probabilities.get(option).copied().unwrap_or(0.0))
    }

    /// How far the best option leads: `max(0, p1 - max(p2, 1 - sum))`.
    ///
    /// The mass the model did not report is treated as if it all belonged to one other option,
    /// so a partial report never overstates the lead.
    pub fn margin(&self) -> Result<f64> {
        if self.probabilities.is_empty() {
            return Err(DecisionError::NoProbabilities);
        }
        let (mut p1, mut p2, mut sum) = (0.0_f64, 0.0_f64, 0.0_f64);
        for &p in self.probabilities.values() {
            sum += p;
            if p > p1 {
                p2 = p1;
                p1 = p;
            } else if p > p2 {
                p2 = p;
            }
        }
        Ok((p1 - p2.max(1.0 - sum)).max(0.0))
    }
}

fn checked_probabilities<I, S>(probabilities: I) -> Result<IndexMap<String, f64>>
where
    I: IntoIterator<Item = (S, f64)>,
    S: Into<String>,
{
    let mut checked = IndexMap::new();
    for (option, p) in probabilities {
        let option = option.into();
        let p = unit(p, &format!("probability of '{option}'"))?;
        if checked.contains_key(&option) {
            return Err(DecisionError::InvalidResponse(format!(
                "probability of '{option}' given twice"
            )));
        }
        checked.insert(option, p);
    }
    Ok(checked)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChoiceAnswer {
    value: String,
    #[serde(default, deserialize_with = "ordered_entries")]
    probabilities: Vec<(String, f64)>,
    #[serde(default)]
    confidence: Option<f64>,
    #[serde(default)]
    options: Vec<String>,
}

impl TryFrom<RawChoiceAnswer> for ChoiceAnswer {
    type Error = DecisionError;

    fn try_from(raw: RawChoiceAnswer) -> Result<Self> {
        let mut answer = Self::new(raw.value).with_probabilities(raw.probabilities)?;
        if let Some(c) = raw.confidence {
            answer = answer.with_confidence(c)?;
        }
        answer.options = raw.options;
        Ok(answer)
    }
}

/// The answer to a [`ScaleQuestion`](crate::ScaleQuestion): where on the scale the input lies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawScaleAnswer")]
pub struct ScaleAnswer {
    pub(crate) mean: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) probabilities: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) confidence: Option<f64>,
}

impl ScaleAnswer {
    /// An answer at level `mean` (fractional levels allowed), without probabilities. The mean must
    /// be finite and not negative; the upper bound depends on the question and is checked by
    /// [`validate`](fn@crate::validate).
    pub fn new(mean: f64) -> Result<Self> {
        Ok(Self {
            mean: checked_mean(mean)?,
            probabilities: Vec::new(),
            confidence: None,
        })
    }

    /// An answer from one probability per level (lowest first); the mean is the
    /// probability-weighted mean of the level indexes, normalised by the total mass.
    pub fn from_probabilities(probabilities: Vec<f64>) -> Result<Self> {
        let probabilities = checked_levels(probabilities)?;
        let total: f64 = probabilities.iter().sum();
        if total <= 0.0 {
            return Err(DecisionError::InvalidResponse(
                "scale probabilities must not all be 0".into(),
            ));
        }
        let weighted: f64 = probabilities
            .iter()
            .enumerate()
            .map(|(i, p)| i as f64 * p)
            .sum();
        Ok(Self {
            mean: weighted / total,
            probabilities,
            confidence: None,
        })
    }

    /// This answer with one probability per level, each in [0, 1]; the mean is kept.
    pub fn with_probabilities(mut self, probabilities: Vec<f64>) -> Result<Self> {
        self.probabilities = checked_levels(probabilities)?;
        Ok(self)
    }

    /// This answer with a confidence in [0, 1]; its formula is up to the model.
    pub fn with_confidence(mut self, confidence: f64) -> Result<Self> {
        self.confidence = Some(unit(confidence, "confidence")?);
        Ok(self)
    }

    /// The probability-weighted mean level index, in [0, n-1].
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The nearest level index to the mean.
    pub fn level_index(&self) -> usize {
        // The mean is finite and non-negative, and `as` saturates, so this cannot wrap.
        self.mean.round() as usize
    }

    /// One probability per level, lowest first; empty when not reported.
    pub fn probabilities(&self) -> &[f64] {
        &self.probabilities
    }

    /// The model's confidence, if it reports one.
    pub fn confidence(&self) -> Option<f64> {
        self.confidence
    }
}

fn checked_mean(mean: f64) -> Result<f64> {
    if !mean.is_finite() {
        return Err(DecisionError::InvalidResponse(format!(
            "scale mean {mean} is not finite"
        )));
    }
    if mean < -TOLERANCE {
        return Err(DecisionError::InvalidResponse(format!(
            "scale mean {mean} is negative"
        )));
    }
    Ok(mean.max(0.0))
}

fn checked_levels(probabilities: Vec<f64>) -> Result<Vec<f64>> {
    probabilities
        .into_iter()
        .enumerate()
        .map(|(i, p)| unit(p, &format!("probability of level {i}")))
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScaleAnswer {
    mean: f64,
    #[serde(default)]
    probabilities: Vec<f64>,
    #[serde(default)]
    confidence: Option<f64>,
}

impl TryFrom<RawScaleAnswer> for ScaleAnswer {
    type Error = DecisionError;

    fn try_from(raw: RawScaleAnswer) -> Result<Self> {
        let mut answer = Self::new(raw.mean)?.with_probabilities(raw.probabilities)?;
        if let Some(c) = raw.confidence {
            answer = answer.with_confidence(c)?;
        }
        Ok(answer)
    }
}

/// One answer of a response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Answer {
    /// Answers a yes/no question.
    YesNo(YesNoAnswer),
    /// Answers a choice question.
    Choice(ChoiceAnswer),
    /// Answers a scale question.
    Scale(ScaleAnswer),
    /// The model declined to answer this question; the other questions can still have answers.
    Refusal {
        /// Why, when the model says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl Answer {
    /// A yes/no answer; see [`YesNoAnswer::new`].
    pub fn yes_no(probability: f64) -> Result<Self> {
        YesNoAnswer::new(probability).map(Self::YesNo)
    }

    /// A refusal without a reason.
    pub fn refusal() -> Self {
        Self::Refusal { reason: None }
    }

    /// A refusal with a reason.
    pub fn refusal_because(reason: impl Into<String>) -> Self {
        Self::Refusal {
            reason: Some(reason.into()),
        }
    }

    /// The kind of answer.
    pub fn kind(&self) -> AnswerKind {
        match self {
            Self::YesNo(_) => AnswerKind::YesNo,
            Self::Choice(_) => AnswerKind::Choice,
            Self::Scale(_) => AnswerKind::Scale,
            Self::Refusal { .. } => AnswerKind::Refusal,
        }
    }

    /// Whether the model declined to answer.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Refusal { .. })
    }
}

impl From<YesNoAnswer> for Answer {
    fn from(a: YesNoAnswer) -> Self {
        Self::YesNo(a)
    }
}

impl From<ChoiceAnswer> for Answer {
    fn from(a: ChoiceAnswer) -> Self {
        Self::Choice(a)
    }
}

impl From<ScaleAnswer> for Answer {
    fn from(a: ScaleAnswer) -> Self {
        Self::Scale(a)
    }
}

/// How many tokens a call used. Decision models generate nothing, so only input is counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Tokens read, over every question of the call.
    pub input_tokens: u64,
}

impl TokenUsage {
    /// Usage of `input_tokens` tokens.
    pub fn new(input_tokens: u64) -> Self {
        Self { input_tokens }
    }
}

// Summing lets callers that split one decision into several calls report one total.
impl Add for TokenUsage {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
        }
    }
}

impl AddAssign for TokenUsage {
    fn add_assign(&mut self, other: Self) {
        *self = *self + other;
    }
}

/// A model's answers to the questions of one request, plus metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawResponse")]
pub struct DecisionResponse {
    pub(crate) answers: IndexMap<String, Answer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_usage: Option<TokenUsage>,
}

impl DecisionResponse {
    /// Starts an empty response.
    pub fn builder() -> DecisionResponseBuilder {
        DecisionResponseBuilder::default()
    }

    /// A builder holding this response's answers and metadata.
    pub fn to_builder(&self) -> DecisionResponseBuilder {
        DecisionResponseBuilder {
            answers: self
                .answers
                .iter()
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect(),
            model_name: self.model_name.clone(),
            token_usage: self.token_usage,
        }
    }

    /// The answers by question name.
    pub fn answers(&self) -> &IndexMap<String, Answer> {
        &self.answers
    }

    /// The answer to question `name`, whatever its kind.
    pub fn answer(&self, name: &str) -> Result<&Answer> {
        self.answers
            .get(name)
            .ok_or_else(|| DecisionError::UnknownAnswer {
                name: name.to_owned(),
                available: self.answers.keys().cloned().collect(),
            })
    }

    /// The yes/no answer to question `name`.
    pub fn yes_no(&self, name: &str) -> Result<&YesNoAnswer> {
        match self.answer(name)? {
            Answer::YesNo(a) => Ok(a),
            other => Err(self.not_a(name, AnswerKind::YesNo, other)),
        }
    }

    /// The choice answer to question `name`.
    pub fn choice(&self, name: &str) -> Result<&ChoiceAnswer> {
        match self.answer(name)? {
            Answer::Choice(a) => Ok(a),
            other => Err(self.not_a(name, AnswerKind::Choice, other)),
        }
    }

    /// The scale answer to question `name`.
    pub fn scale(&self, name: &str) -> Result<&ScaleAnswer> {
        match self.answer(name)? {
            Answer::Scale(a) => Ok(a),
            other => Err(self.not_a(name, AnswerKind::Scale, other)),
        }
    }

    /// Whether the model declined to answer question `name` (false when there is no such answer).
    pub fn is_refused(&self, name: &str) -> bool {
        self.answers.get(name).is_some_and(Answer::is_refusal)
    }

    /// The name of the model that answered, if the model says.
    pub fn model_name(&self) -> Option<&str> {
        self.model_name.as_deref()
    }

    /// How many tokens the call used, if the model says.
    pub fn token_usage(&self) -> Option<TokenUsage> {
        self.token_usage
    }

    /// The answers, consuming the response.
    pub fn into_answers(self) -> IndexMap<String, Answer> {
        self.answers
    }

    fn not_a(&self, name: &str, expected: AnswerKind, actual: &Answer) -> DecisionError {
        match actual {
            // A refusal is not a programming error like a wrong type, so it gets its own error.
            Answer::Refusal { reason } => DecisionError::Refused {
                name: name.to_owned(),
                reason: reason.clone(),
            },
            other => DecisionError::WrongAnswerType {
                name: name.to_owned(),
                expected,
                actual: other.kind(),
            },
        }
    }
}

/// Builds a [`DecisionResponse`]; all checks happen in [`build`](Self::build).
#[derive(Clone, Debug, Default)]
pub struct DecisionResponseBuilder {
    answers: Vec<(String, Answer)>,
    model_name: Option<String>,
    token_usage: Option<TokenUsage>,
}

impl DecisionResponseBuilder {
    /// Adds the answer to question `name`.
    pub fn answer(mut self, name: impl Into<String>, answer: impl Into<Answer>) -> Self {
        self.answers.push((name.into(), answer.into()));
        self
    }

    /// Adds several answers, in order.
    pub fn answers<I, S>(mut self, answers: I) -> Self
    where
        I: IntoIterator<Item = (S, Answer)>,
        S: Into<String>,
    {
        self.answers
            .extend(answers.into_iter().map(|(n, a)| (n.into(), a)));
        self
    }

    /// Sets the name of the model that answered.
    pub fn model_name(mut self, model_name: impl Into<String>) -> Self {
        self.model_name = Some(model_name.into());
        self
    }

    /// Sets the token usage.
    pub fn token_usage(mut self, token_usage: TokenUsage) -> Self {
        self.token_usage = Some(token_usage);
        self
    }

    /// Checks that there is at least one answer and that names are non-blank and unique.
    pub fn build(self) -> Result<DecisionResponse> {
        if self.answers.is_empty() {
            return Err(DecisionError::InvalidResponse(
                "a decision response needs at least one answer".into(),
            ));
        }
        let mut answers = IndexMap::with_capacity(self.answers.len());
        for (name, answer) in self.answers {
            if name.trim().is_empty() {
                return Err(DecisionError::InvalidResponse(format!(
                    "a {} answer has a blank name",
                    answer.kind()
                )));
            }
            if answers.contains_key(&name) {
                return Err(DecisionError::InvalidResponse(format!(
                    "question '{name}' is answered twice"
                )));
            }
            answers.insert(name, answer);
        }
        Ok(DecisionResponse {
            answers,
            model_name: self.model_name,
            token_usage: self.token_usage,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    #[serde(deserialize_with = "ordered_entries")]
    answers: Vec<(String, Answer)>,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default)]
    token_usage: Option<TokenUsage>,
}

impl TryFrom<RawResponse> for DecisionResponse {
    type Error = DecisionError;

    fn try_from(raw: RawResponse) -> Result<Self> {
        let mut builder = DecisionResponse::builder().answers(raw.answers);
        builder.model_name = raw.model_name;
        builder.token_usage = raw.token_usage;
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    fn invalid<T: std::fmt::Debug>(result: Result<T>) -> String {
        match result {
            Err(DecisionError::InvalidResponse(msg)) => msg,
            other => panic!("expected InvalidResponse, got {other:?}"),
        }
    }

    // --- yes/no ---

    #[test]
    fn yes_no_threshold_is_inclusive() {
        let a = YesNoAnswer::new(0.5).unwrap();
        assert_eq!(a.probability(), 0.5);
        assert!(a.is_yes(0.5));
        assert!(!a.is_yes(0.51));
    }

    #[test]
    fn yes_no_clamps_rounding_noise() {
        assert_eq!(YesNoAnswer::new(1.0 + 5e-7).unwrap().probability(), 1.0);
        assert_eq!(YesNoAnswer::new(-5e-7).unwrap().probability(), 0.0);
    }

    #[test]
    fn yes_no_rejects_out_of_range_and_nan() {
        assert_eq!(
            invalid(YesNoAnswer::new(1.1)),
            "probability 1.1 is outside [0, 1]"
        );
        invalid(YesNoAnswer::new(-0.01));
        invalid(YesNoAnswer::new(f64::NAN));
        invalid(YesNoAnswer::new(f64::INFINITY));
    }

    // --- choice ---

    fn offered(answer: ChoiceAnswer, options: &[&str]) -> ChoiceAnswer {
        ChoiceAnswer {
            options: options.iter().map(|s| s.to_string()).collect(),
            ..answer
        }
    }

    #[test]
    fn from_probabilities_picks_the_first_best() {
        let a = ChoiceAnswer::from_probabilities([("a", 0.2), ("b", 0.4), ("c", 0.4)]).unwrap();
        assert_eq!(a.value(), "b");
        assert_eq!(a.probabilities().len(), 3);
        invalid(ChoiceAnswer::from_probabilities(Vec::<(String, f64)>::new()));
    }

    #[test]
    fn choice_probabilities_are_checked() {
        invalid(ChoiceAnswer::new("a").with_probabilities([("a", 1.5)]));
        invalid(ChoiceAnswer::new("a").with_probabilities([("a", f64::NAN)]));
        assert_eq!(
            invalid(ChoiceAnswer::new("a").with_probabilities([("a", 0.5), ("a", 0.5)])),
            "probability of 'a' given twice"
        );
        invalid(ChoiceAnswer::new("a").with_confidence(2.0));
        let a = ChoiceAnswer::new("a").with_confidence(0.75).unwrap();
        assert_eq!(a.confidence(), Some(0.75));
    }

    #[test]
    fn probability_of_reports_offered_options() {
        let a = offered(
            ChoiceAnswer::new("a")
                .with_probabilities([("a", 0.7), ("b", 0.2)])
                .unwrap(),
            &["a", "b", "c"],
        );
        assert_eq!(a.probability_of("a").unwrap(), 0.7);
        assert_eq!(a.probability_of("b").unwrap(), 0.2);
        assert_eq!(
            a.probability_of("c").unwrap(),
            0.0,
            "offered but unreported"
        );
    }

    #[test]
    fn probability_of_rejects_unknown_option() {
        let a = offered(
            ChoiceAnswer::new("a")
                .with_probabilities([("a", 0.7)])
                .unwrap(),
            &["a", "b"],
        );
        match a.probability_of("A") {
            Err(DecisionError::UnknownOption { option, offered }) => {
                assert_eq!(option, "A");
                assert_eq!(offered, ["a", "b"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn probability_of_without_probabilities_fails() {
        let a = offered(ChoiceAnswer::new("a"), &["a", "b"]);
        assert!(matches!(
            a.probability_of("a"),
            Err(DecisionError::NoProbabilities)
        ));
    }

    #[test]
    fn probability_of_unvalidated_answer_uses_reported_options() {
        let a = ChoiceAnswer::new("a")
            .with_probabilities([("b", 0.3)])
            .unwrap();
        assert_eq!(a.probability_of("a").unwrap(), 0.0);
        assert_eq!(a.probability_of("b").unwrap(), 0.3);
        assert!(matches!(
            a.probability_of("c"),
            Err(DecisionError::UnknownOption { .. })
        ));
    }

    #[test]
    fn margin_is_top1_minus_top2() {
        let a = ChoiceAnswer::from_probabilities([("a", 0.2), ("b", 0.7), ("c", 0.1)]).unwrap();
        assert!(close(a.margin().unwrap(), 0.5));
    }

    #[test]
    fn margin_counts_unreported_mass_as_one_rival() {
        // Only 0.6 of the mass is reported: the missing 0.4 beats the reported runner-up 0.1.
        let a = ChoiceAnswer::from_probabilities([("a", 0.5), ("b", 0.1)]).unwrap();
        assert!(close(a.margin().unwrap(), 0.1));
        // A single reported option still leads only by what is known.
        let a = ChoiceAnswer::from_probabilities([("a", 0.3)]).unwrap();
        assert_eq!(a.margin().unwrap(), 0.0, "never negative");
    }

    #[test]
    fn margin_without_probabilities_fails() {
        assert!(matches!(
            ChoiceAnswer::new("a").margin(),
            Err(DecisionError::NoProbabilities)
        ));
    }

    // --- scale ---

    #[test]
    fn scale_mean_from_probabilities() {
        let a = ScaleAnswer::from_probabilities(vec![0.2, 0.3, 0.5]).unwrap();
        assert!(close(a.mean(), 1.3));
        assert_eq!(a.level_index(), 1);
        // Unnormalised mass is normalised rather than trusted.
        let a = ScaleAnswer::from_probabilities(vec![0.0, 0.5]).unwrap();
        assert!(close(a.mean(), 1.0));
        invalid(ScaleAnswer::from_probabilities(vec![0.0, 0.0]));
        invalid(ScaleAnswer::from_probabilities(vec![]));
    }

    #[test]
    fn scale_mean_must_be_finite_and_non_negative() {
        invalid(ScaleAnswer::new(f64::NAN));
        invalid(ScaleAnswer::new(f64::INFINITY));
        invalid(ScaleAnswer::new(-1.0));
        assert_eq!(ScaleAnswer::new(-1e-7).unwrap().mean(), 0.0);
        let a = ScaleAnswer::new(2.0)
            .unwrap()
            .with_probabilities(vec![0.0, 0.0, 1.0])
            .unwrap()
            .with_confidence(0.9)
            .unwrap();
        assert_eq!(a.probabilities(), [0.0, 0.0, 1.0]);
        assert_eq!(a.confidence(), Some(0.9));
        invalid(ScaleAnswer::new(1.0).unwrap().with_probabilities(vec![2.0]));
    }

    // --- token usage ---

    #[test]
    fn token_usage_adds_up() {
        let mut total = TokenUsage::new(3) + TokenUsage::new(4);
        total += TokenUsage::new(u64::MAX);
        assert_eq!(total.input_tokens, u64::MAX);
    }

    // --- response ---

    fn response() -> DecisionResponse {
        DecisionResponse::builder()
            .answer("urgent", Answer::yes_no(0.8).unwrap())
            .answer("route", ChoiceAnswer::new("a"))
            .answer("level", ScaleAnswer::new(1.0).unwrap())
            .answer("topic", Answer::refusal_because("policy"))
            .model_name("m")
            .token_usage(TokenUsage::new(12))
            .build()
            .unwrap()
    }

    #[test]
    fn typed_accessors() {
        let r = response();
        assert_eq!(r.yes_no("urgent").unwrap().probability(), 0.8);
        assert_eq!(r.choice("route").unwrap().value(), "a");
        assert_eq!(r.scale("level").unwrap().mean(), 1.0);
        assert_eq!(r.model_name(), Some("m"));
        assert_eq!(r.token_usage(), Some(TokenUsage::new(12)));
        let names: Vec<_> = r.answers().keys().map(String::as_str).collect();
        assert_eq!(names, ["urgent", "route", "level", "topic"]);
    }

    #[test]
    fn unknown_answer_lists_available_names() {
        let err = response().answer("nope").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no answer named 'nope' (available: urgent, route, level, topic)"
        );
    }

    #[test]
    fn wrong_answer_type_is_an_error() {
        let err = response().choice("urgent").unwrap_err();
        assert!(matches!(
            err,
            DecisionError::WrongAnswerType {
                expected: AnswerKind::Choice,
                actual: AnswerKind::YesNo,
                ..
            }
        ));
    }

    #[test]
    fn refused_answers() {
        let r = response();
        assert!(r.is_refused("topic"));
        assert!(!r.is_refused("urgent"));
        assert!(!r.is_refused("missing"));
        let err = r.yes_no("topic").unwrap_err();
        assert_eq!(err.to_string(), "question 'topic' was refused: policy");
    }

    #[test]
    fn builder_rejects_empty_blank_and_duplicate() {
        invalid(DecisionResponse::builder().build());
        invalid(
            DecisionResponse::builder()
                .answer(" ", Answer::refusal())
                .build(),
        );
        assert_eq!(
            invalid(
                DecisionResponse::builder()
                    .answer("q", Answer::refusal())
                    .answer("q", Answer::refusal())
                    .build()
            ),
            "question 'q' is answered twice"
        );
    }

    #[test]
    fn response_json_round_trip() {
        let r = DecisionResponse::builder()
            .answer("urgent", Answer::yes_no(0.8).unwrap())
            .answer(
                "route",
                ChoiceAnswer::from_probabilities([("a", 0.6), ("b", 0.4)])
                    .unwrap()
                    .with_confidence(0.2)
                    .unwrap(),
            )
            .answer(
                "level",
                ScaleAnswer::from_probabilities(vec![0.5, 0.5]).unwrap(),
            )
            .answer("topic", Answer::refusal())
            .token_usage(TokenUsage::new(5))
            .build()
            .unwrap();
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["answers"]["urgent"],
            json!({"type": "yes_no", "probability": 0.8})
        );
        assert_eq!(json["answers"]["topic"], json!({"type": "refusal"}));
        let back: DecisionResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn response_json_is_checked() {
        assert!(serde_json::from_value::<DecisionResponse>(json!({
            "answers": {"q": {"type": "yes_no", "probability": 2.0}}
        }))
        .is_err());
        assert!(serde_json::from_value::<DecisionResponse>(json!({"answers": {}})).is_err());
    }
}
