//! What the server runs: `GET /v1/models`, `GET /health` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::AppState;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
}

async fn models(State(state): State<AppState>) -> Json<Value> {
    let info = state.model().engine().info();
    Json(json!({
        "object": "list",
        "data": [{
            "id": info.name,
            "object": "model",
            "created": 0,
            "owned_by": "decide",
            "hf_id": info.hf_id,
            "head": info.head.as_str(),
            "device": info.device,
            "max_length": info.max_length,
        }]
    }))
}

async fn health(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"status": "ok", "model": state.model_name()}))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics().render(),
    )
}
