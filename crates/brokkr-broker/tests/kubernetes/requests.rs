//! What brokkr asks of the API server: a waiting delete does not ask again about what is gone
//! (on the fake, which records requests), and on a real cluster, read from the API server's own
//! counters, one request per object and phase.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{CLUSTER_TURN, Cluster, broker_kubeconfig, fake, real};
use crate::support::{
    PG, PG_SMALL, broker, eventually, forget_stand_in_database, manifests_at_stand_in, object_name,
    ok, stand_in_database,
};

/// A deprovision step whose last-deleted object is held by a finalizer waits for it without
/// asking again about the objects it already deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_delete_does_not_ask_again_about_what_is_gone() {
    let (cluster, _dir, kubeconfig) = fake().await;
    let Cluster::Fake(fake) = &cluster else {
        unreachable!()
    };
    let catalog = "targets:
  cluster:
    kind: kubernetes
    namespace: from-context
catalog:
  services:
  - {name: pair, id: svc-pair, description: Two Secrets, bindable: false,
     plans: [{name: one, id: plan-one, description: One}]}
blueprints:
- service: pair
  plan: one
  instance:
    steps:
    - name: secrets
      target: cluster
      templates:
      - {apiVersion: v1, kind: Secret, metadata: {name: first}, stringData: {a: b}}
      - {apiVersion: v1, kind: Secret, metadata: {name: second}, stringData: {c: d}}
";
    let broker = broker(catalog, &kubeconfig).await;
    let instance = "/v2/service_instances/pair-1";
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-pair",
                   "plan_id": "plan-one", "context": {"platform": "kubernetes", "namespace": "team-a"}}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker.poll(&last, None).await);

    // Deleted last to first: `second` goes, `first` is held by a finalizer for a while.
    fake.set_finalizers("v1", "Secret", Some("team-a"), "first", &["e2e/hold"]);
    let before = fake.requests().len();
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id=svc-pair&plan_id=plan-one"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    broker.poll(&last, Some("Secret first")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = |name: &str| {
        let path = format!("/api/v1/namespaces/team-a/secrets/{name}?");
        fake.requests()[before..]
            .iter()
            .filter(|r| r.contains(&path))
            .count()
    };
    assert_eq!(asked("second"), 2, "one read and one delete of `second`");
    assert!(asked("first") >= 3, "`first` is looked at again");
    fake.set_finalizers("v1", "Secret", Some("team-a"), "first", &[]);
    ok(&broker.poll(&last, None).await);
}

/// The API server's `apiserver_request_total`, summed by (verb, resource) over requests to
/// the objects themselves (not their `status` or other subresources). The counters do not say
/// who asked: besides brokkr, the API server reads the `kubernetes` Service every few seconds,
/// and the garbage collector reads and patches an object deleted in the foreground. The
/// assertions hold only what no one else does here.
pub(crate) async fn requests_served(
    client: &kube::Client,
) -> std::collections::BTreeMap<(String, String), u64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        if !label("subresource").is_empty() {
            continue;
        }
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        *counts
            .entry((label("verb"), label("resource")))
            .or_insert(0) += value as u64;
    }
    counts
}

/// What the API server served between two readings, as `VERB resource` → count.
pub(crate) fn served_between(
    before: &std::collections::BTreeMap<(String, String), u64>,
    after: &std::collections::BTreeMap<(String, String), u64>,
    resources: &[&str],
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .filter(|((_, resource), _)| resources.contains(&resource.as_str()))
        .filter_map(|((verb, resource), n)| {
            let d = n - before
                .get(&(verb.clone(), resource.clone()))
                .copied()
                .unwrap_or(0);
            (d > 0).then(|| (format!("{verb} {resource}"), d))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn manifests_postgres_costs_the_api_server_one_request_per_object_and_phase() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    let Cluster::Real(client) = &cluster else {
        unreachable!()
    };
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &["manifests.yaml"]).await;
    let database = stand_in_database();
    let broker = broker(&manifests_at_stand_in(&database), &kubeconfig).await;
    let watched = [
        "secrets",
        "services",
        "statefulsets",
        "persistentvolumeclaims",
    ];
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    // Settles the counters: a watch is counted when it ends.
    let settle = || tokio::time::sleep(Duration::from_secs(2));

    // Provision: three objects, each checked to be brokkr's and applied once; the StatefulSet
    // watched until its Pod is ready (the node runs it and its probe passes; the
    // controller-manager then sets the StatefulSet's status), and that is seen within 2 s.
    let start = requests_served(client).await;
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG,
                "plan_id": PG_SMALL, "context": {"platform": "kubernetes", "namespace": ns}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let pod = format!("{name}-0");
    eventually(|| async {
        let found = cluster.get("v1", "Pod", &ns, &pod).await?;
        let conditions = found["status"]["conditions"].as_array().cloned();
        let ready = conditions
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(())
    })
    .await;
    let flipped = std::time::Instant::now();
    ok(&broker.poll(&last, None).await);
    let seen = flipped.elapsed();
    settle().await;
    let provisioned = requests_served(client).await;
    let provision = served_between(&start, &provisioned, &watched);
    eprintln!("provision: {provision:?}, readiness seen after {seen:?}");
    assert!(
        seen < Duration::from_secs(2),
        "readiness seen after {seen:?}"
    );
    // Services are also read by the API server itself (its `kubernetes` Service), so their
    // reads are not counted.
    let expected = [
        ("APPLY secrets", 1),
        ("APPLY services", 1),
        ("APPLY statefulsets", 1),
        ("GET secrets", 1),
        ("GET statefulsets", 1),
        ("WATCH statefulsets", 1),
    ];
    for (request, n) in expected {
        assert_eq!(provision.get(request), Some(&n), "{request}: {provision:?}");
    }

    // Bind and unbind: the binding Secret applied once; then read (is it brokkr's?) and
    // deleted once.
    let b = uuid::Uuid::new_v4().to_string();
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .put(
            &format!("{binding}?accepts_incomplete=true"),
            json!({"service_id": PG, "plan_id": PG_SMALL}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    settle().await;
    let bound = requests_served(client).await;
    let bind = served_between(&provisioned, &bound, &watched);
    eprintln!("bind: {bind:?}");
    // The Secret checked to be brokkr's, then applied.
    assert_eq!(bind.get("GET secrets"), Some(&1), "{bind:?}");
    assert_eq!(bind.get("APPLY secrets"), Some(&1), "{bind:?}");
    let r = broker
        .delete(&format!(
            "{binding}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    settle().await;
    let unbound = requests_served(client).await;
    let unbind = served_between(&bound, &unbound, &watched);
    eprintln!("unbind: {unbind:?}");
    assert_eq!(unbind.get("GET secrets"), Some(&1), "{unbind:?}");
    assert_eq!(unbind.get("DELETE secrets"), Some(&1), "{unbind:?}");

    // Deprovision: each object read (is it brokkr's?) and deleted once, the StatefulSet
    // watched until it is gone, its claim listed once and deleted once.
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    ok(&broker.poll(&last, None).await);
    settle().await;
    let deprovision = served_between(&unbound, &requests_served(client).await, &watched);
    eprintln!("deprovision: {deprovision:?}");
    // The StatefulSet, deleted in the foreground, is also read and patched by the garbage
    // collector (its `foregroundDeletion` finalizer), so its reads are not counted.
    let expected = [
        ("DELETE secrets", 1),
        ("DELETE services", 1),
        ("DELETE statefulsets", 1),
        ("GET secrets", 1),
        ("LIST persistentvolumeclaims", 1),
        ("DELETE persistentvolumeclaims", 1),
    ];
    for (request, n) in expected {
        assert_eq!(
            deprovision.get(request),
            Some(&n),
            "{request}: {deprovision:?}"
        );
    }
    forget_stand_in_database(&database).await;
}
