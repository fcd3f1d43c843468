//! A cascade: a fast model shortlists, a slow one rescores the shortlist; see [`Cascade`].

use std::sync::Arc;

use decide_contract::{
    DecisionError, DecisionModel, DecisionRequest, DecisionRequestParameters, DecisionResponse,
    Question, YesNoAnswer,
};

use super::{Scorer, ScorerInfo};

/// How many questions the rescorer sees by default.
pub const DEFAULT_TOP_K: usize = 20;

/// A cascade: a fast model shortlists, a slow one rescores the shortlist.
///
/// A bi-encoder scores a 1,000-tool catalogue in one forward pass for the conversation (tool
/// embeddings are cached); a cross-encoder reads every (conversation, tool) pair and is more
/// accurate, but costs a forward pass per pair. [`Cascade`] gets most of the accuracy at a small
/// part of the cost: the shortlist model answers every yes/no question of a request, the
/// `top_k` most probable go to the rescorer, and the rescorer's answers replace the
/// shortlist's for those. Questions outside the shortlist were less probable than every
/// shortlisted one by the shortlist's judgement, so they stay below the rescorer's answers:
/// when the most probable of them would outrank the rescorer's least probable answer, all of
/// them are scaled down in proportion until it no longer does (their order kept).
///
/// Choice and scale questions, and requests with no more yes/no questions than `top_k`, go to
/// the rescorer alone: there is nothing to save. Both models are any
/// [`DecisionModel`](decide_contract::DecisionModel), so the cascade can stack an
/// [`Engine`](crate::Engine), [`Bm25Model`](crate::Bm25Model) or a remote model; a cascade
/// of two [`Scorer`]s is a [`Scorer`] too.
pub struct Cascade<M: ?Sized = dyn DecisionModel> {
    shortlist: Arc<M>,
    rescorer: Arc<M>,
    top_k: usize,
}

impl<M: ?Sized> Clone for Cascade<M> {
    fn clone(&self) -> Self {
        Self {
            shortlist: self.shortlist.clone(),
            rescorer: self.rescorer.clone(),
            top_k: self.top_k,
        }
    }
}

impl<M: ?Sized> std::fmt::Debug for Cascade<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cascade")
            .field("top_k", &self.top_k)
            .finish_non_exhaustive()
    }
}

impl<M: DecisionModel + ?Sized> Cascade<M> {
    /// A cascade that sends the `top_k` most probable yes/no questions of `shortlist` to
    /// `rescorer`. `top_k` must be at least 1.
    pub fn new(shortlist: Arc<M>, rescorer: Arc<M>, top_k: usize) -> Result<Self, DecisionError> {
        if top_k == 0 {
            return Err(DecisionError::InvalidRequest(
                "a cascade's top_k must be at least 1".into(),
            ));
        }
        Ok(Self {
            shortlist,
            rescorer,
            top_k,
        })
    }

    /// How many questions the rescorer sees.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The request with only the `names` questions, same input.
    fn subset(
        request: &DecisionRequest,
        names: &[&String],
    ) -> Result<DecisionRequest, DecisionError> {
        let mut builder = DecisionRequest::builder().input(request.input().clone());
        for name in names {
            if let Some(q) = request.question(name) {
                builder = builder.question((*name).clone(), q.clone());
            }
        }
        builder.build()
    }
}

impl<M: DecisionModel + ?Sized> DecisionModel for Cascade<M> {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse, DecisionError> {
        let questions = request.questions();
        let all_yes_no = questions.values().all(|q| matches!(q, Question::YesNo(_)));
        // Whether any tool is needed is a question about the conversation, not one to rank:
        // the shortlist answers it.
        let is_gate = |q: &Question| matches!(q, Question::YesNo(y) if y.is_needs_tool());
        let ranked_names: Vec<&String> = questions
            .iter()
            .filter(|(_, q)| !is_gate(q))
            .map(|(name, _)| name)
            .collect();
        if !all_yes_no || ranked_names.len() <= self.top_k {
            return self.rescorer.decide(request);
        }
        let first = self.shortlist.decide(request)?;
        let mut ranked: Vec<(&String, f64)> = ranked_names
            .into_iter()
            .map(|name| {
                first
                    .yes_no(name)
                    .map(|a| (name, a.probability()))
                    .map_err(|e| DecisionError::model(format!("shortlist: {e}")))
            })
            .collect::<Result<_, _>>()?;
        // Stable: equal probabilities keep the request's order.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let top: std::collections::HashSet<&String> =
            ranked.iter().take(self.top_k).map(|(n, _)| *n).collect();
        // In the request's order, so the rescorer sees the questions as the caller wrote them.
        let chosen: Vec<&String> = questions.keys().filter(|n| top.contains(n)).collect();
        let second = self.rescorer.decide(&Self::subset(request, &chosen)?)?;

        let mut response = DecisionResponse::builder();
        if let Some(name) = second.model_name() {
            response = response.model_name(name.to_string());
        }
        let usage = match (first.token_usage(), second.token_usage()) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        if let Some(usage) = usage {
            response = response.token_usage(usage);
        }
        // The rescorer's least probable shortlisted answer, and the shortlist's most probable
        // answer outside it: the outsiders are scaled down together, in proportion, so that none
        // outranks a tool the rescorer judged (whose probabilities may sit on another scale)
        // and they keep their order among themselves.
        let floor = chosen
            .iter()
            .filter_map(|n| second.yes_no(n).ok().map(|a| a.probability()))
            .fold(f64::INFINITY, f64::min);
        let ceiling = ranked
            .iter()
            .skip(self.top_k)
            .map(|(_, p)| *p)
            .fold(0.0, f64::max);
        let scale = if ceiling > 0.0 && floor.is_finite() && ceiling >= floor {
            // Strictly below the floor, so that ties never put an outsider first.
            floor / ceiling * (1.0 - 1e-6)
        } else {
            1.0
        };
        for (name, question) in questions {
            if let Some(answer) = second.answers().get(name) {
                response = response.answer(name.clone(), answer.clone());
                continue;
            }
            if is_gate(question) {
                let answer = first.answer(name)?;
                response = response.answer(name.clone(), answer.clone());
                continue;
            }
            let p = first
                .yes_no(name)
                .map_err(|e| DecisionError::model(format!("shortlist: {e}")))?
                .probability();
            response = response.answer(name.clone(), YesNoAnswer::new(p * scale)?);
        }
        response.build()
    }

    fn default_request_parameters(&self) -> DecisionRequestParameters {
        // The two models apply their own defaults to the requests they get.
        DecisionRequestParameters::default()
    }

    /// The shortlist's: it answers whether any tool is needed, and its calibration is the one
    /// the command line and the server selected with before the rescorer was added.
    fn selection_hints(&self) -> decide_contract::SelectionHints {
        self.shortlist.selection_hints()
    }
}

impl Scorer for Cascade<dyn Scorer> {
    /// Both names and devices; no calibration, since the probabilities come from two; the
    /// shortlist's needs-tool head, since it answers the needs-tool question; nothing else, as
    /// the cascade has no files of its own.
    fn about(&self) -> ScorerInfo<'_> {
        let (shortlist, rescorer) = (self.shortlist.about(), self.rescorer.about());
        let device = if shortlist.device == rescorer.device {
            shortlist.device
        } else {
            format!("{} + {}", shortlist.device, rescorer.device)
        };
        ScorerInfo {
            needs_tool: shortlist.needs_tool,
            ..ScorerInfo::new(
                format!("{} → {}", shortlist.name, rescorer.name),
                device,
                None,
            )
        }
    }

    fn yes_no_scores(
        &self,
        _request: &DecisionRequest,
    ) -> Result<Vec<(String, f64)>, DecisionError> {
        Err(DecisionError::UnsupportedFeature(
            "a cascade has two calibrations: calibrate each model alone".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decide_contract::{DecisionInput, MockDecisionModel, YesNoQuestion};

    fn request(n: usize) -> DecisionRequest {
        let mut b = DecisionRequest::builder().input(DecisionInput::Text("hello".into()));
        for i in 0..n {
            b = b.question(
                format!("tool{i}"),
                YesNoQuestion::builder("needed?")
                    .candidate(format!("t{i}"), "a tool")
                    .build()
                    .unwrap(),
            );
        }
        b.build().unwrap()
    }

    fn index(q: &YesNoQuestion) -> f64 {
        q.candidate().unwrap().name[1..].parse::<f64>().unwrap()
    }

    #[test]
    fn only_the_top_k_reach_the_rescorer_and_their_answers_win() {
        // The shortlist prefers high indexes; the rescorer says 0.99 to everything it sees.
        let shortlist = Arc::new(MockDecisionModel::answers_yes_no(|q| index(q) / 100.0));
        let rescorer = Arc::new(MockDecisionModel::answers_yes_no(|_| 0.99));
        let cascade = Cascade::new(shortlist.clone(), rescorer.clone(), 3).unwrap();
        let response = cascade.decide(&request(10)).unwrap();
        let seen = rescorer.request().unwrap();
        let names: Vec<&String> = seen.questions().keys().collect();
        assert_eq!(names, ["tool7", "tool8", "tool9"]);
        for i in 0..10 {
            let p = response.yes_no(&format!("tool{i}")).unwrap().probability();
            let want = if i >= 7 { 0.99 } else { i as f64 / 100.0 };
            assert_eq!(p, want, "tool{i}");
        }
        // The answers come back in the request's order.
        let order: Vec<&String> = response.answers().keys().collect();
        assert_eq!(order.first().map(|s| s.as_str()), Some("tool0"));
        assert_eq!(shortlist.requests().len(), 1);
    }

    #[test]
    fn outsiders_stay_below_the_rescored_shortlist_and_keep_their_order() {
        // The rescorer is far less generous than the shortlist: without scaling, tool6 (0.06)
        // would outrank every rescored tool (0.01 to 0.03).
        let shortlist = Arc::new(MockDecisionModel::answers_yes_no(|q| index(q) / 100.0));
        let rescorer = Arc::new(MockDecisionModel::answers_yes_no(|q| {
            (index(q) - 6.0) / 100.0
        }));
        let cascade = Cascade::new(shortlist, rescorer, 3).unwrap();
        let response = cascade.decide(&request(10)).unwrap();
        let p = |i: usize| response.yes_no(&format!("tool{i}")).unwrap().probability();
        assert_eq!((p(7), p(8), p(9)), (0.01, 0.02, 0.03));
        assert!(p(6) < p(7), "{} vs {}", p(6), p(7));
        for i in 1..6 {
            assert!(p(i) < p(i + 1) && p(i) > 0.0, "tool{i}");
        }
        // Scaled in proportion: tool3 is half of tool6.
        assert!((p(3) - p(6) / 2.0).abs() < 1e-12);
    }

    #[test]
    fn small_requests_skip_the_shortlist() {
        let shortlist = Arc::new(MockDecisionModel::always_fails());
        let rescorer = Arc::new(MockDecisionModel::answers_yes_no(|_| 0.5));
        let cascade = Cascade::new(shortlist.clone(), rescorer, 5).unwrap();
        assert!(cascade.decide(&request(5)).is_ok());
        assert!(shortlist.requests().is_empty());
        assert!(Cascade::new(shortlist.clone(), shortlist, 0).is_err());
    }

    #[test]
    fn a_failing_shortlist_fails_the_decision() {
        let cascade = Cascade::new(
            Arc::new(MockDecisionModel::always_fails()),
            Arc::new(MockDecisionModel::answers_yes_no(|_| 0.5)),
            2,
        )
        .unwrap();
        assert!(cascade.decide(&request(4)).is_err());
    }
}
