//! brokkr on a real node (`#[ignore]`d; BROKKR_E2E_KUBECONFIG names a cluster whose node runs
//! Pods, e.g. `scripts/e2e-cluster up`'s, with the images of `scripts/images` imported): brokkr
//! installed from deploy/ with its own image, the databases catalogs/manifests makes running as
//! Pods, and applications in Pods using them through what brokkr gives them. Nothing here
//! writes a Pod's status: every Ready is the kubelet's, by the Pod's own probes.
//!
//! Run them one at a time, and not beside the other real-cluster suites: each installs brokkr's
//! controllers in the cluster, which act on every namespace.
//!
//! ```sh
//! BROKKR_E2E_KUBECONFIG=$(scripts/e2e-cluster kubeconfig) \
//!   cargo test -p brokkr --test node_e2e -- --ignored --test-threads=1 --nocapture
//! ```

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::{Namespace, Tenant, condition, get, kubectl, try_kubectl};
use support::node::{
    Install, after, created, log_holds, pods, root, secret_entries as entries, true_since, wait_for,
};

const SBD: &str = "servicebindings.services.brokkr.dev";
const SI: &str = "serviceinstances.services.brokkr.dev";
const USAGE: &str = "servicebindingusages.services.brokkr.dev";
const SBIO: &str = "servicebindings.servicebinding.io";
const CLIENT: &str = "brokkr-e2e/client:1";
/// How soon a namespace holding a database and its binding is gone once deleted.
const NAMESPACE_GONE: Duration = Duration::from_secs(150);
/// The seeds' flow's rotation grace period: how long both credentials work.
const GRACE_SECONDS: u64 = 20;

/// The broker's credentials in the install's Secret.
const BROKER_AUTH: &str = "apiVersion: v1
kind: Secret
metadata: {name: brokkr-broker-auth, namespace: brokkr}
stringData: {username: platform, password: node-e2e-s3cret}
";

/// brokkr as `deploy/<dir>` installs it (see [`Install::apply`]), its broker and controller
/// rolled out (Ready by their own probes) and its ClusterServiceBroker Ready: the broker's
/// catalog listed through the broker's Service.
async fn serving(dir: &str, config: Option<&str>, rbac: &[&str], secrets: &str) -> Install {
    let install = Install::apply(dir, config, rbac, secrets);
    let broker = if dir == "base" {
        "deploy/brokkr"
    } else {
        "statefulset/brokkr"
    };
    let took = install.rolled_out(broker);
    let then = install.rolled_out("deploy/brokkr-controller");
    eprintln!("rolled out: {broker} after {took:?}, the controller {then:?} after that");
    condition(
        "brokkr",
        "clusterservicebroker",
        "brokkr",
        "Ready",
        "FetchedCatalog",
    )
    .await;
    install
}

/// brokkr as `deploy/overlays/single` installs it, serving catalogs/manifests with the roles of
/// deploy/rbac/manifests.yaml.
async fn single_with_manifests() -> Install {
    let catalog =
        std::fs::read_to_string(root().join("catalogs/manifests/manifests.yaml")).unwrap();
    serving(
        "overlays/single",
        Some(&catalog),
        &["manifests.yaml"],
        BROKER_AUTH,
    )
    .await
}

/// A fresh namespace and its editor, as whom the tests act.
async fn tenant() -> (Namespace, Tenant) {
    let namespace = Namespace::new();
    let tenant = Tenant::edit(namespace.as_str()).await;
    (namespace, tenant)
}

/// Waits for condition `Ready` of `kind/name` in `ns` to be `True`; on a time-out, says what
/// the conditions were.
fn ready(ns: &str, kind: &str, name: &str, limit: Duration) -> Value {
    let mut last = Value::Null;
    let found = support::node::wait_for_quiet(limit, || {
        let object = get(ns, kind, name)?;
        last = object["status"].clone();
        true_since(&object, "Ready").map(|_| object)
    });
    found.unwrap_or_else(|| panic!("{kind} {name} not Ready after {limit:?}; its status: {last}"))
}

/// A ServiceInstance `orders` of catalogs/manifests' PostgreSQL plan `small` in `ns`.
fn orders(ns: &str) -> String {
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: postgresql
  clusterServicePlanExternalName: small
"
    )
}

/// A ServiceBinding `orders-app` of the instance `orders` in `ns`, with `more` (a line) in its
/// spec.
fn orders_app(ns: &str, more: &str) -> String {
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: orders-app, namespace: {ns}}}
spec:
  instanceRef: {{name: orders}}
  {more}
"
    )
}

/// A Deployment `name` of one container of the client image running `script`.
fn app(ns: &str, name: &str, script: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: {CLIENT}
        command: [sh, -c, {script}]
"
    )
}

/// The seeds' flow with real Pods: a tenant's ServiceInstance of the manifests catalog's
/// PostgreSQL plan becomes a StatefulSet whose Pod turns Ready by its own probe, and only then
/// is the instance Ready; a ServiceBinding gives its Secret; a ServiceBindingUsage injects it
/// into a Deployment whose Pod connects and writes a row; a servicebinding.io ServiceBinding
/// projects the same Secret into a second Deployment whose Pod reads `/bindings/…` and reads
/// the row back. A rotation reaches both Deployments' next Pods, which use the rows the old
/// user wrote, and the old credentials are refused once the grace period is over. Deleting
/// everything leaves no Pod, Service, Secret or claim of the instance.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn the_seeds_flow_runs_on_real_pods() {
    let install = single_with_manifests().await;
    // The broker's metrics, through its Service (the API server's proxy to it).
    let metrics = kubectl(
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/brokkr/services/brokkr:http/proxy/metrics",
        ],
        "",
    );
    assert!(metrics.contains("brokkr_http_requests"), "{metrics}");

    let (namespace, tenant) = tenant().await;
    let ns = namespace.as_str();
    let asked = Instant::now();
    tenant.apply(&orders(ns));
    let instance = ready(ns, SI, "orders", Duration::from_secs(240));
    let took = asked.elapsed();
    let database = pods(ns, "app.kubernetes.io/name=postgresql");
    assert_eq!(database.len(), 1, "one database Pod");
    let pod = &database[0];
    let pod_ready = true_since(pod, "Ready").expect("the database Pod is Ready");
    let instance_ready = true_since(&instance, "Ready").unwrap();
    assert!(
        pod_ready <= instance_ready,
        "the instance was Ready before its database's Pod"
    );
    eprintln!(
        "PostgreSQL instance Ready {took:?} after it was asked for ({:?} by its conditions); \
         its Pod Ready {:?} after the Pod was created",
        after(created(&instance), instance_ready),
        after(created(pod), pod_ready),
    );

    tenant.apply(&orders_app(
        ns,
        &format!("rotationGracePeriodSeconds: {GRACE_SECONDS}"),
    ));
    let binding = ready(ns, SBD, "orders-app", Duration::from_secs(60));
    // The binding's Secret: spec.secretName, or the binding's own name.
    let secret = binding["spec"]["secretName"]
        .as_str()
        .unwrap_or("orders-app")
        .to_owned();
    let written = get(ns, "secret", &secret).expect("the binding's Secret");
    assert_eq!(written["type"], "servicebinding.io/postgresql");
    let first = entries(&written);
    assert!(
        first["username"].starts_with("b_"),
        "a user of the binding's own"
    );

    // The seeds' ServiceBindingUsage: the Secret's entries as DB_-prefixed variables.
    tenant.apply(&app(
        ns,
        "writer",
        "until psql \"$DB_uri\" -v ON_ERROR_STOP=1 -c \"CREATE TABLE IF NOT EXISTS seen (who text); \
         INSERT INTO seen VALUES (current_user)\"; do sleep 1; done; echo row written as $DB_username; sleep 100000",
    ));
    tenant.apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBindingUsage
metadata: {{name: writer-orders, namespace: {ns}}}
spec:
  serviceBindingRef: {{name: orders-app}}
  usedBy: {{kind: deployment, name: writer}}
  parameters: {{envPrefix: {{name: DB_}}}}
"
    ));
    let written_as = |user: &str| format!("row written as {user}");
    log_holds(
        ns,
        "app=writer",
        &written_as(&first["username"]),
        Duration::from_secs(120),
    );

    // The servicebinding.io runtime: the same Secret as files under $SERVICE_BINDING_ROOT.
    tenant.apply(&app(
        ns,
        "reader",
        "until [ -f \"$SERVICE_BINDING_ROOT/orders/uri\" ] && psql \"$(cat \"$SERVICE_BINDING_ROOT/orders/uri\")\" -tAc \
         'SELECT count(*) FROM seen' | grep -qv '^0$'; do sleep 1; done; echo read rows as $(cat \"$SERVICE_BINDING_ROOT/orders/username\"); sleep 100000",
    ));
    tenant.apply(&format!(
        "apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: orders, namespace: {ns}}}
spec:
  service: {{apiVersion: services.brokkr.dev/v1alpha1, kind: ServiceBinding, name: orders-app}}
  workload: {{apiVersion: apps/v1, kind: Deployment, name: reader}}
"
    ));
    let read_as = |user: &str| format!("read rows as {user}");
    log_holds(
        ns,
        "app=reader",
        &read_as(&first["username"]),
        Duration::from_secs(120),
    );

    // A rotation: new credentials in a new Secret, and both Deployments roll to Pods that use
    // them, on the rows the old user wrote.
    let asked = Instant::now();
    tenant
        .try_kubectl(
            &[
                "annotate",
                SBD,
                "orders-app",
                "services.brokkr.dev/rotate=node-e2e",
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let rotated = wait_for(
        "the binding to move to a new Secret",
        Duration::from_secs(60),
        || {
            let binding = get(ns, SBD, "orders-app")?;
            let name = binding["status"]["binding"]["name"].as_str()?.to_owned();
            (name != secret).then_some(name)
        },
    );
    let second = entries(&get(ns, "secret", &rotated).expect("the successor's Secret"));
    assert_ne!(second["username"], first["username"]);
    log_holds(
        ns,
        "app=writer",
        &written_as(&second["username"]),
        Duration::from_secs(120),
    );
    log_holds(
        ns,
        "app=reader",
        &read_as(&second["username"]),
        Duration::from_secs(120),
    );
    eprintln!(
        "rotation: both applications' next Pods use the new credentials {:?} after it was asked for",
        asked.elapsed()
    );
    // Once the grace period is over, the predecessor is unbound: its Secret is gone and its
    // credentials are refused by the database, while the successor's work.
    wait_for(
        "the predecessor to be unbound",
        Duration::from_secs(GRACE_SECONDS + 60),
        || {
            let binding = get(ns, SBD, "orders-app")?;
            let done = binding["status"]["previousBinding"].is_null()
                && get(ns, "secret", &secret).is_none();
            done.then_some(())
        },
    );
    assert!(
        asked.elapsed() >= Duration::from_secs(GRACE_SECONDS),
        "the predecessor was unbound before its grace period was over"
    );
    let reader = pods(ns, "app=reader");
    let reader = reader
        .iter()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .expect("a running reader");
    let reader = reader["metadata"]["name"].as_str().unwrap();
    let psql = |uri: &str| {
        tenant.try_kubectl(
            &[
                "exec",
                reader,
                "--",
                "psql",
                uri,
                "-tAc",
                "SELECT count(*) FROM seen",
            ],
            None,
        )
    };
    let refused = psql(&first["uri"]).expect_err("the old credentials still log in");
    assert!(
        refused.contains("password authentication failed"),
        "refused for another reason: {refused}"
    );
    let rows = psql(&second["uri"]).expect("the new credentials log in");
    assert!(rows.trim().parse::<u32>().unwrap() >= 2, "{rows}");

    // Everything deleted, in any order: nothing of the instance is left.
    for what in [
        format!("{SBIO}/orders"),
        format!("{USAGE}/writer-orders"),
        "deployment/writer".to_owned(),
        "deployment/reader".to_owned(),
        format!("{SBD}/orders-app"),
        format!("{SI}/orders"),
    ] {
        tenant
            .try_kubectl(&["delete", &what, "--wait=false"], None)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_for("the instance to be gone", Duration::from_secs(180), || {
        get(ns, SI, "orders").is_none().then_some(())
    });
    for selector in [
        "app.kubernetes.io/name=postgresql",
        "app.kubernetes.io/managed-by=brokkr",
    ] {
        wait_for(
            "the instance's objects to be gone",
            Duration::from_secs(120),
            || {
                let out = kubectl(
                    &[
                        "-n",
                        ns,
                        "get",
                        "pods,services,secrets,persistentvolumeclaims",
                        "-l",
                        selector,
                        "-o",
                        "name",
                    ],
                    "",
                );
                out.trim().is_empty().then_some(())
            },
        );
    }
    assert!(
        get(ns, "secret", &secret).is_none(),
        "the binding's Secret is gone"
    );
    drop(install);
}

/// The Service brokkr makes a binding's user through is the tenant's to edit: a namespace
/// editor who points their instance's Service at another tenant's database gets no user there.
/// brokkr logs in with their own instance's admin password, which the other server refuses; the
/// bind fails, saying so without the password, and the other database has no user of theirs.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn a_service_pointed_at_another_tenants_database_gives_no_user_there() {
    let install = single_with_manifests().await;
    let (mallory_ns, mallory) = tenant().await;
    let (victim_ns, victim) = tenant().await;
    let (mallory_ns, victim_ns) = (mallory_ns.as_str(), victim_ns.as_str());
    mallory.apply(&orders(mallory_ns));
    victim.apply(&orders(victim_ns));
    ready(mallory_ns, SI, "orders", Duration::from_secs(240));
    ready(victim_ns, SI, "orders", Duration::from_secs(240));
    let database = |ns: &str| {
        let found = pods(ns, "app.kubernetes.io/name=postgresql");
        let pod = found.first().expect("a database Pod").clone();
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let ip = pod["status"]["podIP"].as_str().unwrap().to_owned();
        (name, ip)
    };
    let (victim_pod, victim_ip) = database(victim_ns);
    let roles = || {
        kubectl(
            &[
                "-n",
                victim_ns,
                "exec",
                &victim_pod,
                "--",
                "psql",
                "-U",
                "postgres",
                "-tAc",
                "SELECT rolname FROM pg_roles WHERE rolname LIKE 'b\\_%' ORDER BY 1",
            ],
            "",
        )
    };
    let before = roles();

    // Mallory's Service, its selector gone, sends to the victim's database Pod.
    let service = kubectl(
        &[
            "-n",
            mallory_ns,
            "get",
            "services",
            "-l",
            "app.kubernetes.io/name=postgresql",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
        "",
    );
    mallory
        .try_kubectl(
            &[
                "patch",
                "service",
                &service,
                "--type=json",
                "-p",
                r#"[{"op": "remove", "path": "/spec/selector"}]"#,
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    mallory
        .try_kubectl(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: v1
kind: Endpoints
metadata: {{name: {service}, namespace: {mallory_ns}}}
subsets:
- addresses: [{{ip: {victim_ip}}}]
  ports: [{{name: postgresql, port: 5432, protocol: TCP}}]
"
            )),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // Once kube-proxy follows, the Service's address answers with the victim's server, which
    // refuses Mallory's admin login.
    let (mallory_pod, _) = database(mallory_ns);
    let auth = entries(&get(mallory_ns, "secret", &format!("{service}-auth")).unwrap());
    let uri = format!(
        "postgresql://postgres:{}@{service}.{mallory_ns}.svc:5432/postgres",
        auth["password"]
    );
    wait_for(
        "the Service to lead to the victim's server",
        Duration::from_secs(60),
        || {
            let out = try_kubectl(
                &[
                    "-n",
                    mallory_ns,
                    "exec",
                    &mallory_pod,
                    "--",
                    "psql",
                    &uri,
                    "-tAc",
                    "SELECT 1",
                ],
                None,
            );
            out.err()
                .filter(|e| e.contains("password authentication failed"))
        },
    );

    mallory.apply(&orders_app(mallory_ns, ""));
    let refused = wait_for("the bind to fail", Duration::from_secs(120), || {
        let binding = get(mallory_ns, SBD, "orders-app")?;
        said(&binding, "authentication failed")
    });
    eprintln!("the bind through a Service pointed elsewhere: {refused}");
    assert!(
        !refused.contains(&auth["password"]),
        "the message holds the admin password"
    );
    assert!(
        get(mallory_ns, "secret", "orders-app").is_none(),
        "a Secret was written"
    );
    assert_eq!(roles(), before, "a user was made in the victim's database");

    for (tenant, ns) in [(&mallory, mallory_ns), (&victim, victim_ns)] {
        tenant
            .try_kubectl(&["delete", SBD, "--all", "--wait=false"], None)
            .unwrap_or_else(|e| panic!("{e}"));
        tenant
            .try_kubectl(&["delete", SI, "--all", "--wait=false"], None)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_for("the instance to be gone", Duration::from_secs(180), || {
            get(ns, SI, "orders").is_none().then_some(())
        });
    }
    drop(install);
}

/// Deleting a tenant's namespace deletes its PostgreSQL instance's server together with its
/// binding: the binding's unbind cannot reach the server to drop its user, which went with the
/// server, and the namespace is gone soon all the same.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn a_namespace_deleted_with_its_database_and_binding_goes() {
    let install = single_with_manifests().await;
    let (namespace, tenant) = tenant().await;
    let ns = namespace.as_str();
    tenant.apply(&format!("{}---\n{}", orders(ns), orders_app(ns, "")));
    ready(ns, SBD, "orders-app", Duration::from_secs(240));
    let asked = Instant::now();
    kubectl(&["delete", "namespace", ns, "--wait=false"], "");
    wait_for("the namespace to be gone", NAMESPACE_GONE, || {
        get("default", "namespace", ns).is_none().then_some(())
    });
    eprintln!(
        "a namespace with a PostgreSQL instance and a binding gone {:?} after its deletion",
        asked.elapsed()
    );
    drop(install);
}

/// Redis, MySQL (MariaDB standing in for it) and Memcached from catalogs/manifests the same
/// way: each instance's Pod Ready by its own probe, and a client Pod that connects through its
/// binding's Secret (for MySQL, as the binding's own user).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn redis_mysql_and_memcached_serve_their_clients_on_real_pods() {
    let install = single_with_manifests().await;
    let (namespace, tenant) = tenant().await;
    let ns = namespace.as_str();
    let clients = [
        (
            "redis",
            "until redis-cli -u \"$DB_uri\" --no-auth-warning SET seen client | grep -q OK; do sleep 1; done; \
             echo redis answered $(redis-cli -u \"$DB_uri\" --no-auth-warning GET seen); sleep 100000",
            "redis answered client",
        ),
        (
            "mysql",
            "until mariadb -h \"$DB_host\" -P \"$DB_port\" -u \"$DB_username\" -p\"$DB_password\" \"$DB_database\" \
             -e 'CREATE TABLE IF NOT EXISTS seen (who text); INSERT INTO seen VALUES (\"client\")'; do sleep 1; done; \
             echo mysql answered $(mariadb -h \"$DB_host\" -P \"$DB_port\" -u \"$DB_username\" -p\"$DB_password\" \
             \"$DB_database\" -N -e 'SELECT who FROM seen'); sleep 100000",
            "mysql answered client",
        ),
        (
            "memcached",
            "until memcstat --servers=\"$DB_host:$DB_port\" --binary --username=\"$DB_username\" \
             --password=\"$DB_password\" | grep -q pid; do sleep 1; done; echo memcached answered; sleep 100000",
            "memcached answered",
        ),
    ];
    for (service, _, _) in &clients {
        tenant.apply(&format!(
            "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: {service}, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: {service}
  clusterServicePlanExternalName: small
---
apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: {service}-app, namespace: {ns}}}
spec:
  instanceRef: {{name: {service}}}
"
        ));
    }
    for (service, script, said) in &clients {
        let instance = ready(ns, SI, service, Duration::from_secs(240));
        eprintln!(
            "{service} instance Ready {:?} after its creation",
            after(created(&instance), true_since(&instance, "Ready").unwrap())
        );
        let name = format!("{service}-app");
        let binding = ready(ns, SBD, &name, Duration::from_secs(60));
        // The binding's Secret: spec.secretName, or the binding's own name.
        let secret = binding["spec"]["secretName"]
            .as_str()
            .unwrap_or(&name)
            .to_owned();
        if *service == "mysql" {
            let written = entries(&get(ns, "secret", &secret).expect("the binding's Secret"));
            assert!(written["username"].starts_with("b_"), "a user of its own");
        }
        let script = serde_json::to_string(script).unwrap();
        tenant.apply(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {service}-client, namespace: {ns}, labels: {{app: {service}-client}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: {CLIENT}
    command: [sh, -c, {script}]
    envFrom: [{{prefix: DB_, secretRef: {{name: {secret}}}}}]
"
        ));
        log_holds(
            ns,
            &format!("app={service}-client"),
            said,
            Duration::from_secs(120),
        );
    }
    let _ = try_kubectl(&["-n", ns, "delete", "pods", "--all", "--wait=false"], None);
    for (service, _, _) in &clients {
        tenant
            .try_kubectl(
                &[
                    "delete",
                    &format!("{SBD}/{service}-app"),
                    &format!("{SI}/{service}"),
                    "--wait=false",
                ],
                None,
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for (service, _, _) in &clients {
        wait_for("the instances to be gone", Duration::from_secs(180), || {
            get(ns, SI, service).is_none().then_some(())
        });
    }
    drop(install);
}

/// A catalog of databases that never come up, each for a reason of its own, with a deadline
/// of 60 s: an image the node does not have (pull policy `Never`), one no registry gives
/// (`IfNotPresent`), a server that exits at start (PostgreSQL without its password), and one
/// whose probe never passes.
const NEVER_UP: &str = r#"
targets:
  cluster: {kind: kubernetes, namespace: from-context, pvc_policy: delete}
catalog:
  services:
    - name: never-up
      id: 0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e00
      description: Database servers that never come up
      bindable: false
      plans:
        - {name: absent-image, id: 0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e01, description: An image the node does not have}
        - {name: unpullable, id: 0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e02, description: An image no registry gives}
        - {name: crashing, id: 0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e03, description: A server that exits at start}
        - {name: never-ready, id: 0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e04, description: A server whose probe never passes}
templates:
  server:
    apiVersion: apps/v1
    kind: StatefulSet
    metadata: {name: "{{ registry('name') }}", labels: {app.kubernetes.io/name: never-up}}
    spec:
      replicas: 1
      serviceName: "{{ registry('name') }}"
      selector: {matchLabels: {app.kubernetes.io/name: never-up, app.kubernetes.io/instance: "{{ registry('name') }}"}}
      template:
        metadata: {labels: {app.kubernetes.io/name: never-up, app.kubernetes.io/instance: "{{ registry('name') }}"}}
        spec:
          terminationGracePeriodSeconds: 1
          containers:
            - name: postgresql
              image: "{{ registry('image') }}"
              imagePullPolicy: "{{ registry('pull') }}"
              env: [{name: POSTGRES_PASSWORD, value: "{{ registry('password') }}"}]
              readinessProbe: {exec: {command: [pg_isready, -h, 127.0.0.1, -p, "{{ registry('port') }}"]}, periodSeconds: 2}
blueprints:
  - service: never-up
    plan: absent-image
    deadline: 60s
    instance:
      registry: &registry
        - {name: name, value: "down-{{ sha256(instance_id)[:10] }}"}
        - {name: image, value: "{{ 'postgres:0-absent' if plan_id in ['0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e01', '0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e02'] else 'postgres:17' }}"}
        - {name: pull, value: "{{ 'Never' if plan_id == '0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e01' else 'IfNotPresent' }}"}
        - {name: password, value: "{{ '' if plan_id == '0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e03' else 's3cret' }}"}
        - {name: port, value: "{{ '5433' if plan_id == '0d6f3c1e-5a2b-4c8d-9e7f-1a2b3c4d5e04' else '5432' }}"}
      steps: &steps
        - {name: server, target: cluster, templates: [server]}
  - {service: never-up, plan: unpullable, deadline: 60s, instance: {registry: *registry, steps: *steps}}
  - {service: never-up, plan: crashing, deadline: 60s, instance: {registry: *registry, steps: *steps}}
  - {service: never-up, plan: never-ready, deadline: 60s, instance: {registry: *registry, steps: *steps}}
"#;

/// The message of the first condition of `object` whose message holds `needle`.
fn said(object: &Value, needle: &str) -> Option<String> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .filter_map(|c| c["message"].as_str())
        .find(|m| m.contains(needle))
        .map(str::to_owned)
}

/// A database whose Pod never turns Ready fails its instance within the plan's deadline, and
/// the ServiceInstance's condition says the Pod's reason in the node's words; the instance is
/// then deleted cleanly.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn a_database_that_never_comes_up_fails_its_instance_with_the_pods_reason() {
    let install = serving(
        "overlays/single",
        Some(NEVER_UP),
        &["manifests.yaml"],
        BROKER_AUTH,
    )
    .await;
    let (namespace, tenant) = tenant().await;
    let ns = namespace.as_str();
    let cases = [
        ("absent-image", "ErrImageNeverPull"),
        ("unpullable", "ImagePull"),
        ("crashing", "exited with code 1"),
        ("never-ready", "readiness probe has not passed"),
    ];
    for (plan, _) in cases {
        tenant.apply(&format!(
            "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: {plan}, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: never-up
  clusterServicePlanExternalName: {plan}
"
        ));
    }
    let asked = Instant::now();
    for (plan, reason) in cases {
        let message = wait_for(
            &format!("instance {plan} to fail saying {reason}"),
            Duration::from_secs(150),
            || said(&get(ns, SI, plan)?, "timed out"),
        );
        eprintln!("{plan}: failed after {:?}: {message}", asked.elapsed());
        assert!(message.contains(reason), "{plan}: {message}");
        assert!(
            message.contains("Pod down-"),
            "{plan} names its Pod: {message}"
        );
        let instance = get(ns, SI, plan).unwrap();
        assert!(
            true_since(&instance, "Ready").is_none(),
            "{plan} is not Ready"
        );
    }
    for (plan, _) in cases {
        tenant
            .try_kubectl(&["delete", &format!("{SI}/{plan}"), "--wait=false"], None)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for (plan, _) in cases {
        wait_for(
            "the failed instances to be gone",
            Duration::from_secs(120),
            || get(ns, SI, plan).is_none().then_some(()),
        );
    }
    wait_for(
        "their Pods and StatefulSets to be gone",
        Duration::from_secs(120),
        || {
            let out = kubectl(
                &[
                    "-n",
                    ns,
                    "get",
                    "pods,statefulsets",
                    "-l",
                    "app.kubernetes.io/name=never-up",
                    "-o",
                    "name",
                ],
                "",
            );
            out.trim().is_empty().then_some(())
        },
    );
    drop(install);
}

/// The PostgreSQL store of the HA install: a Deployment of the postgres image in namespace
/// `brokkr-e2e-store`, and the Secret `brokkr-store` naming it.
fn store() -> String {
    kubectl(
        &["apply", "-f", "-"],
        "apiVersion: v1
kind: Namespace
metadata: {name: brokkr-e2e-store}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: store, namespace: brokkr-e2e-store}
spec:
  replicas: 1
  selector: {matchLabels: {app: store}}
  template:
    metadata: {labels: {app: store}}
    spec:
      containers:
      - name: postgresql
        image: postgres:17
        env:
        - {name: POSTGRES_USER, value: brokkr}
        - {name: POSTGRES_DB, value: brokkr}
        - {name: POSTGRES_PASSWORD, value: store-s3cret}
        readinessProbe: {exec: {command: [pg_isready, -U, brokkr, -d, brokkr]}, periodSeconds: 2}
        volumeMounts: [{name: data, mountPath: /var/lib/postgresql/data}]
      volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: store, namespace: brokkr-e2e-store}
spec:
  selector: {app: store}
  ports: [{port: 5432, protocol: TCP}]
",
    );
    kubectl(
        &[
            "-n",
            "brokkr-e2e-store",
            "rollout",
            "status",
            "deploy/store",
            "--timeout=120s",
        ],
        "",
    );
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>());
    format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: brokkr-store, namespace: brokkr}}
stringData:
  url: postgres://brokkr:store-s3cret@store.brokkr-e2e-store.svc.cluster.local:5432/brokkr?sslmode=disable
  encryption-keys: {key}
---
{BROKER_AUTH}"
    )
}

/// SQL run in the store's Pod, its answer's rows.
fn store_query(sql: &str) -> String {
    kubectl(
        &[
            "-n",
            "brokkr-e2e-store",
            "exec",
            "deploy/store",
            "--",
            "psql",
            "-U",
            "brokkr",
            "-d",
            "brokkr",
            "-tAc",
            sql,
        ],
        "",
    )
}

/// The HA install (deploy/base: two brokers on the PostgreSQL store, two controllers) in the
/// middle of 100 provisions: the leading controller's Pod and a broker Pod holding a provision
/// are deleted; the other replicas take over, every instance ends Ready, and the store shows
/// each provisioned exactly once. The time the other controller took to lead is printed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a cluster with a node: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn the_ha_install_takes_over_from_a_deleted_leader_and_broker() {
    let secrets = store();
    let install = serving("base", None, &[], &secrets).await;
    let (namespace, tenant) = tenant().await;
    let ns = namespace.as_str();
    let instances: Vec<String> = (0..100)
        .map(|i| {
            format!(
                "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: db-{i:03}, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: user-provided
  clusterServicePlanExternalName: async
  parameters:
    credentials: {{type: postgresql, host: pg.internal, port: 5432, database: db{i}, username: u, password: p}}
"
            )
        })
        .collect();
    let started = Instant::now();
    tenant.apply(&instances.join("---\n"));

    // A provision in progress, and the broker replica that holds it.
    let owner = wait_for("a provision in progress", Duration::from_secs(60), || {
        let owner = store_query(
            "SELECT lease_owner FROM brokkr_resources WHERE op_state = 'in progress' \
             AND lease_owner IS NOT NULL LIMIT 1",
        );
        (!owner.trim().is_empty()).then(|| owner.trim().to_owned())
    });
    let brokers = pods("brokkr", "app.kubernetes.io/component=broker");
    let broker = brokers
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .find(|name| {
            try_kubectl(&["-n", "brokkr", "logs", name], None).is_ok_and(|log| log.contains(&owner))
        })
        .unwrap_or_else(|| panic!("no broker Pod logged the owner {owner}"));
    let lease = || {
        get("brokkr", "lease", "brokkr-controller")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    let leader = lease().expect("a controller leads");
    eprintln!(
        "after {:?}: deleting the leading controller {leader} and the broker {broker} (owner of a \
         provision in progress)",
        started.elapsed()
    );
    let deleted = Instant::now();
    kubectl(
        &[
            "-n",
            "brokkr",
            "delete",
            "pod",
            &leader,
            &broker,
            "--wait=false",
        ],
        "",
    );
    let new_leader = wait_for(
        "another controller to lead",
        Duration::from_secs(60),
        || lease().filter(|holder| *holder != leader),
    );
    let handover = deleted.elapsed();
    eprintln!("{new_leader} leads {handover:?} after the leader's Pod was deleted");

    for i in 0..100 {
        ready(ns, SI, &format!("db-{i:03}"), Duration::from_secs(300));
    }
    eprintln!(
        "100 instances Ready {:?} after they were created",
        started.elapsed()
    );
    // Each instance provisioned exactly once: one provision, never replaced, succeeded.
    let rows = store_query(
        "SELECT count(*), count(*) FILTER (WHERE op_kind = 'provision' AND op_state = 'succeeded' \
         AND prev_op_id IS NULL) FROM brokkr_resources WHERE binding_id = ''",
    );
    assert_eq!(rows.trim(), "100|100", "provisions at the store");
    let taken_over = store_query(&format!(
        "SELECT count(*) FROM brokkr_resources WHERE op_state = 'in progress' OR lease_owner = '{owner}' AND op_state <> 'succeeded'"
    ));
    assert_eq!(
        taken_over.trim(),
        "0",
        "nothing left with the deleted broker"
    );
    let _ = tenant.try_kubectl(
        &["delete", SI, "--all", "--wait=true", "--timeout=180s"],
        None,
    );
    drop(install);
    let _ = try_kubectl(
        &["delete", "namespace", "brokkr-e2e-store", "--wait=false"],
        None,
    );
}
