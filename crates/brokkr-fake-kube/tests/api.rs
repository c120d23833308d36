//! The fake's API rules that controllers rely on, through kube's client: resourceVersions and
//! optimistic concurrency, generation, patches on `/status`, and watches resumed from a
//! resourceVersion.

use std::time::Duration;

use brokkr_fake_kube::FakeCluster;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"a": value}})).unwrap()
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let fake = FakeCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "default");
    let created = api
        .create(&PostParams::default(), &config_map("c", "1"))
        .await
        .unwrap();
    assert!(created.uid().is_some() && created.creation_timestamp().is_some());
    let first = created.resource_version().unwrap();

    let mut replaced = created.clone();
    replaced.data = Some([("a".to_owned(), "2".to_owned())].into());
    let replaced = api
        .replace("c", &PostParams::default(), &replaced)
        .await
        .unwrap();
    let second = replaced.resource_version().unwrap();
    assert!(second.parse::<u64>().unwrap() > first.parse::<u64>().unwrap());

    // The first version is stale now, for a replace and for a patch that carries it.
    let err = api
        .replace("c", &PostParams::default(), &created)
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
    let stale = Patch::Merge(json!({"metadata": {"resourceVersion": first}, "data": {"a": "3"}}));
    let err = api
        .patch("c", &PatchParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["a"], "2");

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.metadata.resource_version.as_deref(),
        Some(second.as_str())
    );
}

#[tokio::test]
async fn status_changes_keep_the_generation_and_spec_changes_bump_it() {
    let fake = FakeCluster::start().await;
    let api: Api<Deployment> = Api::namespaced(fake.client(), "default");
    let deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": {}, "template": {}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let status = Patch::Json::<()>(
        serde_json::from_value(json!([
            {"op": "add", "path": "/status", "value": {"replicas": 1}}
        ]))
        .unwrap(),
    );
    let d = api
        .patch_status("d", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().replicas, Some(1));
    assert_eq!(d.metadata.generation, Some(1));
    // The object's own path leaves status alone.
    let spec = Patch::Merge(json!({"spec": {"replicas": 2}, "status": {"replicas": 9}}));
    let d = api
        .patch("d", &PatchParams::default(), &spec)
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    assert_eq!(d.status.unwrap().replicas, Some(1));
}

#[tokio::test]
async fn a_watch_resumes_after_a_resource_version() {
    let fake = FakeCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "default");
    let a = api
        .create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("b", "1"))
        .await
        .unwrap();
    let patch = Patch::Merge(json!({"data": {"a": "2"}}));
    api.patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let since = a.resource_version().unwrap();
    let events = api
        .watch(&WatchParams::default().timeout(1), &since)
        .await
        .unwrap();
    let events: Vec<WatchEvent<ConfigMap>> =
        tokio::time::timeout(Duration::from_secs(10), events.try_collect())
            .await
            .expect("the watch ends after its timeout")
            .unwrap();
    let events: Vec<String> = events
        .into_iter()
        .map(|e| match e {
            WatchEvent::Added(o) => format!("added {}", o.name_any()),
            WatchEvent::Modified(o) => format!("modified {}", o.name_any()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(events, ["added b", "modified a"]);

    // From the start, every object is added first.
    let mut events = api
        .watch(&WatchParams::default().labels("missing!=x"), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => names.push(o.name_any()),
            other => panic!("{other:?}"),
        }
    }
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test]
async fn a_namespace_being_deleted_waits_for_the_finalizers_of_what_it_holds() {
    use k8s_openapi::api::core::v1::Namespace;
    let fake = FakeCluster::start().await;
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    fake.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": "team", "finalizers": ["x/y"]}}));
    fake.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "free", "namespace": "team"}}));
    let namespaces: Api<Namespace> = Api::all(fake.client());
    namespaces
        .delete("team", &Default::default())
        .await
        .unwrap();

    assert!(fake.get("v1", "ConfigMap", Some("team"), "free").is_none());
    let held = fake.get("v1", "ConfigMap", Some("team"), "held").unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    let ns = fake.get("v1", "Namespace", None, "team").unwrap();
    assert_eq!(ns["status"]["phase"], "Terminating");
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "team");
    let refused = api
        .create(&PostParams::default(), &config_map("new", "1"))
        .await
        .unwrap_err();
    assert_eq!(code(refused), 403);

    fake.set_finalizers("v1", "ConfigMap", Some("team"), "held", &[]);
    assert!(fake.get("v1", "ConfigMap", Some("team"), "held").is_none());
    assert!(fake.get("v1", "Namespace", None, "team").is_none());
}
