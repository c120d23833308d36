//! The workloads a binding projects into: which it concerns, which mapping each uses, and the
//! projection added where it matches and removed where it no longer does.

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::{Selector, SelectorExt as _};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use super::service::{gvk, served};
use crate::context::Context;
use crate::projector::{self, Path, Projection};
use crate::resources::servicebinding_io::{
    ClusterWorkloadResourceMapping, MappingContainer, MappingTemplate, ServiceBinding,
};
use crate::workloads::{self, Editor, Error, WorkloadChange};

/// The controller's name in its metrics.
pub(super) const CONTROLLER: &str = "ServiceBinding.servicebinding.io";
/// The binding's annotation naming the kind of workload it last projected into:
/// `<apiVersion> <kind>`.
pub(super) const WORKLOAD_ANNOTATION: &str = "projection.services.brokkr.dev/workload-kind";
/// The prefix of the workload annotation recording the mapping a projection used.
pub(super) const MAPPING_ANNOTATION_PREFIX: &str = "mapping.projection.services.brokkr.dev/";

/// Whether the change of a watched object concerns `binding`: its service, a workload it
/// names or selects, or one that carries its projection.
pub(super) fn concerns(binding: &ServiceBinding, change: &WorkloadChange) -> bool {
    let metadata = &change.metadata;
    if binding.metadata.namespace != metadata.namespace {
        return false;
    }
    let name = metadata.name.as_deref().unwrap_or_default();
    let is = |api_version: &str, kind: &str| {
        change.resource.api_version == api_version && change.resource.kind == kind
    };
    let (service, workload) = (&binding.spec.service, &binding.spec.workload);
    if is(&service.api_version, &service.kind) && service.name == name {
        return true;
    }
    if !is(&workload.api_version, &workload.kind) {
        return false;
    }
    let record_key = format!(
        "{MAPPING_ANNOTATION_PREFIX}{}",
        projector::volume_name(&binding.name_any())
    );
    let labels = metadata.labels.clone().unwrap_or_default();
    workload.name.as_deref() == Some(name)
        || workload.selector.as_ref().is_some_and(|selector| {
            Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(&labels))
        })
        || metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&record_key))
}

pub(super) async fn workload_api(
    ctx: &Context,
    api_version: &str,
    kind: &str,
    namespace: &str,
) -> Result<Option<(Api<DynamicObject>, ApiResource)>, Error> {
    Ok(served(ctx, &gvk(api_version, kind)).await?.map(|resource| {
        (
            Api::namespaced_with(ctx.client.clone(), namespace, &resource),
            resource,
        )
    }))
}

/// Unprojects the binding from every workload of the kind it last projected into, when that is
/// not `current` (`<apiVersion> <kind>`), or always with `current` `None`.
pub(super) async fn release_previous_kind(
    binding: &ServiceBinding,
    ctx: &Context,
    namespace: &str,
    current: Option<&str>,
) -> Result<(), Error> {
    let Some(previous) = binding.annotations().get(WORKLOAD_ANNOTATION) else {
        return Ok(());
    };
    if Some(previous.as_str()) == current {
        return Ok(());
    }
    if let Some((api_version, kind)) = previous.split_once(' ')
        && let Some((api, _)) = workload_api(ctx, api_version, kind, namespace).await?
    {
        for failure in sync_workloads(binding, ctx, &api, None, &[]).await?.1 {
            tracing::warn!(binding = %binding.name_any(), %failure, "not unprojected");
        }
    }
    Ok(())
}

/// The mapping entry for `resource`: its ClusterWorkloadResourceMapping's, else the built-in
/// one, else the `PodSpec`-able default.
pub(super) async fn mapping_template(
    ctx: &Context,
    resource: &ApiResource,
) -> Result<MappingTemplate, Error> {
    let name = if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    };
    let mappings = Api::<ClusterWorkloadResourceMapping>::all(ctx.client.clone());
    if let Some(mapping) = mappings.get_opt(&name).await?
        && let Some(template) = mapping.spec.template_for(&resource.version)
    {
        return Ok(template.clone());
    }
    let default = MappingTemplate {
        version: "*".into(),
        ..MappingTemplate::default()
    };
    Ok(match (resource.group.as_str(), resource.kind.as_str()) {
        ("batch", "CronJob") => {
            let at = ".spec.jobTemplate.spec.template";
            let container = |list: &str| MappingContainer {
                path: format!("{at}.spec.{list}[*]"),
                name: Some(".name".into()),
                env: None,
                volume_mounts: None,
            };
            MappingTemplate {
                annotations: Some(format!("{at}.metadata.annotations")),
                containers: Some(vec![container("containers"), container("initContainers")]),
                volumes: Some(format!("{at}.spec.volumes")),
                ..default
            }
        }
        _ => default,
    })
}

/// Projects `projection` (with `templates[0]`'s mapping) into every workload the binding
/// matches and unprojects it from every other workload carrying it; with no projection,
/// unprojects it from every workload. Returns how many workloads carry it, and why the others
/// that should could not be edited.
pub(super) async fn sync_workloads(
    binding: &ServiceBinding,
    ctx: &Context,
    api: &Api<DynamicObject>,
    projection: Option<&Projection>,
    templates: &[MappingTemplate],
) -> Result<(usize, Vec<String>), Error> {
    let volume = projector::volume_name(&binding.name_any());
    let record_key = format!("{MAPPING_ANNOTATION_PREFIX}{volume}");
    let workload = &binding.spec.workload;
    let selector =
        match &workload.selector {
            Some(selector) => Some(Selector::try_from(selector.clone()).map_err(|e| {
                projector::Error::Record {
                    key: "spec.workload.selector".into(),
                    reason: e.to_string(),
                }
            })?),
            None => None,
        };
    let (mut projected, mut failures) = (0, Vec::new());
    let editor = Editor {
        metrics: &ctx.metrics,
        controller: CONTROLLER,
    };
    // What the binding wants of `object`: the mapping it projects with, if it matches, and the
    // one it recorded there, if any.
    let wants = |object: &DynamicObject| {
        let matched = projection.is_some()
            && match (&workload.name, &selector) {
                (Some(name), _) => object.name_any() == *name,
                (None, Some(selector)) => selector.matches(object.labels()),
                (None, None) => false,
            };
        let recorded: Option<MappingTemplate> = object
            .annotations()
            .get(&record_key)
            .and_then(|text| serde_json::from_str(text).ok());
        (templates.first().filter(|_| matched), recorded)
    };
    for object in api.list(&ListParams::default()).await?.items {
        if let (None, None) = wants(&object) {
            continue;
        }
        let name = object.name_any();
        // Decided again on the workload as read again, should another writer come in between.
        let edited = workloads::edit(api, object, editor, |object, after| {
            let (wanted, recorded) = wants(object);
            edit(
                after,
                binding,
                &record_key,
                recorded.as_ref(),
                wanted,
                projection,
            )
        })
        .await;
        match edited {
            Ok(Some(true)) => projected += 1,
            Ok(_) => {}
            // One workload that cannot be edited does not keep the others from being bound.
            Err(Error::Projector(e)) => failures.push(format!("{name}: {e}")),
            Err(e) => return Err(e),
        }
    }
    Ok((projected, failures))
}

/// Unprojects the recorded projection from `workload` when it is not the wanted one, and
/// projects the wanted one; returns whether the workload carries the projection.
pub(super) fn edit(
    workload: &mut Value,
    binding: &ServiceBinding,
    record_key: &str,
    recorded: Option<&MappingTemplate>,
    wanted: Option<&MappingTemplate>,
    projection: Option<&Projection>,
) -> Result<bool, projector::Error> {
    let metadata_annotations = Path::parse_fixed(".metadata.annotations").expect("a valid path");
    if let Some(old) = recorded
        && Some(old) != wanted
    {
        projector::unproject(workload, &old.mapping()?, &binding.name_any())?;
        if let Some(annotations) = metadata_annotations
            .get_mut(workload)
            .and_then(Value::as_object_mut)
        {
            annotations.remove(record_key);
        }
        metadata_annotations.prune_empty(workload);
    }
    let (Some(template), Some(projection)) = (wanted, projection) else {
        return Ok(false);
    };
    projector::project(workload, &template.mapping()?, projection)?;
    let annotations = metadata_annotations.get_or_create(workload, || json!({}))?;
    annotations[record_key] = Value::String(serde_json::to_string(template).expect("a template"));
    Ok(true)
}
