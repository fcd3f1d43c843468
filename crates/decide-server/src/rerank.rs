//! Reranking for retrieval pipelines, in the shapes their clients send:
//! `POST /rerank` (text-embeddings-inference) and `POST /v1/rerank`, `POST /v2/rerank` (Cohere's
//! two versions, which Jina's shares).
//!
//! The documents are scored by the cross-encoder `decide serve --rerank MODEL` loaded, through a
//! queue of its own; without one, by the model's cosine of the query's and each document's
//! embeddings (documents' embeddings are cached as tools' are). The answer's `model` names the
//! model that scored and `scored_by` how. A score is the model's raw score (a logit or a cosine)
//! and its relevance the model's calibration of it (for a cross-encoder, the sigmoid of its
//! logit, as text-embeddings-inference answers); an uncalibrated model's relevance is its raw
//! score. Pairs longer than the model reads are trimmed as decisions trim them (the query keeps
//! its end, a document its start), whatever `truncate` says.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use decide_engine::HeadName;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api_error::{ApiError, TeiError};
use crate::batcher::Lane;
use crate::embeddings::{check_model, texts, MAX_INPUTS};
use crate::limits::{blocking, Body};
use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/rerank", post(tei_rerank))
        .route("/v1/rerank", post(cohere_rerank))
        .route("/v2/rerank", post(cohere_rerank))
}

/// One document's place.
struct Rank {
    index: usize,
    raw: f64,
    relevance: f64,
}

/// The documents, most relevant first, and what scored them.
struct Ranked {
    model: String,
    scored_by: &'static str,
    ranks: Vec<Rank>,
    tokens: usize,
}

/// Scores `documents` against `query` through the reranking model's queue, under one
/// admission slot and the request deadline; tokenizing and waiting on the queue run on the
/// blocking pool and hold the slot until they end ([`blocking`]).
async fn rank(state: &AppState, query: String, documents: Vec<String>) -> Result<Ranked, ApiError> {
    if query.trim().is_empty() {
        return Err(ApiError::bad("query", "empty text"));
    }
    let queue = state.reranker().clone();
    blocking(state, move || {
        let engine = queue.engine();
        let refs: Vec<&str> = documents.iter().map(String::as_str).collect();
        let mut staged = engine.stage_scores(&query, &refs)?;
        let outputs = queue.forward_blocking(staged.take_rows(), Lane::Bulk)?;
        let scores = engine.finish_scores(staged, outputs)?;
        let calibration = engine.calibration().ok();
        let mut ranks: Vec<Rank> = scores
            .raw
            .iter()
            .enumerate()
            .map(|(index, &raw)| Rank {
                index,
                raw,
                relevance: calibration.map_or(raw, |c| c.probability(raw)),
            })
            .collect();
        // Ties keep the documents' order, so that an answer does not depend on the sort.
        ranks.sort_by(|a, b| b.raw.total_cmp(&a.raw).then(a.index.cmp(&b.index)));
        let info = engine.info();
        Ok::<_, ApiError>(Ranked {
            model: info.name.clone(),
            scored_by: match info.head {
                HeadName::CrossEncoder => "cross-encoder",
                HeadName::BiEncoder => "bi-encoder cosine",
            },
            ranks,
            tokens: scores.tokens,
        })
    })
    .await
}

/// The body of text-embeddings-inference's `POST /rerank`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeiRequest {
    query: String,
    texts: Value,
    #[serde(default)]
    #[allow(dead_code)]
    truncate: bool,
    #[serde(default)]
    #[allow(dead_code)]
    truncation_direction: Option<Value>,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
}

/// `POST /rerank`: `[{"index", "score", "text"?}]`, most relevant first.
async fn tei_rerank(
    State(state): State<AppState>,
    body: Result<Body, ApiError>,
) -> Result<Json<Vec<Value>>, TeiError> {
    let Body(raw) = body?;
    let request: TeiRequest = decide_chat::from_slice(&raw).map_err(ApiError::from)?;
    let documents: Vec<String> = texts("texts", request.texts)?
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let ranked = rank(&state, request.query, documents.clone()).await?;
    Ok(Json(
        ranked
            .ranks
            .iter()
            .map(|r| {
                let score = if request.raw_scores {
                    r.raw
                } else {
                    r.relevance
                };
                let mut out = json!({"index": r.index, "score": score});
                if request.return_text {
                    out["text"] = json!(documents[r.index]);
                }
                out
            })
            .collect(),
    ))
}

/// A document as Cohere v1 and Jina take it: text, or `{"text": ...}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

/// The body of Cohere's and Jina's `POST /v1/rerank` (and Cohere's `/v2/rerank`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CohereRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: bool,
    #[serde(default)]
    max_tokens_per_doc: Option<Value>,
    #[serde(default)]
    max_chunks_per_doc: Option<Value>,
    #[serde(default)]
    rank_fields: Option<Value>,
    // A scheduling hint of Cohere's; every request here waits in one FIFO.
    #[serde(default)]
    #[allow(dead_code)]
    priority: Option<Value>,
}

/// `POST /v1/rerank`, `POST /v2/rerank`: `{"model", "scored_by", "results": [{"index",
/// "relevance_score", "document"?}], "usage", "meta"}`, most relevant first.
async fn cohere_rerank(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<Value>, ApiError> {
    let request: CohereRequest = decide_chat::from_slice(&raw)?;
    check_model(state.reranker().engine(), request.model.as_deref())?;
    for (field, given) in [
        ("max_tokens_per_doc", &request.max_tokens_per_doc),
        ("max_chunks_per_doc", &request.max_chunks_per_doc),
        ("rank_fields", &request.rank_fields),
    ] {
        if given.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(
                field,
                "not supported: documents are read whole as text, up to the model's length",
            ));
        }
    }
    if request.documents.is_empty() {
        return Err(ApiError::bad("documents", "empty: send at least one text"));
    }
    if request.documents.len() > MAX_INPUTS {
        return Err(ApiError::bad(
            "documents",
            format!(
                "{} texts, at most {MAX_INPUTS} allowed",
                request.documents.len()
            ),
        ));
    }
    if request.top_n == Some(0) {
        return Err(ApiError::bad("top_n", "must be at least 1"));
    }
    let documents = request
        .documents
        .into_iter()
        .enumerate()
        .map(|(i, v)| match serde_json::from_value::<Document>(v) {
            Ok(Document::Text(t) | Document::Object { text: t }) if !t.trim().is_empty() => Ok(t),
            Ok(_) => Err(ApiError::bad(format!("documents[{i}]"), "empty text")),
            Err(_) => Err(ApiError::bad(
                format!("documents[{i}]"),
                "expected a string or {\"text\": string}",
            )),
        })
        .collect::<Result<Vec<String>, ApiError>>()?;
    let ranked = rank(&state, request.query, documents.clone()).await?;
    let top = request.top_n.unwrap_or(usize::MAX);
    let results: Vec<Value> = ranked
        .ranks
        .iter()
        .take(top)
        .map(|r| {
            let mut out = json!({"index": r.index, "relevance_score": r.relevance});
            if request.return_documents {
                out["document"] = json!({"text": documents[r.index]});
            }
            out
        })
        .collect();
    Ok(Json(json!({
        "model": ranked.model,
        "scored_by": ranked.scored_by,
        "results": results,
        "usage": {"total_tokens": ranked.tokens},
        "meta": {"billed_units": {"search_units": 1}},
    })))
}
