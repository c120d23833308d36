//! The engine's own rules, without the broker: steps in order, values a step produces (and
//! declares) reaching later steps, a deprovision that goes on past a failing step, retries that keep a step's start, optional steps,
//! deadlines, a step that panics, and an operation a dead engine left behind taken over by
//! another. Each test runs on a SQLite store of its own (the real store, in a temporary
//! directory); the step kinds are written here, in Rust.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use brokkr_engine::step::{StepContext, StepKind, StepOutcome};
use brokkr_engine::{
    Attrs, Engine, EngineOptions, Key, NewStatus, OpKind, OpPlan, Operation, Resource, Status,
    Store, connect,
};
use brokkr_osb::OperationState;
use serde_json::{Value, json};

/// Records each step it runs, with what it saw, and answers what the step's `with` says:
/// `{"produce": {...}}`, `{"fail": "why"}`, `{"retry": N}` (retry N times, 30 ms apart),
/// `{"panic": true}`; otherwise done.
#[derive(Default)]
struct Recorder {
    runs: Mutex<Vec<(String, Value, i64)>>,
}

impl Recorder {
    fn names(&self) -> Vec<String> {
        let runs = self.runs.lock().unwrap();
        runs.iter().map(|(name, ..)| name.clone()).collect()
    }
}

#[async_trait]
impl StepKind for Recorder {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let earlier = {
            let mut runs = self.runs.lock().unwrap();
            let earlier = runs.iter().filter(|(name, ..)| name == ctx.step).count();
            runs.push((
                ctx.step.to_owned(),
                ctx.template_context.clone(),
                ctx.started_at,
            ));
            earlier
        };
        let with = ctx.with;
        if let Some(values) = with["produce"].as_object() {
            return StepOutcome::Produced(values.clone());
        }
        if let Some(why) = with["fail"].as_str() {
            return StepOutcome::Fail(why.to_owned());
        }
        if with["panic"] == true {
            panic!("a step kind that panics");
        }
        match with["retry"].as_u64() {
            Some(n) if (earlier as u64) < n => {
                StepOutcome::retry(Duration::from_millis(30), "not yet")
            }
            _ => StepOutcome::Done,
        }
    }
}

/// An engine on a fresh SQLite store, with the recorder registered as `record`.
async fn engine(lease: Duration) -> (Engine, Arc<Recorder>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, recorder) = engine_at(dir.path(), lease).await;
    (engine, recorder, dir)
}

/// An engine on the SQLite store in `dir` (made if new), with a recorder of its own.
async fn engine_at(dir: &std::path::Path, lease: Duration) -> (Engine, Arc<Recorder>) {
    let url = format!("sqlite://{}/brokkr.db", dir.display());
    let store = connect(&url, None).await.unwrap();
    store.migrate().await.unwrap();
    let options = EngineOptions {
        lease,
        poll_interval: Duration::from_millis(20),
        ..EngineOptions::default()
    };
    let engine = Engine::new(store, options);
    let recorder = Arc::new(Recorder::default());
    engine.register("record", recorder.clone());
    (engine, recorder)
}

/// Steps `(name, with)` of the `record` kind.
fn plan(steps: &[(&str, Value)]) -> OpPlan {
    let steps = steps
        .iter()
        .map(|(name, with)| {
            serde_json::from_value(json!({"name": name, "run": "record", "with": with})).unwrap()
        })
        .collect();
    OpPlan {
        steps,
        ..OpPlan::default()
    }
}

/// Stores a provision of instance `id` running `plan`, leased to `engine`, within `deadline`.
async fn provision(engine: &Engine, id: &str, plan: OpPlan, deadline: Duration) -> Key {
    let op = Operation::new(
        OpKind::Provision,
        plan,
        None,
        deadline.as_millis() as i64,
        engine.owner(),
        engine.lease_ms(),
    );
    let key = Key::instance(id);
    let attrs = Attrs {
        parameters: Some(Default::default()),
        ..Attrs::default()
    };
    let resource = Resource::new(key.clone(), "svc", "plan", attrs, op);
    engine.store().create(&resource).await.unwrap();
    key
}

async fn ended(store: &Arc<dyn Store>, key: &Key) -> Resource {
    for _ in 0..500 {
        let r = store.get(key).await.unwrap().unwrap();
        if !r.op.in_progress() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the operation on {key:?} never ended");
}

#[tokio::test]
async fn steps_run_in_order_and_a_produced_value_reaches_later_steps() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let mut steps = plan(&[
        ("first", json!({"produce": {"port": 5432}})),
        ("second", json!({})),
        ("third", json!({})),
    ]);
    steps.steps[0].outputs = vec!["port".into()];
    let key = provision(&engine, "i-1", steps, Duration::from_secs(60)).await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(
        r.op.state,
        OperationState::Succeeded,
        "{:?}",
        r.op.description
    );
    assert_eq!(recorder.names(), ["first", "second", "third"]);
    let runs = recorder.runs.lock().unwrap();
    let seen = &runs[1].1;
    assert_eq!(seen["registry"]["port"], 5432, "{seen}");
    assert_eq!(r.outputs.registry["port"], 5432, "kept with the instance");
}

#[tokio::test]
async fn deprovision_does_not_block_on_a_step_that_fails() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let key = provision(
        &engine,
        "i-10",
        plan(&[("database", json!({})), ("user", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    engine.run_to_end(key.clone()).await;
    let created = ended(engine.store(), &key).await;
    assert_eq!(created.status, Status::Ready);
    // The user cannot be dropped; the database still goes, and the operation succeeds. (The
    // broker's plan for a teardown lists the blueprint's steps last to first.)
    let steps = plan(&[
        ("user", json!({"fail": "role is in use"})),
        ("database", json!({})),
    ]);
    let op = Operation::new(
        OpKind::Deprovision,
        steps,
        None,
        60_000,
        engine.owner(),
        engine.lease_ms(),
    );
    let started = engine
        .store()
        .start(&key, &created.op.id, &op, NewStatus::Set(Status::Deleted))
        .await
        .unwrap();
    assert!(started.is_some());
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(
        r.op.state,
        OperationState::Succeeded,
        "{:?}",
        r.op.description
    );
    let description = r.op.description.unwrap_or_default();
    assert!(
        description.contains("user"),
        "says what was left: {description}"
    );
    assert_eq!(recorder.names(), ["database", "user", "user", "database"]);
}

#[tokio::test]
async fn a_step_may_produce_only_the_values_it_declares() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let steps = plan(&[
        ("first", json!({"produce": {"port": 5432, "password": "x"}})),
        ("second", json!({})),
    ]);
    let key = provision(&engine, "i-9", steps, Duration::from_secs(60)).await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(r.op.state, OperationState::Failed);
    let description = r.op.description.unwrap_or_default();
    assert!(description.contains("`outputs`"), "{description}");
    assert_eq!(recorder.names(), ["first"]);
    assert!(!r.outputs.registry.contains_key("password"), "nothing kept");
}

#[tokio::test]
async fn a_retried_step_keeps_its_start_and_the_operation_waits_between_tries() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let key = provision(
        &engine,
        "i-2",
        plan(&[("slow", json!({"retry": 3})), ("after", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    let began = Instant::now();
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(
        r.op.state,
        OperationState::Succeeded,
        "{:?}",
        r.op.description
    );
    assert!(
        began.elapsed() >= Duration::from_millis(90),
        "three 30 ms waits"
    );
    assert_eq!(recorder.names(), ["slow", "slow", "slow", "slow", "after"]);
    let runs = recorder.runs.lock().unwrap();
    let starts: Vec<i64> = runs.iter().take(4).map(|(_, _, at)| *at).collect();
    assert!(starts.iter().all(|at| *at == starts[0]), "{starts:?}");
}

#[tokio::test]
async fn a_failing_step_fails_the_operation_and_later_steps_do_not_run() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let key = provision(
        &engine,
        "i-3",
        plan(&[
            ("broken", json!({"fail": "the server said no"})),
            ("never", json!({})),
        ]),
        Duration::from_secs(60),
    )
    .await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(r.op.state, OperationState::Failed);
    let description = r.op.description.unwrap_or_default();
    assert!(description.contains("the server said no"), "{description}");
    assert!(
        description.contains("broken"),
        "names the step: {description}"
    );
    assert_eq!(recorder.names(), ["broken"]);
}

#[tokio::test]
async fn an_optional_step_that_fails_is_skipped() {
    let (engine, recorder, _dir) = engine(Duration::from_secs(30)).await;
    let mut steps = plan(&[
        ("extra", json!({"fail": "no backups here"})),
        ("main", json!({})),
    ]);
    steps.steps[0].optional = true;
    let key = provision(&engine, "i-4", steps, Duration::from_secs(60)).await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(
        r.op.state,
        OperationState::Succeeded,
        "{:?}",
        r.op.description
    );
    assert_eq!(recorder.names(), ["extra", "main"]);
    let events = engine.store().events(&r.op.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "step_skipped" && e.step.as_deref() == Some("extra")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_step_that_panics_fails_the_operation_without_taking_the_engine_down() {
    let (engine, _recorder, _dir) = engine(Duration::from_secs(30)).await;
    let key = provision(
        &engine,
        "i-5",
        plan(&[("bad", json!({"panic": true}))]),
        Duration::from_secs(60),
    )
    .await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(r.op.state, OperationState::Failed, "{:?}", r.op.description);
    // The engine still runs operations.
    let key = provision(
        &engine,
        "i-6",
        plan(&[("ok", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    engine.run_to_end(key.clone()).await;
    assert_eq!(
        ended(engine.store(), &key).await.op.state,
        OperationState::Succeeded
    );
}

#[tokio::test]
async fn an_operation_past_its_deadline_fails() {
    let (engine, _recorder, _dir) = engine(Duration::from_secs(30)).await;
    let key = provision(
        &engine,
        "i-7",
        plan(&[("forever", json!({"retry": 1_000_000}))]),
        Duration::from_millis(300),
    )
    .await;
    engine.run_to_end(key.clone()).await;
    let r = ended(engine.store(), &key).await;
    assert_eq!(r.op.state, OperationState::Failed);
    let description = r.op.description.unwrap_or_default();
    assert!(
        description.contains("timed out") && description.contains("'forever'"),
        "names the step: {description}"
    );
}

#[tokio::test]
async fn an_operation_a_dead_engine_held_is_taken_over_once_its_lease_ends() {
    // The first engine stores the operation and dies before running it.
    let (dead, _, dir) = engine(Duration::from_millis(200)).await;
    let key = provision(
        &dead,
        "i-8",
        plan(&[("one", json!({})), ("two", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    drop(dead);
    // Another engine on the same store finds it once the lease has run out.
    let (survivor, recorder) = engine_at(dir.path(), Duration::from_millis(200)).await;
    survivor.start().await.unwrap();
    let r = ended(survivor.store(), &key).await;
    assert_eq!(
        r.op.state,
        OperationState::Succeeded,
        "{:?}",
        r.op.description
    );
    assert_eq!(recorder.names(), ["one", "two"], "each step once");
    assert_ne!(r.op.lease_owner.as_deref(), Some("dead"));
    survivor.shutdown().await;
}

#[tokio::test]
async fn a_claim_and_a_release_show_in_the_next_read_of_the_same_store() {
    // The SQLite store answers reads of rows it changed lately from memory; a lease taken or
    // given back through it must show there at once, or an engine would skip (or run twice) an
    // operation it was given.
    let (engine, _, _dir) = engine(Duration::from_millis(100)).await;
    let store = engine.store();
    let key = provision(
        &engine,
        "i-9",
        plan(&[("one", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    let r = store.get(&key).await.unwrap().unwrap();
    assert_eq!(r.op.lease_owner.as_deref(), Some(engine.owner()));
    tokio::time::sleep(Duration::from_millis(150)).await; // the lease runs out
    let until = r.op.lease_until + 60_000;
    let claimed = store.claim_due("other", until, 10).await.unwrap();
    assert_eq!(claimed, std::slice::from_ref(&key));
    let r = store.get(&key).await.unwrap().unwrap();
    assert_eq!(r.op.lease_owner.as_deref(), Some("other"));
    assert_eq!(r.op.lease_until, until);
    store.release(&key, &r.op.id, "other").await.unwrap();
    let r = store.get(&key).await.unwrap().unwrap();
    assert_eq!(r.op.lease_owner, None);
    assert_eq!(r.op.lease_until, 0);
}

#[tokio::test]
async fn outputs_saved_mid_operation_show_in_the_next_read_of_the_same_store() {
    let (engine, _, _dir) = engine(Duration::from_secs(30)).await;
    let store = engine.store();
    let key = provision(
        &engine,
        "i-10",
        plan(&[("one", json!({}))]),
        Duration::from_secs(60),
    )
    .await;
    let op_id = store.get(&key).await.unwrap().unwrap().op.id;
    let mut outputs = brokkr_engine::Outputs::default();
    outputs.registry.insert("password".into(), json!("saved"));
    assert!(
        store
            .save_outputs(&key, &op_id, engine.owner(), &outputs, None)
            .await
            .unwrap()
    );
    let r = store.get(&key).await.unwrap().unwrap();
    assert_eq!(r.outputs.registry.get("password"), Some(&json!("saved")));
}
