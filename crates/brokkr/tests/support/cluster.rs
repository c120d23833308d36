//! The real-cluster tests' side of a Kubernetes API server (`BROKKR_E2E_KUBECONFIG`): kubectl
//! as a person would run it, brokkr's CRDs, and one `brokkr controller` at a time.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use super::{BIN, Process, controller, eventually};

/// The kubeconfig of the end-to-end cluster.
pub fn kubeconfig() -> PathBuf {
    std::env::var("BROKKR_E2E_KUBECONFIG")
        .expect("BROKKR_E2E_KUBECONFIG: a kubeconfig for the end-to-end cluster")
        .into()
}

/// Runs kubectl against the end-to-end cluster, feeding `stdin`; returns stdout, or what it
/// printed as the error.
pub fn try_kubectl(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl on the PATH");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(format!(
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs kubectl against the end-to-end cluster with `stdin`; panics unless it succeeds.
pub fn kubectl(args: &[&str], stdin: &str) -> String {
    try_kubectl(args, Some(stdin)).unwrap_or_else(|e| panic!("{e}"))
}

/// Server-side applies `yaml`, as `kubectl apply --server-side` does.
pub fn apply(yaml: &str) {
    kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=e2e-user",
            "-f",
            "-",
        ],
        yaml,
    );
}

/// The object `kind/name` of `namespace` as JSON, if it exists. Name brokkr's ServiceBinding
/// `servicebindings.services.brokkr.dev`: a bare `servicebinding` may be servicebinding.io's.
pub fn get(namespace: &str, kind: &str, name: &str) -> Option<Value> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["-n", namespace, "get", kind, name, "-o", "json"])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The condition `type_` of `kind/name` once it has `reason`; on a time-out the message says
/// what the object's conditions were.
pub async fn condition(
    namespace: &str,
    kind: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> Value {
    let found = async || {
        let object = get(namespace, kind, name)?;
        object["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_ && c["reason"] == reason)
            .cloned()
    };
    let waited = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        eventually("a condition", found),
    )
    .await;
    waited.unwrap_or_else(|_| {
        let conditions = get(namespace, kind, name).map(|o| o["status"]["conditions"].clone());
        panic!("timed out waiting for {kind} {name}: {type_} with reason {reason}; its conditions: {conditions:?}")
    })
}

/// A namespace's editor, as a tenant is: kubectl impersonating the user `user` (group
/// `system:authenticated`), bound to Kubernetes' built-in `edit` role in `namespace`, to which
/// deploy/base/tenant-rbac.yaml adds brokkr's kinds.
pub struct Tenant {
    pub user: String,
    pub namespace: String,
}

impl Tenant {
    /// The editor of `namespace`, once the API server has aggregated brokkr's kinds into `edit`.
    pub async fn edit(namespace: &str) -> Self {
        Self::editor(namespace, &Self::of(namespace).user).await
    }

    /// Another editor of `namespace`, named `user`.
    pub async fn editor(namespace: &str, user: &str) -> Self {
        let roles = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/base/tenant-rbac.yaml"),
        )
        .unwrap();
        install_crds();
        kubectl(&["apply", "-f", "-"], &roles);
        let tenant = Self {
            user: user.to_owned(),
            namespace: namespace.to_owned(),
        };
        kubectl(
            &[
                "-n",
                namespace,
                "create",
                "rolebinding",
                &format!("editor-{user}"),
                "--clusterrole=edit",
                &format!("--user={}", tenant.user),
            ],
            "",
        );
        eventually("brokkr's kinds in the edit role", async || {
            tenant
                .try_kubectl(
                    &[
                        "auth",
                        "can-i",
                        "create",
                        "serviceinstances.services.brokkr.dev",
                    ],
                    None,
                )
                .ok()
                .filter(|out| out.trim() == "yes")
        })
        .await;
        tenant
    }

    /// The editor of `namespace`, as [`Tenant::edit`] made it.
    pub fn of(namespace: &str) -> Self {
        Self {
            user: format!("editor-of-{namespace}"),
            namespace: namespace.to_owned(),
        }
    }

    /// kubectl as the tenant, in its namespace.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let user = format!("--as={}", self.user);
        let mut all = vec![
            user.as_str(),
            "--as-group=system:authenticated",
            "-n",
            &self.namespace,
        ];
        all.extend(args);
        try_kubectl(&all, stdin)
    }

    /// Server-side applies `yaml` as the tenant.
    pub fn try_apply(&self, yaml: &str) -> Result<String, String> {
        self.try_kubectl(
            &[
                "apply",
                "--server-side",
                "--field-manager=tenant",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    }

    /// Server-side applies `yaml` as the tenant; panics unless it succeeds.
    pub fn apply(&self, yaml: &str) {
        self.try_apply(yaml).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A namespace of its own, deleted (without waiting) when dropped.
pub struct Namespace(String);

impl Namespace {
    pub fn new() -> Self {
        let name = format!(
            "brokkr-e2e-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        kubectl(&["create", "namespace", &name], "");
        Self(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(["delete", "namespace", &self.0, "--wait=false"])
            .output();
    }
}

/// Whether the API server keeps CEL validation rules in CRDs (Kubernetes 1.25 and later).
pub fn cel_rules_served() -> bool {
    let version: Value = serde_json::from_str(&kubectl(&["version", "-o", "json"], "")).unwrap();
    let minor = version["serverVersion"]["minor"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('+');
    minor.parse::<u32>().is_ok_and(|m| m >= 25)
}

/// `value` without any `x-kubernetes-validations`, as an API server before 1.25 keeps it.
pub fn without_cel_rules(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("x-kubernetes-validations");
            map.values_mut().for_each(without_cel_rules);
        }
        Value::Array(items) => items.iter_mut().for_each(without_cel_rules),
        _ => {}
    }
}

/// Applies brokkr's CRDs (`brokkr crds`) and waits until they are Established; an API server
/// older than 1.25 gets them without their CEL rules, which it does not know (docs/install.md).
pub fn install_crds() {
    let crds = Command::new(BIN)
        .args(["crds", "-o", "json"])
        .output()
        .unwrap();
    assert!(crds.status.success());
    let mut crds: Value = serde_json::from_slice(&crds.stdout).unwrap();
    if !cel_rules_served() {
        without_cel_rules(&mut crds);
    }
    kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &crds.to_string(),
    );
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        "",
    );
}

/// The one `brokkr controller` of a test, with brokkr's CRDs installed before it starts. Tests
/// take turns: a controller reconciles every namespace, so two at once would act on each
/// other's objects. Its log is printed if the test fails.
pub struct Controller {
    process: Process,
    log: tempfile::NamedTempFile,
    _turn: MutexGuard<'static, ()>,
}

static TURN: Mutex<()> = Mutex::new(());

impl Controller {
    /// The controller's process id.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// What the controller logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    pub fn start() -> Self {
        let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        install_crds();
        let log = tempfile::NamedTempFile::new().unwrap();
        let process = controller(&kubeconfig(), log.reopen().unwrap());
        Self {
            process,
            log,
            _turn: turn,
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            eprintln!("--- brokkr controller's log ---\n{log}--- end of log ---");
        }
    }
}

/// The test's controller, a fresh namespace and a broker of its own for brokkr on loopback,
/// deleted when dropped: a ClusterServiceBroker, or a ServiceBroker in the namespace.
pub struct Scope {
    pub namespace: Namespace,
    pub broker: String,
    pub cluster: bool,
    _controller: Controller,
}

impl Scope {
    /// With a ServiceBroker of the namespace.
    pub async fn new(broker_url: &str) -> Self {
        Self::with(broker_url, false).await
    }

    /// The spec fields that name `class` and `plan` in this scope's catalog.
    pub fn plan(&self, class: &str, plan: &str) -> String {
        let prefix = if self.cluster {
            "clusterService"
        } else {
            "service"
        };
        format!("{prefix}ClassExternalName: {class}\n  {prefix}PlanExternalName: {plan}")
    }

    /// With a ClusterServiceBroker.
    pub async fn cluster(broker_url: &str) -> Self {
        Self::with(broker_url, true).await
    }

    async fn with(broker_url: &str, cluster: bool) -> Self {
        let controller = Controller::start();
        let namespace = Namespace::new();
        let scope = Self {
            broker: namespace.as_str().to_owned(),
            namespace,
            cluster,
            _controller: controller,
        };
        kubectl(
            &[
                "-n",
                scope.namespace.as_str(),
                "create",
                "secret",
                "generic",
                "broker-auth",
                "--from-literal=username=platform",
                "--from-literal=password=s3cret",
            ],
            "",
        );
        let ns = scope.namespace.as_str();
        if cluster {
            apply(&format!(
                "apiVersion: services.brokkr.dev/v1alpha1
kind: ClusterServiceBroker
metadata: {{name: {broker}}}
spec:
  url: {broker_url}
  authInfo: {{basic: {{secretRef: {{namespace: {ns}, name: broker-auth}}}}}}
",
                broker = scope.broker,
            ));
            condition(
                ns,
                "clusterservicebroker",
                &scope.broker,
                "Ready",
                "FetchedCatalog",
            )
            .await;
        } else {
            apply(&format!(
                "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBroker
metadata: {{name: {broker}, namespace: {ns}}}
spec:
  url: {broker_url}
  authInfo: {{basic: {{secretRef: {{name: broker-auth}}}}}}
",
                broker = scope.broker,
            ));
            condition(
                ns,
                "servicebroker",
                &scope.broker,
                "Ready",
                "FetchedCatalog",
            )
            .await;
        }
        scope
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if !self.cluster {
            return;
        }
        let _ = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args([
                "delete",
                "clusterservicebroker",
                &self.broker,
                "--wait=false",
            ])
            .output();
    }
}
