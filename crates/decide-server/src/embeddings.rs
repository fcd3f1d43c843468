//! Embeddings from the loaded bi-encoder, in the two shapes vector-store clients send:
//! `POST /v1/embeddings` (OpenAI) and `POST /embed` (text-embeddings-inference).
//!
//! The texts are tokenized on tokio's blocking pool and their rows join the decisions' queue, so
//! embeddings and decisions share forward passes; a text's embedding is the engine's own
//! ([`Engine::embed`](decide_engine::Engine::embed)), alone or in a batch. A text longer than the
//! model reads is refused naming it, as both services do, unless `/embed` is sent
//! `"truncate": true` (it then loses its end).

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use decide_chat::type_name;
use decide_engine::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api_error::{ApiError, TeiError};
use crate::batcher::Lane;
use crate::limits::{blocking, Body};
use crate::AppState;

/// The most texts one request may carry (OpenAI's limit per embeddings request).
pub(crate) const MAX_INPUTS: usize = 2048;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/embed", post(tei_embed))
}

/// The texts of `value` (a string, or an array of strings) with the path of each, for errors.
pub(crate) fn texts(field: &str, value: Value) -> Result<Vec<(String, String)>, ApiError> {
    let items = match value {
        Value::String(s) => vec![(field.to_string(), Value::String(s))],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::bad(field, "empty: send at least one text"))
        }
        Value::Array(items) if items.len() > MAX_INPUTS => {
            return Err(ApiError::bad(
                field,
                format!("{} texts, at most {MAX_INPUTS} allowed", items.len()),
            ))
        }
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("{field}[{i}]"), v))
            .collect(),
        other => {
            return Err(ApiError::bad(
                field,
                format!(
                    "expected a string or an array of strings, got {}",
                    type_name(&other)
                ),
            ))
        }
    };
    items
        .into_iter()
        .map(|(path, v)| match v {
            Value::String(s) if s.trim().is_empty() => Err(ApiError::bad(path, "empty text")),
            Value::String(s) => Ok((path, s)),
            Value::Number(_) | Value::Array(_) => Err(ApiError::bad(
                path,
                "token ids are not supported: send text, the server tokenizes it",
            )),
            other => Err(ApiError::bad(
                path,
                format!("expected a string, got {}", type_name(&other)),
            )),
        })
        .collect()
}

/// Embeddings of some texts and the tokens the model read for them.
struct Embedded {
    vectors: Vec<Vec<f32>>,
    tokens: usize,
}

/// Embeds `texts` through the queue, under one admission slot and the request deadline; a text
/// the model cannot read whole is refused, naming its path, unless `truncate`. Tokenizing and
/// waiting on the queue run on the blocking pool and hold the slot until they end ([`blocking`]).
async fn embed(
    state: &AppState,
    texts: Vec<(String, String)>,
    truncate: bool,
) -> Result<Embedded, ApiError> {
    let model = state.model().clone();
    blocking(state, move || {
        let engine = model.engine();
        let max_length = engine.info().max_length;
        let (paths, texts): (Vec<String>, Vec<String>) = texts.into_iter().unzip();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let staged = engine.stage_embeddings(&refs)?;
        if !truncate {
            if let Some(i) = staged.iter().position(|e| e.truncated) {
                return Err(ApiError::bad(
                    paths[i].clone(),
                    format!("longer than the model's {max_length} tokens; shorten it"),
                ));
            }
        }
        let tokens = staged.iter().map(|e| e.row.len()).sum();
        let rows = staged.into_iter().map(|e| e.row).collect();
        let vectors = model.forward_blocking(rows, Lane::Bulk)?;
        Ok(Embedded { vectors, tokens })
    })
    .await
}

/// Refuses a `dimensions` other than the model's own: its embeddings were not trained to be
/// shortened (Matryoshka), so a cut vector would be a worse one, silently.
fn check_dimensions(asked: Option<usize>, vectors: &[Vec<f32>]) -> Result<(), ApiError> {
    let has = vectors.first().map_or(0, Vec::len);
    match asked {
        Some(d) if d != has => Err(ApiError::bad(
            "dimensions",
            format!(
                "{d} is not supported: this model's embeddings have {has} dimensions and cannot \
                 be shortened; leave dimensions out"
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses a request for a model other than `engine`'s, the one that answers it: a request for
/// another model must fail, not be answered by this one.
pub(crate) fn check_model(engine: &Engine, asked: Option<&str>) -> Result<(), ApiError> {
    let info = engine.info();
    match asked {
        Some(m) if m != info.name && Some(m) != info.hf_id.as_deref() => Err(ApiError::bad(
            "model",
            format!("this endpoint runs '{}', not '{m}'", info.name),
        )),
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// The body of `POST /v1/embeddings`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenAiRequest {
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: EncodingFormat,
    #[serde(default)]
    dimensions: Option<usize>,
    // Accepted as OpenAI does; it names the end user and changes nothing here.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// A vector as OpenAI's `base64` encoding has it: its f32s, little-endian, in base64.
fn base64_of(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `POST /v1/embeddings`: OpenAI's embeddings API; `usage` counts the tokens the model read,
/// special tokens included.
async fn openai_embeddings(
    State(state): State<AppState>,
    Body(raw): Body,
) -> Result<Json<Value>, ApiError> {
    let request: OpenAiRequest = decide_chat::from_slice(&raw)?;
    check_model(state.model().engine(), request.model.as_deref())?;
    let texts = texts("input", request.input)?;
    let embedded = embed(&state, texts, false).await?;
    check_dimensions(request.dimensions, &embedded.vectors)?;
    let data: Vec<Value> = embedded
        .vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match request.encoding_format {
                EncodingFormat::Float => json!(v),
                EncodingFormat::Base64 => json!(base64_of(v)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": state.model_name(),
        "usage": {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens},
    })))
}

/// Which end of a long text text-embeddings-inference cuts.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
enum Direction {
    #[serde(alias = "right")]
    Right,
    #[serde(alias = "left")]
    Left,
}

/// The body of `POST /embed`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeiRequest {
    inputs: Value,
    #[serde(default)]
    truncate: bool,
    #[serde(default)]
    truncation_direction: Option<Direction>,
    #[serde(default = "yes")]
    normalize: bool,
    #[serde(default)]
    prompt_name: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

/// `POST /embed`: text-embeddings-inference's embeddings, one array per input.
///
/// `normalize: false` returns the model's own output: for a model whose sentence-transformers
/// modules end with `Normalize` (both shipped ones do), that is already unit length.
async fn tei_embed(
    State(state): State<AppState>,
    body: Result<Body, ApiError>,
) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    let Body(raw) = body?;
    let request: TeiRequest = decide_chat::from_slice(&raw).map_err(ApiError::from)?;
    if request.truncation_direction == Some(Direction::Left) {
        return Err(ApiError::bad(
            "truncation_direction",
            "only Right is supported: a document keeps its start, as the engine embeds it",
        )
        .into());
    }
    if request.prompt_name.is_some() {
        return Err(ApiError::bad("prompt_name", "this model has no prompts").into());
    }
    let texts = texts("inputs", request.inputs)?;
    let mut embedded = embed(&state, texts, request.truncate).await?;
    check_dimensions(request.dimensions, &embedded.vectors)?;
    if request.normalize {
        for v in &mut embedded.vectors {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x /= norm);
            }
        }
    }
    Ok(Json(embedded.vectors))
}
