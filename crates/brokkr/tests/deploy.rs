//! The install manifests of deploy/ and the Dockerfile, checked without a cluster or a container
//! builder: the checked-in CRDs are what `brokkr crds` prints, the ConfigMap is the quickstart,
//! every overlay renders (with the kubectl on the PATH) to the objects docs/install.md describes,
//! the controller's RBAC holds what it needs, and the Dockerfile builds what CI builds.
//! `BROKKR_BLESS=1` rewrites deploy/crds/crds.yaml from `brokkr crds`.
//!
//! The same manifests are applied to a real API server by `tests/deploy_e2e.rs` (`#[ignore]`d).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_brokkr");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every document of a YAML stream, as JSON values.
fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("a YAML stream")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// `kubectl kustomize deploy/<dir>` (scripts/test installs kubectl where it is missing).
fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("deploy").join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!("kubectl kustomize deploy/{dir}: {e} (scripts/test installs kubectl)")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&String::from_utf8(out.stdout).unwrap())
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    kinds
}

#[test]
fn checked_in_crds_are_what_brokkr_crds_prints() {
    let out = Command::new(BIN).arg("crds").output().unwrap();
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = root().join("deploy/crds/crds.yaml");
    if std::env::var_os("BROKKR_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap();
    assert!(
        checked_in == generated,
        "deploy/crds/crds.yaml differs from `brokkr crds`; regenerate it with \
         `brokkr crds > deploy/crds/crds.yaml` (or BROKKR_BLESS=1 cargo test -p brokkr --test deploy)"
    );
}

#[test]
fn config_map_holds_the_quickstart_configuration() {
    let docs = documents(&read("deploy/base/config.yaml"));
    let config = docs[0]["data"]["brokkr.yaml"].as_str().unwrap();
    assert_eq!(config, brokkr_blueprint::QUICKSTART);
}

/// What every brokkr container must have: probes on /healthz and /readyz, requests and limits,
/// a non-root user and a read-only root filesystem.
fn check_pod(what: &str, pod: &Value) {
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
    for c in pod["containers"].as_array().unwrap() {
        assert_eq!(c["image"].as_str().unwrap(), "brokkr:0.1.0", "{what}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{what}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{what}");
        for k in ["cpu", "memory"] {
            assert!(
                c["resources"]["requests"][k].is_string(),
                "{what}: requests.{k}"
            );
        }
        assert!(c["resources"]["limits"]["memory"].is_string(), "{what}");
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{what}"
        );
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"], false,
            "{what}"
        );
    }
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name}"))
}

#[test]
fn base_is_the_highly_available_install() {
    let objects = kustomize("base");
    let broker = find(&objects, "Deployment", "brokkr");
    assert_eq!(broker["metadata"]["namespace"], "brokkr");
    assert_eq!(broker["spec"]["replicas"], 2);
    let pod = &broker["spec"]["template"]["spec"];
    check_pod("broker", pod);
    let c = &pod["containers"][0];
    assert_eq!(
        c["args"],
        serde_json::json!(["serve", "--config", "/etc/brokkr"])
    );
    for (var, secret, key) in [
        ("BROKKR_STORE", "brokkr-store", "url"),
        ("BROKKR_ENCRYPTION_KEY", "brokkr-store", "encryption-keys"),
        ("BROKKR_BROKER_USERNAME", "brokkr-broker-auth", "username"),
        ("BROKKR_BROKER_PASSWORD", "brokkr-broker-auth", "password"),
    ] {
        let from = &env(c, var)["valueFrom"]["secretKeyRef"];
        assert_eq!(
            (&from["name"], &from["key"]),
            (&secret.into(), &key.into()),
            "{var}"
        );
    }
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "brokkr-config");
    find(&objects, "ConfigMap", "brokkr-config");

    let controller = find(&objects, "Deployment", "brokkr-controller");
    assert_eq!(controller["spec"]["replicas"], 2);
    let pod = &controller["spec"]["template"]["spec"];
    check_pod("controller", pod);
    assert_eq!(pod["serviceAccountName"], "brokkr-controller");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "controller");
    assert!(
        !c["args"]
            .as_array()
            .unwrap()
            .contains(&"--no-leader-election".into())
    );
    assert_eq!(
        env(c, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    // The pod's own IP is refused to namespaced brokers.
    assert_eq!(
        env(c, "POD_IPS")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );

    for name in ["brokkr", "brokkr-controller"] {
        let pdb = find(&objects, "PodDisruptionBudget", name);
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
    }
    find(&objects, "Service", "brokkr");
    find(&objects, "Service", "brokkr-controller-metrics");
    find(&objects, "NetworkPolicy", "brokkr-broker");
    find(&objects, "NetworkPolicy", "brokkr-controller");
    let csb = find(&objects, "ClusterServiceBroker", "brokkr");
    assert!(csb["metadata"]["namespace"].is_null(), "cluster-scoped");
    assert_eq!(csb["spec"]["url"], "http://brokkr.brokkr.svc:8080");
    assert_eq!(
        csb["spec"]["authInfo"]["basic"]["secretRef"],
        serde_json::json!({"namespace": "brokkr", "name": "brokkr-broker-auth"})
    );
    let crds = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, brokkr_controller_crd_count());
    // Only API versions that current Kubernetes serves.
    for o in &objects {
        let v = o["apiVersion"].as_str().unwrap();
        assert!(!v.contains("beta"), "{v} in {}", o["kind"]);
    }
}

fn brokkr_controller_crd_count() -> usize {
    let out = Command::new(BIN).arg("crds").output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .matches("kind: CustomResourceDefinition")
        .count()
}

#[test]
fn single_overlay_runs_one_broker_on_sqlite() {
    let objects = kustomize("overlays/single");
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "brokkr"),
        "{:?}",
        kinds(&objects)
    );
    assert!(!objects.iter().any(|o| o["kind"] == "PodDisruptionBudget"));
    let sts = find(&objects, "StatefulSet", "brokkr");
    assert_eq!(sts["spec"]["replicas"], 1);
    let pod = &sts["spec"]["template"]["spec"];
    check_pod("single broker", pod);
    let c = &pod["containers"][0];
    assert_eq!(
        env(c, "BROKKR_STORE")["value"],
        "sqlite:///var/lib/brokkr/brokkr.db"
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "data" && m["mountPath"] == "/var/lib/brokkr")
    );
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    assert_eq!(
        find(&objects, "Deployment", "brokkr-controller")["spec"]["replicas"],
        1
    );
}

#[test]
fn monitoring_overlay_adds_a_service_monitor() {
    let objects = kustomize("overlays/monitoring");
    let sm = find(&objects, "ServiceMonitor", "brokkr");
    let ports: Vec<&str> = sm["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["port"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["http", "metrics"]);
    let services = objects.iter().filter(|o| o["kind"] == "Service");
    for s in services {
        let port = s["spec"]["ports"][0]["name"].as_str().unwrap();
        assert!(ports.contains(&port), "{port}");
    }
}

#[test]
fn monitoring_overlay_ships_the_alerts_and_the_dashboard_from_their_files() {
    let objects = kustomize("overlays/monitoring");
    let rule = find(&objects, "PrometheusRule", "brokkr");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], "brokkr");
    let file = documents(&read("deploy/overlays/monitoring/prometheus-rule.yaml"));
    assert_eq!(rule["spec"], file[0]["spec"]);
    // The dashboard: the JSON file itself, in a ConfigMap Grafana's sidecar picks up.
    let dashboard = find(&objects, "ConfigMap", "brokkr-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["brokkr-dashboard.json"],
        read("deploy/overlays/monitoring/brokkr-dashboard.json")
    );
}

/// The rules of a ClusterRole or Role, as (group, resource, verb) triples.
fn grants(role: &Value) -> Vec<(String, String, String)> {
    let mut out = vec![];
    for rule in role["rules"].as_array().unwrap() {
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    out.push((
                        g.as_str().unwrap().to_owned(),
                        r.as_str().unwrap().to_owned(),
                        v.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

fn has(grants: &[(String, String, String)], group: &str, resource: &str, verbs: &[&str]) {
    for verb in verbs {
        assert!(
            grants
                .iter()
                .any(|(g, r, v)| g == group && r == resource && v == verb),
            "missing {verb} on {group}/{resource}"
        );
    }
}

#[test]
fn controller_rbac_grants_what_the_controllers_use_and_no_wildcards() {
    let docs = documents(&read("deploy/base/controller-rbac.yaml"));
    let role = find(&docs, "ClusterRole", "brokkr-controller");
    let g = grants(role);
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    for crd in documents(&read("deploy/crds/crds.yaml")) {
        let group = crd["spec"]["group"].as_str().unwrap();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
        for sub in ["", "/status", "/finalizers"] {
            has(&g, group, &format!("{plural}{sub}"), &all);
        }
    }
    has(&g, "", "secrets", &all);
    has(&g, "", "events", &["create", "patch"]);
    has(&g, "", "namespaces", &["get"]);
    let ns_rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"][0] == "namespaces")
        .unwrap();
    assert_eq!(ns_rule["resourceNames"], serde_json::json!(["kube-system"]));
    // Namespaces are watched (their metadata): nothing is written into one being deleted.
    let watch_rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"][0] == "namespaces" && r.get("resourceNames").is_none())
        .unwrap();
    assert_eq!(watch_rule["verbs"], serde_json::json!(["list", "watch"]));
    let lease = find(&docs, "Role", "brokkr-controller-leader-election");
    has(
        &grants(lease),
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    );
    // The addresses the API server advertises, refused to namespaced brokers: the EndpointSlices
    // of `default` listed (by label), and on Kubernetes 1.20 the one Endpoints object; nothing
    // else, and no watch.
    let api_server = find(&docs, "Role", "brokkr-controller-api-server");
    assert_eq!(api_server["metadata"]["namespace"], "default");
    assert_eq!(
        api_server["rules"],
        serde_json::json!([
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["endpoints"],
             "resourceNames": ["kubernetes"], "verbs": ["get"]}])
    );
    let binding = find(&docs, "RoleBinding", "brokkr-controller-api-server");
    assert_eq!(binding["subjects"][0]["name"], "brokkr-controller");

    let aggregate = find(&docs, "ClusterRole", "brokkr-controller-servicebinding");
    assert_eq!(
        aggregate["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"],
        serde_json::json!({"servicebinding.io/controller": "true"})
    );
    let workloads = find(&docs, "ClusterRole", "brokkr-controller-workloads");
    assert_eq!(
        workloads["metadata"]["labels"]["servicebinding.io/controller"],
        "true"
    );
    let w = grants(workloads);
    for (group, resources) in [
        ("apps", &["deployments", "statefulsets", "daemonsets"][..]),
        ("batch", &["jobs", "cronjobs"][..]),
    ] {
        for r in resources {
            has(&w, group, r, &["get", "list", "watch", "update", "patch"]);
        }
    }
    for doc in &docs {
        if doc.get("rules").is_some() {
            for (g, r, v) in grants(doc) {
                assert!(
                    g != "*" && r != "*" && v != "*",
                    "wildcard in {}",
                    doc["metadata"]["name"]
                );
            }
        }
    }
    for name in ["brokkr-controller", "brokkr-controller-servicebinding"] {
        let binding = find(&docs, "ClusterRoleBinding", name);
        assert_eq!(
            binding["subjects"][0],
            serde_json::json!({"kind": "ServiceAccount", "name": "brokkr-controller", "namespace": "brokkr"})
        );
    }
}

#[test]
fn namespace_overlay_runs_a_teams_controller_with_a_role_alone() {
    let objects = kustomize("overlays/namespace");
    for o in &objects {
        assert_eq!(o["metadata"]["namespace"], "team-a", "{}", o["kind"]);
        assert!(
            !o["kind"].as_str().unwrap().starts_with("Cluster"),
            "nothing cluster-wide: {}",
            o["kind"]
        );
    }
    let deployment = find(&objects, "Deployment", "brokkr-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    check_pod("namespace controller", pod);
    let c = &pod["containers"][0];
    assert_eq!(env(c, "BROKKR_NAMESPACES")["value"], "team-a");
    assert_eq!(c["resources"]["limits"]["memory"], "128Mi");
    let g = grants(find(&objects, "Role", "brokkr-controller"));
    for resource in ["serviceinstances", "servicebindings", "servicebrokers"] {
        for sub in ["", "/status", "/finalizers"] {
            has(
                &g,
                "services.brokkr.dev",
                &format!("{resource}{sub}"),
                &["get", "list", "watch", "patch"],
            );
        }
    }
    has(
        &g,
        "",
        "secrets",
        &["get", "list", "watch", "create", "delete"],
    );
    has(
        &g,
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    );
    has(
        &g,
        "apps",
        "deployments",
        &["get", "list", "watch", "patch"],
    );
    let binding = find(&objects, "RoleBinding", "brokkr-controller");
    assert_eq!(binding["subjects"][0]["name"], "brokkr-controller");
}

/// The Dockerfile's instructions, with continuation lines joined.
fn dockerfile() -> Vec<String> {
    let text = read("Dockerfile");
    let mut lines = vec![];
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(line);
            lines.push(std::mem::take(&mut current));
        }
    }
    lines
}

fn workspace_rust_version() -> String {
    let manifest = read("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.starts_with("rust-version"))
        .unwrap();
    line.split('"').nth(1).unwrap().to_owned()
}

fn version_at_least(have: &str, need: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap()).collect() };
    parse(have) >= parse(need)
}

#[test]
fn dockerfile_builds_the_brokkr_binary_as_ci_does_and_runs_it_unprivileged() {
    let lines = dockerfile();
    // The toolchain: at least the workspace's rust-version.
    let rust = lines
        .iter()
        .find_map(|l| l.strip_prefix("ARG RUST_VERSION="))
        .expect("ARG RUST_VERSION");
    assert!(
        version_at_least(rust, &workspace_rust_version()),
        "RUST_VERSION {rust} is older than the workspace's rust-version"
    );
    // The build: the brokkr package, from the lock file as CI's build (scripts/test) uses it.
    let run = lines
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build");
    let cargo: String = run[run.find("cargo build").unwrap()..]
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(cargo, "cargo build --release --locked -p brokkr");
    assert!(read("scripts/test").contains("cargo test --workspace --locked"));
    assert!(run.contains("target/release/brokkr"), "{run}");
    assert!(root().join("crates/brokkr/src/main.rs").exists());
    // The lock file satisfies the manifests, so `--locked` builds.
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--format-version",
            "1",
            "--no-deps",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The commit and date reach `brokkr version` through build.rs.
    for arg in ["BROKKR_COMMIT", "BROKKR_BUILD_DATE"] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("ARG {arg}"))),
            "{arg}"
        );
        assert!(read("crates/brokkr/build.rs").contains(arg));
    }
    // The runtime: distroless, the binary copied from the build stage, a numeric non-root user.
    let froms: Vec<&String> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage");
    assert!(froms[1].contains("distroless"), "{}", froms[1]);
    assert!(run.contains("/out/usr/local/bin/brokkr"));
    assert!(lines.iter().any(|l| l == "COPY --from=build /out/ /"));
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric uid");
    assert_ne!(uid, 0);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ENTRYPOINT [\"/usr/local/bin/brokkr\"]"))
    );
    // The manifests run as the same user.
    assert!(read("deploy/base/broker.yaml").contains(&format!("runAsUser: {uid}")));
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l == "target/"));
}

#[test]
fn version_prints_version_commit_and_build_date_as_dash_dash_version_does() {
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("brokkr {}", env!("CARGO_PKG_VERSION")));
    let commit = lines[1].strip_prefix("commit: ").unwrap();
    let built = lines[2].strip_prefix("built: ").unwrap();
    assert!(!commit.is_empty());
    assert!(built.len() >= 10 && built.as_bytes()[4] == b'-', "{built}");
    let long = Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8(long.stdout).unwrap().trim(),
        format!(
            "brokkr {} (commit {commit}, built {built})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn the_tenant_quota_example_counts_brokkrs_kinds_within_the_controllers_bounds() {
    use brokkr_controller::broker_policy::NamespaceBounds;

    let docs = documents(&read("deploy/examples/tenant-quota.yaml"));
    assert_eq!(docs.len(), 1);
    let quota = &docs[0];
    assert_eq!(quota["kind"], "ResourceQuota");
    // Every `count/<plural>.<group>` names a kind of brokkr's CRDs (a misspelt one would count
    // nothing), and every namespaced kind a tenant creates or the controller writes is counted.
    let served: Vec<String> = documents(&read("deploy/crds/crds.yaml"))
        .iter()
        .filter(|crd| crd["spec"]["scope"] == "Namespaced")
        .map(|crd| {
            format!(
                "count/{}.{}",
                crd["spec"]["names"]["plural"].as_str().unwrap(),
                crd["spec"]["group"].as_str().unwrap()
            )
        })
        .collect();
    let hard = quota["spec"]["hard"].as_object().unwrap();
    let counted: Vec<&String> = hard.keys().filter(|k| k.starts_with("count/")).collect();
    for key in &counted {
        assert!(
            served.contains(key),
            "{key} is none of brokkr's namespaced kinds"
        );
    }
    for kind in &served {
        assert!(hard.contains_key(kind), "{kind} is not counted");
    }
    let count = |key: &str| -> usize { hard[key].as_str().unwrap().parse().unwrap() };
    let defaults = NamespaceBounds::default();
    // Brokers: no more than the controller serves. Classes and plans: no fewer than it writes,
    // or the quota would refuse a catalog in part where the controller refuses it whole.
    assert_eq!(
        count("count/servicebrokers.services.brokkr.dev"),
        defaults.max_brokers
    );
    assert!(count("count/serviceclasses.services.brokkr.dev") >= defaults.max_classes);
    assert!(count("count/serviceplans.services.brokkr.dev") >= defaults.max_plans);
    assert!(read("docs/install.md").contains("deploy/examples/tenant-quota.yaml"));
    // deploy/base's controller says its bounds, and they are the defaults the quota follows.
    let controller = documents(&read("deploy/base/controller.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let c = &controller["spec"]["template"]["spec"]["containers"][0];
    for (var, default) in [
        ("BROKKR_MAX_BROKERS_PER_NAMESPACE", defaults.max_brokers),
        (
            "BROKKR_MAX_CATALOG_CLASSES_PER_NAMESPACE",
            defaults.max_classes,
        ),
        ("BROKKR_MAX_CATALOG_PLANS_PER_NAMESPACE", defaults.max_plans),
    ] {
        assert_eq!(env(c, var)["value"], default.to_string(), "{var}");
    }
}

/// A variable of scripts/images: `NAME=value` or `NAME=(words...)`, as words.
fn images_script_var(script: &str, name: &str) -> Vec<String> {
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("scripts/images sets {name}"));
    line.trim_start_matches('(')
        .trim_end_matches(')')
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A JSON-array instruction of the Dockerfile's final stage (`ENTRYPOINT`, `CMD`) as words.
fn exec_form(lines: &[&String], instruction: &str) -> Vec<String> {
    let text = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .unwrap_or_else(|| panic!("{instruction} in the final stage"));
    serde_json::from_str(text).unwrap()
}

#[test]
fn the_image_scripts_images_builds_holds_what_the_dockerfiles_final_stage_holds() {
    let lines = dockerfile();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    let stage: Vec<&String> = lines[last_from..].iter().collect();
    let script = read("scripts/images");
    let var = |name: &str| images_script_var(&script, name);
    let single = |name: &str| var(name).join(" ");

    // The same release build of the same package.
    assert!(script.contains("cargo build --release --locked -p brokkr"));
    // User, working directory, entrypoint, arguments and ports.
    let user = stage.iter().find_map(|l| l.strip_prefix("USER ")).unwrap();
    assert_eq!(single("BROKKR_USER"), *user);
    let workdir = stage
        .iter()
        .find_map(|l| l.strip_prefix("WORKDIR "))
        .unwrap();
    assert_eq!(single("BROKKR_WORKDIR"), *workdir);
    assert_eq!(
        vec![single("BROKKR_BINARY")],
        exec_form(&stage, "ENTRYPOINT")
    );
    assert_eq!(var("BROKKR_CMD"), exec_form(&stage, "CMD"));
    let exposed: Vec<String> = stage
        .iter()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(var("BROKKR_PORTS"), exposed);
    // The binary where the build stage installs it, and the store's directory made as there:
    // the user's, mode 0750.
    let run = lines.iter().find(|l| l.contains("cargo build")).unwrap();
    assert!(
        run.contains(&format!("/out{}", single("BROKKR_BINARY"))),
        "{run}"
    );
    let (uid, gid) = user.split_once(':').unwrap();
    assert!(
        run.contains(&format!(
            "install -d -o {uid} -g {gid} -m 0750 /out{workdir}"
        )),
        "{run}"
    );
    assert!(script.contains(
        "install -d -o \"${BROKKR_USER%%:*}\" -g \"${BROKKR_USER##*:}\" -m 0750 \"$r$BROKKR_WORKDIR\""
    ));
    // CA certificates, as distroless/cc has them.
    assert!(script.contains("/etc/ssl/certs/ca-certificates.crt"));
}
