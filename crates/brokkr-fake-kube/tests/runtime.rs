//! kube-runtime against the fake: a watcher sees an object added, modified and deleted; a
//! Controller over a custom resource reconciles an object created after it started and takes
//! it through a finalizer to deletion.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use brokkr_fake_kube::FakeCluster;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher::{self, Event};
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What a test waits for at most.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_watcher_sees_add_modify_and_delete() {
    let fake = FakeCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "default");
    let config = watcher::Config::default().fields("metadata.name=watched");
    let mut events = watcher::watcher(api.clone(), config).boxed();
    // The initial list is empty.
    loop {
        match next(&mut events).await {
            Event::InitDone => break,
            Event::InitApply(cm) => panic!("nothing exists yet: {cm:?}"),
            _ => {}
        }
    }
    let cm = |data: &str| {
        serde_json::from_value::<ConfigMap>(json!({
            "metadata": {"name": "watched"}, "data": {"a": data}
        }))
        .unwrap()
    };
    api.create(&PostParams::default(), &cm("1")).await.unwrap();
    // Another object the field selector leaves out.
    let other = json!({"metadata": {"name": "other"}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(other).unwrap(),
    )
    .await
    .unwrap();
    let patch = Patch::Merge(json!({"data": {"a": "2"}}));
    api.patch("watched", &PatchParams::default(), &patch)
        .await
        .unwrap();
    api.delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match next(&mut events).await {
            Event::Apply(cm) => seen.push(format!("apply {}", cm.data.unwrap()["a"])),
            Event::Delete(cm) => seen.push(format!("delete {}", cm.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["apply 1", "apply 2", "delete watched"]);
}

async fn next<T>(
    events: &mut (impl futures::Stream<Item = Result<Event<T>, watcher::Error>> + Unpin),
) -> Event<T> {
    tokio::time::timeout(PATIENCE, events.try_next())
        .await
        .expect("an event in time")
        .expect("no watch error")
        .expect("the stream goes on")
}

/// A custom resource for the controller test.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "test.brokkr.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    size: u32,
}

/// What the controller reports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
pub struct WidgetStatus {
    built: u32,
}

const FINALIZER: &str = "test.brokkr.dev/cleanup";

struct Context {
    api: Api<Widget>,
    cleanups: AtomicUsize,
}

async fn reconcile(widget: Arc<Widget>, ctx: Arc<Context>) -> Result<Action, kube::Error> {
    let api = ctx.api.clone();
    finalizer(&api, FINALIZER, widget, |event| async {
        match event {
            Finalizer::Apply(w) => {
                let status = json!({"status": {"built": w.spec.size}});
                api.patch_status(
                    &w.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(status),
                )
                .await?;
                Ok(Action::await_change())
            }
            Finalizer::Cleanup(_) => {
                ctx.cleanups.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => e,
        other => panic!("finalizer: {other}"),
    })
}

#[tokio::test]
async fn a_controller_reconciles_and_finalizes() {
    let fake = FakeCluster::start().await;
    fake.add_kind("test.brokkr.dev", "v1", "Widget", "widgets", true);
    let api: Api<Widget> = Api::namespaced(fake.client(), "default");
    let ctx = Arc::new(Context {
        api: api.clone(),
        cleanups: AtomicUsize::new(0),
    });
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_millis(50)),
            ctx.clone(),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    let widget = Widget::new("w", WidgetSpec { size: 3 });
    api.create(&PostParams::default(), &widget).await.unwrap();
    let built = wait_for(|| async {
        let w = api.get("w").await.unwrap();
        w.status.as_ref().is_some_and(|s| s.built == 3).then_some(w)
    })
    .await;
    assert_eq!(built.finalizers(), [FINALIZER]);
    assert_eq!(
        built.metadata.generation,
        Some(1),
        "a status change keeps it"
    );

    // A spec change bumps the generation and is reconciled.
    let patch = Patch::Merge(json!({"spec": {"size": 5}}));
    api.patch("w", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let rebuilt = wait_for(|| async {
        let w = api.get("w").await.unwrap();
        w.status.as_ref().is_some_and(|s| s.built == 5).then_some(w)
    })
    .await;
    assert_eq!(rebuilt.metadata.generation, Some(2));

    api.delete("w", &DeleteParams::default()).await.unwrap();
    wait_for(|| async { api.get_opt("w").await.unwrap().is_none().then_some(()) }).await;
    assert_eq!(ctx.cleanups.load(Ordering::SeqCst), 1);
    controller.abort();
}

async fn wait_for<T, F: Future<Output = Option<T>>>(mut probe: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
