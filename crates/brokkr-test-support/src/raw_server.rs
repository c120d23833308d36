//! A server on loopback that answers every request with a given head and a body written as
//! the same bytes over and over, counting the requests it answered and the body bytes it wrote:
//! what a client's body limits and time limits are tested against.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The head of a `200 OK` JSON answer whose body ends when the server hangs up (no
/// `Content-Length`): what a broker streaming a catalog too large to read sends.
pub const JSON_OK: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";

/// A [`raw_server`], serving until the test's runtime ends.
pub struct RawServer {
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// How many requests it has begun to answer (each once its head had arrived).
    pub requests: Arc<AtomicUsize>,
    /// How many body bytes it has written.
    pub sent: Arc<AtomicUsize>,
}

/// Starts a server on loopback that answers every request, once the request's head has arrived,
/// with `head` (the status line and headers, and the blank line that ends them) and then `body`
/// `times` times, `pause` apart, until the client hangs up.
pub async fn raw_server(
    head: impl Into<String>,
    body: Vec<u8>,
    times: usize,
    pause: Duration,
) -> RawServer {
    let (requests, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (head, body) = (Arc::new(head.into()), Arc::new(body));
    let (counted_requests, counted) = (requests.clone(), sent.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (requests, counted) = (counted_requests.clone(), counted.clone());
            let (head, body) = (head.clone(), body.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                requests.fetch_add(1, Ordering::SeqCst);
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..times {
                    if socket.write_all(&body).await.is_err() {
                        return;
                    }
                    counted.fetch_add(body.len(), Ordering::SeqCst);
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            });
        }
    });
    RawServer {
        url,
        requests,
        sent,
    }
}
