//! The catalogs/manifests PostgreSQL plan through the OSB API: provision (labelled objects, one
//! apply each, readiness seen by watching, then the database bindings share), bind (a user of
//! the binding's own, a servicebinding.io Secret), a rotation (the successor's user reads what
//! the predecessor's wrote; the predecessor's is refused once it is unbound), an update that
//! prunes what the new plan no longer renders, unbind and deprovision (the claim too). The
//! instance's server, which the broker outside the cluster cannot reach, is the test
//! PostgreSQL server.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;

use crate::cluster::{CLUSTER_TURN, Cluster, broker_kubeconfig, fake, real};
use crate::support::{
    PG, PG_MEDIUM, PG_SMALL, as_admin, binding_secret, broker, entries, eventually,
    forget_stand_in_database, login_at, manifests_at_stand_in, object_name, ok, stand_in_database,
    stand_in_postgres,
};

/// provision → ready → bind → update → unbind → deprovision of the manifests PostgreSQL plan.
async fn manifests_postgres(cluster: &Cluster, kubeconfig: &str, ns: &str) {
    // A catalog whose small plan also has a Secret the medium plan does not (a kind the broker's
    // role covers): the update to medium must prune it.
    let small =
        "{name: server, target: cluster, templates: [pg-secret, pg-service, pg-statefulset]}";
    let database = stand_in_database();
    let manifests = manifests_at_stand_in(&database);
    assert!(manifests.contains(small));
    let medium = "    plan: medium\n    instance: *pg-instance\n";
    assert!(manifests.contains(medium));
    let catalog = manifests
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
                "    plan: medium\n    instance: {{registry: *pg-registry, steps: [{small}, *pg-app-database]}}\n"
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

    // The provision made the database the bindings share, owned by a role of its own.
    let made = format!("SELECT datname::text FROM pg_database WHERE datname = '{database}'");
    assert_eq!(as_admin(&made).await, vec![database.clone()]);
    let (host, port, _, _) = stand_in_postgres();
    let server = Some((host.as_str(), port));

    // Bind: a user of the binding's own, its credentials, and the same as a servicebinding.io
    // Secret.
    let b = uuid::Uuid::new_v4().to_string();
    let credentials = broker
        .bind(
            &instance,
            &b,
            json!({"service_id": PG, "plan_id": PG_SMALL}),
        )
        .await;
    assert_eq!(credentials["type"], "postgresql");
    assert_eq!(credentials["host"], format!("{name}.{ns}.svc"));
    assert_eq!(credentials["database"], database.as_str());
    let user = credentials["username"].as_str().unwrap().to_owned();
    assert!(user.starts_with("b_"), "{user}");
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
    assert_ne!(
        written["password"], auth["password"],
        "a binding has the server's admin password"
    );
    assert_eq!(
        secret["metadata"]["labels"]["brokkr.dev/binding-id"],
        b.as_str()
    );
    let mut conn = login_at(server, &credentials).await.unwrap();
    for sql in [
        "CREATE TABLE orders (id int)",
        "INSERT INTO orders VALUES (1)",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();

    // A rotation: the successor is a new user, which uses what the predecessor made; once the
    // predecessor is unbound, its credentials are refused and the successor's still work.
    let successor = uuid::Uuid::new_v4().to_string();
    let rotated = broker
        .bind(
            &instance,
            &successor,
            json!({"service_id": PG, "plan_id": PG_SMALL, "predecessor_binding_id": b}),
        )
        .await;
    assert_ne!(rotated["username"], credentials["username"]);
    assert_ne!(rotated["password"], credentials["password"]);
    let mut conn = login_at(server, &rotated).await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (2)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    login_at(server, &credentials)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    broker.unbind(&instance, &b, PG, PG_SMALL).await;
    assert!(
        cluster
            .get("v1", "Secret", ns, &secret_name)
            .await
            .is_none()
    );
    let refused = login_at(server, &credentials).await.err();
    let refused = refused.expect("the predecessor's credentials still log in");
    assert!(
        refused.to_string().contains(&user),
        "refused for another reason: {refused}"
    );
    let mut conn = login_at(server, &rotated).await.unwrap();
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 2);
    conn.close().await.unwrap();

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

    // Unbind removes the Secret and the user.
    broker.unbind(&instance, &successor, PG, PG_MEDIUM).await;
    let secret_name = binding_secret(&name, &successor);
    assert!(
        cluster
            .get("v1", "Secret", ns, &secret_name)
            .await
            .is_none()
    );
    assert!(login_at(server, &rotated).await.is_err());

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
    // The instance's server would go with it; the stand-in stays.
    forget_stand_in_database(&database).await;
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
