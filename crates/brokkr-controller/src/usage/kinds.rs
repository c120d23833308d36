//! The UsageKinds brokkr ships: how a binding's Secret is injected into the workload kinds
//! most clusters run.

use kube::api::PostParams;
use kube::{Api, ResourceExt as _};

use crate::resources::{UsageKind, UsageKindResource, UsageKindSpec, WorkloadMapping};

/// The UsageKinds brokkr ships, created when the controller starts if they are missing and
/// never overwritten.
pub fn shipped_usage_kinds() -> Vec<UsageKind> {
    let kind = |name: &str, display: &str, group: &str, version: &str, k: &str, template: &str| {
        let mut kind = UsageKind::new(
            name,
            UsageKindSpec {
                display_name: display.into(),
                resource: UsageKindResource {
                    group: group.into(),
                    version: version.into(),
                    kind: k.into(),
                },
                labels_path: format!("{}.metadata.labels", template.trim_start_matches('.')),
                mapping: WorkloadMapping {
                    pod_template_path: (template != ".spec.template").then(|| template.into()),
                    ..WorkloadMapping::default()
                },
            },
        );
        kind.metadata.labels = Some(
            [(
                "app.kubernetes.io/managed-by".to_owned(),
                "brokkr".to_owned(),
            )]
            .into_iter()
            .collect(),
        );
        kind
    };
    vec![
        kind(
            "deployment",
            "Deployment",
            "apps",
            "v1",
            "Deployment",
            ".spec.template",
        ),
        // Kyma's Function: a kubeless function carries a whole Deployment.
        kind(
            "function",
            "Function",
            "kubeless.io",
            "v1beta1",
            "Function",
            ".spec.deployment.spec.template",
        ),
        kind(
            "statefulset",
            "StatefulSet",
            "apps",
            "v1",
            "StatefulSet",
            ".spec.template",
        ),
        kind(
            "daemonset",
            "DaemonSet",
            "apps",
            "v1",
            "DaemonSet",
            ".spec.template",
        ),
        kind("job", "Job", "batch", "v1", "Job", ".spec.template"),
        kind(
            "cronjob",
            "CronJob",
            "batch",
            "v1",
            "CronJob",
            ".spec.jobTemplate.spec.template",
        ),
    ]
}

/// Creates the shipped UsageKinds that do not exist; leaves the others as they are.
pub async fn create_shipped_usage_kinds(client: &kube::Client) -> Result<(), kube::Error> {
    let api = Api::<UsageKind>::all(client.clone());
    for kind in shipped_usage_kinds() {
        match api.create(&PostParams::default(), &kind).await {
            Ok(_) => tracing::info!(usage_kind = %kind.name_any(), "created"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
