//! Credentials that expire are revoked: a binding of a plan with `rotation.revoke_expired`,
//! past its `expires_at`, is unbound by the broker itself — its PostgreSQL role on the shared
//! server (BROKKR_TEST_POSTGRES_URL, as scripts/test sets it up) is dropped, so its login is
//! refused — and the platform then sees it gone (fetch 404, unbind 410), while a binding of a
//! plan without revocation keeps working past its `expires_at`. Two replicas on one PostgreSQL
//! store sweeping the same expired bindings unbind each once.

#[macro_use]
mod harness;

use std::time::Duration;

use brokkr_broker::expiry;
use brokkr_engine::{Key, OpKind, Status};
use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

const SERVICE_ID: &str = "5d0e9c1a-2b3c-4d5e-8f70-1a2b3c4d5e60";
/// Bindings live 2 seconds and are revoked.
const REVOKED: &str = "5d0e9c1a-2b3c-4d5e-8f70-1a2b3c4d5e61";
/// Bindings live 1 second and are not revoked.
const KEPT: &str = "5d0e9c1a-2b3c-4d5e-8f70-1a2b3c4d5e62";
/// How often the tests' brokers sweep.
const SWEEP: Duration = Duration::from_millis(200);

/// A database per instance and a role per binding on the shared PostgreSQL server, whose admin
/// URL is in a file of `dir`.
fn config(dir: &tempfile::TempDir) -> String {
    let url = std::env::var("BROKKR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".to_owned());
    let file = dir.path().join("pg-url");
    std::fs::write(&file, url).unwrap();
    format!(
        r#"
targets:
  shared-pg: {{kind: postgres, url_file: {file}}}
catalog:
  services:
  - name: pg
    id: {SERVICE_ID}
    description: d
    bindable: true
    bindings_retrievable: true
    plans:
    - {{name: revoked, id: {REVOKED}, description: d}}
    - {{name: kept, id: {KEPT}, description: d}}
templates:
  database: {{kind: Database, name: "{{{{ registry('database') }}}}", owner: "{{{{ registry('owner') }}}}"}}
  user: {{kind: User, name: "{{{{ registry('username') }}}}", password: "{{{{ registry('password') }}}}", database: "{{{{ registry('database') }}}}"}}
blueprints:
- service: pg
  plan: revoked
  instance: &instance
    registry:
    - {{name: database, value: "{{{{ opaque_name('db_', instance_id) }}}}"}}
    - {{name: owner, value: "{{{{ opaque_name('own_', instance_id) }}}}"}}
    steps:
    - {{name: database, target: shared-pg, templates: [database]}}
  binding:
    rotation: {{lifetime: 2s, revoke_expired: true}}
    registry: &registry
    - {{name: username, value: "{{{{ opaque_name('u_', [instance_id, binding_id]) }}}}"}}
    - {{name: password, value: "{{{{ password(32) }}}}", secret: true}}
    steps: &steps
    - {{name: user, target: shared-pg, templates: [user]}}
    credentials: &credentials
      type: postgresql
      uri: "postgresql://{{{{ registry('username') }}}}:{{{{ registry('password') }}}}@{{{{ targets['shared-pg'].host }}}}:{{{{ targets['shared-pg'].port }}}}/{{{{ registry('database') }}}}"
- service: pg
  plan: kept
  instance: *instance
  binding:
    rotation: {{lifetime: 1s}}
    registry: *registry
    steps: *steps
    credentials: *credentials
"#,
        file = file.display()
    )
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

fn binding_path(instance: &str, binding: &str) -> String {
    format!("/v2/service_instances/{instance}/service_bindings/{binding}")
}

impl TestBroker {
    async fn provision_ok(&self, plan: &str, id: &str) {
        let path = format!("/v2/service_instances/{id}");
        let body = json!({"service_id": SERVICE_ID, "plan_id": plan,
                          "organization_guid": "org", "space_guid": "space"});
        let r = self
            .put(&format!("{path}?accepts_incomplete=true"), body)
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self.wait_done(&format!("{path}/last_operation")).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    }

    /// Binds and returns the login URI.
    async fn bind_ok(&self, plan: &str, id: &str, b: &str) -> String {
        let path = binding_path(id, b);
        let body = json!({"service_id": SERVICE_ID, "plan_id": plan});
        let r = self
            .put(&format!("{path}?accepts_incomplete=true"), body)
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self.wait_done(&format!("{path}/last_operation")).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        let fetched = self.get(&path).await;
        assert_eq!(fetched.status, StatusCode::OK);
        assert!(fetched.body["metadata"]["expires_at"].is_string());
        fetched.body["credentials"]["uri"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The binding as the store has it.
    async fn stored(&self, id: &str, b: &str) -> brokkr_engine::Resource {
        let store = self.broker().engine.store().clone();
        store.get(&Key::binding(id, b)).await.unwrap().unwrap()
    }

    async fn admin_get(&self, path: &str) -> Value {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .basic_auth(ADMIN, Some(ADMIN_PASSWORD));
        let r = self.send(request).await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
        r.body
    }

    async fn revoked_count(&self) -> u64 {
        let metrics = self.client.get(format!("{}/metrics", self.base));
        let text = metrics.send().await.unwrap().text().await.unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("brokkr_bindings_revoked_total "))
            .unwrap_or_else(|| panic!("no revocation counter in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

async fn logs_in(uri: &str) -> bool {
    match PgConnection::connect(uri).await {
        Ok(conn) => {
            conn.close().await.unwrap();
            true
        }
        Err(_) => false,
    }
}

async fn expired_bindings_are_revoked_and_others_kept(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_with(backend, &config(&dir)).await;
    let sweeper = expiry::spawn(broker.broker(), SWEEP);
    let (revoked, kept) = (unique("revoked"), unique("kept"));
    broker.provision_ok(REVOKED, &revoked).await;
    broker.provision_ok(KEPT, &kept).await;
    let kept_uri = broker.bind_ok(KEPT, &kept, "b").await;
    let uri = broker.bind_ok(REVOKED, &revoked, "b").await;
    assert!(
        logs_in(&uri).await,
        "the credentials work before they expire"
    );
    let bound = broker.stored(&revoked, "b").await;
    let expires_at = bound.outputs.expires_at.expect("expires_at");

    // Refused soon after `expires_at`: a sweep's interval plus the unbind's step.
    let refused_at = loop {
        let late = brokkr_engine::now_ms() - expires_at;
        if !logs_in(&uri).await {
            break late;
        }
        assert!(
            late < 10_000,
            "the login still works {late} ms after expires_at"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused_at >= 0, "refused {refused_at} ms before expires_at");
    eprintln!("login refused {refused_at} ms after expires_at");

    // The platform sees it gone, as after its own unbind.
    let path = binding_path(&revoked, "b");
    let done = broker.wait_done(&format!("{path}/last_operation")).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(broker.get(&path).await.status, StatusCode::NOT_FOUND);
    let query = format!("service_id={SERVICE_ID}&plan_id={REVOKED}&accepts_incomplete=true");
    let deleted = broker.delete(&format!("{path}?{query}")).await;
    assert_eq!(deleted.status, StatusCode::GONE, "{:?}", deleted.body);

    // An unbind that replaced the bind, told apart in the admin API.
    let unbound = broker.stored(&revoked, "b").await;
    assert_eq!(unbound.status, Status::Deleted);
    assert_eq!(unbound.op.kind, OpKind::Unbind);
    assert_eq!(unbound.previous.unwrap().id, bound.op.id);
    let shown = broker
        .admin_get(&format!("/admin/v1/operations/{}", unbound.op.id))
        .await;
    assert_eq!(shown["operation"]["kind"], "unbind");
    assert_eq!(shown["operation"]["state"], "succeeded");
    let description = shown["operation"]["description"].as_str().unwrap();
    assert!(
        description.starts_with("the credentials expired at ") && description.contains("unbound"),
        "{description}"
    );
    assert_eq!(broker.revoked_count().await, 1);

    // The binding of the plan without revocation outlived its `expires_at` untouched.
    let kept_binding = broker.stored(&kept, "b").await;
    assert!(kept_binding.outputs.expires_at.unwrap() < brokkr_engine::now_ms());
    assert_eq!(kept_binding.status, Status::Ready);
    assert_eq!(kept_binding.op.kind, OpKind::Bind);
    assert_eq!(
        broker.get(&binding_path(&kept, "b")).await.status,
        StatusCode::OK
    );
    assert!(
        logs_in(&kept_uri).await,
        "a binding not revoked still logs in"
    );
    sweeper.abort();
}

store_tests!(expired_bindings_are_revoked_and_others_kept);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_revoke_each_expired_binding_once() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(&dir);
    let first = start_with(Backend::Postgres, &yaml).await;
    let id = unique("replicas");
    first.provision_ok(REVOKED, &id).await;
    let bindings = ["b1", "b2", "b3", "b4"];
    let mut binds = Vec::new();
    for b in bindings {
        first.bind_ok(REVOKED, &id, b).await;
        binds.push(first.stored(&id, b).await.op.id);
    }
    let expires_at = first.stored(&id, "b4").await.outputs.expires_at.unwrap();
    let wait = u64::try_from(expires_at - brokkr_engine::now_ms()).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(wait + 100)).await;

    // A second replica, started after they expired, and the first sweep at the same moment.
    let second = first.replica(&yaml).await;
    let (a, b) = (first.broker(), second.broker());
    let (started_a, started_b) = tokio::join!(expiry::sweep(&a), expiry::sweep(&b));
    let (started_a, started_b) = (started_a.unwrap(), started_b.unwrap());
    assert_eq!(
        started_a + started_b,
        bindings.len(),
        "{started_a} + {started_b}"
    );
    // Their loops find nothing left to start.
    let sweepers = [expiry::spawn(a, SWEEP), expiry::spawn(b, SWEEP)];
    for (b, bind) in bindings.iter().zip(&binds) {
        let path = binding_path(&id, b);
        let done = first.wait_done(&format!("{path}/last_operation")).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        let r = first.stored(&id, b).await;
        assert_eq!(r.status, Status::Deleted);
        // The unbind replaced the bind: no second one came after it.
        assert_eq!(r.op.kind, OpKind::Unbind);
        assert_eq!(&r.previous.unwrap().id, bind, "{b} was unbound once");
    }
    tokio::time::sleep(SWEEP * 3).await;
    let counts = (first.revoked_count().await, second.revoked_count().await);
    assert_eq!(counts.0 + counts.1, 4, "{counts:?}");
    for sweeper in sweepers {
        sweeper.abort();
    }
}
