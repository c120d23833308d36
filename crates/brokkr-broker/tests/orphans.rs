//! Steps a deprovision leaves behind: the operation succeeds and says what it left, the leftover
//! is listed by the admin API and counted in `/metrics`, survives a restart, and the janitor
//! removes it once its step succeeds — on SQLite and PostgreSQL.

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
    bindable: false
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
      run: drop-database
      with: {name: "{{ registry('database') }}"}
      budget: 200ms
      on: [deprovision]
"#;

/// Drops a database, unless its server is down; records what it dropped.
struct DropDatabase {
    down: Arc<AtomicBool>,
    dropped: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl StepKind for DropDatabase {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        if self.down.load(Ordering::SeqCst) {
            return StepOutcome::retry(Duration::from_millis(50), "the server is unreachable");
        }
        let name = ctx.with["name"].as_str().unwrap_or("?").to_owned();
        self.dropped.lock().unwrap().push(name);
        StepOutcome::Done
    }
}

store_tests!(a_deprovision_that_left_a_step_behind_is_cleaned_up_in_the_background);

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

async fn a_deprovision_that_left_a_step_behind_is_cleaned_up_in_the_background(backend: Backend) {
    let down = Arc::new(AtomicBool::new(true));
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let step: Arc<dyn StepKind> = Arc::new(DropDatabase {
        down: down.clone(),
        dropped: dropped.clone(),
    });
    let kinds = [("drop-database", step)];
    let store = TestStore::new(backend).await;
    let b = serve(&store, CONFIG, options(), ServerLimits::default(), &kinds).await;

    let body = json!({"service_id": "svc-left", "plan_id": "plan-left",
                      "parameters": {"admin_password": "s3cret-param"}});
    let (status, _) = b
        .call(Method::PUT, "/v2/service_instances/lo-1", Some(body), false)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let q = "accepts_incomplete=true&service_id=svc-left&plan_id=plan-left";
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
    assert_eq!(listed.len(), 1, "{listed:?}");
    let orphan = &listed[0];
    assert_eq!(orphan["instance_id"], "lo-1");
    assert_eq!(orphan["kind"], "deprovision");
    assert_eq!(orphan["step"], "database");
    assert!(!orphan.to_string().contains("s3cret-param"), "{orphan}");
    let gauge = "brokkr_orphans{kind=\"deprovision\",step=\"database\"} 1";
    eventually("the gauge counts the orphan", || async {
        b.metrics().await.contains(gauge).then_some(())
    })
    .await;

    // The janitor tries it again and records why it still fails.
    let tried = eventually("the janitor tries again", || async {
        let listed = orphans(&b).await;
        let o = listed.first()?.clone();
        (o["attempts"].as_i64()? >= 1).then_some(o)
    })
    .await;
    assert_eq!(tried["last_error"], "the server is unreachable", "{tried}");
    assert!(
        b.metrics()
            .await
            .contains("brokkr_janitor_attempts_total{result=\"failed\"}")
    );

    // A restart keeps it.
    b.stop().await;
    let b = serve(&store, CONFIG, options(), ServerLimits::default(), &kinds).await;
    assert_eq!(orphans(&b).await.len(), 1);

    // Once the server is back, the janitor drops the database — named from the instance's
    // registry, which the orphan kept — and forgets the orphan.
    down.store(false, Ordering::SeqCst);
    eventually("the janitor removes the orphan", || async {
        orphans(&b).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(*dropped.lock().unwrap(), ["db-lo-1"]);
    let metrics = eventually("the gauge no longer counts it", || async {
        let metrics = b.metrics().await;
        (!metrics.contains("brokkr_orphans{")).then_some(metrics)
    })
    .await;
    assert!(metrics.contains("brokkr_janitor_attempts_total{result=\"resolved\"} 1"));

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
