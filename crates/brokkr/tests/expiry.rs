//! `brokkr serve` revoking expired credentials, the real binary: a plan with
//! `rotation.revoke_expired` and a 1 s lifetime, swept every 200 ms (`BROKKR_EXPIRY_SWEEP_INTERVAL`,
//! the environment twin of `--expiry-sweep-interval`): a binding is gone (404, then 410 on
//! DELETE) soon after it expires, the log says which binding and when it expired without its
//! credentials, and `/metrics` counts it. An interval of zero is refused before anything starts.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{BIN, eventually, serve_logged};

const SERVICE: &str = "9e8d7c6b-5a49-4382-9176-5f4e3d2c1b01";
const PLAN: &str = "9e8d7c6b-5a49-4382-9176-5f4e3d2c1b02";

fn config_yaml() -> String {
    format!(
        r#"
catalog:
  services:
  - name: tokens
    id: {SERVICE}
    description: d
    bindable: true
    bindings_retrievable: true
    plans:
    - {{name: short, id: {PLAN}, description: Tokens live a second}}
blueprints:
- service: tokens
  plan: short
  binding:
    rotation: {{lifetime: 1s, revoke_expired: true}}
    registry:
    - {{name: token, value: "{{{{ password(24) }}}}", secret: true}}
    credentials: {{type: token, token: "{{{{ registry('token') }}}}"}}
"#
    )
}

async fn send(
    osb: &brokkr_osb::client::Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = osb.request(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[test]
fn a_sweep_interval_of_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("brokkr.db").display());
    let out = Command::new(BIN)
        .args(["serve", "--expiry-sweep-interval", "0s", "--store", &store])
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--expiry-sweep-interval must be longer than zero"),
        "{stderr}"
    );
    assert!(!dir.path().join("brokkr.db").exists(), "no store was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_revokes_a_binding_once_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, config_yaml()).unwrap();
    let log_path = dir.path().join("brokkr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let env = [
        ("BROKKR_EXPIRY_SWEEP_INTERVAL", "200ms".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ];
    let (_serve, base) = serve_logged(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &env,
        log,
    );
    let osb = brokkr_osb::client::Client::builder(&base)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    let http = reqwest::Client::new();
    eventually("brokkr serve answers", async || {
        let health = http.get(format!("{base}/healthz")).send().await;
        health.is_ok_and(|r| r.status().is_success()).then_some(())
    })
    .await;

    let instance = "/v2/service_instances/i";
    let provision = json!({"service_id": SERVICE, "plan_id": PLAN,
                           "organization_guid": "org", "space_guid": "space"});
    let (status, body) = send(&osb, Method::PUT, instance, Some(provision.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let binding = format!("{instance}/service_bindings/b");
    let (status, body) = send(&osb, Method::PUT, &binding, Some(provision)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let bound = Instant::now();
    let token = body["credentials"]["token"].as_str().unwrap().to_owned();

    eventually("the binding is revoked", async || {
        let (status, _) = send(&osb, Method::GET, &binding, None).await;
        (status == StatusCode::NOT_FOUND).then_some(())
    })
    .await;
    let revoked_after = bound.elapsed();
    eprintln!("revoked {revoked_after:?} after the bind (lifetime 1s, sweep 200ms)");
    assert!(revoked_after < Duration::from_secs(5), "{revoked_after:?}");
    let query = format!("?service_id={SERVICE}&plan_id={PLAN}");
    let (status, body) = send(&osb, Method::DELETE, &format!("{binding}{query}"), None).await;
    assert_eq!(status, StatusCode::GONE, "{body}");

    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("brokkr_bindings_revoked_total 1"),
        "{metrics}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("revoking a binding whose credentials expired"))
        .unwrap_or_else(|| panic!("no revocation logged:\n{log}"));
    for field in ["instance_id=\"i\"", "binding_id=\"b\"", "expires_at="] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(!log.contains(&token), "the credentials are not logged");
}
