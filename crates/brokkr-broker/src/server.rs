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
//! - **An idle timeout**: a connection without traffic for [`ServerLimits::idle_timeout`] is
//!   closed, unless a request whose body has fully arrived is being answered (an operation may
//!   take a while). This bounds request bodies that stall and HTTP/2 connections.
//!
//! Together they free the slots slow clients hold: each header read timeout admits up to
//! `max_connections` of the connections waiting, so `/healthz` keeps answering. On shutdown the server stops accepting, lets
//! requests in flight finish and closes idle connections.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
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

use crate::broker::AppState;

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
    /// How long a connection may go without traffic, unless a request whose body has arrived
    /// is being answered.
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

/// Serves the broker's [`router`](crate::app::router) on `listener` within `limits` until `shutdown`
/// completes, then drains: requests in flight finish, idle connections close.
pub async fn serve(
    listener: TcpListener,
    broker: AppState,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let router = crate::app::router(broker.clone());
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
                let answering = Answering::start(activity.clone(), request.body().is_end_stream());
                let request = request.map(|body| {
                    axum::body::Body::new(TrackedBody {
                        inner: body,
                        answering: answering.clone(),
                    })
                });
                let response = router.clone().oneshot(request);
                async move {
                    let response = response.await;
                    answering.finish();
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
    /// Requests being answered whose body has fully arrived.
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

    /// Completes once the connection has been idle too long: no request with its body complete
    /// being answered, and no traffic for the idle timeout — or for the header read timeout,
    /// before its first request.
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

/// One request's part in its connection's [`Activity`]: it counts as being answered from the
/// end of its body until its response is ready.
struct Answering {
    activity: Arc<Activity>,
    /// [`RECEIVING`], [`ANSWERING`] or [`ANSWERED`].
    stage: AtomicU8,
}

const RECEIVING: u8 = 0;
const ANSWERING: u8 = 1;
const ANSWERED: u8 = 2;

impl Answering {
    fn start(activity: Arc<Activity>, body_complete: bool) -> Arc<Self> {
        activity.served.store(true, Ordering::Relaxed);
        activity.touch();
        let answering = Arc::new(Self {
            activity,
            stage: AtomicU8::new(RECEIVING),
        });
        if body_complete {
            answering.body_complete();
        }
        answering
    }

    fn body_complete(&self) {
        let stage =
            self.stage
                .compare_exchange(RECEIVING, ANSWERING, Ordering::Relaxed, Ordering::Relaxed);
        if stage.is_ok() {
            self.activity.answering.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn finish(&self) {
        if self.stage.swap(ANSWERED, Ordering::Relaxed) == ANSWERING {
            self.activity.answering.fetch_sub(1, Ordering::Relaxed);
        }
        self.activity.touch();
    }
}

/// A request body that tells its [`Answering`] when it has fully arrived.
struct TrackedBody {
    inner: Incoming,
    answering: Arc<Answering>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.answering.body_complete();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
