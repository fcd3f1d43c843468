//! The engine as a [`DecisionModel`]: questions become (input, document) pairs, one batched
//! scoring call answers them all.

use decide_contract::indexmap::IndexSet;
use decide_contract::{
    Answer, ChoiceAnswer, DecisionError, DecisionFuture, DecisionRequest,
    DecisionRequestParameters, DecisionResponse, Question, ScaleAnswer, TokenUsage, YesNoAnswer,
};

use crate::calibration::{sigmoid, softmax, Calibration};
use crate::engine::Engine;
use crate::staged::{EncodedRow, StagedScores};

/// The text a candidate is scored as: `name: description`, or the name alone when the
/// description adds nothing.
pub fn candidate_text(name: &str, description: &str) -> String {
    let description = description.trim();
    if description.is_empty() || description == name {
        name.to_string()
    } else {
        format!("{name}: {description}")
    }
}

/// Which documents a question needs, as indexes into the request's deduplicated documents.
pub(crate) enum Plan {
    YesNo { yes: usize, no: Option<usize> },
    Options(Vec<usize>),
}

/// The request's distinct documents, in first-seen order; a question refers to them by index.
#[derive(Default)]
pub(crate) struct Documents(IndexSet<String>);

impl Documents {
    // A set rather than a searched list: a catalogue of 1,000 tools would cost half a million
    // string comparisons a decision.
    fn add(&mut self, text: String) -> usize {
        self.0.insert_full(text).0
    }

    /// The documents as text, in index order.
    pub(crate) fn refs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }
}

pub(crate) fn plan(request: &DecisionRequest) -> (Documents, Vec<Plan>) {
    let mut docs = Documents::default();
    let mut plans = Vec::new();
    for question in request.questions().values() {
        plans.push(match question {
            Question::YesNo(q) => {
                let yes = match (q.yes_when(), q.candidate()) {
                    (Some(when), _) => when.to_string(),
                    (None, Some(c)) => candidate_text(&c.name, &c.description),
                    (None, None) => q.text().to_string(),
                };
                Plan::YesNo {
                    yes: docs.add(yes),
                    no: q.no_when().map(|n| docs.add(n.to_string())),
                }
            }
            Question::Choice(q) => Plan::Options(
                q.options()
                    .iter()
                    .map(|o| docs.add(candidate_text(&o.name, &o.description)))
                    .collect(),
            ),
            Question::Scale(q) => Plan::Options(
                q.levels()
                    .iter()
                    .map(|l| {
                        docs.add(candidate_text(
                            &l.label,
                            l.description.as_deref().unwrap_or(""),
                        ))
                    })
                    .collect(),
            ),
        });
    }
    (docs, plans)
}

fn answer(
    question: &Question,
    plan: &Plan,
    scores: &[f64],
    cal: Calibration,
) -> Result<Answer, DecisionError> {
    Ok(match (question, plan) {
        (Question::YesNo(_), Plan::YesNo { yes, no }) => {
            let p = match no {
                // Both criteria given: which one the input matches better decides, so the
                // offset cancels and only the slope applies.
                Some(no) => sigmoid(cal.a * (scores[*yes] - scores[*no])),
                None => cal.probability(scores[*yes]),
            };
            Answer::YesNo(YesNoAnswer::new(p)?)
        }
        (Question::Choice(q), Plan::Options(idx)) => {
            let logits: Vec<f64> = idx.iter().map(|&i| cal.a * scores[i]).collect();
            let probs = softmax(&logits);
            let best = argmax(&probs);
            let names: Vec<String> = q.options().iter().map(|o| o.name.clone()).collect();
            Answer::Choice(
                ChoiceAnswer::new(names[best].clone())
                    .with_probabilities(names.into_iter().zip(probs.iter().copied()))?
                    .with_confidence(probs[best])?,
            )
        }
        (Question::Scale(_), Plan::Options(idx)) => {
            let logits: Vec<f64> = idx.iter().map(|&i| cal.a * scores[i]).collect();
            let probs = softmax(&logits);
            let mean = probs.iter().enumerate().map(|(i, p)| i as f64 * p).sum();
            let confidence = probs[argmax(&probs)];
            Answer::Scale(
                ScaleAnswer::new(mean)?
                    .with_probabilities(probs)?
                    .with_confidence(confidence)?,
            )
        }
        _ => {
            return Err(DecisionError::UnsupportedFeature(format!(
                "question type of '{}'",
                question.text()
            )))
        }
    })
}

fn argmax(v: &[f64]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

/// The raw score behind each yes/no question of `request`: its document's, or with both
/// criteria the difference of the two.
pub(crate) fn yes_no_raw(
    request: &DecisionRequest,
    plans: &[Plan],
    raw: &[f64],
) -> Result<Vec<(String, f64)>, DecisionError> {
    request
        .questions()
        .keys()
        .zip(plans)
        .map(|(name, plan)| match plan {
            Plan::YesNo { yes, no: None } => Ok((name.clone(), raw[*yes])),
            Plan::YesNo { yes, no: Some(no) } => Ok((name.clone(), raw[*yes] - raw[*no])),
            Plan::Options(_) => Err(DecisionError::UnsupportedFeature(format!(
                "question '{name}' is not a yes/no question"
            ))),
        })
        .collect()
}

/// The response to `request` from the raw scores of its documents.
pub(crate) fn respond(
    request: &DecisionRequest,
    plans: &[Plan],
    raw: &[f64],
    calibration: Calibration,
    model_name: &str,
    tokens: usize,
) -> Result<DecisionResponse, DecisionError> {
    let mut response = DecisionResponse::builder()
        .model_name(model_name.to_string())
        .token_usage(TokenUsage::new(tokens as u64));
    for ((name, question), plan) in request.questions().iter().zip(plans) {
        response = response.answer(name.clone(), answer(question, plan, raw, calibration)?);
    }
    response.build()
}

impl Engine {
    /// Adds `lexical_weight ·` BM25 coverage of the input to each document's score (hybrid
    /// scoring, see [`crate::lexical`]); nothing when the weight is zero.
    fn add_lexical(&self, input: &decide_contract::DecisionInput, docs: &[&str], raw: &mut [f64]) {
        let weight = self.lexical_weight();
        if weight == 0.0 || docs.is_empty() {
            return;
        }
        let coverage = self
            .inner
            .lexical
            .get(docs)
            .coverage(&crate::lexical::query_text(input));
        for (s, c) in raw.iter_mut().zip(coverage) {
            *s += weight * c;
        }
    }

    /// The raw score behind each yes/no answer of `request`, in question order, before
    /// calibration: the score of its document, or with both criteria the difference of the
    /// two. What `decide calibrate` fits on, so the fit sees exactly the scores decisions are
    /// made from.
    pub fn yes_no_scores(
        &self,
        request: &DecisionRequest,
    ) -> Result<Vec<(String, f64)>, DecisionError> {
        let (docs, plans) = plan(request);
        let refs = docs.refs();
        let mut scores = self
            .score_input(request.input(), &refs)
            .map_err(DecisionError::from_model_error)?;
        self.add_lexical(request.input(), &refs, &mut scores.raw);
        yes_no_raw(request, &plans, &scores.raw)
    }

    fn answer_request(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        let mut staged = self.stage_decision(request)?;
        let rows = staged.take_rows();
        let outputs = self
            .forward_rows(&rows)
            .map_err(DecisionError::from_model_error)?;
        staged.finish(outputs)
    }

    /// Stages a decision: checks the model name, plans every question's documents and
    /// tokenizes them with the input, without running the model. Run its rows
    /// ([`StagedDecision::take_rows`]), alone or with other requests' rows, through
    /// [`forward_rows`](Self::forward_rows), then [`StagedDecision::finish`] it.
    pub fn stage_decision(
        &self,
        request: &DecisionRequest,
    ) -> Result<StagedDecision, DecisionError> {
        // An engine holds one model: a request for another must fail, not be answered by this one.
        if let Some(asked) = request.model_name() {
            let info = self.info();
            if asked != info.name && Some(asked) != info.hf_id.as_deref() {
                return Err(DecisionError::UnsupportedFeature(format!(
                    "the request asks for model '{asked}', this engine runs '{}'",
                    info.name
                )));
            }
        }
        let calibration = self
            .calibration()
            .map_err(DecisionError::from_model_error)?;
        let (docs, plans) = plan(request);
        let refs = docs.refs();
        let scores = self
            .stage_input(request.input(), &refs)
            .map_err(DecisionError::from_model_error)?;
        let mut lexical = vec![0.0; refs.len()];
        self.add_lexical(request.input(), &refs, &mut lexical);
        Ok(StagedDecision {
            engine: self.clone(),
            request: request.clone(),
            plans,
            scores,
            lexical,
            calibration,
        })
    }
}

/// A decision whose rows wait for the model; see [`Engine::stage_decision`].
pub struct StagedDecision {
    engine: Engine,
    request: DecisionRequest,
    plans: Vec<Plan>,
    scores: StagedScores,
    /// The weighted lexical score of each document, added to the model's before calibration.
    lexical: Vec<f64>,
    calibration: Calibration,
}

impl StagedDecision {
    /// The rows still held (all of them until [`take_rows`](Self::take_rows)).
    pub fn rows(&self) -> &[EncodedRow] {
        self.scores.rows()
    }

    /// Takes the rows out, to run them elsewhere; their outputs go back to
    /// [`finish`](Self::finish) in the same order.
    pub fn take_rows(&mut self) -> Vec<EncodedRow> {
        self.scores.take_rows()
    }

    /// The answers, from the outputs of the staged rows (in the order they were taken).
    pub fn finish(self, outputs: Vec<Vec<f32>>) -> Result<DecisionResponse, DecisionError> {
        let engine = self.engine;
        let mut scores = engine
            .finish_scores(self.scores, outputs)
            .map_err(DecisionError::from_model_error)?;
        for (s, l) in scores.raw.iter_mut().zip(&self.lexical) {
            *s += l;
        }
        respond(
            &self.request,
            &self.plans,
            &scores.raw,
            self.calibration,
            &engine.info().name,
            scores.tokens,
        )
    }
}

impl decide_contract::DecisionModel for Engine {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        self.answer_request(request)
    }

    /// Runs inference off the async runtime: on tokio's blocking pool when called inside a
    /// runtime, on a thread of its own otherwise, so no runtime worker ever waits on the model.
    fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
        let engine = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = move || {
            let _ = tx.send(engine.answer_request(&request));
        };
        let spawned = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(job);
                Ok(())
            }
            Err(_) => std::thread::Builder::new()
                .name("decide-engine".into())
                .spawn(job)
                .map(|_| ()),
        };
        Box::pin(async move {
            spawned.map_err(DecisionError::from_model_error)?;
            rx.await.map_err(|_| {
                DecisionError::model("the inference thread stopped without an answer")
            })?
        })
    }

    fn default_request_parameters(&self) -> DecisionRequestParameters {
        DecisionRequestParameters::for_model(self.info().name.clone())
    }
}
