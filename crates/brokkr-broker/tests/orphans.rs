//! Steps an unbind and a deprovision leave behind: each operation succeeds and says what it
//! left, the leftover is listed by the admin API and counted in `/metrics`, survives a restart,
//! and the janitor removes it once its step succeeds — on SQLite and PostgreSQL. Replicas
//! sharing a PostgreSQL store never retry one leftover at the same time.

#[macro_use]
mod harness;
mod serving;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brokkr_broker::server::ServerLimits;
use brokkr_engine::EngineOptions;
use brokkr_engine::step::{StepContext, StepKind, StepOutcome, async_trait};
use harness::Backend;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use serving::{Served, TestStore, serve};

const CONFIG: &str = r#"
catalog:
  services:
  - name: leftovers
    id: svc-left
    description: Databases on a server that may be down when they are dropped
    bindable: true
    plans:
    - {name: p, id: plan-left, description: d}
blueprints:
- service: leftovers
  plan: p
  instance:
    registry:
    - {name: database, value: "db-{{ instance_id }}"}
    steps:
    - name: database
      run: drop
      with: {name: "{{ registry('database') }}"}
      budget: 200ms
      on: [deprovision]
  binding:
    registry:
    - {name: user, value: "u-{{ binding_id }}"}
    steps:
    - name: login
      run: drop
      with: {name: "{{ registry('database') }}/{{ registry('user') }}"}
      budget: 200ms
      on: [unbind]
    credentials: {type: api-key, key: k}
"#;

/// Drops a database or a login, unless its server is down; records what it dropped.
struct Drop {
    down: Arc<AtomicBool>,
    dropped: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl StepKind for Drop {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        if self.down.load(Ordering::SeqCst) {
            return StepOutcome::retry(Duration::from_millis(50), "the server is unreachable");
        }
        let name = ctx.with["name"].as_str().unwrap_or("?").to_owned();
        self.dropped.lock().unwrap().push(name);
        StepOutcome::Done
    }
}

store_tests!(steps_left_behind_by_unbind_and_deprovision_are_cleaned_up);

fn options() -> EngineOptions {
    EngineOptions {
        poll_interval: Duration::from_millis(50),
        orphan_backoff: Duration::from_millis(100),
        orphan_backoff_max: Duration::from_millis(400),
        ..EngineOptions::default()
    }
}

async fn orphans(b: &Served) -> Vec<Value> {
    let (status, body) = b.call(Method::GET, "/admin/v1/orphans", None, true).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    body["orphans"].as_array().unwrap().clone()
}

/// Polls `probe` until it returns something, for up to 10 s.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    probe: impl Fn() -> F,
) -> T {
    for _ in 0..200 {
        if let Some(v) = probe().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

async fn steps_left_behind_by_unbind_and_deprovision_are_cleaned_up(backend: Backend) {
    let down = Arc::new(AtomicBool::new(true));
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let step: Arc<dyn StepKind> = Arc::new(Drop {
        down: down.clone(),
        dropped: dropped.clone(),
    });
    let kinds = [("drop", step)];
    let store = TestStore::new(backend).await;
    let b = serve(&store, CONFIG, options(), ServerLimits::default(), &kinds).await;

    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-left", "plan_id": "plan-left",
                      "parameters": {"admin_password": "s3cret-param"}});
    let (status, _) = b
        .call(Method::PUT, "/v2/service_instances/lo-1", Some(body), false)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let q = "accepts_incomplete=true&service_id=svc-left&plan_id=plan-left";

    // An unbind leaves its login behind, and says so.
    let binding = "/v2/service_instances/lo-1/service_bindings/app";
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-left", "plan_id": "plan-left"});
    let (status, _) = b.call(Method::PUT, binding, Some(body), false).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = b
        .call(Method::DELETE, &format!("{binding}?{q}"), None, false)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let poll = format!("{binding}/last_operation");
    let done = eventually("the unbind ends", || async {
        let (_, body) = b.call(Method::GET, &poll, None, false).await;
        (body["state"] != "in progress").then_some(body)
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done:?}");
    assert_eq!(
        done["description"],
        "unbound; left behind: step 'login' (gave up after 200ms: the server is \
         unreachable); retried in the background"
    );

    // So does the deprovision that follows, with its database.
    let (status, _) = b
        .call(
            Method::DELETE,
            &format!("/v2/service_instances/lo-1?{q}"),
            None,
            false,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    // The deprovision succeeds, and says what it left behind.
    let poll = "/v2/service_instances/lo-1/last_operation";
    let done = eventually("the deprovision ends", || async {
        let (_, body) = b.call(Method::GET, poll, None, false).await;
        (body["state"] != "in progress").then_some(body)
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done:?}");
    assert_eq!(
        done["description"],
        "deprovisioned; left behind: step 'database' (gave up after 200ms: the server is \
         unreachable); retried in the background"
    );

    // The admin API lists it — without parameters — and /metrics counts it.
    let listed = orphans(&b).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let (login, database) = (&listed[0], &listed[1]);
    assert_eq!(
        (
            &login["instance_id"],
            &login["binding_id"],
            &login["kind"],
            &login["step"]
        ),
        (
            &json!("lo-1"),
            &json!("app"),
            &json!("unbind"),
            &json!("login")
        )
    );
    assert_eq!(
        (&database["instance_id"], &database["binding_id"]),
        (&json!("lo-1"), &Value::Null)
    );
    assert_eq!(
        (&database["kind"], &database["step"]),
        (&json!("deprovision"), &json!("database"))
    );
    assert!(
        !Value::from(listed.clone())
            .to_string()
            .contains("s3cret-param"),
        "{listed:?}"
    );
    for gauge in [
        "brokkr_orphans{kind=\"deprovision\",step=\"database\"} 1",
        "brokkr_orphans{kind=\"unbind\",step=\"login\"} 1",
    ] {
        eventually("the gauge counts the orphans", || async {
            b.metrics().await.contains(gauge).then_some(())
        })
        .await;
    }

    // The janitor tries it again and records why it still fails.
    let tried = eventually("the janitor tries again", || async {
        let listed = orphans(&b).await;
        let o = listed.last()?.clone();
        (o["attempts"].as_i64()? >= 1).then_some(o)
    })
    .await;
    assert_eq!(tried["last_error"], "the server is unreachable", "{tried}");
    // Every result is exported from the start, at zero; this one counted the attempt.
    let metrics = b.metrics().await;
    assert!(metrics.contains("brokkr_janitor_attempts_total{result=\"failed\"}"));
    assert!(!metrics.contains("brokkr_janitor_attempts_total{result=\"failed\"} 0\n"));

    // A restart keeps it.
    b.stop().await;
    let b = serve(&store, CONFIG, options(), ServerLimits::default(), &kinds).await;
    assert_eq!(orphans(&b).await.len(), 2);

    // Once the server is back, the janitor drops the login and the database — named from the
    // registries the orphans kept, the instance's too — and forgets the orphans.
    down.store(false, Ordering::SeqCst);
    eventually("the janitor removes the orphan", || async {
        orphans(&b).await.is_empty().then_some(())
    })
    .await;
    let mut dropped = dropped.lock().unwrap().clone();
    dropped.sort();
    assert_eq!(dropped, ["db-lo-1", "db-lo-1/u-app"]);
    let metrics = eventually("the gauge no longer counts it", || async {
        let metrics = b.metrics().await;
        (!metrics.contains("brokkr_orphans{")).then_some(metrics)
    })
    .await;
    assert!(metrics.contains("brokkr_janitor_attempts_total{result=\"resolved\"} 2"));

    // Nothing is left for a repeated DELETE.
    let (status, _) = b
        .call(
            Method::DELETE,
            &format!("/v2/service_instances/lo-1?{q}"),
            None,
            false,
        )
        .await;
    assert_eq!(status, StatusCode::GONE);
    b.stop().await;
}

/// Fails after a while, counting how many runs overlap.
struct Overlapping {
    running: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl StepKind for Overlapping {
    async fn run(&self, _: &StepContext<'_>) -> StepOutcome {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        StepOutcome::Fail("the server is unreachable".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_sharing_a_store_never_retry_one_orphan_at_the_same_time() {
    let overlapping = Overlapping {
        running: Arc::default(),
        most: Arc::default(),
        runs: Arc::default(),
    };
    let (most, runs) = (overlapping.most.clone(), overlapping.runs.clone());
    let kinds = [("drop", Arc::new(overlapping) as Arc<dyn StepKind>)];
    let store = TestStore::new(Backend::Postgres).await;
    let options = EngineOptions {
        orphan_backoff: Duration::from_millis(1),
        orphan_backoff_max: Duration::from_millis(1),
        ..options()
    };
    let a = serve(
        &store,
        CONFIG,
        options.clone(),
        ServerLimits::default(),
        &kinds,
    )
    .await;
    let b = serve(&store, CONFIG, options, ServerLimits::default(), &kinds).await;
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-left", "plan_id": "plan-left"});
    let (status, _) = a
        .call(Method::PUT, "/v2/service_instances/lo-2", Some(body), false)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let q = "accepts_incomplete=true&service_id=svc-left&plan_id=plan-left";
    let (status, body) = a
        .call(
            Method::DELETE,
            &format!("/v2/service_instances/lo-2?{q}"),
            None,
            false,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");

    // Both replicas' janitors keep finding the orphan due; only one holds it at a time.
    eventually("the janitors retry it a few times", || async {
        (runs.load(Ordering::SeqCst) >= 6).then_some(())
    })
    .await;
    assert_eq!(most.load(Ordering::SeqCst), 1);
    let listed = orphans(&b).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    a.stop().await;
    b.stop().await;
}
