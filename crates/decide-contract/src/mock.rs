//! A scriptable [`DecisionModel`] for tests of code that uses one.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{DecisionError, Result};
use crate::listener::DecisionModelListener;
use crate::model::{DecisionFuture, DecisionModel};
use crate::request::{DecisionRequest, DecisionRequestParameters, Question, YesNoQuestion};
use crate::response::{Answer, DecisionResponse, TokenUsage};

type AnswerFn = dyn Fn(&DecisionRequest) -> Result<Vec<(String, Answer)>> + Send + Sync;

enum Behaviour {
    Answers(Box<AnswerFn>),
    Fails(String),
}

/// A test double modelled on LangChain4j's `DecisionModelMock`.
///
/// It answers with fixed answers, with answers computed from the request or from each question,
/// or always fails. It records every request it receives (after the defaults are applied), and
/// it supports asynchronous calls unless told otherwise. Its responses go through the usual
/// validation, so a test that scripts a wrong answer sees the error a real model would cause.
pub struct MockDecisionModel {
    behaviour: Behaviour,
    token_usage: Option<TokenUsage>,
    model_name: Option<String>,
    listeners: Vec<Arc<dyn DecisionModelListener>>,
    async_supported: bool,
    requests: Mutex<Vec<DecisionRequest>>,
}

impl MockDecisionModel {
    const DEFAULT_FAILURE: &'static str = "Something went wrong, but this is an expected error";

    fn with_behaviour(behaviour: Behaviour) -> Self {
        Self {
            behaviour,
            token_usage: None,
            model_name: None,
            listeners: Vec::new(),
            async_supported: true,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Always answers with these answers, whatever the request.
    pub fn always_answers<I, S, A>(answers: I) -> Self
    where
        I: IntoIterator<Item = (S, A)>,
        S: Into<String>,
        A: Into<Answer>,
    {
        let answers: Vec<(String, Answer)> = answers
            .into_iter()
            .map(|(n, a)| (n.into(), a.into()))
            .collect();
        Self::answers(move |_| Ok(answers.clone()))
    }

    /// Answers with whatever `answer` computes from the request; an error is returned as is.
    pub fn answers(
        answer: impl Fn(&DecisionRequest) -> Result<Vec<(String, Answer)>> + Send + Sync + 'static,
    ) -> Self {
        Self::with_behaviour(Behaviour::Answers(Box::new(answer)))
    }

    /// Answers each question with what `answer` computes from its name and question.
    pub fn answers_questions(
        answer: impl Fn(&str, &Question) -> Answer + Send + Sync + 'static,
    ) -> Self {
        Self::answers(move |request| {
            Ok(request
                .questions()
                .iter()
                .map(|(name, question)| (name.clone(), answer(name, question)))
                .collect())
        })
    }

    /// Answers yes/no questions with the probability `probability` computes; any other question
    /// kind fails with [`DecisionError::UnsupportedFeature`], and a probability outside [0, 1]
    /// with [`DecisionError::InvalidResponse`].
    pub fn answers_yes_no(
        probability: impl Fn(&YesNoQuestion) -> f64 + Send + Sync + 'static,
    ) -> Self {
        Self::answers(move |request| {
            request
                .questions()
                .iter()
                .map(|(name, question)| match question {
                    Question::YesNo(q) => Ok((name.clone(), Answer::yes_no(probability(q))?)),
                    other => Err(DecisionError::UnsupportedFeature(format!(
                        "this mock answers only yes/no questions; question '{name}' is a {} question",
                        other.answer_kind()
                    ))),
                })
                .collect()
        })
    }

    /// Always fails with a [`DecisionError::Model`] error saying
    /// "Something went wrong, but this is an expected error".
    pub fn always_fails() -> Self {
        Self::always_fails_with(Self::DEFAULT_FAILURE)
    }

    /// Always fails with a [`DecisionError::Model`] error with this message.
    pub fn always_fails_with(message: impl Into<String>) -> Self {
        Self::with_behaviour(Behaviour::Fails(message.into()))
    }

    /// Reports this token usage in every response.
    pub fn with_token_usage(mut self, token_usage: TokenUsage) -> Self {
        self.token_usage = Some(token_usage);
        self
    }

    /// Uses this model name as the default request parameter (so requests and responses carry it).
    pub fn with_model_name(mut self, model_name: impl Into<String>) -> Self {
        self.model_name = Some(model_name.into());
        self
    }

    /// Adds a listener.
    pub fn with_listener(mut self, listener: Arc<dyn DecisionModelListener>) -> Self {
        self.listeners.push(listener);
        self
    }

    /// Makes asynchronous calls fail with [`DecisionError::AsyncNotSupported`], like a model
    /// without an asynchronous path.
    pub fn without_async_support(mut self) -> Self {
        self.async_supported = false;
        self
    }

    /// Every request received so far, in order, with the defaults applied.
    pub fn requests(&self) -> Vec<DecisionRequest> {
        self.recorded().clone()
    }

    /// The only request received, or `None` unless exactly one was.
    pub fn request(&self) -> Option<DecisionRequest> {
        match self.recorded().as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        }
    }

    fn recorded(&self) -> MutexGuard<'_, Vec<DecisionRequest>> {
        // A test that panicked while holding the lock must not hide the requests from the next.
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn respond(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
        self.recorded().push(request.clone());
        let answers = match &self.behaviour {
            Behaviour::Answers(answer) => answer(request)?,
            Behaviour::Fails(message) => return Err(DecisionError::model(message.clone())),
        };
        let mut builder = DecisionResponse::builder().answers(answers);
        if let Some(name) = request.model_name() {
            builder = builder.model_name(name);
        }
        if let Some(usage) = self.token_usage {
            builder = builder.token_usage(usage);
        }
        builder.build()
    }
}

impl DecisionModel for MockDecisionModel {
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
        self.respond(request)
    }

    fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
        if !self.async_supported {
            return Box::pin(std::future::ready(Err(DecisionError::AsyncNotSupported {
                model: self
                    .model_name
                    .clone()
                    .unwrap_or_else(|| "MockDecisionModel".to_owned()),
            })));
        }
        Box::pin(std::future::ready(self.respond(&request)))
    }

    fn default_request_parameters(&self) -> DecisionRequestParameters {
        DecisionRequestParameters {
            model_name: self.model_name.clone(),
        }
    }

    fn listeners(&self) -> Vec<Arc<dyn DecisionModelListener>> {
        self.listeners.clone()
    }
}

impl fmt::Debug for MockDecisionModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let behaviour = match &self.behaviour {
            Behaviour::Answers(_) => "answers",
            Behaviour::Fails(_) => "fails",
        };
        f.debug_struct("MockDecisionModel")
            .field("behaviour", &behaviour)
            .field("model_name", &self.model_name)
            .field("token_usage", &self.token_usage)
            .field("listeners", &self.listeners.len())
            .field("async_supported", &self.async_supported)
            .field("requests", &self.recorded().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::{ListenerResult, RequestContext, ResponseContext};
    use crate::request::{ChoiceQuestion, YesNoQuestion};
    use crate::response::ChoiceAnswer;

    fn request() -> DecisionRequest {
        DecisionRequest::builder()
            .input("hello")
            .question("urgent", YesNoQuestion::new("Urgent?").unwrap())
            .question(
                "route",
                ChoiceQuestion::with_options("Which?", ["a", "b"]).unwrap(),
            )
            .build()
            .unwrap()
    }

    fn fixed() -> MockDecisionModel {
        MockDecisionModel::always_answers([
            ("urgent", Answer::yes_no(0.9).unwrap()),
            ("route", ChoiceAnswer::new("b").into()),
        ])
    }

    #[test]
    fn fixed_answers_with_token_usage() {
        let mock = fixed().with_token_usage(TokenUsage::new(7));
        let response = mock.decide(&request()).unwrap();
        assert_eq!(response.yes_no("urgent").unwrap().probability(), 0.9);
        assert_eq!(response.choice("route").unwrap().value(), "b");
        assert_eq!(response.choice("route").unwrap().options(), ["a", "b"]);
        assert_eq!(response.token_usage(), Some(TokenUsage::new(7)));
    }

    #[test]
    fn records_requests() {
        let mock = fixed();
        assert!(mock.requests().is_empty());
        assert_eq!(mock.request(), None);
        mock.decide(&request()).unwrap();
        assert_eq!(mock.request(), Some(request()));
        mock.decide(&request()).unwrap();
        assert_eq!(mock.requests().len(), 2);
        assert_eq!(mock.request(), None, "more than one request");
    }

    #[test]
    fn model_name_is_a_default_parameter() {
        let mock = fixed().with_model_name("mock-1");
        let response = mock.decide(&request()).unwrap();
        assert_eq!(response.model_name(), Some("mock-1"));
        assert_eq!(mock.request().unwrap().model_name(), Some("mock-1"));
        assert_eq!(mock.model_name().as_deref(), Some("mock-1"));

        let overridden = request().with_parameters(DecisionRequestParameters::for_model("other"));
        let response = mock.decide(&overridden).unwrap();
        assert_eq!(response.model_name(), Some("other"));
    }

    #[test]
    fn answers_from_the_request() {
        let mock = MockDecisionModel::answers(|request| {
            let long = request.input().render().len() > 3;
            Ok(vec![
                (
                    "urgent".into(),
                    Answer::yes_no(if long { 1.0 } else { 0.0 })?,
                ),
                ("route".into(), Answer::refusal()),
            ])
        });
        let response = mock.decide(&request()).unwrap();
        assert!(response.yes_no("urgent").unwrap().is_yes(0.5));
        assert!(response.is_refused("route"));
    }

    #[test]
    fn answers_each_question() {
        let mock = MockDecisionModel::answers_questions(|name, question| match question {
            Question::Choice(q) => ChoiceAnswer::new(q.options()[0].name.clone()).into(),
            _ => Answer::refusal_because(name),
        });
        let response = mock.decide(&request()).unwrap();
        assert_eq!(response.choice("route").unwrap().value(), "a");
        assert!(response.is_refused("urgent"));
    }

    #[test]
    fn answers_yes_no_questions() {
        let mock =
            MockDecisionModel::answers_yes_no(|q| if q.text() == "Urgent?" { 0.8 } else { 0.1 });
        let only_yes_no = DecisionRequest::builder()
            .input("x")
            .question("a", YesNoQuestion::new("Urgent?").unwrap())
            .question("b", YesNoQuestion::new("Late?").unwrap())
            .build()
            .unwrap();
        let response = mock.decide(&only_yes_no).unwrap();
        assert_eq!(response.yes_no("a").unwrap().probability(), 0.8);
        assert_eq!(response.yes_no("b").unwrap().probability(), 0.1);
        let err = mock.decide(&request()).unwrap_err();
        assert!(matches!(err, DecisionError::UnsupportedFeature(_)), "{err}");
    }

    #[test]
    fn always_fails() {
        let err = MockDecisionModel::always_fails()
            .decide(&request())
            .unwrap_err();
        assert!(matches!(err, DecisionError::Model(_)));
        assert_eq!(
            err.to_string(),
            "Something went wrong, but this is an expected error"
        );
        let err = MockDecisionModel::always_fails_with("custom")
            .decide(&request())
            .unwrap_err();
        assert_eq!(err.to_string(), "custom");
    }

    #[test]
    fn wrong_scripted_answers_are_caught_by_validation() {
        let mock = MockDecisionModel::always_answers([("urgent", Answer::yes_no(0.5).unwrap())]);
        let err = mock.decide(&request()).unwrap_err();
        assert!(matches!(err, DecisionError::InvalidResponse(_)));
    }

    #[test]
    fn notifies_its_listeners() {
        #[derive(Default)]
        struct Count(Mutex<(u32, u32)>);
        impl DecisionModelListener for Count {
            fn on_request(&self, _ctx: &mut RequestContext<'_>) -> ListenerResult {
                self.0.lock().unwrap().0 += 1;
                Ok(())
            }
            fn on_response(&self, _ctx: &mut ResponseContext<'_>) -> ListenerResult {
                self.0.lock().unwrap().1 += 1;
                Ok(())
            }
        }
        let count = Arc::new(Count::default());
        let mock = fixed().with_listener(count.clone());
        mock.decide(&request()).unwrap();
        assert_eq!(*count.0.lock().unwrap(), (1, 1));
    }

    #[tokio::test]
    async fn async_returns_a_ready_future() {
        let mock = fixed().with_model_name("mock-1");
        let response = mock.decide_async(&request()).await.unwrap();
        assert_eq!(response.choice("route").unwrap().value(), "b");
        assert_eq!(mock.request().unwrap().model_name(), Some("mock-1"));
    }

    #[tokio::test]
    async fn without_async_support_fails() {
        let mock = fixed().without_async_support();
        let err = mock.decide_async(&request()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "MockDecisionModel does not support asynchronous calls"
        );
        assert!(mock.requests().is_empty());
    }

    #[test]
    fn debug_does_not_need_the_closures() {
        let rendered = format!("{:?}", fixed());
        assert!(rendered.contains("MockDecisionModel"), "{rendered}");
    }
}
