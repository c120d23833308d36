//! What the flows share: the manifests catalog and its plan ids, a broker on a catalog that
//! reaches the cluster through a kubeconfig, the names the catalogs give objects, and polling.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::harness::{Backend, Reply, TestBroker, start_with};

pub(crate) const MANIFESTS: &str = include_str!("../../../../catalogs/manifests/manifests.yaml");
pub(crate) const PG: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b01";
pub(crate) const PG_SMALL: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b11";
pub(crate) const PG_MEDIUM: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b12";

/// Polls `probe` until it returns something (60 s at most).
pub(crate) async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    probe: impl Fn() -> F,
) -> T {
    for _ in 0..600 {
        if let Some(found) = probe().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gave up waiting");
}

/// The name the catalogs give an instance's objects.
pub(crate) fn object_name(prefix: &str, instance_id: &str) -> String {
    let hash: String = Sha256::digest(instance_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}-{}", &hash[..12])
}

/// The name the catalogs give a binding's Secret.
pub(crate) fn binding_secret(name: &str, binding_id: &str) -> String {
    let hash: String = Sha256::digest(binding_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{name}-b-{}", &hash[..10])
}

/// A broker on SQLite serving `catalog`, whose kubernetes target reaches the cluster through
/// `kubeconfig`.
pub(crate) async fn broker(catalog: &str, kubeconfig: &str) -> TestBroker {
    let yaml = catalog.replace(
        "    kind: kubernetes\n",
        &format!("    kind: kubernetes\n    kubeconfig: {kubeconfig}\n"),
    );
    start_with(Backend::Sqlite, &yaml).await
}

impl TestBroker {
    /// Polls a last_operation until it is terminal (`timeout` at most), or until its
    /// description contains `until`.
    pub(crate) async fn poll(&self, path: &str, until: Option<&str>) -> Reply {
        let mut last = Value::Null;
        for _ in 0..1200 {
            let r = self.get(path).await;
            last = r.body.clone();
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
            if r.body["state"] != "in progress" {
                return r;
            }
            if until.is_some_and(|u| r.description().contains(u)) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{path} never got there: {last}");
    }
}

/// Asserts that an operation succeeded.
pub(crate) fn ok(r: &Reply) {
    assert_eq!(r.body["state"], "succeeded", "{:?}", r.body);
}

/// Decodes every entry of a Secret's `data`.
pub(crate) fn entries(secret: &Value) -> serde_json::Map<String, Value> {
    use base64::Engine as _;
    let data = secret["data"].as_object().unwrap();
    data.iter()
        .map(|(k, v)| {
            let b = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap();
            (k.clone(), Value::String(String::from_utf8(b).unwrap()))
        })
        .collect()
}
