//! The engine's step semantics, driven through the OSB API with step kinds written in Rust:
//! conditions, retries with reasons, optional steps, panics, and the non-blocking budget of
//! deprovision steps — against both store backends.

#[macro_use]
mod harness;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brokkr_engine::step::{StepContext, StepKind, StepOutcome, async_trait};
use harness::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const CONFIG: &str = r#"
catalog:
  services:
  - name: steps
    id: svc-steps
    description: Step semantics
    bindable: false
    plan_updateable: true
    plans:
    - {name: p, id: plan-steps, description: d}
blueprints:
- service: steps
  plan: p
  instance:
    steps:
    - {name: count, run: counter, on: [provision, deprovision]}
    - {name: backup, run: counter, when: "parameters.backup", on: [provision]}
    - {name: flaky, run: flaky, with: {failures: 2}, on: [provision]}
    - {name: best-effort, run: fail, optional: true, on: [provision]}
    - {name: stuck, run: stuck, budget: 200ms, on: [deprovision]}
    - {name: boom, run: panics, on: [update]}
"#;

/// Counts runs per step name.
#[derive(Default)]
struct Runs(Mutex<HashMap<String, u32>>);

impl Runs {
    fn bump(&self, step: &str) -> u32 {
        let mut runs = self.0.lock().unwrap();
        let n = runs.entry(step.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn get(&self, step: &str) -> u32 {
        self.0.lock().unwrap().get(step).copied().unwrap_or(0)
    }
}

struct Counter(Arc<Runs>);
#[async_trait]
impl StepKind for Counter {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        self.0.bump(ctx.step);
        StepOutcome::Done
    }
}

struct Flaky(Arc<Runs>);
#[async_trait]
impl StepKind for Flaky {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let attempt = self.0.bump(ctx.step);
        let failures = ctx.with["failures"].as_u64().unwrap_or(0);
        if u64::from(attempt) <= failures {
            StepOutcome::retry(
                Duration::from_millis(20),
                format!("not ready (attempt {attempt})"),
            )
        } else {
            StepOutcome::Done
        }
    }
}

struct Fail;
#[async_trait]
impl StepKind for Fail {
    async fn run(&self, _: &StepContext<'_>) -> StepOutcome {
        StepOutcome::Fail("the backup service is down".into())
    }
}

/// Waits for a volume to detach, which it does once the test says so.
struct Stuck(Arc<AtomicBool>);
#[async_trait]
impl StepKind for Stuck {
    async fn run(&self, _: &StepContext<'_>) -> StepOutcome {
        if self.0.load(Ordering::SeqCst) {
            StepOutcome::retry(Duration::from_millis(50), "the volume is still attached")
        } else {
            StepOutcome::Done
        }
    }
}

struct Panics;
#[async_trait]
impl StepKind for Panics {
    async fn run(&self, _: &StepContext<'_>) -> StepOutcome {
        panic!("boom in a step")
    }
}

store_tests!(step_semantics);

async fn events(b: &TestBroker, op: &str) -> Vec<(String, String, String)> {
    let rb = b
        .client
        .get(format!("{}/admin/v1/operations/{op}", b.base))
        .basic_auth(ADMIN, Some(ADMIN_PASSWORD));
    let r = b.send(rb).await;
    r.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_owned();
            (s("kind"), s("step"), s("message"))
        })
        .collect()
}

async fn step_semantics(backend: Backend) {
    let runs = Arc::new(Runs::default());
    let attached = Arc::new(AtomicBool::new(true));
    let kinds: Vec<(&str, Arc<dyn StepKind>)> = vec![
        ("counter", Arc::new(Counter(runs.clone()))),
        ("flaky", Arc::new(Flaky(runs.clone()))),
        ("fail", Arc::new(Fail)),
        ("stuck", Arc::new(Stuck(attached.clone()))),
        ("panics", Arc::new(Panics)),
    ];
    let b = start_with_steps(backend, CONFIG, kinds).await;
    let path = "/v2/service_instances/s-1?accepts_incomplete=true";
    let poll = "/v2/service_instances/s-1/last_operation";
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-steps", "plan_id": "plan-steps",
                      "parameters": {"backup": false}});

    // Provision: a false condition skips, retries carry their reason, an optional failure is
    // skipped, and the operation succeeds.
    let op = b.put(path, body).await.operation();
    assert_eq!(b.wait_done(poll).await.body["state"], "succeeded");
    assert_eq!(
        (runs.get("count"), runs.get("backup"), runs.get("flaky")),
        (1, 0, 3)
    );
    let log = events(&b, &op).await;
    let has = |kind: &str, step: &str, text: &str| {
        log.iter()
            .any(|(k, s, m)| k == kind && s == step && m.contains(text))
    };
    assert!(
        has("step_skipped", "backup", "condition is false"),
        "{log:#?}"
    );
    assert!(
        has("step_retry", "flaky", "not ready (attempt 2)"),
        "{log:#?}"
    );
    assert!(
        has("step_skipped", "best-effort", "the backup service is down"),
        "{log:#?}"
    );
    assert_eq!(log.last().unwrap().0, "succeeded");

    // Update: a panicking step fails the operation with its message; the broker keeps serving.
    let r = b
        .patch(
            path,
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-steps", "parameters": {"backup": true}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = b.wait_done(poll).await;
    assert_eq!(done.body["state"], "failed");
    assert!(
        done.body["description"]
            .as_str()
            .unwrap()
            .contains("panicked: boom in a step")
    );
    assert_eq!(done.body["instance_usable"], true);
    assert_eq!(
        b.send(b.request(Method::GET, "/v2/catalog")).await.status,
        StatusCode::OK
    );

    // Deprovision never blocks: the stuck step is skipped once its budget is spent.
    let q = "accepts_incomplete=true&service_id=svc-steps&plan_id=plan-steps";
    let op = b
        .delete(&format!("/v2/service_instances/s-1?{q}"))
        .await
        .operation();
    let done = b.wait_done(poll).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(runs.get("count"), 2);
    let log = events(&b, &op).await;
    assert!(
        log.iter().any(|(k, s, m)| k == "step_skipped"
            && s == "stuck"
            && m.contains("gave up after 200ms: the volume is still attached")),
        "{log:#?}"
    );
    let _: Value = done.body;

    // Deprovisioning again retries only the skipped step, until it is done; then 410.
    let r = b.delete(&format!("/v2/service_instances/s-1?{q}")).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let again = b.wait_done(poll).await;
    assert_eq!(again.body["state"], "succeeded", "{:?}", again.body);
    assert_eq!(runs.get("count"), 2, "finished steps are not run again");
    attached.store(false, Ordering::SeqCst);
    let op = b
        .delete(&format!("/v2/service_instances/s-1?{q}"))
        .await
        .operation();
    let done = b.wait_done(poll).await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    let log = events(&b, &op).await;
    assert!(
        log.iter()
            .any(|(k, s, _)| k == "step_finished" && s == "stuck"),
        "{log:#?}"
    );
    let r = b.delete(&format!("/v2/service_instances/s-1?{q}")).await;
    assert_eq!(r.status, StatusCode::GONE, "nothing is left to retry");
}

const BINDING_CONFIG: &str = r#"
catalog:
  services:
  - name: keys
    id: svc-keys
    description: Keys revoked on unbind
    bindable: true
    plans:
    - {name: p, id: plan-keys, description: d}
blueprints:
- service: keys
  plan: p
  binding:
    steps:
    - {name: revoke, run: stuck, budget: 100ms, on: [unbind]}
    credentials: {type: api-key, key: k}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unbind_that_skipped_steps_can_be_repeated() {
    let attached = Arc::new(AtomicBool::new(true));
    let kinds: Vec<(&str, Arc<dyn StepKind>)> = vec![("stuck", Arc::new(Stuck(attached.clone())))];
    let b = start_with_steps(Backend::Sqlite, BINDING_CONFIG, kinds).await;
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-keys", "plan_id": "plan-keys"});
    let r = b.put("/v2/service_instances/k-1", body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let binding = "/v2/service_instances/k-1/service_bindings/app";
    let r = b.put(binding, body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let q = "accepts_incomplete=true&service_id=svc-keys&plan_id=plan-keys";
    let poll = format!("{binding}/last_operation");
    for detached in [false, true] {
        attached.store(!detached, Ordering::SeqCst);
        let r = b.delete(&format!("{binding}?{q}")).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = b.wait_done(&poll).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        let log = events(&b, &r.operation()).await;
        let finished = log
            .iter()
            .any(|(k, s, _)| k == "step_finished" && s == "revoke");
        assert_eq!(finished, detached, "{log:#?}");
    }
    let r = b.delete(&format!("{binding}?{q}")).await;
    assert_eq!(r.status, StatusCode::GONE, "nothing is left to retry");
}
