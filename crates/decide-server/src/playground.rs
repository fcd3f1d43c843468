//! The playground at `GET /`: one page, built into the binary, that tries the tool filter and
//! the router on a person's own tools and conversation through the public endpoints
//! (`/v1/select`, `/v1/route`), and the shipped examples it offers at `/playground/examples/`.
//!
//! It needs no build step and no network: inline CSS and script, no CDN. It and the examples
//! hold no data of the server's, so they are open without the API key; the page sends the key
//! a person types with each call.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::AppState;

const PAGE: &str = include_str!("playground.html");

/// The shipped examples the page offers, by the name they are served under.
const EXAMPLES: [(&str, &str); 4] = [
    ("tools.json", include_str!("../../../examples/tools.json")),
    (
        "tools-openai.json",
        include_str!("../../../examples/tools-openai.json"),
    ),
    (
        "conversation.json",
        include_str!("../../../examples/conversation.json"),
    ),
    ("routes.json", include_str!("../../../examples/routes.json")),
];

/// Where the examples are served.
pub(crate) const EXAMPLES_PATH: &str = "/playground/examples";

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(page))
        .route("/playground/examples/{name}", get(example))
}

/// Whether `path` is the page or one of its examples, which need no API key.
pub(crate) fn is_public(path: &str) -> bool {
    path == "/" || path.starts_with(EXAMPLES_PATH)
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn example(Path(name): Path<String>) -> Response {
    match EXAMPLES.iter().find(|(n, _)| *n == name) {
        Some((_, text)) => ([(header::CONTENT_TYPE, "application/json")], *text).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!(
                "no example '{name}' (there are {})",
                EXAMPLES.map(|(n, _)| n).join(", ")
            ),
        )
            .into_response(),
    }
}
