//! Requests that must be refused before anything is stored: the ids `.` and `..` (which
//! clients normalise away, so a resource under them could never be reached again), and admin
//! requests without credentials, which get a challenge like the OSB API's.

#[macro_use]
mod harness;

use harness::*;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

store_tests!(dot_ids_are_refused);

/// Sends `method path` with `body` over a raw connection — HTTP clients normalise `.` and `..`
/// away — and returns the status line and the body.
async fn raw(b: &TestBroker, method: &str, path: &str, body: &str) -> (String, Value) {
    let addr = b.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // platform:test-password
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Basic cGxhdGZvcm06dGVzdC1wYXNzd29yZA==\r\n\
         X-Broker-API-Version: 2.17\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.lines().next().unwrap().to_owned();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn dot_ids_are_refused(backend: Backend) {
    let b = start(backend).await;
    let provision = provision_body(SYNC_PLAN).to_string();
    for id in [".", "..", "%2E", "%2e%2E"] {
        let (status, body) = raw(
            &b,
            "PUT",
            &format!("/v2/service_instances/{id}"),
            &provision,
        )
        .await;
        assert!(status.contains(" 400 "), "{id}: {status}");
        assert!(
            body["description"]
                .as_str()
                .unwrap()
                .contains("not `.` or `..`"),
            "{id}: {body}"
        );
        let bind = format!("/v2/service_instances/ok-1/service_bindings/{id}");
        let (status, _) = raw(&b, "PUT", &bind, &provision).await;
        assert!(status.contains(" 400 "), "{id}: {status}");
    }
    // Nothing was stored.
    let rb = b
        .client
        .get(format!("{}/admin/v1/instances", b.base))
        .basic_auth(ADMIN, Some(ADMIN_PASSWORD));
    let listed = b.send(rb).await;
    assert_eq!(
        listed.body["instances"],
        Value::Array(vec![]),
        "{:?}",
        listed.body
    );
    // Dots inside an id are fine.
    let (status, _) = raw(&b, "PUT", "/v2/service_instances/a.b..c", &provision).await;
    assert!(status.contains(" 201 "), "{status}");
}

#[tokio::test]
async fn admin_requests_without_credentials_are_challenged() {
    let b = start(Backend::Sqlite).await;
    for auth in [None, Some(("operator", "wrong"))] {
        let mut rb = b.client.get(format!("{}/admin/v1/instances", b.base));
        if let Some((user, password)) = auth {
            rb = rb.basic_auth(user, Some(password));
        }
        let r = b.send(rb).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers["www-authenticate"], "Basic realm=\"brokkr admin\"",
            "{auth:?}"
        );
        assert_eq!(r.description(), "admin authentication required");
    }
}
