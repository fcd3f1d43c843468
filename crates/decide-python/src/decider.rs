//! `decide._native.Decider`: one loaded model behind the tool filter, the router, embeddings and
//! reranking, each call made with the interpreter detached.
//!
//! Every call takes the same library path as the command line and the server: the filter through
//! [`FilterOptions::apply`] and [`FilteringToolProvider::select`], the router through
//! [`RouteRequest::router`], embeddings through [`Engine::stage_embeddings`] and reranking through
//! [`Engine::score`] with the model's calibration, as `decide serve` answers them.

use std::error::Error as StdError;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use decide_chat::{parse_messages, parse_tools, ChatMessage, StaticToolProvider};
use decide_engine::{
    Bm25Model, DeviceSpec, Engine, HeadName, Precision, Scorer, BM25_MODEL_NAME, DEFAULT_MODEL,
};
use decide_filter::{Fallback, FilterOptions, FilteringToolProvider, SelectRequest};
use decide_router::{RouteReason, RouteRequest, RoutesSpec};
use pyo3::prelude::*;
use pyo3::types::PyString;
use serde_json::{json, Value};

use crate::convert::to_json;
use crate::DecideError;

/// A tool's row of a selection: name, probability (`None` when it passed without asking),
/// why, and whether it passed.
type ToolRow = (String, Option<f64>, String, bool);
/// The needs-tool gate: the head's answer, the probability compared, whether it opened.
type GateRow = (Option<f64>, f64, bool);
/// What `select` hands to the Python layer: the tools in the catalogue's order, the gate, the
/// fallback applied (strategy, reason), and the thresholds the filter used (min probability,
/// target recall, companion min probability).
type SelectOut = (
    Vec<ToolRow>,
    Option<GateRow>,
    Option<(String, String)>,
    (f64, Option<f64>, Option<f64>),
);
/// What `route` hands over: the route taken, every route's probability, and why.
type RouteOut = (String, Vec<(String, f64)>, &'static str);
/// A document's place: its index, relevance (calibrated) and raw score.
type RankRow = (usize, f64, f64);

/// One line, as `decide` prints an error after `error: `: the error, then each cause after `: `.
pub fn one_line(error: &(dyn StdError + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line.replace('\n', " ")
}

fn fail(error: impl StdError + 'static) -> PyErr {
    DecideError::new_err(one_line(&error))
}

fn invalid(message: impl Into<String>) -> PyErr {
    DecideError::new_err(message.into())
}

/// Runs `work` with the interpreter detached, so that other Python threads run meanwhile. A
/// panic in the engine becomes a [`DecideError`]: PyO3 would raise it as `PanicException`, which
/// derives from `BaseException` and so escapes the `except Exception` an agent loop relies on.
fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> PyResult<T> + Send,
{
    py.detach(move || {
        panic::catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(invalid(format!(
                "internal error: the engine panicked ({})",
                what.replace('\n', " ")
            )))
        })
    })
}

/// `value` as JSON, errors named from `root` (`tools[3].function: ...`).
fn json_of(value: &Bound<'_, PyAny>, root: &str) -> PyResult<Value> {
    to_json(value).map_err(|e| invalid(e.message(root)))
}

/// A conversation as `decide select` takes it: messages in any shape [`parse_messages`] reads,
/// or a string, which is one user message (the command line's TEXT).
enum Conversation {
    Text(String),
    Messages(Value),
}

impl Conversation {
    fn read(messages: &Bound<'_, PyAny>) -> PyResult<Self> {
        match messages.cast::<PyString>() {
            Ok(s) => Ok(Self::Text(s.to_cow()?.into_owned())),
            Err(_) => json_of(messages, "messages").map(Self::Messages),
        }
    }

    fn parse(self) -> PyResult<Vec<ChatMessage>> {
        match self {
            Self::Text(text) if text.trim().is_empty() => Err(invalid("messages: empty message")),
            Self::Text(text) => Ok(vec![ChatMessage::user(text)]),
            Self::Messages(json) => parse_messages(&json).map_err(fail),
        }
    }
}

/// A count option of the filter, refused below 1 in the builder's words.
fn count(option: &str, value: Option<i64>) -> PyResult<Option<usize>> {
    match value {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(n as usize)),
        Some(n) => Err(invalid(format!(
            "{option}: must be at least 1, but was {n}"
        ))),
    }
}

/// Texts as the embeddings endpoints take them, each checked and named by its path.
fn texts(field: &str, value: Value) -> PyResult<Vec<String>> {
    let items = match value {
        Value::Array(items) if items.is_empty() => {
            return Err(invalid(format!("{field}: empty: send at least one text")))
        }
        Value::Array(items) => items,
        Value::String(s) => vec![Value::String(s)],
        other => {
            return Err(invalid(format!(
                "{field}: expected a string or a list of strings, got {}",
                json_kind(&other)
            )))
        }
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if s.trim().is_empty() => {
                Err(invalid(format!("{field}[{i}]: empty text")))
            }
            Value::String(s) => Ok(s),
            // A document may be `{"text": ...}`, as Cohere's rerank clients send it.
            Value::Object(mut o) if field == "documents" && o.len() == 1 => {
                match o.remove("text") {
                    Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
                    Some(Value::String(_)) => Err(invalid(format!("{field}[{i}]: empty text"))),
                    _ => Err(invalid(format!(
                        "{field}[{i}]: expected a string or {{\"text\": string}}"
                    ))),
                }
            }
            other => Err(invalid(format!(
                "{field}[{i}]: expected a string, got {}",
                json_kind(&other)
            ))),
        })
        .collect()
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a dict",
    }
}

/// A loaded decision model: the neural engine (or BM25 for `model="bm25"`), shared by every
/// thread that calls it. Scoring runs with the interpreter detached, so calls from several
/// Python threads run at once.
#[pyclass(frozen, module = "decide._native")]
pub struct Decider {
    scorer: Arc<dyn Scorer>,
    /// The engine behind `scorer`, for embeddings and reranking; `None` for BM25.
    engine: Option<Engine>,
}

impl Decider {
    fn engine(&self) -> PyResult<&Engine> {
        self.engine.as_ref().ok_or_else(|| {
            invalid(format!(
                "model '{}' is lexical (BM25): embeddings and reranking need a neural model",
                self.scorer.about().name
            ))
        })
    }
}

#[pymethods]
impl Decider {
    /// Loads `model` (a name in `models/`, a folder, a Hugging Face id in the local cache, or
    /// `bm25`), resolved as `decide --model` resolves it, on `device` in `dtype`.
    #[new]
    #[pyo3(signature = (model = None, device = "cpu", dtype = "f32"))]
    fn new(py: Python<'_>, model: Option<String>, device: &str, dtype: &str) -> PyResult<Self> {
        let model = model.unwrap_or_else(|| DEFAULT_MODEL.to_string());
        let device: DeviceSpec = device.parse().map_err(fail)?;
        let precision: Precision = dtype.parse().map_err(fail)?;
        detached(py, move || {
            if model == BM25_MODEL_NAME {
                return Ok(Self {
                    scorer: Arc::new(Bm25Model::new()),
                    engine: None,
                });
            }
            // As `decide select` loads it: the calibration is required, since the filter's
            // thresholds are probabilities.
            let engine = Engine::builder()
                .model(model)
                .device(device)
                .precision(precision)
                .allow_uncalibrated(false)
                .build()
                .map_err(fail)?;
            Ok(Self {
                scorer: Arc::new(engine.clone()),
                engine: Some(engine),
            })
        })
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> String {
        self.scorer.about().name
    }

    /// The device it runs on.
    #[getter]
    fn device(&self) -> String {
        self.scorer.about().device
    }

    /// The precision of its weights (`f32`, `int8`, ...); `None` for BM25.
    #[getter]
    fn dtype(&self) -> Option<String> {
        self.engine.as_ref().map(|e| e.info().dtype.clone())
    }

    /// The tools `messages` needs among `tools`, through the filter `decide select` runs.
    #[pyo3(signature = (
        messages, tools, *, min_probability = None, target_recall = None, max_results = None,
        always_include = Vec::new(), needs_tool_gate = None, fallback = None, max_messages = None,
        max_message_length = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        tools: &Bound<'_, PyAny>,
        min_probability: Option<f64>,
        target_recall: Option<f64>,
        max_results: Option<i64>,
        always_include: Vec<String>,
        needs_tool_gate: Option<bool>,
        fallback: Option<String>,
        max_messages: Option<i64>,
        max_message_length: Option<i64>,
    ) -> PyResult<SelectOut> {
        let conversation = Conversation::read(messages)?;
        let tools = json_of(tools, "tools")?;
        let fallback: Option<Fallback> = fallback.map(|f| f.parse()).transpose().map_err(fail)?;
        let options = FilterOptions {
            min_probability,
            target_recall,
            max_results: count("max_results", max_results)?,
            max_messages: count("max_messages", max_messages)?,
            max_message_length: count("max_message_length", max_message_length)?,
            always_include,
            fallback,
            needs_tool_gate,
        };
        let model = self.scorer.clone();
        detached(py, move || {
            let tools = parse_tools(&tools).map_err(fail)?;
            let messages = conversation.parse()?;
            // The rules `decide select` and `/v1/select` apply to their input, in their words.
            let request = SelectRequest::new(&messages, tools, options).map_err(fail)?;
            let builder = FilteringToolProvider::builder()
                .tool_provider(Arc::new(StaticToolProvider::from_specifications(
                    request.tools,
                )))
                .decision_model(model);
            let filter = request
                .options
                .apply(builder)
                .and_then(|b| b.build())
                .map_err(fail)?;
            let selection = filter.select(&request.request).map_err(fail)?;
            let rows = selection
                .decisions
                .into_iter()
                .map(|d| {
                    let reason = serde_json::to_value(d.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    (d.name, d.probability, reason, d.passed)
                })
                .collect();
            let gate = selection.gate.map(|g| (g.answer, g.probability, g.open));
            let fallback = selection
                .fallback
                .map(|f| (f.strategy.as_str().to_string(), f.reason));
            let thresholds = (
                filter.min_probability(),
                filter.target_recall(),
                filter.companion_min_probability(),
            );
            Ok((rows, gate, fallback, thresholds))
        })
    }

    /// The route `messages` takes among `routes` (a routes file's `{"default", "routes"}`, or a
    /// list of routes and `default`, the first route when not given), through the router
    /// `decide route` asks: the route, every route's probability in the routes' order, and why.
    #[pyo3(signature = (messages, routes, *, default = None, min_probability = None, max_messages = None))]
    fn route(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        routes: &Bound<'_, PyAny>,
        default: Option<String>,
        min_probability: Option<f64>,
        max_messages: Option<i64>,
    ) -> PyResult<RouteOut> {
        let conversation = Conversation::read(messages)?;
        let spec = match json_of(routes, "routes")? {
            Value::Array(list) => {
                // A bare name is a route described by its name, as `{"name": ...}` is.
                let list: Vec<Value> = list
                    .into_iter()
                    .map(|r| match r {
                        Value::String(name) => json!({ "name": name }),
                        other => other,
                    })
                    .collect();
                let default = default.or_else(|| {
                    list.first()
                        .and_then(|r| r.get("name"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                json!({ "default": default, "routes": list })
            }
            Value::Object(mut file) => {
                if let Some(d) = default {
                    if file.contains_key("default") {
                        return Err(invalid(
                            "default: given twice, in routes and as default=; give one",
                        ));
                    }
                    file.insert("default".into(), Value::String(d));
                }
                Value::Object(file)
            }
            other => {
                return Err(invalid(format!(
                    "routes: expected a routes file {{\"default\", \"routes\"}} or a list of routes, got {}",
                    json_kind(&other)
                )))
            }
        };
        let max_messages = count("max_messages", max_messages)?;
        let model = self.scorer.clone();
        detached(py, move || {
            let routes = RoutesSpec::from_value(spec).map_err(fail)?;
            let messages = conversation.parse()?;
            // The rules `decide route` and `/v1/route` apply to their input, in their words.
            let request =
                RouteRequest::new(messages, routes, max_messages, min_probability).map_err(fail)?;
            let router = request.router(model).map_err(fail)?;
            let decision = router.decide(&request.routing_request()).map_err(fail)?;
            let response = request.response(&decision);
            let reason = match decision.reason {
                RouteReason::Chosen => "chosen",
                RouteReason::OnlyCandidate => "only-candidate",
                RouteReason::NoUserMessage => "no-user-message",
                RouteReason::BelowMinProbability => "below-min-probability",
                RouteReason::Fallback { .. } => "fallback",
            };
            Ok((response.route, response.probabilities, reason))
        })
    }

    /// The model's embedding of each text, as `/v1/embeddings` answers: a text longer than the
    /// model reads is refused unless `truncate`, which drops its end.
    #[pyo3(signature = (texts, *, truncate = false))]
    fn embed(
        &self,
        py: Python<'_>,
        texts: &Bound<'_, PyAny>,
        truncate: bool,
    ) -> PyResult<Vec<Vec<f32>>> {
        let texts = self::texts("texts", json_of(texts, "texts")?)?;
        let engine = self.engine()?.clone();
        detached(py, move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let staged = engine.stage_embeddings(&refs).map_err(fail)?;
            if !truncate {
                if let Some(i) = staged.iter().position(|e| e.truncated) {
                    return Err(invalid(format!(
                        "texts[{i}]: longer than the model's {} tokens; shorten it, or pass truncate=True",
                        engine.info().max_length
                    )));
                }
            }
            let rows: Vec<_> = staged.into_iter().map(|e| e.row).collect();
            engine.forward_rows(&rows).map_err(fail)
        })
    }

    /// `documents` ranked against `query`, most relevant first, as `decide serve`'s rerank
    /// endpoints rank them: the model's name, how it scored (`cross-encoder` or `bi-encoder
    /// cosine`), and each document's index, relevance (the calibrated score) and raw score.
    fn rerank(
        &self,
        py: Python<'_>,
        query: &str,
        documents: &Bound<'_, PyAny>,
    ) -> PyResult<(String, &'static str, Vec<RankRow>)> {
        if query.trim().is_empty() {
            return Err(invalid("query: empty text"));
        }
        let documents = texts("documents", json_of(documents, "documents")?)?;
        let engine = self.engine()?.clone();
        let query = query.to_string();
        detached(py, move || {
            let refs: Vec<&str> = documents.iter().map(String::as_str).collect();
            let scores = engine.score(&query, &refs).map_err(fail)?;
            let calibration = engine.calibration().ok();
            let mut ranks: Vec<RankRow> = scores
                .raw
                .iter()
                .enumerate()
                .map(|(i, &raw)| (i, calibration.map_or(raw, |c| c.probability(raw)), raw))
                .collect();
            // Ties keep the documents' order, so that an answer does not depend on the sort.
            ranks.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
            let info = engine.info();
            let scored_by = match info.head {
                HeadName::CrossEncoder => "cross-encoder",
                HeadName::BiEncoder => "bi-encoder cosine",
            };
            Ok((info.name.clone(), scored_by, ranks))
        })
    }

    fn __repr__(&self) -> String {
        let about = self.scorer.about();
        format!("Decider(model={:?}, device={:?})", about.name, about.device)
    }
}
