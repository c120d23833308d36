//! The `kubernetes` target against the in-memory fake API server: server-side apply with
//! brokkr's labels, namespace policies, readiness, prune on update, deletion that waits, PVC
//! policy, read-back and binding Secrets.

use std::time::Duration;

use brokkr_blueprint::{NamespacePolicy, PvcPolicy, TargetConfig, TargetKind};
use brokkr_fake_kube::FakeCluster;
use brokkr_targets::kubernetes::{Kubernetes, instance_namespace, label_value};
use brokkr_targets::{NamesKey, Readiness, Scope, Target, TargetError};
use serde_json::{Value, json};

const INSTANCE: &str = "3f2a9c4e-0b1d-4e5f-8a7b-6c5d4e3f2a10";

fn scope<'a>(context: &'a Value, step: &'a str) -> Scope<'a> {
    Scope {
        instance_id: INSTANCE,
        binding_id: None,
        service_id: "svc-1",
        plan_id: "plan-small",
        step,
        context,
        names_key: &NamesKey::RENDER_ONLY,
    }
}

/// A target on the fake; a call that waits for a change watches for 300 ms, not 10 s.
fn target(fake: &FakeCluster, namespace: NamespacePolicy, pvc: PvcPolicy) -> Kubernetes {
    Kubernetes::with_client("cluster", fake.client(), namespace, pvc)
        .watching_for(Duration::from_millis(300))
}

/// A target that puts objects in namespace `default` and deletes claims with their StatefulSet.
fn in_default(fake: &FakeCluster) -> Kubernetes {
    target(
        fake,
        NamespacePolicy::Fixed("default".into()),
        PvcPolicy::Delete,
    )
}

fn statefulset(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    })
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"ports": [{"port": 5432}]}})
}

fn waiting(r: Result<Readiness, TargetError>) -> String {
    match r {
        Ok(Readiness::Waiting(w)) => w,
        other => panic!("expected waiting, got {other:?}"),
    }
}

#[tokio::test]
async fn apply_labels_objects_and_uses_server_side_apply() {
    let fake = FakeCluster::start().await;
    let k = target(&fake, NamespacePolicy::FromContext, PvcPolicy::Delete);
    let context = json!({"namespace": "default", "platform": "kubernetes"});
    let s = scope(&context, "server");
    k.apply(&statefulset("pg", 1), &s).await.unwrap();
    let live = fake
        .get("apps/v1", "StatefulSet", Some("default"), "pg")
        .unwrap();
    let labels = &live["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/managed-by"], "brokkr");
    assert_eq!(labels["brokkr.dev/instance-id"], INSTANCE);
    assert_eq!(labels["brokkr.dev/service"], "svc-1");
    assert_eq!(labels["brokkr.dev/plan"], "plan-small");
    assert_eq!(labels["brokkr.dev/step"], "server");
    assert_eq!(labels["app"], "pg", "the template's own labels stay");
    assert_eq!(
        live["metadata"]["annotations"]["brokkr.dev/instance-id"],
        INSTANCE
    );
    let claim = &live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"];
    assert_eq!(claim["brokkr.dev/instance-id"], INSTANCE);
    assert_eq!(claim["brokkr.dev/claim-of"], "pg");
    assert!(
        claim.get("brokkr.dev/plan").is_none(),
        "claim templates are immutable"
    );
    let patch = fake
        .requests()
        .into_iter()
        .find(|r| r.starts_with("PATCH /apis/apps/v1/namespaces/default/statefulsets/pg"))
        .unwrap();
    assert!(patch.contains("fieldManager=brokkr"), "{patch}");
    assert!(patch.contains("force=true"), "{patch}");
    assert!(patch.ends_with("application/apply-patch+yaml"), "{patch}");
}

#[tokio::test]
async fn long_ids_are_hashed_in_labels_and_kept_whole_in_annotations() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let long = "i".repeat(80);
    let context = json!({});
    let s = Scope {
        instance_id: &long,
        ..scope(&context, "server")
    };
    k.apply(&service("svc"), &s).await.unwrap();
    let live = fake.get("v1", "Service", Some("default"), "svc").unwrap();
    let label = live["metadata"]["labels"]["brokkr.dev/instance-id"]
        .as_str()
        .unwrap();
    assert_eq!(label, label_value(&long));
    assert!(label.len() <= 63);
    assert_eq!(
        live["metadata"]["annotations"]["brokkr.dev/instance-id"],
        long
    );
}

#[tokio::test]
async fn namespace_policies() {
    let fake = FakeCluster::start().await;
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    let context = json!({"namespace": "team-a"});

    let fixed = target(
        &fake,
        NamespacePolicy::Fixed("default".into()),
        PvcPolicy::Delete,
    );
    fixed
        .apply(&service("fixed"), &scope(&context, "s"))
        .await
        .unwrap();
    assert!(
        fake.get("v1", "Service", Some("default"), "fixed")
            .is_some()
    );

    let from_context = target(&fake, NamespacePolicy::FromContext, PvcPolicy::Delete);
    from_context
        .apply(&service("ctx"), &scope(&context, "s"))
        .await
        .unwrap();
    assert!(fake.get("v1", "Service", Some("team-a"), "ctx").is_some());
    let none = json!({});
    let e = from_context
        .apply(&service("ctx"), &scope(&none, "s"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TargetError::Invalid(m) if m.contains("no `namespace`")),
        "{e}"
    );
    let mut elsewhere = service("x");
    elsewhere["metadata"]["namespace"] = json!("kube-system");
    let e = from_context
        .apply(&elsewhere, &scope(&context, "s"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("remove metadata.namespace"), "{e}");

    // per-instance: created with the first object, removed once the last step releases it.
    let per = target(&fake, NamespacePolicy::PerInstance, PvcPolicy::Delete);
    let ns = instance_namespace(INSTANCE);
    per.apply(&service("a"), &scope(&context, "one"))
        .await
        .unwrap();
    per.apply(&service("b"), &scope(&context, "two"))
        .await
        .unwrap();
    let namespace = fake.get("v1", "Namespace", None, &ns).unwrap();
    assert_eq!(
        namespace["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "brokkr"
    );
    assert!(fake.get("v1", "Service", Some(&ns), "a").is_some());
    per.delete(&service("b"), &scope(&context, "two"))
        .await
        .unwrap();
    per.released(&scope(&context, "two")).await.unwrap();
    assert!(
        fake.get("v1", "Namespace", None, &ns).is_some(),
        "step one still uses it"
    );
    per.delete(&service("a"), &scope(&context, "one"))
        .await
        .unwrap();
    // A claim still being deleted (its Pod not yet gone) is waited for.
    fake.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-a-0", "namespace": ns,
            "finalizers": ["kubernetes.io/pvc-protection"]}}));
    let claims: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(fake.client(), &ns);
    claims
        .delete("data-a-0", &Default::default())
        .await
        .unwrap();
    let e = per.released(&scope(&context, "one")).await.unwrap_err();
    assert!(
        matches!(&e, TargetError::Unavailable(m) if m.contains("data-a-0")),
        "{e}"
    );
    assert!(fake.get("v1", "Namespace", None, &ns).is_some());
    fake.set_finalizers("v1", "PersistentVolumeClaim", Some(&ns), "data-a-0", &[]);
    per.released(&scope(&context, "one")).await.unwrap();
    assert!(fake.get("v1", "Namespace", None, &ns).is_none());
    // Another instance's namespace of the same name is never taken over.
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    let e = per
        .apply(&service("a"), &scope(&context, "one"))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("does not belong to this instance"),
        "{e}"
    );
}

#[tokio::test]
async fn readiness_follows_live_status_and_declared_checks() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "server");
    let sts = statefulset("pg", 3);
    assert_eq!(
        waiting(k.ready(&sts, &s).await),
        "waiting for StatefulSet pg to be created"
    );
    k.apply(&sts, &s).await.unwrap();
    assert_eq!(
        waiting(k.ready(&sts, &s).await),
        "waiting for StatefulSet pg to be ready (0/3)"
    );
    fake.set_status(
        "apps/v1",
        "StatefulSet",
        Some("default"),
        "pg",
        json!({"observedGeneration": 1, "readyReplicas": 2}),
    );
    assert!(waiting(k.ready(&sts, &s).await).ends_with("(2/3)"));
    fake.set_status("apps/v1", "StatefulSet", Some("default"), "pg",
        json!({"observedGeneration": 1, "readyReplicas": 3, "currentRevision": "r1", "updateRevision": "r1"}));
    assert_eq!(k.ready(&sts, &s).await.unwrap(), Readiness::Ready);

    let check = json!({"apiVersion": "v1", "kind": "Pod", "name": "pg-0",
        "jsonpath": "{.status.phase}", "equals": "Running"});
    assert_eq!(
        waiting(k.check(&check, &s).await),
        "waiting for Pod pg-0 to be created"
    );
    fake.create(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pg-0", "namespace": "default"}, "status": {"phase": "Pending"}}));
    assert_eq!(
        waiting(k.check(&check, &s).await),
        "waiting for Pod pg-0 $.status.phase to be Running (now \"Pending\")"
    );
    fake.set_status(
        "v1",
        "Pod",
        Some("default"),
        "pg-0",
        json!({"phase": "Running"}),
    );
    assert_eq!(k.check(&check, &s).await.unwrap(), Readiness::Ready);

    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "init"},
        "spec": {"template": {"spec": {"containers": []}}}});
    k.apply(&job, &s).await.unwrap();
    fake.set_status("batch/v1", "Job", Some("default"), "init",
        json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}));
    let e = k.ready(&job, &s).await.unwrap_err();
    assert!(
        matches!(&e, TargetError::Invalid(m) if m.contains("Job init failed")),
        "{e}"
    );
}

#[tokio::test]
async fn custom_resources_are_discovered_applied_and_read_back() {
    let fake = FakeCluster::start().await;
    fake.add_kind("kubedb.com", "v1", "Postgres", "postgreses", true);
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "db");
    let pg = json!({"apiVersion": "kubedb.com/v1", "kind": "Postgres", "metadata": {"name": "pg"},
        "spec": {"version": "16.1", "replicas": 1}});
    k.apply(&pg, &s).await.unwrap();
    assert!(
        fake.get("kubedb.com/v1", "Postgres", Some("default"), "pg")
            .is_some()
    );
    // An operator's resource is ready by its Ready condition once it has one.
    fake.set_status(
        "kubedb.com/v1",
        "Postgres",
        Some("default"),
        "pg",
        json!({"phase": "Provisioning",
        "conditions": [{"type": "Ready", "status": "False", "reason": "NotReady"}]}),
    );
    assert_eq!(
        waiting(k.ready(&pg, &s).await),
        "waiting for Postgres pg to be ready: NotReady"
    );
    let phase = json!({"apiVersion": "kubedb.com/v1", "kind": "Postgres", "name": "pg",
        "jsonpath": "{.status.phase}", "equals": "Ready"});
    assert!(waiting(k.check(&phase, &s).await).contains("to be Ready (now \"Provisioning\")"));
    fake.set_status(
        "kubedb.com/v1",
        "Postgres",
        Some("default"),
        "pg",
        json!({"phase": "Ready",
        "conditions": [{"type": "Ready", "status": "True"}]}),
    );
    assert_eq!(k.ready(&pg, &s).await.unwrap(), Readiness::Ready);
    assert_eq!(k.check(&phase, &s).await.unwrap(), Readiness::Ready);

    // Credentials read back from the auth Secret the operator creates, decoded.
    let read = json!({"apiVersion": "v1", "kind": "Secret", "name": "pg-auth",
        "values": {"username": "/data/username", "password": "/data/password", "kind": "/type"}});
    let e = k.read(&read, &s).await.unwrap_err();
    assert_eq!(
        e,
        TargetError::Unavailable("waiting for Secret pg-auth to be created".into())
    );
    fake.create(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/basic-auth",
        "metadata": {"name": "pg-auth", "namespace": "default"},
        "data": {"username": "cG9zdGdyZXM=", "password": "czNjcmV0"}}),
    );
    let values = k.read(&read, &s).await.unwrap();
    assert_eq!(values["username"], "postgres");
    assert_eq!(values["password"], "s3cret");
    assert_eq!(values["kind"], "kubernetes.io/basic-auth");
    let missing = json!({"apiVersion": "v1", "kind": "Secret", "name": "pg-auth",
        "values": {"ca": "/data/ca.crt"}});
    let e = k.read(&missing, &s).await.unwrap_err();
    assert!(
        matches!(&e, TargetError::Unavailable(m) if m.contains("/data/ca.crt")),
        "{e}"
    );

    let unknown =
        json!({"apiVersion": "kubedb.com/v1", "kind": "Oracle", "metadata": {"name": "o"}});
    let e = k.apply(&unknown, &s).await.unwrap_err();
    assert!(
        matches!(&e, TargetError::Invalid(m) if m.contains("is its CRD installed")),
        "{e}"
    );
}

#[tokio::test]
async fn update_prunes_what_the_new_render_drops() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "server");
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tuning"},
        "data": {"max_connections": "20"}});
    for r in [&statefulset("pg", 1), &service("pg"), &config] {
        k.apply(r, &s).await.unwrap();
    }
    // Another step's and another instance's objects are not this step's to prune.
    k.apply(&service("other-step"), &scope(&context, "metrics"))
        .await
        .unwrap();
    let other = Scope {
        instance_id: "someone-else",
        ..scope(&context, "server")
    };
    k.apply(&service("other-instance"), &other).await.unwrap();

    let kept = [statefulset("pg", 3), service("pg")];
    for r in &kept {
        k.apply(r, &s).await.unwrap();
    }
    k.prune(&kept, &s).await.unwrap();
    assert!(
        fake.get("v1", "ConfigMap", Some("default"), "tuning")
            .is_none()
    );
    assert_eq!(
        fake.get("apps/v1", "StatefulSet", Some("default"), "pg")
            .unwrap()["spec"]["replicas"],
        3
    );
    for name in ["pg", "other-step", "other-instance"] {
        assert!(
            fake.get("v1", "Service", Some("default"), name).is_some(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_pruned_statefulset_takes_its_claims_as_its_annotation_says() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "server");
    let mut kept = statefulset("kept", 1);
    kept["metadata"]["annotations"] = json!({"brokkr.dev/pvc-policy": "retain"});
    for (sts, annotation) in [
        ("dropped", "delete"),
        ("kept", "retain"),
        ("archived", "retain"),
    ] {
        let mut object = statefulset(sts, 1);
        object["metadata"]["annotations"] = json!({"brokkr.dev/pvc-policy": annotation});
        k.apply(&object, &s).await.unwrap();
        let live = fake
            .get("apps/v1", "StatefulSet", Some("default"), sts)
            .unwrap();
        let labels = live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"].clone();
        fake.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("data-{sts}-0"), "namespace": "default",
                "labels": labels}}));
    }
    k.prune(std::slice::from_ref(&kept), &s).await.unwrap();
    let claim = |name: &str| fake.get("v1", "PersistentVolumeClaim", Some("default"), name);
    for gone in ["dropped", "archived"] {
        assert!(
            fake.get("apps/v1", "StatefulSet", Some("default"), gone)
                .is_none(),
            "{gone}"
        );
    }
    assert!(
        claim("data-dropped-0").is_none(),
        "deleted with its StatefulSet"
    );
    assert!(claim("data-archived-0").is_some(), "retained by annotation");
    assert!(claim("data-kept-0").is_some(), "a kept StatefulSet's claim");
}

#[tokio::test]
async fn delete_waits_until_gone_and_follows_the_pvc_policy() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "server");
    let sts = statefulset("pg", 1);
    k.apply(&sts, &s).await.unwrap();
    // The claim the StatefulSet controller would create from its template.
    let template = fake
        .get("apps/v1", "StatefulSet", Some("default"), "pg")
        .unwrap();
    let claim_labels = template["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"].clone();
    fake.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-pg-0", "namespace": "default", "labels": claim_labels}}));
    fake.set_finalizers(
        "apps/v1",
        "StatefulSet",
        Some("default"),
        "pg",
        &["foregroundDeletion"],
    );

    let e = k.delete(&sts, &s).await.unwrap_err();
    assert_eq!(
        e,
        TargetError::Unavailable("waiting for StatefulSet pg to be deleted".into())
    );
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "data-pg-0")
            .is_some(),
        "claims go after their StatefulSet"
    );
    fake.set_finalizers("apps/v1", "StatefulSet", Some("default"), "pg", &[]);
    k.delete(&sts, &s).await.unwrap();
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "data-pg-0")
            .is_none()
    );
    k.delete(&sts, &s).await.unwrap(); // already gone

    // retain, by the target's default or per plan by annotation.
    let retain = target(
        &fake,
        NamespacePolicy::Fixed("default".into()),
        PvcPolicy::Retain,
    );
    k.apply(&sts, &s).await.unwrap();
    fake.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-pg-0", "namespace": "default", "labels": claim_labels}}));
    retain.delete(&sts, &s).await.unwrap();
    assert!(
        fake.get("apps/v1", "StatefulSet", Some("default"), "pg")
            .is_none()
    );
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "data-pg-0")
            .is_some()
    );
    let mut annotated = statefulset("pg", 1);
    annotated["metadata"]["annotations"] = json!({"brokkr.dev/pvc-policy": "delete"});
    retain.apply(&annotated, &s).await.unwrap();
    retain.delete(&annotated, &s).await.unwrap();
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "data-pg-0")
            .is_none()
    );

    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "files"},
        "spec": {"accessModes": ["ReadWriteOnce"]}});
    retain.apply(&claim, &s).await.unwrap();
    retain.delete(&claim, &s).await.unwrap();
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "files")
            .is_some()
    );
    k.delete(&claim, &s).await.unwrap();
    assert!(
        fake.get("v1", "PersistentVolumeClaim", Some("default"), "files")
            .is_none()
    );
}

#[tokio::test]
async fn binding_credentials_become_a_service_binding_secret() {
    let fake = FakeCluster::start().await;
    let k = target(&fake, NamespacePolicy::FromContext, PvcPolicy::Delete);
    let context = json!({"namespace": "default"});
    let s = Scope {
        binding_id: Some("b-1"),
        ..scope(&context, "secret")
    };
    let credentials = json!({"type": "postgresql", "provider": "brokkr", "host": "pg.default.svc",
        "port": 5432, "username": "u", "password": "p@ss"});
    let at = k
        .publish_credentials("orders-db", credentials.as_object().unwrap(), &s)
        .await
        .unwrap();
    assert_eq!(at, json!({"namespace": "default", "name": "orders-db"}));
    let secret = fake
        .get("v1", "Secret", Some("default"), "orders-db")
        .unwrap();
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    let decode = |k: &str| {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD
            .decode(secret["data"][k].as_str().unwrap())
            .unwrap();
        String::from_utf8(b).unwrap()
    };
    assert_eq!(decode("type"), "postgresql");
    assert_eq!(decode("provider"), "brokkr");
    assert_eq!(decode("port"), "5432");
    assert_eq!(decode("password"), "p@ss");
    assert_eq!(secret["metadata"]["labels"]["brokkr.dev/binding-id"], "b-1");
    let e = k
        .publish_credentials("Bad_Name", credentials.as_object().unwrap(), &s)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("DNS subdomain"), "{e}");
    assert!(!e.to_string().contains("p@ss"));
    // Unbinding costs a read (is it this binding's?) and one delete, of exactly that Secret.
    let before = fake.requests().len();
    k.unpublish_credentials("orders-db", &s).await.unwrap();
    assert!(
        fake.get("v1", "Secret", Some("default"), "orders-db")
            .is_none()
    );
    let requests: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| r.contains("/secrets/orders-db"))
        .map(|r| r.split('?').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        requests,
        [
            "GET /api/v1/namespaces/default/secrets/orders-db",
            "DELETE /api/v1/namespaces/default/secrets/orders-db"
        ]
    );
    k.unpublish_credentials("orders-db", &s).await.unwrap();
}

#[tokio::test]
async fn a_kubeconfig_file_and_context_reach_the_cluster() {
    let fake = FakeCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, fake.kubeconfig()).unwrap();
    let mut config = TargetConfig {
        kind: TargetKind::Kubernetes,
        url_env: None,
        url_file: None,
        host: None,
        port: None,
        timeout: None,
        kubeconfig: Some(path.display().to_string()),
        context: Some("fake".into()),
        namespace: Some(NamespacePolicy::Fixed("default".into())),
        pvc_policy: None,
        root: None,
        keep_running: None,
        run_as: None,
    };
    let context = json!({});
    let k = Kubernetes::new("cluster", &config);
    k.apply(&service("svc"), &scope(&context, "s"))
        .await
        .unwrap();
    assert!(fake.get("v1", "Service", Some("default"), "svc").is_some());
    let agents = fake.user_agents();
    assert!(!agents.is_empty());
    assert!(
        agents
            .iter()
            .all(|a| *a == format!("brokkr/{}", env!("CARGO_PKG_VERSION"))),
        "{agents:?}"
    );
    config.context = Some("missing".into());
    let e = Kubernetes::new("cluster", &config)
        .apply(&service("svc"), &scope(&context, "s"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TargetError::Unavailable(m) if m.contains("kubeconfig")),
        "{e}"
    );
}

#[tokio::test]
async fn an_https_cluster_gets_a_tls_client_and_an_unreachable_one_is_retried() {
    // rustls needs exactly one crypto provider (ring) to build kube's TLS client.
    let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(config).expect("a TLS client");
    let k = Kubernetes::with_client(
        "cluster",
        client,
        NamespacePolicy::Fixed("default".into()),
        PvcPolicy::Delete,
    );
    let context = json!({});
    let e = k
        .apply(&service("svc"), &scope(&context, "s"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TargetError::Unavailable(m) if m.contains("kubernetes target cluster")),
        "{e}"
    );
}

#[tokio::test]
async fn objects_brokkr_did_not_create_are_never_taken_over_or_deleted() {
    let fake = FakeCluster::start().await;
    let k = in_default(&fake);
    let context = json!({});
    let s = scope(&context, "server");
    // A Service someone else made, and one another instance made.
    fake.create(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "theirs", "namespace": "default", "labels": {"app": "theirs"}},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}));
    k.apply(
        &service("other"),
        &Scope {
            instance_id: "another-instance",
            ..s
        },
    )
    .await
    .unwrap();
    for name in ["theirs", "other"] {
        let e = k.apply(&service(name), &s).await.unwrap_err();
        assert!(
            matches!(&e, TargetError::Invalid(m) if m.contains("not created by brokkr")),
            "{name}: {e}"
        );
        k.delete(&service(name), &s).await.unwrap();
        let live = fake.get("v1", "Service", Some("default"), name).unwrap();
        let owner = &live["metadata"]["annotations"]["brokkr.dev/instance-id"];
        assert_ne!(owner, INSTANCE, "{name} was neither taken over nor deleted");
    }
    // Nor a Secret of the same name as a binding's.
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-creds", "namespace": "default"}, "data": {"k": "dg=="}}));
    let b = Scope {
        binding_id: Some("b-1"),
        ..s
    };
    let credentials = json!({"type": "postgresql", "password": "p"});
    let e = k
        .publish_credentials("app-creds", credentials.as_object().unwrap(), &b)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not created by brokkr"), "{e}");
    k.unpublish_credentials("app-creds", &b).await.unwrap();
    let kept = fake
        .get("v1", "Secret", Some("default"), "app-creds")
        .unwrap();
    assert_eq!(kept["data"]["k"], "dg==");
}
