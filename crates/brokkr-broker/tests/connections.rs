//! Clients that open connections and never finish a request cannot starve the broker: past the
//! connection cap, new connections wait; those that stall in their headers are closed after the
//! header read timeout, those that stall in their body after the idle timeout, and `/healthz`
//! is answered meanwhile. Everything talks to 127.0.0.1, a bounded number of
//! connections, for a few seconds.

#[macro_use]
mod harness;
mod serving;

use std::time::{Duration, Instant};

use brokkr_broker::server::ServerLimits;
use brokkr_engine::EngineOptions;
use harness::Backend;
use serving::{TestStore, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CAP: usize = 4;

/// A provision whose body stops after its first bytes (platform:test-password).
const STALLED_BODY: &[u8] = b"PUT /v2/service_instances/i-1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\
    Authorization: Basic cGxhdGZvcm06dGVzdC1wYXNzd29yZA==\r\nX-Broker-API-Version: 2.17\r\n\
    Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"service_id\": ";

/// Reads until the server closes the connection; fails after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut answer = Vec::new();
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_and_health_keeps_answering() {
    let store = TestStore::new(Backend::Sqlite).await;
    let limits = ServerLimits {
        max_connections: CAP,
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
    };
    let b = serve(
        &store,
        &harness::quickstart(|s| s),
        EngineOptions::default(),
        limits,
        &[],
    )
    .await;

    // More clients than the cap: some stop halfway through their headers, some in their body,
    // some send nothing.
    let mut slow = Vec::new();
    for i in 0..CAP + 2 {
        let mut stream = TcpStream::connect(b.addr).await.unwrap();
        let sent: &[u8] = match i % 3 {
            0 => b"GET /v2/catalog HTTP/1.1\r\nHost: 127.0.0.1\r\n",
            1 => STALLED_BODY,
            _ => b"",
        };
        stream.write_all(sent).await.unwrap();
        slow.push(stream);
    }

    // Health is answered once the header read timeout frees the slots, not before.
    let started = Instant::now();
    let mut health = TcpStream::connect(b.addr).await.unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = closed_within(&mut health, Duration::from_secs(5)).await;
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    assert!(
        waited >= Duration::from_millis(500),
        "answered after {waited:?}, while the cap was held by slow clients"
    );

    // Every slow client has been cut off.
    for stream in &mut slow {
        closed_within(stream, Duration::from_secs(3)).await;
    }
    let metrics = b.metrics().await;
    assert!(metrics.contains("brokkr_http_connections 1"), "{metrics}");
    b.stop().await;
}
