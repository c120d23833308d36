//! The HTTP server: hyper connections over a TCP listener, with limits that keep slow or idle
//! clients from exhausting the process.
//!
//! - **A cap on open connections** ([`ServerLimits::max_connections`]): at the cap, the server
//!   stops accepting; further connections wait in the kernel's listen backlog until one closes.
//!   File descriptors stay bounded and nothing is refused outright.
//! - **A header read timeout**: a connection that does not deliver a request's complete headers
//!   within [`ServerLimits::header_read_timeout`] — of being accepted, or of the previous
//!   response on a kept-alive connection — is closed (hyper's HTTP/1 timer; the same limit
//!   covers a client that sends nothing at all, before its protocol is known).
//! - **An idle timeout**: a connection with no request being answered and no traffic for
//!   [`ServerLimits::idle_timeout`] is closed (this bounds HTTP/2 connections and request
//!   bodies that stall).
//!
//! Together they free the slots slow clients hold: each header read timeout admits up to
//! `max_connections` of the connections waiting, so `/healthz` keeps answering. On shutdown the server stops accepting, lets
//! requests in flight finish and closes idle connections.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::ServiceExt as _;
use tracing::{debug, warn};

use crate::AppState;

/// Default cap on open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default time a client has to send a request's headers.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a connection may sit idle.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How many connections the server holds, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Most connections open at once; beyond, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a connection may go without traffic while no request is being answered.
    pub idle_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Serves the broker's [`crate::router`] on `listener` within `limits` until `shutdown`
/// completes, then drains: requests in flight finish, idle connections close.
pub async fn serve(
    listener: TcpListener,
    broker: AppState,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let router = crate::router(broker.clone());
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !is_connection_error(&e) {
                        // Out of file descriptors, most likely: wait for some to close.
                        warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let service = {
            let (router, activity) = (router.clone(), activity.clone());
            hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let answering = Answering::start(activity.clone());
                let response = router.clone().oneshot(request.map(axum::body::Body::new));
                async move {
                    let response = response.await;
                    drop(answering);
                    response
                }
            })
        };
        let io = TokioIo::new(Tracked {
            inner: stream,
            activity: activity.clone(),
        });
        let connection = builder.serve_connection(io, service).into_owned();
        let connection = graceful.watch(connection);
        let open = broker.metrics.connections.clone();
        open.inc();
        tokio::spawn(async move {
            tokio::select! {
                result = connection => {
                    if let Err(e) = result {
                        debug!(error = %e, "connection ended with an error");
                    }
                }
                () = activity.idle_past(limits) => debug!("closed an idle connection"),
            }
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Errors of one connection that `accept` reports and that say nothing about the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// What a connection has been doing, for its idle timeout.
struct Activity {
    opened: Instant,
    /// Milliseconds from `opened` to the last traffic or request start/end.
    last_ms: AtomicU64,
    /// Requests being answered.
    answering: AtomicUsize,
    /// Whether a request has started (until then the header read timeout applies).
    served: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            answering: AtomicUsize::new(0),
            served: AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Completes once the connection has been idle too long: no request being answered and no
    /// traffic for the idle timeout — or for the header read timeout, before its first request.
    async fn idle_past(&self, limits: ServerLimits) {
        loop {
            let limit = match self.served.load(Ordering::Relaxed) {
                true => limits.idle_timeout,
                false => limits.header_read_timeout,
            };
            let last = self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let busy = self.answering.load(Ordering::Relaxed) > 0;
            if !busy && last.elapsed() >= limit {
                return;
            }
            let wake = match busy {
                true => Instant::now() + limit,
                false => last + limit,
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// Marks a request as being answered for as long as it lives.
struct Answering(Arc<Activity>);

impl Answering {
    fn start(activity: Arc<Activity>) -> Self {
        activity.served.store(true, Ordering::Relaxed);
        activity.answering.fetch_add(1, Ordering::Relaxed);
        activity.touch();
        Self(activity)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A TCP stream that records its traffic in its connection's [`Activity`].
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
