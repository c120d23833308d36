//! An instance's dashboard URL on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test dashboard_e2e -- --ignored`): `brokkr
//! serve` with a plan whose `http` step learns the URL from a local server playing the Director,
//! and `brokkr controller` copying it into the ServiceInstance's `status.dashboardURL` once the
//! asynchronous provision has succeeded (the class is `instancesRetrievable`, so the controller
//! fetches the instance); a fixed pattern reaches status from the provision's answer.

mod support;

use support::cluster::*;
use support::director::Director;
use support::*;

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_dashboard_url_learnt_after_the_provision_answer_reaches_status() {
    let director = Director::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("brokkr.yaml");
    std::fs::write(&config, director.config()).unwrap();
    let config = config.display().to_string();
    let (_broker, broker_url) = serve_with(dir.path(), &["--config", &config], &[]);
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();
    let class = eventually("the class kyma", async || {
        let classes = kubectl(&["get", "clusterserviceclasses", "-o", "json"], "");
        let classes: serde_json::Value = serde_json::from_str(&classes).ok()?;
        (classes["items"].as_array()?.iter())
            .find(|c| c["spec"]["externalName"] == "kyma")
            .cloned()
    })
    .await;
    assert_eq!(class["spec"]["instancesRetrievable"], true, "{class}");

    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: runtime, namespace: {ns}}}
spec:
  {plan}
  externalID: rt-{ns}
---
apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: grafana, namespace: {ns}}}
spec:
  {grafana}
  externalID: g-{ns}
",
        plan = scope.plan("kyma", "runtime"),
        grafana = scope.plan("kyma", "grafana"),
    ));
    for name in ["runtime", "grafana"] {
        condition(
            ns,
            "serviceinstance",
            name,
            "Ready",
            "ProvisionedSuccessfully",
        )
        .await;
    }
    let runtime = get(ns, "serviceinstance", "runtime").unwrap();
    let id = format!("rt-{ns}");
    assert_eq!(director.calls(&id), 3, "two 'in progress', then 'finished'");
    assert_eq!(
        runtime["status"]["dashboardURL"],
        Director::dashboard(&id),
        "{runtime}"
    );
    let grafana = get(ns, "serviceinstance", "grafana").unwrap();
    assert_eq!(
        grafana["status"]["dashboardURL"],
        format!("https://grafana.example.com/d/g-{ns}"),
        "{grafana}"
    );
}
