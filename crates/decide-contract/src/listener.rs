//! Observers of decision calls: metrics, logging, tracing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::{BoxError, DecisionError};
use crate::request::DecisionRequest;
use crate::response::DecisionResponse;

/// What a listener callback returns; an error is logged and otherwise ignored.
pub type ListenerResult = std::result::Result<(), BoxError>;

/// Attributes a listener can keep between the callbacks of one call, for example a start time.
pub type Attributes = Map<String, Value>;

/// Passed to [`DecisionModelListener::on_request`] before the model runs.
#[derive(Debug)]
pub struct RequestContext<'a> {
    /// The request, with the model's defaults applied.
    pub request: &'a DecisionRequest,
    /// The model that is about to answer: the request's model name, else the model's own.
    pub model_name: Option<&'a str>,
    /// Shared by every callback of this call, and only this call.
    pub attributes: &'a mut Attributes,
}

/// Passed to [`DecisionModelListener::on_response`] after a response was validated.
#[derive(Debug)]
pub struct ResponseContext<'a> {
    /// The validated response.
    pub response: &'a DecisionResponse,
    /// The request, with the model's defaults applied.
    pub request: &'a DecisionRequest,
    /// The model that answered, as in [`RequestContext::model_name`].
    pub model_name: Option<&'a str>,
    /// Shared by every callback of this call, and only this call.
    pub attributes: &'a mut Attributes,
}

/// Passed to [`DecisionModelListener::on_error`] when the model or the validation failed.
#[derive(Debug)]
pub struct ErrorContext<'a> {
    /// The error the caller will get.
    pub error: &'a DecisionError,
    /// The request, with the model's defaults applied.
    pub request: &'a DecisionRequest,
    /// The model that failed, as in [`RequestContext::model_name`].
    pub model_name: Option<&'a str>,
    /// Shared by every callback of this call, and only this call.
    pub attributes: &'a mut Attributes,
}

/// Observes the calls of a [`DecisionModel`](crate::DecisionModel).
///
/// Each call gets `on_request`, then exactly one of `on_response` or `on_error` (none when an
/// asynchronous call is dropped before it finishes). A listener cannot break a call: an error it
/// returns, or even a panic, is logged and ignored.
pub trait DecisionModelListener: Send + Sync {
    /// Called before the model runs.
    fn on_request(&self, _ctx: &mut RequestContext<'_>) -> ListenerResult {
        Ok(())
    }

    /// Called with a validated response.
    fn on_response(&self, _ctx: &mut ResponseContext<'_>) -> ListenerResult {
        Ok(())
    }

    /// Called when the model or the validation failed.
    fn on_error(&self, _ctx: &mut ErrorContext<'_>) -> ListenerResult {
        Ok(())
    }
}

/// Runs one callback so that neither its error nor its panic reaches the caller.
fn guarded(callback: &str, index: usize, run: impl FnOnce() -> ListenerResult) {
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(listener = index, %error, "decision model listener failed in {callback}; ignored");
        }
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            tracing::warn!(listener = index, panic = %message, "decision model listener panicked in {callback}; ignored");
        }
    }
}

pub(crate) fn notify_request(
    listeners: &[Arc<dyn DecisionModelListener>],
    request: &DecisionRequest,
    model_name: Option<&str>,
    attributes: &mut Attributes,
) {
    for (index, listener) in listeners.iter().enumerate() {
        guarded("on_request", index, || {
            listener.on_request(&mut RequestContext {
                request,
                model_name,
                attributes,
            })
        });
    }
}

pub(crate) fn notify_outcome(
    listeners: &[Arc<dyn DecisionModelListener>],
    request: &DecisionRequest,
    outcome: &Result<DecisionResponse, DecisionError>,
    model_name: Option<&str>,
    attributes: &mut Attributes,
) {
    for (index, listener) in listeners.iter().enumerate() {
        match outcome {
            Ok(response) => guarded("on_response", index, || {
                listener.on_response(&mut ResponseContext {
                    response,
                    request,
                    model_name,
                    attributes,
                })
            }),
            Err(error) => guarded("on_error", index, || {
                listener.on_error(&mut ErrorContext {
                    error,
                    request,
                    model_name,
                    attributes,
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Answer, YesNoQuestion};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl DecisionModelListener for Recorder {
        fn on_request(&self, ctx: &mut RequestContext<'_>) -> ListenerResult {
            ctx.attributes.insert("seen".into(), Value::from(true));
            self.0.lock().unwrap().push("request".into());
            Ok(())
        }

        fn on_response(&self, ctx: &mut ResponseContext<'_>) -> ListenerResult {
            self.0
                .lock()
                .unwrap()
                .push(format!("response seen={}", ctx.attributes["seen"]));
            Ok(())
        }

        fn on_error(&self, ctx: &mut ErrorContext<'_>) -> ListenerResult {
            self.0.lock().unwrap().push(format!("error {}", ctx.error));
            Ok(())
        }
    }

    struct Failing;

    impl DecisionModelListener for Failing {
        fn on_request(&self, _ctx: &mut RequestContext<'_>) -> ListenerResult {
            Err("nope".into())
        }
    }

    struct Panicking;

    impl DecisionModelListener for Panicking {
        fn on_request(&self, _ctx: &mut RequestContext<'_>) -> ListenerResult {
            panic!("listener bug")
        }

        fn on_error(&self, _ctx: &mut ErrorContext<'_>) -> ListenerResult {
            panic!("listener bug")
        }
    }

    fn request() -> DecisionRequest {
        DecisionRequest::builder()
            .input("x")
            .question("q", YesNoQuestion::new("Q?").unwrap())
            .build()
            .unwrap()
    }

    #[test]
    fn default_callbacks_do_nothing() {
        struct Silent;
        impl DecisionModelListener for Silent {}
        let listeners: Vec<Arc<dyn DecisionModelListener>> = vec![Arc::new(Silent)];
        let mut attributes = Attributes::new();
        notify_request(&listeners, &request(), None, &mut attributes);
        assert!(attributes.is_empty());
    }

    #[test]
    fn failing_and_panicking_listeners_do_not_stop_the_others() {
        let recorder = Arc::new(Recorder::default());
        let listeners: Vec<Arc<dyn DecisionModelListener>> =
            vec![Arc::new(Failing), Arc::new(Panicking), recorder.clone()];
        let request = request();
        let mut attributes = Attributes::new();
        notify_request(&listeners, &request, Some("m"), &mut attributes);
        let response = crate::DecisionResponse::builder()
            .answer("q", Answer::yes_no(1.0).unwrap())
            .build()
            .unwrap();
        notify_outcome(
            &listeners,
            &request,
            &Ok(response),
            Some("m"),
            &mut attributes,
        );
        notify_outcome(
            &listeners,
            &request,
            &Err(DecisionError::model("boom")),
            Some("m"),
            &mut attributes,
        );
        assert_eq!(
            *recorder.0.lock().unwrap(),
            ["request", "response seen=true", "error boom"]
        );
    }
}
