//! What bounds a request: its body size (413) and the time it takes to arrive (408), the
//! decisions in flight (503 at once, never a pile-up) and its deadline (504); and where its CPU
//! work runs (tokio's blocking pool, never a runtime worker).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::StatusCode;
use tokio::sync::OwnedSemaphorePermit;

use crate::api_error::ApiError;
use crate::AppState;

/// The layer that stops reading a body past `max_body_bytes`.
pub(crate) fn body_limit(state: &AppState) -> DefaultBodyLimit {
    DefaultBodyLimit::max(state.config().max_body_bytes)
}

/// The request body, every JSON body the server reads: over the limit, a 413 that names it; an
/// object that names a key twice, a 400 naming the key and where it is.
///
/// RFC 8259 leaves a repeated key to the reader, and readers differ (serde_json keeps the last
/// value, others the first), so a proxy or a log that reads the body another way would see
/// another request than the one decided on. Checking here, where every handler gets its body,
/// refuses it on every endpoint alike; the handlers of the other wire formats take
/// `Result<Body, ApiError>` and answer the refusal in their own shape. A body that is not JSON
/// at all passes on, for the endpoint's parser to say so as it always has.
pub(crate) struct Body(pub(crate) Bytes);

/// Up to this size a body is scanned for repeated keys on the runtime's worker: a scan this
/// short spares most requests a second hand-off to the blocking pool; larger bodies are
/// scanned there, as they are parsed.
const INLINE_CHECK_BYTES: usize = 64 * 1024;

/// A 400 for a key that `bytes` names twice in one object.
fn refuse_duplicate_keys(bytes: &[u8]) -> Result<(), ApiError> {
    match decide_http::unique_keys::duplicate_key(bytes) {
        Some(duplicate) => Err(ApiError::bad(duplicate.path.clone(), duplicate.to_string())),
        None => Ok(()),
    }
}

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config().read_timeout;
        let bytes = tokio::time::timeout(limit, Bytes::from_request(request, state))
            .await
            .map_err(|_| ApiError::SlowBody(limit.as_secs()))?
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::TooLarge(state.config().max_body_bytes)
                } else {
                    ApiError::bad("", e.body_text())
                }
            })?;
        if bytes.len() <= INLINE_CHECK_BYTES {
            refuse_duplicate_keys(&bytes)?;
        } else {
            let scanned = bytes.clone();
            off_runtime(move || refuse_duplicate_keys(&scanned)).await?;
        }
        Ok(Body(bytes))
    }
}

/// A slot for one decision, or 503 at once when every slot is taken.
pub(crate) fn admit(state: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    state.try_permit().ok_or_else(|| {
        state.metrics().observe_rejected();
        ApiError::Overloaded(Some(state.retry_after_secs()))
    })
}

/// Runs `future` under the request deadline.
pub(crate) async fn deadline<T>(
    state: &AppState,
    future: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let limit = state.config().request_timeout;
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or(Err(ApiError::Timeout(limit.as_secs_f64())))
}

/// Sets a flag when dropped: the request's future ended (answered, timed out, or dropped
/// because the client went away), so its queued work is no longer wanted.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs CPU work (parsing and validating a large body, say) on tokio's blocking pool, so that
/// the runtime's workers keep answering other requests meanwhile.
pub(crate) async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
}

/// Runs blocking work (the filter or the router, which call the batched engine's blocking path)
/// on tokio's blocking pool, under the request's deadline and one admission slot. Its error
/// answers as [`AppState::error`] says: a full queue with the server's `Retry-After`.
///
/// The slot goes with the work and is freed when the work really ends, not when the request is
/// answered; once the deadline passes or the client leaves, the work's rows still queued are
/// dropped ([`with_cancel`](crate::batcher::with_cancel)), so it ends soon after.
pub(crate) async fn blocking<T: Send + 'static, E: Into<ApiError> + 'static>(
    state: &AppState,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = admit(state)?;
    let flag = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(flag.clone());
    deadline(
        state,
        off_runtime(move || {
            let _permit = permit;
            crate::batcher::with_cancel(flag, work).map_err(Into::into)
        }),
    )
    .await
    .map_err(|e| state.error(e))
}
