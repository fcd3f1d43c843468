//! The engine as a [`DecisionModel`]: questions become (input, document) pairs, one batched
//! scoring call answers them all.

use decide_contract::{
    DecisionError, DecisionFuture, DecisionInput, DecisionModel, DecisionRequest,
    DecisionRequestParameters, DecisionResponse, SelectionHints,
};

use super::staged::{EncodedRow, StagedScores};
use super::{Engine, Scores};
use crate::answering::{plan, respond, yes_no_raw, Plan, Scored, Scorer, ScorerInfo};
use crate::calibration::Calibration;
use crate::lexical::query_text;

impl Engine {
    /// `lexical_weight ·` BM25 coverage of the input for each document (hybrid scoring, see
    /// [`Bm25Index::coverage`](crate::Bm25Index::coverage)), added to the model's scores before calibration; zeros when the
    /// weight is zero.
    fn lexical_scores(&self, input: &DecisionInput, docs: &[&str]) -> Vec<f64> {
        let mut lexical = vec![0.0; docs.len()];
        let weight = self.lexical_weight();
        if weight == 0.0 || docs.is_empty() {
            return lexical;
        }
        let coverage = self.inner.lexical.get(docs).coverage(&query_text(input));
        for (s, c) in lexical.iter_mut().zip(coverage) {
            *s += weight * c;
        }
        lexical
    }

    /// Plans the request's documents and stages their scoring against its input.
    fn stage_documents(&self, request: &DecisionRequest) -> Result<Documents, DecisionError> {
        let (docs, plans) = plan(request, self.tool_parameters(), self.tool_server());
        let refs = docs.refs();
        // A request that asks only whether any tool is needed still needs the conversation's
        // embedding, when there is a head to read it.
        let head_alone = refs.is_empty()
            && self.info().needs_tool.is_some()
            && plans.iter().any(|p| matches!(p, Plan::NeedsTool));
        let scores = if head_alone {
            self.stage_conversation(request.input())
        } else {
            self.stage_input(request.input(), &refs)
        }
        .map_err(DecisionError::from_model_error)?;
        Ok(Documents {
            plans,
            scores,
            lexical: self.lexical_scores(request.input(), &refs),
        })
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
        Ok(StagedDecision {
            engine: self.clone(),
            request: request.clone(),
            documents: self.stage_documents(request)?,
            calibration,
        })
    }
}

/// A request's documents, planned and staged.
struct Documents {
    plans: Vec<Plan>,
    scores: StagedScores,
    /// The weighted lexical score of each document, added to the model's before calibration.
    lexical: Vec<f64>,
}

impl Documents {
    /// The raw score of each document, from the outputs of its staged rows.
    fn finish(
        self,
        engine: &Engine,
        outputs: Vec<Vec<f32>>,
    ) -> Result<(Vec<Plan>, Scores), DecisionError> {
        let mut scores = engine
            .finish_scores(self.scores, outputs)
            .map_err(DecisionError::from_model_error)?;
        for (s, l) in scores.raw.iter_mut().zip(&self.lexical) {
            *s += l;
        }
        Ok((self.plans, scores))
    }
}

/// A decision whose rows wait for the model; see [`Engine::stage_decision`].
pub struct StagedDecision {
    engine: Engine,
    request: DecisionRequest,
    documents: Documents,
    calibration: Calibration,
}

impl StagedDecision {
    /// The rows still held (all of them until [`take_rows`](Self::take_rows)).
    pub fn rows(&self) -> &[EncodedRow] {
        self.documents.scores.rows()
    }

    /// Takes the rows out, to run them elsewhere; their outputs go back to
    /// [`finish`](Self::finish) in the same order.
    pub fn take_rows(&mut self) -> Vec<EncodedRow> {
        self.documents.scores.take_rows()
    }

    /// The answers, from the outputs of the staged rows (in the order they were taken).
    pub fn finish(self, outputs: Vec<Vec<f32>>) -> Result<DecisionResponse, DecisionError> {
        let (plans, scores) = self.documents.finish(&self.engine, outputs)?;
        // Only a request that asks whether any tool is needed pays for the head.
        let asked = plans.iter().any(|p| matches!(p, Plan::NeedsTool));
        let needs_tool = match (asked, &self.engine.info().needs_tool) {
            (true, Some(head)) => scores
                .query
                .as_deref()
                .and_then(|query| head.probability(query, scores.last_message.as_deref())),
            _ => None,
        };
        respond(
            &self.request,
            &plans,
            Scored {
                raw: &scores.raw,
                needs_tool,
            },
            self.calibration,
            &self.engine.info().name,
            scores.tokens,
        )
    }
}

impl Scorer for Engine {
    fn about(&self) -> ScorerInfo<'_> {
        let info = self.info();
        ScorerInfo {
            name: info.name.clone(),
            device: info.device.clone(),
            calibration: info.calibration,
            conformal: Engine::conformal(self),
            lexical_weight: Engine::lexical_weight(self),
            tool_parameters: Engine::tool_parameters(self),
            tool_server: Engine::tool_server(self),
            model_dir: Some(&info.dir),
            needs_tool: Engine::needs_tool(self),
        }
    }

    fn conversation_embeddings(
        &self,
        inputs: &[DecisionInput],
    ) -> Result<Vec<Vec<f64>>, crate::EngineError> {
        Engine::conversation_embeddings(self, inputs)
    }

    /// The score of its document, or with both criteria the difference of the two, the
    /// lexical score included: the numbers the engine's answers are computed from.
    fn yes_no_scores(
        &self,
        request: &DecisionRequest,
    ) -> Result<Vec<(String, f64)>, DecisionError> {
        let mut documents = self.stage_documents(request)?;
        let rows = documents.scores.take_rows();
        let outputs = self
            .forward_rows(&rows)
            .map_err(DecisionError::from_model_error)?;
        let (plans, scores) = documents.finish(self, outputs)?;
        yes_no_raw(request, &plans, &scores.raw)
    }
}

impl DecisionModel for Engine {
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

    fn selection_hints(&self) -> SelectionHints {
        SelectionHints {
            conformal: self.conformal().cloned(),
            companion_min_probability: self.needs_tool().map(|h| h.companion_min_probability),
        }
    }
}
