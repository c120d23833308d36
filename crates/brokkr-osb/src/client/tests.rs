//! The client against brokers on loopback: answers cut at their limits, texts cut, refused
//! addresses.

use std::sync::Arc;
use std::time::Duration;

use brokkr_test_support::{JSON_OK, RawServer, raw_server};

use super::*;

const MIB: usize = 1 << 20;

#[tokio::test]
async fn a_catalog_longer_than_the_limit_is_cut_off_while_it_streams() {
    // 120 MiB without a Content-Length: the body ends when the broker hangs up.
    let RawServer { url, sent, .. } =
        raw_server(JSON_OK, vec![b' '; 64 << 10], 120 * 16, Duration::ZERO).await;
    let client = Client::builder(&url)
        .body_limits(BodyLimits {
            catalog: MIB as u64,
            ..BodyLimits::default()
        })
        .build()
        .unwrap();
    let e = client.catalog().await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::InvalidResponse { status, .. } if status == StatusCode::OK),
        "{e:?}"
    );
    assert!(
        text.contains("larger than the 1048576 bytes") && text.contains(&url),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let written = sent.load(std::sync::atomic::Ordering::SeqCst);
    // The client stopped reading at the limit: the broker could not write much more than
    // what the sockets' buffers hold.
    assert!(written < 32 * MIB, "the broker wrote {written} bytes");
}

#[tokio::test]
async fn an_honest_content_length_over_the_limit_fails_before_the_body_is_read() {
    let RawServer { url, sent, .. } = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 125829120\r\n\r\n",
        vec![b' '; 64 << 10],
        120 * 16,
        Duration::from_millis(10),
    )
    .await;
    let client = Client::builder(&url).build().unwrap();
    let e = client.catalog().await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("larger than the 8388608 bytes")
            && text.contains("Content-Length: 125829120"),
        "{text}"
    );
    assert!(sent.load(std::sync::atomic::Ordering::SeqCst) < 4 * MIB);
}

#[tokio::test]
async fn other_answers_have_their_own_smaller_limit() {
    let RawServer { url, .. } = raw_server(
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
        vec![b' '; 64 << 10],
        64,
        Duration::ZERO,
    )
    .await;
    let client = Client::builder(&url).build().unwrap();
    let request = crate::messages::ProvisionRequest::default();
    let e = client.provision("i-1", &request, true).await.unwrap_err();
    // A 201 with an unreadable body, as orphan mitigation wants to know it.
    assert!(
        matches!(&e, Error::InvalidResponse { status, message } if *status == StatusCode::CREATED
            && message.contains("larger than the 1048576 bytes")),
        "{e:?}"
    );
}

#[tokio::test]
async fn an_error_answer_too_long_to_read_keeps_its_status() {
    let RawServer { url, .. } = raw_server(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n",
        vec![b' '; 64 << 10],
        64,
        Duration::ZERO,
    )
    .await;
    let client = Client::builder(&url).build().unwrap();
    let e = client.catalog().await.unwrap_err();
    assert!(
        matches!(&e, Error::Broker(b) if b.status == StatusCode::SERVICE_UNAVAILABLE
            && b.description.is_none()),
        "{e:?}"
    );
    assert!(e.is_transient());
}

#[tokio::test]
async fn a_broker_that_trickles_its_answer_is_cut_off_at_the_timeout() {
    // One byte every 100 ms: no read ever waits long, the whole answer would take hours.
    let RawServer { url, .. } =
        raw_server(JSON_OK, vec![b' '; 1], 100_000, Duration::from_millis(100)).await;
    let client = Client::builder(&url)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let e = client.catalog().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&e, Error::Transport { source, .. } if source.is_timeout()),
        "{e:?}"
    );
    assert!(e.to_string().contains("did not answer in time"), "{e}");
}

/// A broker on loopback answering a provision with `provision` (202) and every poll with
/// `poll` (200); returns its URL and the query of every poll.
async fn scripted_broker(
    provision: serde_json::Value,
    poll: serde_json::Value,
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::RawQuery;
    let polls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = polls.clone();
    let app = axum::Router::new()
        .route(
            "/v2/service_instances/{id}",
            axum::routing::put(
                move || async move { (StatusCode::ACCEPTED, axum::Json(provision)) },
            ),
        )
        .route(
            "/v2/service_instances/{id}/last_operation",
            axum::routing::get(move |RawQuery(query): RawQuery| async move {
                seen.lock().unwrap().push(query.unwrap_or_default());
                axum::Json(poll)
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, polls)
}

#[tokio::test]
async fn a_million_character_description_comes_out_cut_and_a_huge_operation_is_refused() {
    let (url, polls) = scripted_broker(
        serde_json::json!({"operation": "o".repeat(500_000),
            "dashboard_url": format!("https://dash.example.com/{}", "d".repeat(500_000))}),
        serde_json::json!({"state": "failed", "description": "x".repeat(1_000_000)}),
    )
    .await;
    let client = Client::builder(&url).build().unwrap();
    let request = crate::messages::ProvisionRequest::default();
    let e = client.provision("i-1", &request, true).await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidResponse { status, message } if *status == StatusCode::ACCEPTED
            && message.contains("operation is 500000 bytes")),
        "{e:?}"
    );
    assert!(e.to_string().len() < 300, "{e}");

    let last = client
        .last_operation(&Poll::instance("i-1"))
        .await
        .unwrap()
        .body;
    let description = last.description.unwrap();
    assert_eq!(description.chars().count(), MAX_TEXT + 1);
    assert!(description.ends_with('…'));
    assert_eq!(polls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_bodys_unexpected_value_is_cut_in_the_error() {
    let (url, _) = scripted_broker(
        serde_json::json!({}),
        serde_json::json!({"state": "s".repeat(1_000_000)}),
    )
    .await;
    let client = Client::builder(&url).build().unwrap();
    let e = client
        .last_operation(&Poll::instance("i-1"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
    assert!(
        e.to_string().chars().count() < 1200,
        "{}",
        e.to_string().len()
    );
}

fn no_loopback() -> AddressFilter {
    AddressFilter::new(|a| !a.ip().to_canonical().is_loopback())
}

#[tokio::test]
async fn a_refused_address_is_never_connected_to() {
    let RawServer { url, sent, .. } = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n",
        vec![b' '; 14],
        1,
        Duration::ZERO,
    )
    .await;
    // An IP address in the URL: refused when the client is built.
    let e = Client::builder(&url)
        .connect_only_to(no_loopback())
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::AddressRefused { .. }), "{e:?}");
    // A name that resolves to a refused address: refused before connecting.
    let port = url.rsplit(':').next().unwrap();
    let named = Client::builder(format!("http://localhost:{port}"))
        .connect_only_to(no_loopback())
        .build()
        .unwrap();
    let e = named.catalog().await.unwrap_err();
    assert!(
        matches!(&e, Error::AddressRefused { address, .. } if address.ip().is_loopback()),
        "{e:?}"
    );
    assert!(e.to_string().contains("may not connect"), "{e}");
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
    // The same name through a filter that accepts it: connected.
    let accepted = Client::builder(format!("http://localhost:{port}"))
        .connect_only_to(AddressFilter::new(|_| true))
        .build()
        .unwrap();
    let e = accepted.catalog().await.unwrap_err();
    assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
}

#[tokio::test]
async fn an_address_in_the_url_is_checked_again_at_every_call() {
    let RawServer { url, sent, .. } = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n",
        vec![b' '; 14],
        2,
        Duration::ZERO,
    )
    .await;
    let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let now_refused = refused.clone();
    let client = Client::builder(&url)
        .connect_only_to(AddressFilter::new(move |_| {
            !now_refused.load(std::sync::atomic::Ordering::SeqCst)
        }))
        .build()
        .unwrap();
    let e = client.catalog().await.unwrap_err();
    assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
    let before = sent.load(std::sync::atomic::Ordering::SeqCst);
    refused.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = client.catalog().await.unwrap_err();
    assert!(matches!(e, Error::AddressRefused { .. }), "{e:?}");
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), before);
}
