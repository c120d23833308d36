//! An instance's dashboard URL: a fixed pattern answered with the provision, and a URL an `http`
//! step learns from a local server playing the Director (it answers the URL only once it says
//! the runtime is "finished"), answered by fetch instance and the answers after it — and one
//! that is not an absolute http(s) URL failing the step, with nothing answered.

#[macro_use]
mod harness;

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::get;
use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How many times each runtime's status has been asked for.
type Calls = Arc<Mutex<Vec<String>>>;

/// The Director: a runtime is "in progress" for its first two status calls (with
/// `Retry-After: 0`), then "finished" with its dashboard URL — an absolute one, or for runtime
/// `bad-*` a URL without a scheme.
async fn status(State(calls): State<Calls>, Path(id): Path<String>) -> (HeaderMap, String) {
    let mut calls = calls.lock().unwrap();
    calls.push(id.clone());
    let asked = calls.iter().filter(|c| **c == id).count();
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    if asked <= 2 {
        headers.insert("retry-after", "0".parse().unwrap());
        return (headers, json!({"status": "in progress"}).to_string());
    }
    let url = match id.starts_with("bad-") {
        true => format!("console.example.com/runtimes/{id}"),
        false => format!("https://console.example.com/runtimes/{id}"),
    };
    let body = json!({"status": "finished", "dashboardURL": url});
    (headers, body.to_string())
}

async fn director() -> (String, Calls) {
    let calls = Calls::default();
    let app = axum::Router::new()
        .route("/runtimes/{id}/status", get(status))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, calls)
}

fn config(director: &str) -> String {
    format!(
        r#"
catalog:
  services:
  - name: kyma
    id: svc-kyma
    description: A runtime whose console the Director knows
    bindable: false
    instances_retrievable: true
    plan_updateable: true
    plans:
    - {{name: learnt, id: plan-learnt, description: d}}
    - {{name: fixed, id: plan-fixed, description: d}}
blueprints:
- service: kyma
  plan: learnt
  instance:
    steps:
    - name: director
      run: http
      with:
        url: "{director}/runtimes/{{{{ instance_id }}}}/status"
        until: {{pointer: /status, equals: finished}}
        extract: {{console: /dashboardURL}}
      outputs: [console]
    dashboard_url: "{{{{ registry('console') }}}}"
- service: kyma
  plan: fixed
  instance:
    steps:
    - {{name: settle, delay: 10ms}}
    dashboard_url: "https://grafana.example.com/d/{{{{ instance_id }}}}?ns={{{{ context.namespace }}}}"
"#
    )
}

fn provision(plan: &str) -> Value {
    json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-kyma",
           "plan_id": plan, "context": {"platform": "kubernetes", "namespace": "shop"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_url_learnt_by_a_step_is_answered_once_the_step_has_run() {
    let (base, calls) = director().await;
    let b = start_with(Backend::Sqlite, &config(&base)).await;
    let path = "/v2/service_instances/rt-1";
    let r = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-learnt"),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert_eq!(
        r.body.get("dashboard_url"),
        None,
        "not known yet: {:?}",
        r.body
    );
    let done = b.wait_done(&format!("{path}/last_operation")).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(
        calls.lock().unwrap().len(),
        3,
        "two 'in progress', then 'finished'"
    );

    let url = "https://console.example.com/runtimes/rt-1";
    let fetched = b.get(path).await;
    assert_eq!(fetched.status, StatusCode::OK, "{:?}", fetched.body);
    assert_eq!(fetched.body["dashboard_url"], url);
    // The same provision again: 200 with it.
    let again = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-learnt"),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.body["dashboard_url"], url);
    // An update answers the URL known when it starts, and runs the step again.
    let update = json!({"service_id": "svc-kyma", "parameters": {"size": 2}});
    let r = b
        .patch(&format!("{path}?accepts_incomplete=true"), update)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert_eq!(r.body["dashboard_url"], url);
    let done = b.wait_done(&format!("{path}/last_operation")).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(b.get(path).await.body["dashboard_url"], url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_pattern_is_answered_with_the_provision() {
    let (base, calls) = director().await;
    let b = start_with(Backend::Sqlite, &config(&base)).await;
    let path = "/v2/service_instances/grafana-7";
    let r = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-fixed"),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let url = "https://grafana.example.com/d/grafana-7?ns=shop";
    assert_eq!(r.body["dashboard_url"], url, "{:?}", r.body);
    // Repeated while it runs: the same operation, with the URL.
    let repeat = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-fixed"),
        )
        .await;
    assert!(repeat.status.is_success(), "{:?}", repeat.body);
    assert_eq!(repeat.body["dashboard_url"], url, "{:?}", repeat.body);
    let done = b.wait_done(&format!("{path}/last_operation")).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(b.get(path).await.body["dashboard_url"], url);
    assert!(calls.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_url_that_is_not_absolute_fails_the_step_and_is_never_answered() {
    let (base, _calls) = director().await;
    let b = start_with(Backend::Sqlite, &config(&base)).await;
    let path = "/v2/service_instances/bad-1";
    let r = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-learnt"),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = b.wait_done(&format!("{path}/last_operation")).await;
    assert_eq!(done.body["state"], "failed", "{:?}", done.body);
    assert_eq!(
        done.description(),
        "step 'director' failed: dashboard_url: is not an absolute URL \
         (it has no scheme such as https://)"
    );
    assert_eq!(b.get(path).await.status, StatusCode::NOT_FOUND);
    // Provisioned again with the same attributes (a failed instance runs again): still no URL.
    let again = b
        .put(
            &format!("{path}?accepts_incomplete=true"),
            provision("plan-learnt"),
        )
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{:?}", again.body);
    assert_eq!(again.body.get("dashboard_url"), None, "{:?}", again.body);
}
