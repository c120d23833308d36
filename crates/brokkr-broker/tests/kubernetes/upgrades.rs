//! An upgrade on the Kubernetes target: a plan moved from maintenance version 1.0.0 to 1.1.0,
//! whose blueprint now edits its StatefulSet and no longer renders one of its two Services, is
//! applied by an OSB update carrying the new `maintenance_info`: the StatefulSet changed in
//! place, the Service that went deleted, the Service that stayed left as it was, and nothing
//! asked of the API server twice. On the fake the requests are read from its log; on a real
//! cluster from the API server's own counters.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{CLUSTER_TURN, Cluster, fake, real};
use crate::requests::{requests_served, served_between};
use crate::support::{broker, eventually, ok};

/// The catalog at `version`: 1.0.0 renders a StatefulSet `kv` (MODE=one) and Services `kv` and
/// `kv-metrics`; 1.1.0 the StatefulSet with MODE=two and the Service `kv` alone.
fn catalog(version: &str, kubeconfig: &str) -> String {
    let (mode, metrics) = match version {
        "1.0.0" => (
            "one",
            "      - {apiVersion: v1, kind: Service, metadata: {name: kv-metrics},\n         spec: {selector: {app: kv}, ports: [{port: 9121, protocol: TCP}]}}\n",
        ),
        _ => ("two", ""),
    };
    format!(
        "targets:
  cluster:
    kind: kubernetes
    kubeconfig: {kubeconfig}
    namespace: from-context
catalog:
  services:
  - {{name: kv, id: svc-kv, description: A StatefulSet and its Services, bindable: false,
     plan_updateable: true, instances_retrievable: true,
     plans: [{{name: one, id: plan-kv, description: One,
               maintenance_info: {{version: {version}, description: MODE {mode}}}}}]}}
blueprints:
- service: kv
  plan: one
  instance:
    steps:
    - name: server
      target: cluster
      templates:
      - apiVersion: apps/v1
        kind: StatefulSet
        metadata: {{name: kv}}
        spec:
          serviceName: kv
          replicas: 1
          selector: {{matchLabels: {{app: kv}}}}
          template:
            metadata: {{labels: {{app: kv}}}}
            spec:
              containers:
              - {{name: kv, image: 'redis:7.4', env: [{{name: MODE, value: {mode}}}]}}
      - {{apiVersion: v1, kind: Service, metadata: {{name: kv}},
         spec: {{selector: {{app: kv}}, ports: [{{port: 6379, protocol: TCP}}]}}}}
{metrics}"
    )
}

/// Provisions at 1.0.0, moves the catalog to 1.1.0 and upgrades; returns the requests the
/// upgrade made as `VERB resource` → count, read by `served` before and after it.
async fn upgrade<F, Fut>(
    cluster: &Cluster,
    kubeconfig: &str,
    ns: &str,
    served: F,
) -> BTreeMap<String, u64>
where
    F: Fn() -> Fut,
    Fut: Future<Output = BTreeMap<String, u64>>,
{
    let broker = broker(
        &catalog("1.0.0", "").replace("    kubeconfig: \n", ""),
        kubeconfig,
    )
    .await;
    let instance = "/v2/service_instances/kv-1";
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-kv",
                   "plan_id": "plan-kv", "context": {"platform": "kubernetes", "namespace": ns}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    cluster.make_ready(ns, "kv").await;
    ok(&broker.poll(&last, None).await);
    assert!(
        cluster
            .get("v1", "Service", ns, "kv-metrics")
            .await
            .is_some()
    );

    broker.replace_config(&catalog("1.1.0", kubeconfig));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = served().await;
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"service_id": "svc-kv", "maintenance_info": {"version": "1.1.0"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let sts = eventually(|| async {
        let live = cluster.get("apps/v1", "StatefulSet", ns, "kv").await?;
        let env = &live["spec"]["template"]["spec"]["containers"][0]["env"][0];
        (env["value"] == "two").then_some(live)
    })
    .await;
    assert_eq!(sts["spec"]["serviceName"], "kv");
    cluster.make_ready(ns, "kv").await;
    ok(&broker.poll(&last, None).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = served().await;
    assert!(
        cluster
            .get("v1", "Service", ns, "kv-metrics")
            .await
            .is_none(),
        "the Service 1.1.0 no longer renders is still there"
    );
    assert!(cluster.get("v1", "Service", ns, "kv").await.is_some());
    let fetched = broker.get(instance).await;
    assert_eq!(fetched.body["maintenance_info"]["version"], "1.1.0");
    after
        .into_iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(&k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect()
}

/// What an upgrade of this plan asks, exactly: each rendered object applied once, the
/// StatefulSet watched for readiness once, and the Service that went deleted once.
const EXACTLY: [(&str, u64); 4] = [
    ("APPLY statefulsets", 1),
    ("APPLY services", 1),
    ("DELETE services", 1),
    ("WATCH statefulsets", 1),
];

/// Asserts `EXACTLY` of `upgrade`.
fn assert_exactly(upgrade: &BTreeMap<String, u64>) {
    for (request, n) in EXACTLY {
        assert_eq!(upgrade.get(request), Some(&n), "{request}: {upgrade:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_edits_the_statefulset_and_deletes_the_service_that_went_on_the_fake() {
    let (cluster, _dir, kubeconfig) = fake().await;
    let Cluster::Fake(fake) = &cluster else {
        unreachable!()
    };
    let upgrade = upgrade(&cluster, &kubeconfig, "team-a", || async {
        // brokkr's requests in the fake's log (not the test's own reads) as `VERB resource`
        // counts, a server-side apply being a PATCH of `application/apply-patch+yaml`.
        let mut counts = BTreeMap::new();
        let agents = fake.user_agents();
        let brokkrs = (fake.requests().into_iter().zip(agents))
            .filter(|(_, agent)| agent.starts_with("brokkr/"))
            .map(|(request, _)| request);
        for request in brokkrs {
            let mut words = request.split_whitespace();
            let (Some(method), Some(path)) = (words.next(), words.next()) else {
                continue;
            };
            let apply = words.next().is_some_and(|t| t.contains("apply-patch"));
            let path = path.split('?').next().unwrap_or_default();
            let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
            let Some(at) = parts.iter().position(|p| *p == "namespaces") else {
                continue;
            };
            let (resource, named) = match &parts[at + 2..] {
                [resource] => (*resource, false),
                [resource, _] => (*resource, true),
                _ => continue,
            };
            let watch = request.contains("watch=true");
            let verb = match (method, named, apply, watch) {
                ("PATCH", _, true, _) => "APPLY",
                ("GET", _, _, true) => "WATCH",
                ("GET", false, _, _) => "LIST",
                (m, _, _, _) => m,
            };
            *counts.entry(format!("{verb} {resource}")).or_insert(0) += 1;
        }
        counts
    })
    .await;
    eprintln!("upgrade on the fake: {upgrade:?}");
    assert_exactly(&upgrade);
    // brokkr's own reads: each rendered object read once (is it brokkr's?) before its apply;
    // the objects the step made listed once per kind it looks at (those of the render, and the
    // common kinds a step may have made before), to find what no longer renders.
    assert_eq!(upgrade.get("GET statefulsets"), Some(&1), "{upgrade:?}");
    assert_eq!(upgrade.get("GET services"), Some(&1), "{upgrade:?}");
    let lists: Vec<_> = upgrade
        .iter()
        .filter(|(k, _)| k.starts_with("LIST "))
        .collect();
    assert!(lists.iter().all(|(_, n)| **n == 1), "{lists:?}");
    assert!(lists.len() <= 10, "{lists:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn an_upgrade_edits_the_statefulset_and_deletes_the_service_that_went_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    let Cluster::Real(client) = &cluster else {
        unreachable!()
    };
    let resources = ["services", "statefulsets"];
    let empty = BTreeMap::new();
    let upgrade = upgrade(&cluster, &kubeconfig, &ns, || async {
        served_between(&empty, &requests_served(client).await, &resources)
    })
    .await;
    eprintln!("upgrade on a cluster: {upgrade:?}");
    // The counters do not say who asked: reads are also the test's own (and the API server's,
    // of its `kubernetes` Service), so only writes and the watch are counted.
    assert_exactly(&upgrade);
}
