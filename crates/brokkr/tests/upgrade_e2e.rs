//! Upgrades from the platform side on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test upgrade_e2e -- --ignored`): `brokkr
//! serve` on the shared-server catalog with a maintenance version on PostgreSQL's `small` plan,
//! `brokkr controller`, and a namespace's editor who provisions, sees the plan move on, and asks
//! for the upgrade with `kubectl patch`.

mod support;

use std::path::Path;

use support::cluster::*;
use support::*;

/// The shared-server catalog with `version` as the `small` PostgreSQL plan's maintenance version.
fn catalog(version: &str) -> String {
    let shared = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../catalogs/shared/shared.yaml"),
    )
    .unwrap();
    let small = "          description: Up to 10 connections\n";
    assert!(shared.contains(small));
    shared.replacen(
        small,
        &format!(
            "{small}          maintenance_info: {{version: {version}, description: 'Release {version}'}}\n"
        ),
        1,
    )
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn an_editor_sees_a_newer_version_and_upgrades_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, catalog("1.0.0")).unwrap();
    let (_broker, broker_url) = serve_with(
        dir.path(),
        &["--config", config.to_str().unwrap()],
        &shared_servers_env(),
    );
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    tenant.apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  {fields}
",
        fields = scope.plan("postgresql", "small")
    ));
    condition(
        ns,
        "serviceinstance",
        "orders",
        "Ready",
        "ProvisionedSuccessfully",
    )
    .await;
    let instance = get(ns, "serviceinstance", "orders").unwrap();
    assert_eq!(
        instance["status"]["externalProperties"]["maintenanceInfoVersion"],
        "1.0.0"
    );
    let uid = instance["metadata"]["uid"].as_str().unwrap().to_owned();
    let osb = brokkr_osb::client::Client::builder(&broker_url)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    let version = async || {
        let fetched = osb.instance(&uid, None).await.ok()?.body;
        fetched.maintenance_info.map(|m| m.version)
    };
    assert_eq!(version().await.as_deref(), Some("1.0.0"));

    // The platform team moves the plan on; the broker reloads its configuration, and the
    // catalog is listed again.
    std::fs::write(&config, catalog("1.1.0")).unwrap();
    eventually("the broker to offer 1.1.0", async || {
        let catalog = osb.catalog().await.ok()?.body;
        let offered = catalog.services.iter().flat_map(|s| &s.plans).any(|p| {
            p.name == "small"
                && p.maintenance_info
                    .as_ref()
                    .is_some_and(|m| m.version == "1.1.0")
        });
        offered.then_some(())
    })
    .await;
    kubectl(
        &[
            "-n",
            ns,
            "patch",
            "servicebroker",
            &scope.broker,
            "--type=merge",
            "-p",
            r#"{"spec":{"relistRequests":1}}"#,
        ],
        "",
    );
    let offered = eventually("UpgradeAvailable", async || {
        let instance = get(ns, "serviceinstance", "orders")?;
        let conditions = instance["status"]["conditions"].as_array()?.clone();
        conditions
            .into_iter()
            .find(|c| c["type"] == "UpgradeAvailable" && c["status"] == "True")
    })
    .await;
    let message = offered["message"].as_str().unwrap();
    assert!(
        message.contains("offers version 1.1.0 (the instance runs 1.0.0): Release 1.1.0"),
        "{message}"
    );
    assert_eq!(
        version().await.as_deref(),
        Some("1.0.0"),
        "nobody asked yet"
    );

    // The editor asks for it, as the condition says.
    tenant
        .try_kubectl(
            &[
                "patch",
                "serviceinstance",
                "orders",
                "--type=merge",
                "-p",
                r#"{"spec":{"maintenance":{"version":"1.1.0"}}}"#,
            ],
            None,
        )
        .unwrap();
    eventually("the instance to run 1.1.0", async || {
        let instance = get(ns, "serviceinstance", "orders")?;
        let status = &instance["status"];
        let upgraded = status["externalProperties"]["maintenanceInfoVersion"] == "1.1.0"
            && status["lastConditionState"] == "Ready"
            && !status["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "UpgradeAvailable");
        upgraded.then_some(())
    })
    .await;
    assert_eq!(version().await.as_deref(), Some("1.1.0"));
    let columns = kubectl(&["-n", ns, "get", "serviceinstance", "orders"], "");
    assert!(
        columns.contains("VERSION") && columns.contains("1.1.0"),
        "{columns}"
    );
    kubectl(&["-n", ns, "delete", "serviceinstance", "orders"], "");
}

/// A namespace's editor cannot store a maintenance version that is not a semantic version of
/// at most 256 characters (the CRD bounds it; the controller would echo it in a condition).
/// Needs no broker: the API server refuses it.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn an_editor_cannot_store_a_huge_or_malformed_maintenance_version() {
    install_crds();
    let namespace = Namespace::new();
    let ns = namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    let with_version = |version: &str| {
        format!(
            "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  clusterServiceClassExternalName: postgresql
  clusterServicePlanExternalName: small
  maintenance: {{version: \"{version}\"}}
"
        )
    };
    let huge = format!("1.0.0-{}", "a".repeat(1_000_000));
    for refused in [huge.as_str(), "latest", "1.0", "1.0.0; rm -rf /"] {
        let said = tenant
            .try_kubectl(
                &["apply", "--dry-run=server", "-f", "-"],
                Some(&with_version(refused)),
            )
            .expect_err("refused");
        assert!(said.contains("spec.maintenance.version"), "{said:.300}");
    }
    for accepted in ["1.1.0", "2.0.0-rc.1+build.7"] {
        tenant
            .try_kubectl(
                &["apply", "--dry-run=server", "-f", "-"],
                Some(&with_version(accepted)),
            )
            .unwrap_or_else(|e| panic!("{accepted}: {e}"));
    }
}
