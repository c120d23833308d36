//! The catalogs/manifests PostgreSQL plan through the OSB API: provision (labelled objects, one
//! apply each, readiness seen by watching), bind (a servicebinding.io Secret), an update that
//! prunes what the new plan no longer renders, unbind and deprovision (the claim too).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{CLUSTER_TURN, Cluster, broker_kubeconfig, fake, real};
use crate::support::{
    MANIFESTS, PG, PG_MEDIUM, PG_SMALL, binding_secret, broker, entries, eventually, object_name,
    ok,
};

/// provision → ready → bind → update → unbind → deprovision of the manifests PostgreSQL plan.
async fn manifests_postgres(cluster: &Cluster, kubeconfig: &str, ns: &str) {
    // A catalog whose small plan also has a Secret the medium plan does not (a kind the broker's
    // role covers): the update to medium must prune it.
    let small =
        "{name: server, target: cluster, templates: [pg-secret, pg-service, pg-statefulset]}";
    assert!(MANIFESTS.contains(small));
    let medium = "    plan: medium\n    instance: *pg-instance\n";
    assert!(MANIFESTS.contains(medium));
    let catalog = MANIFESTS
        .replacen(
            small,
            "{name: server, target: cluster, templates: [pg-secret, pg-service, pg-statefulset, \
             {apiVersion: v1, kind: Secret, metadata: {name: \"{{ registry('name') }}-small\"}, \
             stringData: {plan: small}}]}",
            1,
        )
        .replacen(
            medium,
            &format!(
                "    plan: medium\n    instance: {{registry: *pg-registry, steps: [{small}]}}\n"
            ),
            1,
        );
    let broker = broker(&catalog, kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL,
                "context": {"platform": "kubernetes", "namespace": ns},
                "parameters": {"version": "16", "storage": "1Gi"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let waiting = broker
        .poll(
            &last,
            Some(&format!("waiting for StatefulSet {name} to be ready")),
        )
        .await;
    // On a real node the database may be ready before the poll sees it wait.
    if matches!(cluster, Cluster::Fake(_)) || waiting.body["state"] != "succeeded" {
        assert_eq!(waiting.body["state"], "in progress", "{:?}", waiting.body);
    }
    if let Cluster::Fake(fake) = cluster {
        // While it waits for readiness, the step watches the StatefulSet (10 s at a time, then
        // it reads it again) without applying again: one apply per object, and no read of the
        // Secret or the Service, whose readiness the apply's answer shows.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let statefulset = format!("/apis/apps/v1/namespaces/{ns}/statefulsets");
        let count = |prefix: String| {
            fake.requests()
                .iter()
                .filter(|r| r.starts_with(&prefix))
                .count()
        };
        let named = |verb: &str, path: &str| count(format!("{verb} {path}/{name}?"));
        assert_eq!(named("PATCH", &statefulset), 1, "applies");
        assert_eq!(
            named("GET", &statefulset),
            2,
            "reads: the owner check, then one per watch"
        );
        assert_eq!(
            count(format!("GET {statefulset}?&watch=true")),
            2,
            "watches"
        );
        let services = format!("/api/v1/namespaces/{ns}/services");
        assert_eq!(named("PATCH", &services), 1);
        assert_eq!(named("GET", &services), 1, "the owner check only");
    }

    // Every object is there, labelled, in the namespace from the OSB context.
    for (api_version, kind, object) in [
        ("v1", "Secret", format!("{name}-auth")),
        ("v1", "Service", name.clone()),
        ("apps/v1", "StatefulSet", name.clone()),
        ("v1", "Secret", format!("{name}-small")),
    ] {
        let live = cluster.get(api_version, kind, ns, &object).await;
        let live = live.unwrap_or_else(|| panic!("{kind} {object}"));
        let labels = &live["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/managed-by"], "brokkr", "{kind}");
        assert_eq!(labels["brokkr.dev/instance-id"], id.as_str(), "{kind}");
        assert_eq!(labels["brokkr.dev/service"], PG, "{kind}");
        assert_eq!(labels["brokkr.dev/plan"], PG_SMALL, "{kind}");
        assert_eq!(labels["brokkr.dev/step"], "server", "{kind}");
    }
    let sts = cluster
        .get("apps/v1", "StatefulSet", ns, &name)
        .await
        .unwrap();
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "postgres:16");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    let claim_template = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(
        claim_template["spec"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    assert_eq!(
        claim_template["metadata"]["labels"]["brokkr.dev/instance-id"],
        id.as_str()
    );

    // After a long wait, readiness is still seen within a second: the step watches the
    // StatefulSet instead of polling it less and less often.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let flipped = std::time::Instant::now();
    cluster.make_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    let seen = flipped.elapsed();
    assert!(
        seen < Duration::from_secs(2),
        "readiness seen after {seen:?}"
    );
    let claim = cluster.claim(ns, &name).await;

    // Bind: the credentials, and the same as a servicebinding.io Secret.
    let b = uuid::Uuid::new_v4().to_string();
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .put(
            &format!("{binding}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    let credentials = broker.get(&binding).await.body["credentials"].clone();
    assert_eq!(credentials["type"], "postgresql");
    assert_eq!(credentials["host"], format!("{name}.{ns}.svc"));
    let secret_name = binding_secret(&name, &b);
    let secret = cluster.get("v1", "Secret", ns, &secret_name).await.unwrap();
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    let written = entries(&secret);
    for key in [
        "type", "provider", "host", "username", "password", "database", "uri",
    ] {
        assert_eq!(written[key], credentials[key], "{key}");
    }
    assert_eq!(written["port"], "5432");
    let auth = entries(
        &cluster
            .get("v1", "Secret", ns, &format!("{name}-auth"))
            .await
            .unwrap(),
    );
    assert_eq!(written["password"], auth["password"]);
    assert_eq!(
        secret["metadata"]["labels"]["brokkr.dev/binding-id"],
        b.as_str()
    );

    // The version is chosen at provision: an update may not change it.
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_MEDIUM, "parameters": {"version": "17"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);

    // Update to medium: the StatefulSet changes, the Secret only small has is pruned, and the
    // update waits for the StatefulSet again.
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_MEDIUM}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let sts = eventually(|| async {
        let live = cluster.get("apps/v1", "StatefulSet", ns, &name).await?;
        (live["metadata"]["labels"]["brokkr.dev/plan"] == PG_MEDIUM).then_some(live)
    })
    .await;
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "postgres:16", "kept");
    assert_eq!(container["resources"]["limits"]["memory"], "2Gi");
    let claim_template = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(
        claim_template["spec"]["resources"]["requests"]["storage"], "1Gi",
        "kept"
    );
    cluster.make_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    let pruned = cluster
        .get("v1", "Secret", ns, &format!("{name}-small"))
        .await;
    assert!(
        pruned.is_none(),
        "the Secret of the small plan is still there"
    );

    // Unbind removes the Secret.
    let r = broker
        .delete(&format!(
            "{binding}?accepts_incomplete=true&service_id={PG}&plan_id={PG_MEDIUM}"
        ))
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    assert!(
        cluster
            .get("v1", "Secret", ns, &secret_name)
            .await
            .is_none()
    );

    // Deprovision removes everything, the claim too (pvc_policy: delete).
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_MEDIUM}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker.poll(&last, None).await;
    ok(&done);
    assert!(!done.description().contains("skipped"), "{:?}", done.body);
    // The objects brokkr applied are gone when the deprovision ends; the claim, held by the
    // `kubernetes.io/pvc-protection` finalizer until its Pod is gone, soon after.
    for (api_version, kind, object) in [
        ("apps/v1", "StatefulSet", name.clone()),
        ("v1", "Service", name.clone()),
        ("v1", "Secret", format!("{name}-auth")),
    ] {
        let gone = cluster.get(api_version, kind, ns, &object).await;
        assert!(gone.is_none(), "{kind} {object} is still there");
    }
    eventually(|| async {
        let claim = cluster.get("v1", "PersistentVolumeClaim", ns, &claim).await;
        claim.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manifests_postgres_lifecycle_on_the_fake() {
    let (cluster, _dir, kubeconfig) = fake().await;
    manifests_postgres(&cluster, &kubeconfig, "team-a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn manifests_postgres_lifecycle_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &["manifests.yaml"]).await;
    manifests_postgres(&cluster, &kubeconfig, &ns).await;
}
