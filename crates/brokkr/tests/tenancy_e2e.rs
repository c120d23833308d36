//! One tenant against another, the broker and the cluster, on a real API server (`#[ignore]`d;
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test tenancy_e2e -- --ignored`). Every
//! tenant acts as a namespace editor does — kubectl impersonating a user bound to the built-in
//! `edit` role, which deploy/base/tenant-rbac.yaml extends — never as cluster admin. The
//! platform side (the ClusterServiceBroker on the shared-server catalog, the real PostgreSQL)
//! is set up as its admin would.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::*;
use support::*;

const SI: &str = "serviceinstances.services.brokkr.dev";
const SB: &str = "servicebindings.services.brokkr.dev";

fn instance(ns: &str, name: &str, extra: &str) -> String {
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: {name}, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: postgresql
  clusterServicePlanExternalName: small
{extra}"
    )
}

fn binding(ns: &str, name: &str, instance: &str, extra: &str) -> String {
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: {name}, namespace: {ns}}}
spec:
  instanceRef: {{name: {instance}}}
{extra}"
    )
}

/// The OSB id the controller recorded for an instance.
fn recorded_id(ns: &str, name: &str) -> String {
    get(ns, SI, name).unwrap()["status"]["externalID"]
        .as_str()
        .expect("status.externalID recorded")
        .to_owned()
}

/// `brokkr serve` on the shared-server catalog with its requests logged (each with its
/// originating user): its directory, its log, the process and its URL.
fn logged_broker() -> (tempfile::TempDir, tempfile::NamedTempFile, Process, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let (broker, url) = serve_shared_logged(
        dir.path(),
        &[("RUST_LOG", "info,brokkr_broker=debug".into())],
        log.reopen().unwrap(),
    );
    (dir, log, broker, url)
}

/// A tenant edits its instance's `spec.externalID` to the id of another tenant's instance, and
/// creates one with that id: the API server refuses the edit (CEL, 1.25+) or the controller
/// ignores it; either way the tenant never gets credentials to the other database, and deleting
/// its instance deprovisions only its own. Ids the OSB path cannot carry are refused.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_cannot_take_over_another_tenants_instance_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::cluster(&broker_url).await;
    let victim_ns = Namespace::new();
    let (victim_ns, attacker_ns) = (victim_ns.as_str(), scope.namespace.as_str());
    let victim = Tenant::edit(victim_ns).await;
    let attacker = Tenant::edit(attacker_ns).await;

    victim.apply(&instance(victim_ns, "orders", ""));
    victim.apply(&binding(victim_ns, "orders-app", "orders", ""));
    condition(victim_ns, SB, "orders-app", "Ready", "InjectedBindResult").await;
    let victim_secret = get(victim_ns, "secret", "orders-app").unwrap();
    let victim_id = recorded_id(victim_ns, "orders");

    attacker.apply(&instance(attacker_ns, "mine", ""));
    condition(attacker_ns, SI, "mine", "Ready", "ProvisionedSuccessfully").await;
    let own_id = recorded_id(attacker_ns, "mine");
    let patch = format!(r#"{{"spec": {{"externalID": "{victim_id}"}}}}"#);
    match attacker.try_kubectl(&["patch", SI, "mine", "--type=merge", "-p", &patch], None) {
        Err(refused) => assert!(refused.contains("immutable"), "{refused}"),
        Ok(_) => {
            // No CEL rules on this API server: the controller keeps the recorded id.
            condition(attacker_ns, SI, "mine", "Ready", "ExternalIDChanged").await;
            assert_eq!(recorded_id(attacker_ns, "mine"), own_id);
        }
    }
    attacker.apply(&binding(attacker_ns, "steal", "mine", ""));
    tokio::time::sleep(Duration::from_secs(5)).await;
    if let Some(stolen) = get(attacker_ns, "secret", "steal") {
        assert_ne!(
            entry(&stolen, "database"),
            entry(&victim_secret, "database"),
            "the attacker's binding is to its own database"
        );
    }
    attacker
        .try_kubectl(&["delete", SB, "steal", "--timeout=90s"], None)
        .unwrap();
    attacker
        .try_kubectl(&["delete", SI, "mine", "--timeout=90s"], None)
        .unwrap();
    eventually("the attacker's instance to go", async || {
        get(attacker_ns, SI, "mine").is_none().then_some(())
    })
    .await;

    // An instance created with the victim's id is refused before any broker call.
    attacker.apply(&instance(
        attacker_ns,
        "clone",
        &format!("  externalID: {victim_id}\n"),
    ));
    condition(attacker_ns, SI, "clone", "Failed", "ExternalIDInUse").await;
    attacker
        .try_kubectl(&["delete", SI, "clone"], None)
        .unwrap();

    // Ids that are not one OSB path segment never reach the controller.
    for bad in ["..", "a/b", "\"\""] {
        let refused = attacker
            .try_apply(&instance(
                attacker_ns,
                "odd",
                &format!("  externalID: {bad}\n"),
            ))
            .expect_err(bad);
        assert!(refused.contains("externalID"), "{refused}");
    }

    log_in(&victim_secret)
        .await
        .expect("the victim's credentials still log in");
    condition(victim_ns, SI, "orders", "Ready", "ProvisionedSuccessfully").await;
    assert_eq!(recorded_id(victim_ns, "orders"), victim_id);
    victim
        .try_kubectl(&["delete", SB, "orders-app"], None)
        .unwrap();
    victim.try_kubectl(&["delete", SI, "orders"], None).unwrap();
}

/// What the tenant roles allow: brokkr's namespaced kinds in the tenant's namespace, reading
/// the cluster's catalog; not status, not the cluster-scoped kinds, not another namespace.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_namespace_editor_uses_brokkr_in_its_namespace_and_nowhere_else() {
    let (ns, other) = (Namespace::new(), Namespace::new());
    let tenant = Tenant::edit(ns.as_str()).await;
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend(args);
        tenant.try_kubectl(&all, None).unwrap_or_default().trim() == "yes"
    };
    for kind in [
        SI,
        SB,
        "servicebindingusages.services.brokkr.dev",
        "servicebrokers.services.brokkr.dev",
        "servicebindings.servicebinding.io",
    ] {
        assert!(can(&["create", kind]), "create {kind}");
        assert!(can(&["delete", kind]), "delete {kind}");
        assert!(
            !can(&["patch", kind, "--subresource=status"]),
            "{kind}/status"
        );
        assert!(
            !can(&["create", kind, "-n", other.as_str()]),
            "{kind} in another namespace"
        );
    }
    for kind in [
        "serviceclasses.services.brokkr.dev",
        "serviceplans.services.brokkr.dev",
        "clusterserviceclasses.services.brokkr.dev",
    ] {
        assert!(can(&["list", kind]), "list {kind}");
        assert!(!can(&["create", kind]), "create {kind}");
    }
    for kind in [
        "clusterservicebrokers.services.brokkr.dev",
        "usagekinds.services.brokkr.dev",
        "clusterworkloadresourcemappings.servicebinding.io",
    ] {
        assert!(!can(&["create", kind]), "create {kind}");
    }
}

/// A tenant writes someone else's identity into `spec.userInfo`: where the API server serves
/// ValidatingAdmissionPolicies, deploy/base's policy refuses it; elsewhere the controller
/// forwards no originating identity at all. The broker's log shows what it was sent.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_cannot_speak_to_a_broker_as_someone_else() {
    let (_dir, log, _broker, broker_url) = logged_broker();
    // The broker's log carries the originating user of each request.
    let header = brokkr_osb::headers::OriginatingIdentity::new(
        "kubernetes",
        serde_json::json!({"username": "log-probe"}),
    )
    .to_header();
    eventually("the broker to log the originating user", async || {
        std::process::Command::new("curl")
            .args([
                "-sf",
                "-u",
                "platform:s3cret",
                "-H",
                "X-Broker-API-Version: 2.17",
            ])
            .arg("-H")
            .arg(format!("X-Broker-API-Originating-Identity: {header}"))
            .arg(format!("{broker_url}/v2/catalog"))
            .output()
            .unwrap();
        std::fs::read_to_string(log.path())
            .unwrap()
            .contains("log-probe")
            .then_some(())
    })
    .await;

    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    let forged = "  userInfo: {username: system:admin, groups: [system:masters]}\n";
    if let Some(refused) = install_user_info_policy(&tenant).await {
        assert!(refused.contains("userInfo"), "{refused}");
        let own = format!("  userInfo: {{username: {}}}\n", tenant.user);
        tenant.apply(&instance(ns, "own", &own));
        condition(ns, SI, "own", "Ready", "ProvisionedSuccessfully").await;
        tenant.try_kubectl(&["delete", SI, "own"], None).unwrap();
    } else {
        tenant.apply(&instance(ns, "forged", forged));
        condition(ns, SI, "forged", "Ready", "ProvisionedSuccessfully").await;
        tenant.try_kubectl(&["delete", SI, "forged"], None).unwrap();
        eventually("the instance to go", async || {
            get(ns, SI, "forged").is_none().then_some(())
        })
        .await;
    }
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        !logged.contains("system:masters") && !logged.contains("system:admin"),
        "a forged identity reached the broker"
    );
}

/// Whether the API server serves ValidatingAdmissionPolicies (Kubernetes 1.30+).
fn policies_served() -> bool {
    kubectl(&["api-resources", "-o", "name"], "")
        .lines()
        .any(|l| l == "validatingadmissionpolicies.admissionregistration.k8s.io")
}

/// Installs deploy/base's `brokkr-user-info` policy where the API server serves policies, and
/// waits until it refuses `tenant` a forged `spec.userInfo`: the refusal, or nothing where
/// policies are not served.
async fn install_user_info_policy(tenant: &Tenant) -> Option<String> {
    if !policies_served() {
        return None;
    }
    let policy = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/base/user-info-policy.yaml"),
    )
    .unwrap();
    kubectl(&["apply", "-f", "-"], &policy);
    let ns = tenant.namespace.as_str();
    let forged = "  userInfo: {username: system:admin, groups: [system:masters]}\n";
    let refused = eventually("the policy to refuse a forged userInfo", async || {
        let attempt = tenant.try_apply(&instance(ns, "probe", forged));
        if attempt.is_ok() {
            let _ = kubectl(&["-n", ns, "delete", SI, "probe", "--wait=false"], "");
        }
        attempt.err()
    })
    .await;
    Some(refused)
}

/// The users the broker logged for the requests it answered whose method is `method` and whose
/// path holds `path`: each line's `user` field, empty when the request carried no identity.
fn callers(log: &std::path::Path, method: &str, path: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!("method={method}")) && l.contains(path))
        .filter(|l| l.contains("answered"))
        .map(|l| {
            l.split_once(" user=")
                .map(|(_, rest)| rest.split('}').next().unwrap_or_default().to_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// Two editors of one namespace: Alice creates an instance and a binding with her own
/// `userInfo`; Carol changes the parameters Secret, rotates the binding and deletes both. Only
/// Alice's own provision and bind carry her identity (where the API server checks it); none of
/// what Carol caused does.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_call_carries_only_the_identity_of_whoever_caused_it() {
    let (_dir, log, _broker, broker_url) = logged_broker();
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let alice = Tenant::edit(ns).await;
    let carol = Tenant::editor(ns, &format!("carol-of-{ns}")).await;
    let checked = install_user_info_policy(&alice).await.is_some();
    let params = |extension: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: params, namespace: {ns}}}\n\
             stringData: {{parameters: '{{\"extensions\": [\"{extension}\"]}}'}}\n"
        )
    };
    alice.apply(&params("citext"));
    let own = format!("  userInfo: {{username: {}}}\n", alice.user);
    alice.apply(&instance(
        ns,
        "db",
        &format!("{own}  parametersFrom:\n  - secretKeyRef: {{name: params, key: parameters}}\n"),
    ));
    condition(ns, SI, "db", "Ready", "ProvisionedSuccessfully").await;
    alice.apply(&binding(ns, "app", "db", &own));
    condition(ns, SB, "app", "Ready", "InjectedBindResult").await;
    let id = recorded_id(ns, "db");
    let instance_path = format!("/v2/service_instances/{id}");

    // Carol changes the Secret: the update that follows is not Alice's.
    carol
        .try_kubectl(&["apply", "-f", "-"], Some(&params("hstore")))
        .unwrap();
    eventually("the Secret's update at the broker", async || {
        (!callers(log.path(), "PATCH", &instance_path).is_empty()).then_some(())
    })
    .await;
    // Carol rotates the binding: the successor's bind is not Alice's.
    carol
        .try_kubectl(
            &["annotate", SB, "app", "services.brokkr.dev/rotate=carol"],
            None,
        )
        .unwrap();
    eventually("the rotation's bind", async || {
        let binds = callers(
            log.path(),
            "PUT",
            &format!("{instance_path}/service_bindings/"),
        );
        (binds.len() == 2).then_some(())
    })
    .await;
    // Carol deletes both.
    carol.try_kubectl(&["delete", SB, "app"], None).unwrap();
    carol.try_kubectl(&["delete", SI, "db"], None).unwrap();
    eventually("the instance to go", async || {
        get(ns, SI, "db").is_none().then_some(())
    })
    .await;

    let binds = callers(
        log.path(),
        "PUT",
        &format!("{instance_path}/service_bindings/"),
    );
    let provisions: Vec<_> = callers(log.path(), "PUT", &instance_path)
        .into_iter()
        .take(1)
        .collect();
    let hers = |users: &[String]| users.iter().filter(|u| u.contains(&alice.user)).count();
    assert_eq!(hers(&provisions), usize::from(checked), "{provisions:?}");
    assert_eq!(hers(&binds), usize::from(checked), "{binds:?}");
    assert!(!binds[1].contains(&alice.user), "the rotation: {binds:?}");
    for method in ["PATCH", "DELETE"] {
        let calls = callers(log.path(), method, &instance_path);
        assert!(!calls.is_empty(), "no {method} logged");
        assert_eq!(hers(&calls), 0, "{method}: {calls:?}");
    }
}

/// An identity written while the policy's binding was away is never forwarded: not with the
/// provision the controller makes while it still thinks the policy is there, nor with the
/// deletion after the binding is back. Needs an API server that serves policies.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn an_identity_written_while_the_policy_was_away_is_never_forwarded() {
    let (_dir, log, _broker, broker_url) = logged_broker();
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    if install_user_info_policy(&tenant).await.is_none() {
        eprintln!("the API server serves no ValidatingAdmissionPolicy: nothing to test");
        return;
    }
    // The controller has seen the policy in force.
    let own = format!("  userInfo: {{username: {}}}\n", tenant.user);
    tenant.apply(&instance(ns, "own", &own));
    condition(ns, SI, "own", "Ready", "ProvisionedSuccessfully").await;

    // An admin takes the binding away; the tenant writes a forged identity meanwhile.
    kubectl(
        &[
            "delete",
            "validatingadmissionpolicybinding",
            "brokkr-user-info",
        ],
        "",
    );
    let forged = "  userInfo: {username: alice, groups: [system:masters]}\n";
    eventually("the forged userInfo admitted", async || {
        tenant.try_apply(&instance(ns, "forged", forged)).ok()
    })
    .await;
    condition(ns, SI, "forged", "Ready", "ProvisionedSuccessfully").await;
    let policy = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/base/user-info-policy.yaml"),
    )
    .unwrap();
    kubectl(&["apply", "-f", "-"], &policy);
    tenant.try_kubectl(&["delete", SI, "forged"], None).unwrap();
    eventually("the forged instance to go", async || {
        get(ns, SI, "forged").is_none().then_some(())
    })
    .await;
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        !logged.contains("system:masters"),
        "an identity nobody checked reached the broker"
    );
}

/// The shipped `brokkr-user-info` policy and binding, put back as they are in deploy/base when
/// dropped (the binding deleted first: `apply` would keep a field a patch added).
struct ShippedPolicyOnDrop;

impl Drop for ShippedPolicyOnDrop {
    fn drop(&mut self) {
        let _ = try_kubectl(
            &[
                "delete",
                "validatingadmissionpolicybinding",
                "brokkr-user-info",
                "--ignore-not-found",
            ],
            None,
        );
        let policy = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/base/user-info-policy.yaml"),
        )
        .unwrap();
        let _ = try_kubectl(&["apply", "-f", "-"], Some(&policy));
    }
}

/// An admin narrows the policy's binding to namespaces labelled `brokkr-user-info: checked`,
/// which the tenants' namespace is not: a second editor there creates an instance with a forged
/// `userInfo` (alice, in `system:masters`), which the API server now admits. The broker gets no
/// identity, and the instance's `OriginatingIdentity` condition says it was withheld. Needs an
/// API server that serves policies (1.30+); skipped where it does not.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_policy_an_admin_narrowed_is_not_trusted_and_the_instance_says_so() {
    let (_dir, log, _broker, broker_url) = logged_broker();
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let alice = Tenant::edit(ns).await;
    let carol = Tenant::editor(ns, &format!("carol-of-{ns}")).await;
    if install_user_info_policy(&alice).await.is_none() {
        eprintln!("the API server serves no ValidatingAdmissionPolicy: nothing to test");
        return;
    }
    let _restore = ShippedPolicyOnDrop;
    kubectl(
        &[
            "patch",
            "validatingadmissionpolicybinding",
            "brokkr-user-info",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"matchResources":{"namespaceSelector":{"matchLabels":{"brokkr-user-info":"checked"}}}}}"#,
        ],
        "",
    );
    let forged = "  userInfo: {username: alice, groups: [tenants-a, system:masters]}\n";
    eventually("the forged userInfo admitted", async || {
        carol.try_apply(&instance(ns, "forged", forged)).ok()
    })
    .await;
    condition(ns, SI, "forged", "Ready", "ProvisionedSuccessfully").await;
    let instance = get(ns, SI, "forged").unwrap();
    assert!(
        instance["status"]["externalProperties"]["userInfo"].is_null(),
        "{instance}"
    );
    let said = instance["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "OriginatingIdentity")
        .cloned()
        .unwrap_or_default();
    assert_eq!(said["reason"], "UserInfoNotChecked", "{instance}");
    let logged = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        !logged.contains("system:masters"),
        "an identity nobody checked reached the broker"
    );
}

/// Bind requests the broker logged for the binding id `id`.
fn binds(log: &std::path::Path, id: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("method=PUT") && l.contains(&format!("service_bindings/{id}")))
        .filter(|l| l.contains("answered"))
        .count()
}

/// A binding whose Secret can never be written makes no loop of bind and unbind calls: a
/// missing `addKeysFrom` Secret waits without calling the broker, and a JSONPath that matches
/// nothing in the credentials is retried with a backoff.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_binding_that_cannot_be_written_does_not_hammer_the_broker() {
    let (_dir, log, _broker, broker_url) = logged_broker();
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    tenant.apply(&instance(ns, "db", ""));
    condition(ns, SI, "db", "Ready", "ProvisionedSuccessfully").await;

    tenant.apply(&binding(
        ns,
        "missing-source",
        "db",
        "  secretTransforms: [{addKeysFrom: {secretRef: {namespace: x, name: not-there}}}]\n",
    ));
    let waiting = condition(
        ns,
        SB,
        "missing-source",
        "Ready",
        "ErrorWithSecretTransforms",
    )
    .await;
    assert!(waiting["message"].as_str().unwrap().contains("not-there"));

    tenant.apply(&binding(
        ns,
        "no-match",
        "db",
        "  secretTransforms: [{addKey: {key: extra, jsonPathExpression: '{.nothing.here}'}}]\n",
    ));
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let elapsed = start.elapsed();
    let no_match = get(ns, SB, "no-match").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let missing = get(ns, SB, "missing-source").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(binds(log.path(), &missing), 0, "waited without a bind");
    let tries = binds(log.path(), &no_match);
    // 1 s doubling: binds at about 0, 1, 3, 7 and 15 s.
    assert!(
        (1..=6).contains(&tries),
        "{tries} binds in {elapsed:?}: the retries back off"
    );
    assert!(get(ns, "secret", "no-match").is_none());
    tenant.try_kubectl(&["delete", SB, "--all"], None).unwrap();
}

/// Names up to what Kubernetes allows work: a ServiceBinding of 70 characters gets its Secret
/// (its label value shortened), a ServiceBroker of 70 characters its catalog.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn names_longer_than_a_label_value_work() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    let long = format!("app-{}", "x".repeat(66));
    assert_eq!(long.len(), 70);
    tenant.apply(&instance(ns, "db", ""));
    tenant.apply(&binding(ns, &long, "db", ""));
    condition(ns, SB, &long, "Ready", "InjectedBindResult").await;
    let secret = get(ns, "secret", &long).expect("the Secret of the long-named binding");
    let label = secret["metadata"]["labels"]["services.brokkr.dev/service-binding"]
        .as_str()
        .unwrap();
    assert!(label.len() <= 63 && label.starts_with("app-x"), "{label}");
    log_in(&secret).await.expect("its credentials log in");

    kubectl(
        &[
            "-n",
            ns,
            "create",
            "secret",
            "generic",
            "tenant-broker-auth",
            "--from-literal=username=platform",
            "--from-literal=password=s3cret",
        ],
        "",
    );
    let broker = format!("broker-{}", "y".repeat(63));
    tenant.apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBroker
metadata: {{name: {broker}, namespace: {ns}}}
spec:
  url: {broker_url}
  authInfo: {{basic: {{secretRef: {{name: tenant-broker-auth}}}}}}
"
    ));
    condition(ns, "servicebroker", &broker, "Ready", "FetchedCatalog").await;
    let classes = kubectl(&["-n", ns, "get", "serviceclasses", "-o", "json"], "");
    let classes: Value = serde_json::from_str(&classes).unwrap();
    assert!(
        !classes["items"].as_array().unwrap().is_empty(),
        "the long-named broker's classes"
    );
    tenant.try_kubectl(&["delete", SB, &long], None).unwrap();
}

/// The ServiceBroker `own` of the namespace `ns` at `url`, with the platform's credentials
/// from the Secret `own-broker-auth`.
fn own_broker(ns: &str, url: &str) -> String {
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBroker
metadata: {{name: own, namespace: {ns}}}
spec:
  url: {url}
  authInfo: {{basic: {{secretRef: {{name: own-broker-auth}}}}}}
"
    )
}

/// A fresh namespace whose editor runs its own ServiceBroker `own` for `broker_url`, with an
/// instance `db` of it and a binding `app`, bound: the namespace, its editor, and the Secret.
async fn namespace_with_its_own_broker(broker_url: &str) -> (Namespace, Tenant, Value) {
    let namespace = Namespace::new();
    let ns = namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    tenant
        .try_kubectl(
            &[
                "create",
                "secret",
                "generic",
                "own-broker-auth",
                "--from-literal=username=platform",
                "--from-literal=password=s3cret",
            ],
            None,
        )
        .unwrap();
    tenant.apply(&own_broker(ns, broker_url));
    condition(ns, "servicebroker", "own", "Ready", "FetchedCatalog").await;
    tenant.apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: db, namespace: {ns}}}
spec:
  serviceClassExternalName: postgresql
  servicePlanExternalName: small
"
    ));
    tenant.apply(&binding(ns, "app", "db", ""));
    condition(ns, SB, "app", "Ready", "InjectedBindResult").await;
    let secret = get(ns, "secret", "app").unwrap();
    (namespace, tenant, secret)
}

/// Deletes the namespace `ns` as an admin would, and waits up to 120 s for it to go.
async fn delete_namespace(ns: &str) {
    kubectl(&["delete", "namespace", ns, "--wait=false"], "");
    let deadline = Instant::now() + Duration::from_secs(120);
    while try_kubectl(&["get", "namespace", ns], None).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the namespace is still there after 120 s: {}",
            kubectl(
                &[
                    "-n",
                    ns,
                    "get",
                    "serviceinstances,servicebindings,servicebrokers,secrets",
                    "-o",
                    "wide"
                ],
                ""
            )
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A namespace with its own ServiceBroker, deleted with everything in it, ends with its
/// instances deprovisioned at that broker and the namespace gone: the broker, its classes and
/// plans and its credentials Secret are kept until the last instance is deprovisioned.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_namespace_with_its_own_broker_is_deleted_without_an_admin() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let _controller = Controller::start();
    let (namespace, _tenant, secret) = namespace_with_its_own_broker(&broker_url).await;
    log_in(&secret).await.expect("the credentials log in");
    delete_namespace(namespace.as_str()).await;
    assert!(
        log_in(&secret).await.is_err(),
        "unbound and deprovisioned at the broker"
    );
}

/// A tenant points its own broker at a dead URL, and then its namespace is deleted: the
/// instance and binding cannot be deprovisioned or unbound, and the tenant's RoleBinding goes
/// with the namespace, so nobody but an admin could annotate them. The namespace still ends,
/// once its deletion has waited the controller's `--namespace-deletion-timeout` (30 s in the
/// tests), with an Event about the Namespace saying what the broker keeps.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_namespace_whose_broker_went_dead_is_deleted_without_an_admin() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let _controller = Controller::start();
    let (namespace, tenant, _) = namespace_with_its_own_broker(&broker_url).await;
    let ns = namespace.as_str();
    let id = recorded_id(ns, "db");
    // Nothing listens there.
    tenant.apply(&own_broker(
        ns,
        &format!("http://127.0.0.1:{}", free_port()),
    ));
    condition(ns, "servicebroker", "own", "Ready", "ErrorFetchingCatalog").await;
    delete_namespace(ns).await;
    let events = kubectl(
        &[
            "-n",
            "kube-system",
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={ns},reason=AbandonedWithNamespace"),
            "-o",
            "json",
        ],
        "",
    );
    let events: Value = serde_json::from_str(&events).unwrap();
    let notes: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains(&id)),
        "an Event names what the broker keeps: {notes:?}"
    );
}
