//! What the node tests share (a cluster whose node runs Pods: `scripts/e2e-cluster up`, images
//! from `scripts/images`): brokkr installed from deploy/ as docs/install.md says, with the
//! `brokkr:dev` image; Pods, their logs, and what the kubelet reports of them. No test writes a
//! Pod's status: every Ready here is the kubelet's, by the Pod's own probes.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::cluster::{cel_rules_served, kubectl, try_kubectl, without_cel_rules};

/// The checkout's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Polls `check` every half second until it returns something, for up to `limit`; the panic
/// names `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The YAML documents of `text` that are objects.
pub fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| d.is_object())
        .collect()
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize takes no
/// absolute paths to other kustomizations.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to) = (normal(from), normal(to));
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &to[common..] {
        path.push(c.as_os_str());
    }
    path
}

/// The components of `path` with `.` and `..` resolved.
fn normal(path: &Path) -> Vec<Component<'_>> {
    let mut out = vec![];
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The kinds of deploy/ a server older than them does not serve: ValidatingAdmissionPolicies
/// (Kubernetes 1.30) and policy/v1 PodDisruptionBudgets (1.21).
pub fn unserved_kinds() -> Vec<&'static str> {
    let served = kubectl(&["api-resources", "-o", "name"], "");
    let mut unserved: Vec<&str> = [
        (
            "validatingadmissionpolicies.admissionregistration.k8s.io",
            "ValidatingAdmissionPolicy",
        ),
        (
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding",
        ),
    ]
    .into_iter()
    .filter(|(resource, _)| !served.lines().any(|l| l == *resource))
    .map(|(_, kind)| kind)
    .collect();
    if !kubectl(&["api-versions"], "")
        .lines()
        .any(|l| l == "policy/v1")
    {
        unserved.push("PodDisruptionBudget");
    }
    unserved
}

/// kubectl's `--validate` for brokkr's CRDs, as docs/install.md says: off on an API server that
/// does not keep CEL rules (before Kubernetes 1.25), since it drops the CRDs' rules and
/// kubectl's own check refuses them.
fn validation(cel_rules_served: bool) -> &'static str {
    if cel_rules_served {
        "--validate=true"
    } else {
        "--validate=false"
    }
}

/// `kubectl apply -k deploy/crds` with `flags` (`--dry-run=server`, say), as docs/install.md
/// says.
pub fn apply_crds(flags: &[&str]) {
    let crds = root().join("deploy/crds").display().to_string();
    let mut args = vec!["apply", validation(cel_rules_served())];
    args.extend(flags);
    args.extend(["-k", &crds]);
    kubectl(&args, "");
}

/// Waits until brokkr's CRDs are Established.
pub fn crds_established() {
    kubectl(
        &[
            "wait",
            "--for",
            "condition=Established",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=brokkr",
            "--timeout=60s",
        ],
        "",
    );
}

/// brokkr installed from a kustomization of deploy/ as docs/install.md says: the CRDs first,
/// the namespace and its Secrets, then an overlay of the user's own that names the image
/// `brokkr:dev` (and, when given, replaces the broker's configuration), plus the roles of
/// deploy/rbac the configuration needs. Dropping it deletes what it applied but the CRDs, and
/// waits for the namespace `brokkr` to go, so that the next test's controllers are alone.
pub struct Install {
    overlay: PathBuf,
    objects: Vec<Value>,
    extra: Vec<String>,
}

impl Install {
    /// Applies `deploy/<dir>` with the `brokkr:dev` image, the broker's configuration replaced
    /// by `config` (a whole brokkr.yaml) when given, the files of deploy/rbac named in `rbac`,
    /// and `secrets` (YAML of the Secrets the kustomization reads) created first.
    pub fn apply(dir: &str, config: Option<&str>, rbac: &[&str], secrets: &str) -> Self {
        // The CRDs, established before anything uses their kinds.
        apply_crds(&[]);
        crds_established();
        let cel = cel_rules_served();
        kubectl(
            &[
                "apply",
                "-f",
                &root()
                    .join("deploy/base/namespace.yaml")
                    .display()
                    .to_string(),
            ],
            "",
        );
        kubectl(&["apply", "-f", "-"], secrets);

        // The user's overlay, in a directory of its own under target/.
        let overlay = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "overlay-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&overlay).unwrap();
        let base = relative(&overlay, &root().join("deploy").join(dir));
        let mut kustomization = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [base],
            "images": [{"name": "brokkr", "newName": "brokkr", "newTag": "dev"}],
        });
        if let Some(config) = config {
            let patch = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "brokkr-config", "namespace": "brokkr"},
                "data": {"brokkr.yaml": config}});
            kustomization["patches"] = json!([{"patch": patch.to_string()}]);
        }
        std::fs::write(
            overlay.join("kustomization.yaml"),
            kustomization.to_string(),
        )
        .unwrap();
        let path = overlay.display().to_string();
        let mut objects = documents(&kubectl(&["kustomize", &path], ""));
        let unserved = unserved_kinds();
        objects.retain(|o| !unserved.iter().any(|kind| o["kind"] == *kind));
        if !cel {
            objects
                .iter_mut()
                .filter(|o| o["kind"] == "CustomResourceDefinition")
                .for_each(without_cel_rules);
        }
        if unserved.is_empty() && cel {
            kubectl(&["apply", "-k", &path], "");
        } else {
            // What `kubectl apply -k` would apply, less what this server does not serve.
            let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
            kubectl(&["apply", validation(cel), "-f", "-"], &list.to_string());
        }
        let extra: Vec<String> = rbac
            .iter()
            .map(|f| root().join("deploy/rbac").join(f).display().to_string())
            .collect();
        for file in &extra {
            kubectl(&["apply", "-f", file], "");
        }
        Self {
            overlay,
            objects,
            extra,
        }
    }

    /// Waits for a workload of namespace `brokkr` (`deploy/brokkr-controller`,
    /// `statefulset/brokkr`) to roll out: its Pods Ready by their own probes.
    pub fn rolled_out(&self, workload: &str) -> Duration {
        let started = Instant::now();
        kubectl(
            &[
                "-n",
                "brokkr",
                "rollout",
                "status",
                workload,
                "--timeout=300s",
            ],
            "",
        );
        started.elapsed()
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for component in ["broker", "controller"] {
                let logs = try_kubectl(
                    &[
                        "-n",
                        "brokkr",
                        "logs",
                        "-l",
                        &format!("app.kubernetes.io/component={component}"),
                        "--tail=60",
                        "--prefix",
                    ],
                    None,
                );
                eprintln!("--- {component} logs ---\n{}", logs.unwrap_or_else(|e| e));
            }
        }
        for file in &self.extra {
            let _ = try_kubectl(&["delete", "--ignore-not-found", "-f", file], None);
        }
        let rest: Vec<&Value> = self
            .objects
            .iter()
            .filter(|o| o["kind"] != "CustomResourceDefinition")
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": rest});
        let _ = try_kubectl(
            &[
                "delete",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
                "-f",
                "-",
            ],
            Some(&list.to_string()),
        );
        let _ = std::fs::remove_dir_all(&self.overlay);
    }
}

/// The Pods of namespace `ns` labelled `selector`.
pub fn pods(ns: &str, selector: &str) -> Vec<Value> {
    let out = kubectl(&["-n", ns, "get", "pods", "-l", selector, "-o", "json"], "");
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// A Secret's entries, decoded.
pub fn secret_entries(secret: &Value) -> std::collections::BTreeMap<String, String> {
    use base64::Engine as _;
    let data = secret["data"].as_object().cloned().unwrap_or_default();
    data.into_iter()
        .map(|(key, value)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(value.as_str().unwrap_or_default())
                .unwrap();
            (key, String::from_utf8(bytes).unwrap())
        })
        .collect()
}

/// The time of condition `type_` of `object` when its status is `True`.
pub fn true_since(object: &Value, type_: &str) -> Option<SystemTime> {
    let condition = object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")?;
    humantime::parse_rfc3339(condition["lastTransitionTime"].as_str()?).ok()
}

/// When `object` was created.
pub fn created(object: &Value) -> SystemTime {
    humantime::parse_rfc3339(object["metadata"]["creationTimestamp"].as_str().unwrap()).unwrap()
}

/// How long after `from` `to` came (whole seconds, as the API server keeps times).
pub fn after(from: SystemTime, to: SystemTime) -> Duration {
    to.duration_since(from).unwrap_or_default()
}

/// Waits until the log of a Pod of `ns` labelled `selector` holds `needle`, and returns it.
pub fn log_holds(ns: &str, selector: &str, needle: &str, limit: Duration) -> String {
    let mut last = String::new();
    let found = wait_for_quiet(limit, || {
        last = try_kubectl(
            &[
                "-n",
                ns,
                "logs",
                "-l",
                selector,
                "--tail=200",
                "--all-containers",
            ],
            None,
        )
        .unwrap_or_else(|e| e);
        last.contains(needle).then(|| last.clone())
    });
    found.unwrap_or_else(|| {
        let described = try_kubectl(&["-n", ns, "describe", "pods", "-l", selector], None)
            .unwrap_or_else(|e| e);
        panic!(
            "no {needle:?} in the log of {selector} after {limit:?}; the log:\n{last}\n{described}"
        )
    })
}

/// As [`wait_for`], but `None` on a time-out.
pub fn wait_for_quiet<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
