//! The cluster a flow runs against: the in-memory fake, or a real one from
//! `BROKKR_E2E_KUBECONFIG` with the broker acting as the ServiceAccount deploy/rbac describes.
//! Real-cluster tests take turns (`CLUSTER_TURN`).

use brokkr_fake_kube::FakeCluster;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::{entries, eventually};

/// The cluster a flow runs against: the fake, or a real one.
pub(crate) enum Cluster {
    Fake(FakeCluster),
    Real(kube::Client),
}

impl Cluster {
    /// The API of `kind` in `api_version`: in namespace `ns`, or cluster-wide.
    pub(crate) async fn api(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> Api<DynamicObject> {
        let client = match self {
            Self::Fake(fake) => fake.client(),
            Self::Real(client) => client.clone(),
        };
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
        match ns {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        }
    }

    /// Object `name` of `kind` in namespace `ns`, if it exists.
    pub(crate) async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: &str,
        name: &str,
    ) -> Option<Value> {
        let api = self.api(api_version, kind, Some(ns)).await;
        let found = api.get_opt(name).await.unwrap();
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    /// Creates `object` as it is.
    pub(crate) async fn create(&self, object: Value) {
        let ns = object["metadata"]["namespace"].as_str();
        let api_version = object["apiVersion"].as_str().unwrap();
        let api = self
            .api(api_version, object["kind"].as_str().unwrap(), ns)
            .await;
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    /// Merges `status` into the status of object `name`.
    pub(crate) async fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        ns: &str,
        name: &str,
        status: Value,
    ) {
        let api = self.api(api_version, kind, Some(ns)).await;
        let patch = json!({"status": status});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// Makes a one-replica StatefulSet ready: on the fake, its status; on a real cluster, whose
    /// node runs its Pod (the images of scripts/images), waits until the Pod of its current
    /// revision is Ready by its own probe. No test writes a Pod's status.
    pub(crate) async fn make_ready(&self, ns: &str, name: &str) {
        let sts = eventually(|| async {
            let live = self.get("apps/v1", "StatefulSet", ns, name).await?;
            let seen = live["status"]["observedGeneration"] == live["metadata"]["generation"];
            (seen || matches!(self, Self::Fake(_))).then_some(live)
        })
        .await;
        match self {
            Self::Fake(_) => {
                let generation = sts["metadata"]["generation"].clone();
                let status = json!({"observedGeneration": generation, "replicas": 1,
                    "readyReplicas": 1, "availableReplicas": 1,
                    "currentRevision": format!("{name}-{generation}"),
                    "updateRevision": format!("{name}-{generation}")});
                self.set_status("apps/v1", "StatefulSet", ns, name, status)
                    .await;
            }
            Self::Real(_) => {
                let pod = format!("{name}-0");
                // After an update the controller replaces the Pod: wait for one of the new
                // revision, ready by the kubelet's account.
                let revision = sts["status"]["updateRevision"].clone();
                eventually(|| async {
                    let found = self.get("v1", "Pod", ns, &pod).await?;
                    let labels = &found["metadata"]["labels"];
                    let current = labels["controller-revision-hash"] == revision;
                    let ready = found["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    (current && ready && found["metadata"]["deletionTimestamp"].is_null())
                        .then_some(())
                })
                .await;
            }
        }
    }

    /// The claim the StatefulSet controller makes from the template `data` (the fake has no
    /// controller, so the test makes it there).
    pub(crate) async fn claim(&self, ns: &str, sts: &str) -> String {
        let name = format!("data-{sts}-0");
        if let Self::Fake(_) = self {
            let live = self.get("apps/v1", "StatefulSet", ns, sts).await.unwrap();
            let labels = live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"].clone();
            self.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}))
                .await;
        }
        eventually(|| async { self.get("v1", "PersistentVolumeClaim", ns, &name).await }).await;
        name
    }

    /// Namespace `name`, if it exists.
    pub(crate) async fn namespace(&self, name: &str) -> Option<Value> {
        let api = self.api("v1", "Namespace", None).await;
        let found = api.get_opt(name).await.unwrap();
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    /// Server-side applies `object` as the test's own field manager.
    pub(crate) async fn apply(&self, object: &Value) {
        let ns = object["metadata"]["namespace"].as_str();
        let api = self
            .api(
                object["apiVersion"].as_str().unwrap(),
                object["kind"].as_str().unwrap(),
                ns,
            )
            .await;
        let name = object["metadata"]["name"].as_str().unwrap();
        api.patch(
            name,
            &PatchParams::apply("brokkr-e2e").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap();
    }
}

/// The fake API server, serving KubeDB's Postgres kind and holding the namespace `team-a`, and
/// a kubeconfig file for it.
pub(crate) async fn fake() -> (Cluster, tempfile::TempDir, String) {
    let fake = FakeCluster::start().await;
    fake.add_kind("kubedb.com", "v1", "Postgres", "postgreses", true);
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, fake.kubeconfig()).unwrap();
    (Cluster::Fake(fake), dir, path.display().to_string())
}

/// Gives the broker's ServiceAccount exactly the permissions deploy/rbac grants it
/// (serviceaccount.yaml and the `roles` files) and returns a kubeconfig that acts as it, next
/// to the admin's `kubeconfig`: the flows then prove those roles are enough.
pub(crate) async fn broker_kubeconfig(
    cluster: &Cluster,
    kubeconfig: &str,
    roles: &[&str],
) -> String {
    let rbac = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/rbac");
    for file in std::iter::once(&"serviceaccount.yaml").chain(roles) {
        let text = std::fs::read_to_string(format!("{rbac}/{file}")).unwrap();
        let objects: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for object in objects.iter().filter(|o| o.is_object()) {
            cluster.apply(object).await;
        }
    }
    // A token the controller-manager's token controller fills in (on every version).
    cluster
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "brokkr-e2e-token", "namespace": "brokkr",
                "annotations": {"kubernetes.io/service-account.name": "brokkr"}}}))
        .await;
    let token = eventually(|| async {
        let secret = cluster
            .get("v1", "Secret", "brokkr", "brokkr-e2e-token")
            .await?;
        secret["data"]["token"]
            .is_string()
            .then(|| entries(&secret)["token"].clone())
    })
    .await;
    let admin = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = serde_json::to_value(admin).unwrap();
    config["users"] = json!([{"name": "brokkr", "user": {"token": token}}]);
    for context in config["contexts"].as_array_mut().unwrap() {
        context["context"]["user"] = json!("brokkr");
    }
    let path = std::env::temp_dir().join(format!("brokkr-e2e-{}.kubeconfig", uuid::Uuid::new_v4()));
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    path.display().to_string()
}

/// A real cluster from BROKKR_E2E_KUBECONFIG, and a fresh namespace in it.
pub(crate) async fn real() -> (Cluster, String, String) {
    let path = std::env::var("BROKKR_E2E_KUBECONFIG")
        .expect("BROKKR_E2E_KUBECONFIG: a kubeconfig for the end-to-end cluster");
    let file = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    let cluster = Cluster::Real(kube::Client::try_from(config).unwrap());
    let ns = format!(
        "brokkr-e2e-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        .await;
    // The namespace's default ServiceAccount is needed before Pods can be created.
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": ns}});
    if cluster
        .get("v1", "ServiceAccount", &ns, "default")
        .await
        .is_none()
    {
        let Cluster::Real(client) = &cluster else {
            unreachable!()
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ServiceAccount")),
        );
        let sa: DynamicObject = serde_json::from_value(sa).unwrap();
        let _ = api.create(&PostParams::default(), &sa).await;
    }
    (cluster, path, ns)
}

/// One real-cluster test at a time in this binary: the request count reads the API server's
/// own counters, which any other test's requests would move.
pub(crate) static CLUSTER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
