//! The connection loop of an HTTP/1 server that slow or idle clients cannot exhaust, and that
//! stops within a deadline: `decide serve` and `decide mcp --http` both run it.
//!
//! `axum::serve` has none of these: no header read timeout (a client that sends half its
//! headers holds a connection forever), no cap on connections, and a graceful shutdown that
//! waits for every connection, an open event stream included, however long it takes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, CONNECTION};
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// How long connections may take, and how many there may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers; an idle keep-alive connection is
    /// closed after it too (default 10 s).
    pub read_timeout: Duration,
    /// Open connections at once; past it, new ones wait in the kernel's backlog (default 1024).
    pub max_connections: usize,
    /// After the shutdown signal, how long requests in flight may take before their
    /// connections are dropped (default 10 s).
    pub shutdown_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// After the shutdown signal, how long an idle keep-alive connection stays open before it is
/// closed. A request its client had already sent (still on the wire, or in the socket's buffer)
/// is answered, with `Connection: close`, instead of being reset; a quarter of a second covers
/// any such request on loopback or a LAN, and costs little next to the shutdown deadline.
const DRAIN_GRACE: Duration = Duration::from_millis(250);

/// Serves `service` on `listener` until `shutdown` completes, then stops accepting, lets the
/// requests in flight finish for up to `limits.shutdown_timeout`, and drops the connections
/// still open.
///
/// Each connection must send a request's headers within `limits.read_timeout` (an idle
/// keep-alive connection is closed after it too), and at most `limits.max_connections` are
/// served at once: idle or half-sent connections cannot exhaust the server or hold its
/// shutdown. Once the signal has come, every answer carries `Connection: close`, and the
/// connections close as their answers end; a connection answering nothing (idle, or part-way
/// through a request's headers) closes after a short grace; a body that never ends (an event
/// stream) is the caller's to end at the signal, or it is dropped at the deadline.
///
/// The error is the listener's address, unreadable; a failed `accept` (out of file descriptors
/// and the like) waits for connections to close instead.
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    listener.local_addr()?;
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let draining = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Finished connections are reaped as we go, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; were it, nothing more could be served.
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: wait for connections to close.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(service.clone());
        let draining_now = Arc::clone(&draining);
        let answering = Arc::new(AtomicUsize::new(0));
        let answering_now = Arc::clone(&answering);
        let service = hyper::service::service_fn(move |request| {
            let answer = hyper::service::Service::call(&service, request);
            let draining = Arc::clone(&draining_now);
            let answering = Answering::start(&answering_now);
            async move {
                let mut response = answer.await?;
                // hyper adds `Connection: close` itself only once `graceful_shutdown` is
                // called, which waits for the grace below.
                if draining.load(Ordering::Relaxed) {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, S::Error>(response.map(|body| Tracked {
                    body: Box::pin(body),
                    _answering: answering,
                }))
            }
        });
        let mut stop = stop_rx.clone();
        let grace = DRAIN_GRACE.min(limits.shutdown_timeout);
        let read_timeout = limits.read_timeout;
        connections.spawn(async move {
            let _permit = permit;
            let io = hyper_util::rt::TokioIo::new(stream);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(read_timeout);
            let connection = builder.serve_connection(io, service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            tokio::select! {
                _ = connection.as_mut() => return,
                () = tokio::time::sleep(grace) => {}
            }
            // Closes the connection if idle, else once its answer is written.
            connection.as_mut().graceful_shutdown();
            loop {
                tokio::select! {
                    _ = connection.as_mut() => return,
                    () = tokio::time::sleep(grace) => {}
                }
                // Nothing is being answered: the connection is part-way through a request's
                // headers, or has not sent any. hyper would wait for the rest, up to the read
                // timeout, and so hold the shutdown for it; no request is lost by closing now.
                if answering.load(Ordering::Acquire) == 0 {
                    return;
                }
            }
        });
    }
    drop(listener);
    draining.store(true, Ordering::Relaxed);
    let _ = stop_tx.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_timeout, drained)
        .await
        .is_err()
    {
        connections.shutdown().await;
    }
    Ok(())
}

/// One request of a connection being answered, from its headers until its answer's body has
/// been handed to the connection whole (or dropped).
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that counts as [`Answering`] until hyper drops it, which it does once the
/// last frame is written.
struct Tracked<B> {
    body: Pin<Box<B>>,
    _answering: Answering,
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
