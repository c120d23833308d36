//! The built-in `http` step kind against a real HTTP server on loopback: rendered URL, headers
//! (one from the environment) and body, a 503 with Retry-After retried, values extracted into
//! the registry and seen by the credentials, and an unexpected 4xx failing the operation with the
//! method, URL and status — never the secret.

#[macro_use]
mod harness;

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// What the external system saw, and how many more times it answers 503.
#[derive(Default)]
struct Seen {
    calls: Vec<(HeaderMap, Value)>,
    unavailable: u32,
}

type Shared = Arc<Mutex<Seen>>;

async fn records(
    State(seen): State<Shared>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> (AxumStatus, HeaderMap, String) {
    let mut seen = seen.lock().unwrap();
    seen.calls.push((headers, body));
    let mut out = HeaderMap::new();
    if seen.unavailable > 0 {
        seen.unavailable -= 1;
        out.insert("retry-after", "0".parse().unwrap());
        return (AxumStatus::SERVICE_UNAVAILABLE, out, "busy".into());
    }
    (
        AxumStatus::CREATED,
        out,
        r#"{"id": "rec-42", "extra": true}"#.into(),
    )
}

async fn external() -> (String, Shared) {
    let seen = Shared::default();
    let app = axum::Router::new()
        .route("/records", post(records))
        .route("/missing", post(|| async { AxumStatus::NOT_FOUND }))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

fn config(url: &str) -> String {
    format!(
        r#"
catalog:
  services:
  - name: dns
    id: svc-dns
    description: A record in an external system
    bindable: true
    bindings_retrievable: true
    plans: [{{name: p, id: plan-dns, description: d}}]
blueprints:
- service: dns
  plan: p
  instance:
    registry:
    - {{name: token, value: "{{{{ password(16) }}}}", secret: true}}
    steps:
    - name: register
      run: http
      with:
        method: post
        url: "{url}?instance={{{{ instance_id }}}}"
        headers:
          Authorization: "Bearer {{{{ registry('token') }}}}"
          X-Package: {{from_env: CARGO_PKG_NAME}}
        body: {{name: "{{{{ instance_id }}}}", ttl: 300}}
        expect: [201]
        extract: {{record_id: /id}}
      outputs: [record_id]
  binding:
    credentials: {{type: dns, record: "{{{{ registry('record_id') }}}}"}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_steps_call_out_retry_and_keep_what_they_extract() {
    let (base, seen) = external().await;
    seen.lock().unwrap().unavailable = 2;
    let b = start_with(Backend::Sqlite, &config(&format!("{base}/records"))).await;
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-dns", "plan_id": "plan-dns"});
    let r = b
        .put(
            "/v2/service_instances/zone-1?accepts_incomplete=true",
            body.clone(),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = b
        .wait_done("/v2/service_instances/zone-1/last_operation")
        .await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);

    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.calls.len(), 3, "two 503s, then the 201");
        let (headers, sent) = seen.calls.last().unwrap();
        assert_eq!(headers["x-package"], "brokkr-broker");
        assert!(
            headers["authorization"]
                .to_str()
                .unwrap()
                .starts_with("Bearer ")
        );
        assert_eq!(sent, &json!({"name": "zone-1", "ttl": 300}));
    }

    let r = b
        .put(
            "/v2/service_instances/zone-1/service_bindings/app?accepts_incomplete=true",
            body,
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    let r = b
        .get("/v2/service_instances/zone-1/service_bindings/app")
        .await;
    assert_eq!(r.body["credentials"]["record"], "rec-42", "{:?}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unexpected_status_fails_the_operation_naming_the_call() {
    let (base, _) = external().await;
    let b = start_with(Backend::Sqlite, &config(&format!("{base}/missing"))).await;
    let r = b
        .put(
            "/v2/service_instances/zone-2?accepts_incomplete=true",
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-dns", "plan_id": "plan-dns"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let done = b
        .wait_done("/v2/service_instances/zone-2/last_operation")
        .await;
    assert_eq!(done.body["state"], "failed");
    assert!(
        done.body.get("instance_usable").is_none(),
        "OSB: not for a failed provision: {:?}",
        done.body
    );
    let description = done.description();
    assert!(
        description.contains(&format!("POST {base}/missing answered 404")),
        "{description}"
    );
    assert!(
        !description.contains("instance="),
        "no query string: {description}"
    );
    assert!(!description.contains("Bearer"), "{description}");
}
