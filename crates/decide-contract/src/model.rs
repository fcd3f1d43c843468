//! The [`DecisionModel`] trait: a provider SPI wrapped in one public call path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::conformal::Conformal;
use crate::error::{DecisionError, Result};
use crate::listener::{notify_outcome, notify_request, Attributes, DecisionModelListener};
use crate::request::{DecisionRequest, DecisionRequestParameters};
use crate::response::DecisionResponse;
use crate::validate::validate;

/// The future of an asynchronous decision. It is `'static`, so it can be spawned.
pub type DecisionFuture = Pin<Box<dyn Future<Output = Result<DecisionResponse>> + Send + 'static>>;

/// A model that answers a set of named, typed questions about one input, in one call.
///
/// Implementors write [`do_decide`](Self::do_decide) (and, if they are truly asynchronous,
/// [`do_decide_async`](Self::do_decide_async)); callers use [`decide`](Self::decide) and
/// [`decide_async`](Self::decide_async), which apply the model's default parameters, notify the
/// listeners and validate the response, so every implementation behaves the same at the edges.
/// Implementations should not override the public methods.
///
/// Probabilities in answers must come from the model's output distribution; a model that cannot
/// provide them for choice or scale answers leaves them empty rather than inventing values.
pub trait DecisionModel: Send + Sync {
    /// The provider SPI: answer a request that already has the defaults applied.
    ///
    /// A question type or input the model cannot handle should fail with
    /// [`DecisionError::UnsupportedFeature`] before any work is done.
    fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse>;

    /// The asynchronous provider SPI. By default a future already failed with
    /// [`DecisionError::AsyncNotSupported`]: a model that is not truly asynchronous does not
    /// pretend to be by blocking a runtime thread. A truly asynchronous engine overrides it.
    fn do_decide_async(&self, _request: DecisionRequest) -> DecisionFuture {
        let model = self
            .model_name()
            .unwrap_or_else(|| std::any::type_name::<Self>().to_owned());
        Box::pin(std::future::ready(Err(DecisionError::AsyncNotSupported {
            model,
        })))
    }

    /// Parameters used where a request leaves them unset.
    fn default_request_parameters(&self) -> DecisionRequestParameters {
        DecisionRequestParameters::default()
    }

    /// Listeners notified on every call.
    fn listeners(&self) -> Vec<Arc<dyn DecisionModelListener>> {
        Vec::new()
    }

    /// The model's name; by default the one in its default parameters.
    fn model_name(&self) -> Option<String> {
        self.default_request_parameters().model_name
    }

    /// What the model knows of reading its own probabilities when selecting from them (its conformal
    /// table, its needs-tool gate's companion threshold), so that a consumer such as a tool filter
    /// learns them from the model it calls rather than from its caller. None by default.
    fn selection_hints(&self) -> SelectionHints {
        SelectionHints::default()
    }

    /// Answers `request`: applies the defaults (the request's own parameters win), notifies
    /// `on_request`, runs [`do_decide`](Self::do_decide), [validates](fn@validate) the response, then
    /// notifies `on_response` or `on_error`. Listeners share one attributes map per call.
    fn decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
        let request = with_defaults(self, request);
        let listeners = self.listeners();
        let model_name = effective_model_name(self, &request);
        let mut attributes = Attributes::new();
        notify_request(&listeners, &request, model_name.as_deref(), &mut attributes);
        let outcome = self
            .do_decide(&request)
            .and_then(|response| validate(&request, response));
        notify_outcome(
            &listeners,
            &request,
            &outcome,
            model_name.as_deref(),
            &mut attributes,
        );
        outcome
    }

    /// The same as [`decide`](Self::decide) around [`do_decide_async`](Self::do_decide_async).
    ///
    /// `on_request` runs before this returns; `on_response`/`on_error` run when the future
    /// completes, on whatever thread polls it. Dropping the future cancels the call and notifies
    /// no one.
    fn decide_async(&self, request: &DecisionRequest) -> DecisionFuture {
        let request = with_defaults(self, request);
        let listeners = self.listeners();
        let model_name = effective_model_name(self, &request);
        let mut attributes = Attributes::new();
        notify_request(&listeners, &request, model_name.as_deref(), &mut attributes);
        let pending = self.do_decide_async(request.clone());
        Box::pin(async move {
            let outcome = pending
                .await
                .and_then(|response| validate(&request, response));
            notify_outcome(
                &listeners,
                &request,
                &outcome,
                model_name.as_deref(),
                &mut attributes,
            );
            outcome
        })
    }
}

/// A model's own facts about selecting from its probabilities; see
/// [`DecisionModel::selection_hints`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelectionHints {
    /// The table that turns a target recall into a probability threshold, fitted on labelled
    /// conversations the model never trained on; `None` when the model has none.
    pub conformal: Option<Conformal>,
    /// With a needs-tool head, the probability at which further tools pass once the gate is open
    /// (see [`needs_tool_gate`](crate::needs_tool_gate)); `None` for a model without one, which
    /// selects with one threshold by default.
    pub companion_min_probability: Option<f64>,
}

fn with_defaults<M: DecisionModel + ?Sized>(
    model: &M,
    request: &DecisionRequest,
) -> DecisionRequest {
    let parameters = model
        .default_request_parameters()
        .override_with(request.parameters());
    request.with_parameters(parameters)
}

fn effective_model_name<M: DecisionModel + ?Sized>(
    model: &M,
    request: &DecisionRequest,
) -> Option<String> {
    request
        .model_name()
        .map(str::to_owned)
        .or_else(|| model.model_name())
}

// Forwarding impls, so that shared and boxed models (`Arc<dyn DecisionModel>`) are models too.
// Every method forwards, so an inner model's overrides are kept.
macro_rules! forward_decision_model {
    ($($wrapper:ty),*) => {$(
        impl<T: DecisionModel + ?Sized> DecisionModel for $wrapper {
            fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
                (**self).do_decide(request)
            }

            fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
                (**self).do_decide_async(request)
            }

            fn default_request_parameters(&self) -> DecisionRequestParameters {
                (**self).default_request_parameters()
            }

            fn listeners(&self) -> Vec<Arc<dyn DecisionModelListener>> {
                (**self).listeners()
            }

            fn model_name(&self) -> Option<String> {
                (**self).model_name()
            }

            fn selection_hints(&self) -> SelectionHints {
                (**self).selection_hints()
            }

            fn decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
                (**self).decide(request)
            }

            fn decide_async(&self, request: &DecisionRequest) -> DecisionFuture {
                (**self).decide_async(request)
            }
        }
    )*};
}

forward_decision_model!(Arc<T>, Box<T>, &T);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listener::{ErrorContext, ListenerResult, RequestContext, ResponseContext};
    use crate::{Answer, YesNoQuestion};
    use serde_json::Value;
    use std::sync::Mutex;

    /// A model that answers every question "yes" (or returns a canned result) and remembers
    /// the request it got.
    struct Fixed {
        defaults: DecisionRequestParameters,
        listeners: Vec<Arc<dyn DecisionModelListener>>,
        answer_to: &'static str,
        seen: Mutex<Option<DecisionRequest>>,
    }

    impl Fixed {
        fn new() -> Self {
            Self {
                defaults: DecisionRequestParameters::default(),
                listeners: Vec::new(),
                answer_to: "q",
                seen: Mutex::new(None),
            }
        }
    }

    impl DecisionModel for Fixed {
        fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
            *self.seen.lock().unwrap() = Some(request.clone());
            DecisionResponse::builder()
                .answer(self.answer_to, Answer::yes_no(1.0)?)
                .build()
        }

        fn default_request_parameters(&self) -> DecisionRequestParameters {
            self.defaults.clone()
        }

        fn listeners(&self) -> Vec<Arc<dyn DecisionModelListener>> {
            self.listeners.clone()
        }
    }

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Log {
        fn entries(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    impl DecisionModelListener for Log {
        fn on_request(&self, ctx: &mut RequestContext<'_>) -> ListenerResult {
            ctx.attributes.insert("id".into(), Value::from(42));
            self.0
                .lock()
                .unwrap()
                .push(format!("request model={}", ctx.model_name.unwrap_or("-")));
            Ok(())
        }

        fn on_response(&self, ctx: &mut ResponseContext<'_>) -> ListenerResult {
            self.0
                .lock()
                .unwrap()
                .push(format!("response id={}", ctx.attributes["id"]));
            Ok(())
        }

        fn on_error(&self, ctx: &mut ErrorContext<'_>) -> ListenerResult {
            self.0
                .lock()
                .unwrap()
                .push(format!("error id={}: {}", ctx.attributes["id"], ctx.error));
            Ok(())
        }
    }

    struct Broken;

    impl DecisionModelListener for Broken {
        fn on_request(&self, _ctx: &mut RequestContext<'_>) -> ListenerResult {
            Err("listener failed".into())
        }

        fn on_response(&self, _ctx: &mut ResponseContext<'_>) -> ListenerResult {
            panic!("listener panicked")
        }
    }

    fn request() -> DecisionRequest {
        DecisionRequest::builder()
            .input("hello")
            .question("q", YesNoQuestion::new("Q?").unwrap())
            .build()
            .unwrap()
    }

    #[test]
    fn defaults_are_applied() {
        let model = Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            ..Fixed::new()
        };
        model.decide(&request()).unwrap();
        let seen = model.seen.lock().unwrap().clone().unwrap();
        assert_eq!(seen.model_name(), Some("small"));
        assert_eq!(seen.input(), request().input(), "otherwise unchanged");
        assert_eq!(seen.questions(), request().questions());
    }

    #[test]
    fn request_parameters_override_defaults() {
        let model = Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            ..Fixed::new()
        };
        let request = request().with_parameters(DecisionRequestParameters::for_model("large"));
        model.decide(&request).unwrap();
        let seen = model.seen.lock().unwrap().clone().unwrap();
        assert_eq!(seen.model_name(), Some("large"));
    }

    #[test]
    fn model_name_comes_from_default_parameters() {
        let model = Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            ..Fixed::new()
        };
        assert_eq!(model.model_name().as_deref(), Some("small"));
        assert_eq!(Fixed::new().model_name(), None);
        assert!(Fixed::new().listeners().is_empty());
    }

    #[test]
    fn decide_validates_the_response() {
        let model = Fixed {
            answer_to: "other",
            ..Fixed::new()
        };
        let err = model.decide(&request()).unwrap_err();
        assert!(matches!(err, DecisionError::InvalidResponse(_)), "{err}");
    }

    #[tokio::test]
    async fn default_decide_async_is_not_supported() {
        let err = Fixed::new().decide_async(&request()).await.unwrap_err();
        match err {
            DecisionError::AsyncNotSupported { model } => {
                assert!(model.ends_with("Fixed"), "{model}")
            }
            other => panic!("unexpected {other:?}"),
        }
        let named = Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            ..Fixed::new()
        };
        let err = named.decide_async(&request()).await.unwrap_err();
        assert_eq!(err.to_string(), "small does not support asynchronous calls");
    }

    #[test]
    fn listeners_see_request_then_response() {
        let log = Arc::new(Log::default());
        let model = Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            listeners: vec![log.clone()],
            ..Fixed::new()
        };
        model.decide(&request()).unwrap();
        assert_eq!(log.entries(), ["request model=small", "response id=42"]);
    }

    #[test]
    fn listeners_see_request_then_error_and_error_is_returned() {
        let log = Arc::new(Log::default());
        let model = Fixed {
            listeners: vec![log.clone()],
            answer_to: "other",
            ..Fixed::new()
        };
        let err = model.decide(&request()).unwrap_err();
        assert!(matches!(err, DecisionError::InvalidResponse(_)));
        let entries = log.entries();
        assert_eq!(entries[0], "request model=-");
        assert!(
            entries[1].starts_with("error id=42: invalid response:"),
            "{entries:?}"
        );
        assert_eq!(entries.len(), 2);
    }

    #[test]
    fn attributes_are_per_call() {
        struct Counter;
        impl DecisionModelListener for Counter {
            fn on_request(&self, ctx: &mut RequestContext<'_>) -> ListenerResult {
                assert!(ctx.attributes.is_empty(), "a fresh map every call");
                ctx.attributes.insert("n".into(), Value::from(1));
                Ok(())
            }
        }
        let model = Fixed {
            listeners: vec![Arc::new(Counter)],
            ..Fixed::new()
        };
        model.decide(&request()).unwrap();
        model.decide(&request()).unwrap();
    }

    #[test]
    fn broken_listeners_are_ignored() {
        let log = Arc::new(Log::default());
        let model = Fixed {
            listeners: vec![Arc::new(Broken), log.clone()],
            ..Fixed::new()
        };
        assert!(model.decide(&request()).is_ok());
        assert_eq!(log.entries(), ["request model=-", "response id=42"]);
    }

    /// A truly asynchronous model, to check the async template around it.
    struct Async(Fixed);

    impl DecisionModel for Async {
        fn do_decide(&self, request: &DecisionRequest) -> Result<DecisionResponse> {
            self.0.do_decide(request)
        }

        fn do_decide_async(&self, request: DecisionRequest) -> DecisionFuture {
            let result = self.0.do_decide(&request);
            Box::pin(async move {
                tokio::task::yield_now().await;
                result
            })
        }

        fn default_request_parameters(&self) -> DecisionRequestParameters {
            self.0.default_request_parameters()
        }

        fn listeners(&self) -> Vec<Arc<dyn DecisionModelListener>> {
            self.0.listeners()
        }
    }

    #[tokio::test]
    async fn decide_async_applies_defaults_and_notifies() {
        let log = Arc::new(Log::default());
        let model = Async(Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            listeners: vec![log.clone(), Arc::new(Broken)],
            ..Fixed::new()
        });
        let future = model.decide_async(&request());
        assert_eq!(
            log.entries(),
            ["request model=small"],
            "on_request runs at once"
        );
        let response = tokio::spawn(future).await.unwrap().unwrap();
        assert_eq!(response.yes_no("q").unwrap().probability(), 1.0);
        assert_eq!(log.entries(), ["request model=small", "response id=42"]);
        let seen = model.0.seen.lock().unwrap().clone().unwrap();
        assert_eq!(seen.model_name(), Some("small"));
    }

    #[tokio::test]
    async fn decide_async_validates_and_reports_errors() {
        let log = Arc::new(Log::default());
        let model = Async(Fixed {
            listeners: vec![log.clone()],
            answer_to: "other",
            ..Fixed::new()
        });
        let err = model.decide_async(&request()).await.unwrap_err();
        assert!(matches!(err, DecisionError::InvalidResponse(_)));
        assert_eq!(log.entries().len(), 2);
        assert!(log.entries()[1].starts_with("error id=42"));
    }

    #[test]
    fn shared_and_boxed_models_forward() {
        let model: Arc<dyn DecisionModel> = Arc::new(Fixed {
            defaults: DecisionRequestParameters::for_model("small"),
            ..Fixed::new()
        });
        assert_eq!(model.model_name().as_deref(), Some("small"));
        assert!(model.decide(&request()).is_ok());
        let boxed: Box<dyn DecisionModel> = Box::new(Fixed::new());
        assert!(boxed.decide(&request()).is_ok());
        let by_ref: &dyn DecisionModel = &*boxed;
        assert!((&by_ref).decide(&request()).is_ok());
    }

    #[tokio::test]
    async fn forwarded_async_names_the_inner_model() {
        let model: Arc<dyn DecisionModel> = Arc::new(Fixed::new());
        let err = model.decide_async(&request()).await.unwrap_err();
        assert!(err.to_string().contains("Fixed"), "{err}");
    }
}
