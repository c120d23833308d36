//! The servicebinding.io ServiceBinding controller: projects a Provisioned Service's Secret
//! into the workloads a binding names (by name or by label selector) through the
//! [`projector`], and unprojects it from workloads it no longer names and when
//! the binding goes.
//!
//! - The service: a `v1` `Secret` directly (Direct Secret Reference), else any resource whose
//!   `.status.binding.name` names a Secret (brokkr's ServiceBinding included).
//! - The mapping: the ClusterWorkloadResourceMapping named `<plural>.<group>` (its entry for the
//!   workload's version, else `*`), else the built-in one, else `PodSpec`-able. The entry used is
//!   recorded on each workload (annotation `mapping.projection.services.brokkr.dev/<volume>` in
//!   its own metadata), and unprojection uses it. A workload whose mapping changed is unprojected
//!   with the old one and projected again with the new one.
//! - Every workload of the kind in the namespace is looked at: those matched are projected, those
//!   carrying this binding's projection but no longer matched (renamed, relabelled) are
//!   unprojected.
//! - Conditions `ServiceAvailable`, `WorkloadProjected` and `Ready`, `observedGeneration` and
//!   `.status.binding`.
//!
//! The service's kind and the workload's kind are watched ([`crate::workloads`]): a workload
//! created, renamed or relabelled, or a service whose `.status.binding` moved, wakes the
//! bindings it concerns at once; each binding also looks again every 5 minutes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{GroupVersionKind, Selector, SelectorExt as _};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use crate::cache;
use crate::context::Context;
use crate::finalizer;
use crate::projector::{self, Path, Projection};
use crate::resources::LocalObjectReference;
use crate::resources::servicebinding_io::{
    ClusterWorkloadResourceMapping, MappingContainer, MappingTemplate, ServiceBinding,
    ServiceBindingStatus,
};
use crate::workloads::WorkloadChange;

/// The finalizer under which a binding's projections are removed.
pub const FINALIZER: &str = "servicebinding.io/finalizer";
/// The binding's annotation naming the kind of workload it last projected into:
/// `<apiVersion> <kind>`.
pub const WORKLOAD_ANNOTATION: &str = "projection.services.brokkr.dev/workload-kind";
/// The prefix of the workload annotation recording the mapping a projection used.
pub const MAPPING_ANNOTATION_PREFIX: &str = "mapping.projection.services.brokkr.dev/";
/// How soon a failed reconcile is tried again.
const RECHECK: Duration = Duration::from_secs(10);
/// How often a binding looks at its service and workloads although none changed (their changes
/// wake it at once: this is a safety net).
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A workload could not be edited.
    #[error(transparent)]
    Projector(#[from] projector::Error),
}

impl From<projector::PathError> for Error {
    fn from(e: projector::PathError) -> Self {
        Error::Projector(e.into())
    }
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let controller = ctx.controller(
        ctx.scope.api::<ServiceBinding>(&client),
        ctx.scope.watch_config(),
    );
    let bindings = controller.store();
    let controller = controller
        // A service or workload that appears, goes or changes wakes the bindings it concerns.
        .reconcile_on(cache::waking(
            bindings,
            ctx.workloads.changes(),
            |bindings, change| cache::woken(bindings, |b| concerns(b, &change)),
        ))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "servicebinding.io controller");
            }
        });
    stopping_on(controller, shutdown).await;
}

/// How long reconciles in progress may take to finish once shutdown is asked for.
const GRACE: Duration = Duration::from_secs(5);

/// Runs `controller` until it ends, or until `GRACE` after `shutdown`: kube-runtime holds a
/// controller's reconciles until its first list succeeds, and nothing ends that wait when the
/// kind is not served (its CRD not installed), so a graceful shutdown alone would never end.
pub(crate) async fn stopping_on(
    controller: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
) {
    let deadline = async {
        shutdown.await;
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        () = controller => {}
        () = deadline => tracing::info!("a controller did not stop in time; leaving it"),
    }
}

/// Reconciles one servicebinding.io ServiceBinding.
pub async fn reconcile(binding: Arc<ServiceBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = reconcile_inner(&binding, &ctx).await;
    ctx.metrics
        .reconciled("ServiceBinding.servicebinding.io", result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %binding.namespace().unwrap_or_default(), binding = %binding.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceBinding>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

/// One condition to set.
struct Observed {
    type_: &'static str,
    ok: Option<bool>,
    reason: &'static str,
    message: String,
}

async fn reconcile_inner(binding: &ServiceBinding, ctx: &Context) -> Result<Action, Error> {
    let namespace = binding.namespace().unwrap_or_default();
    let api = Api::<ServiceBinding>::namespaced(ctx.client.clone(), &namespace);
    let workload = &binding.spec.workload;
    let workloads = workload_api(ctx, &workload.api_version, &workload.kind, &namespace).await?;
    let kind = format!("{} {}", workload.api_version, workload.kind);

    if binding.metadata.deletion_timestamp.is_some() {
        if let Some((api, _)) = &workloads {
            let (_, failures) = sync_workloads(binding, api, None, &[]).await?;
            // A record nobody can read again would keep the binding forever: let it go.
            for failure in failures {
                tracing::warn!(binding = %binding.name_any(), %failure, "not unprojected");
            }
        }
        release_previous_kind(binding, ctx, &namespace, Some(&kind)).await?;
        finalizer::remove(&api, binding, FINALIZER).await?;
        return Ok(Action::await_change());
    }
    finalizer::add(&api, binding, FINALIZER).await?;
    // Another kind of workload than last time: unproject from the old kind's workloads first.
    release_previous_kind(binding, ctx, &namespace, Some(&kind)).await?;
    if binding.annotations().get(WORKLOAD_ANNOTATION) != Some(&kind) {
        api.patch(
            &binding.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {WORKLOAD_ANNOTATION: kind}}})),
        )
        .await?;
    }
    let invalid = match (&workload.name, &workload.selector) {
        (Some(_), Some(_)) => Some("sets both name and selector"),
        (None, None) => Some("sets neither name nor selector"),
        _ => None,
    };

    let mut observed = Vec::new();
    let secret = service_secret(binding, ctx, &namespace).await?;
    observed.push(match &secret {
        Ok(name) => Observed {
            type_: "ServiceAvailable",
            ok: Some(true),
            reason: "ResolvedBindingSecret",
            message: format!("Secret {name}"),
        },
        Err((reason, message)) => Observed {
            type_: "ServiceAvailable",
            ok: Some(false),
            reason,
            message: message.clone(),
        },
    });

    let projected = match (&workloads, &secret) {
        _ if invalid.is_some() => Observed {
            type_: "WorkloadProjected",
            ok: Some(false),
            reason: "InvalidWorkloadReference",
            message: format!("spec.workload {}", invalid.unwrap_or_default()),
        },
        (None, _) => Observed {
            type_: "WorkloadProjected",
            ok: Some(false),
            reason: "WorkloadNotFound",
            message: format!(
                "{} {} is not served",
                binding.spec.workload.api_version, binding.spec.workload.kind
            ),
        },
        (Some(_), Err(_)) => Observed {
            type_: "WorkloadProjected",
            ok: None,
            reason: "ServiceNotAvailable",
            message: "waiting for the service".into(),
        },
        (Some((api, resource)), Ok(secret)) => {
            let template = mapping_template(ctx, resource).await?;
            let projection = Projection {
                binding: binding.name_any(),
                name: binding
                    .spec
                    .name
                    .clone()
                    .unwrap_or_else(|| binding.name_any()),
                secret: secret.clone(),
                type_: binding.spec.type_.clone(),
                provider: binding.spec.provider.clone(),
                env: binding
                    .spec
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.key.clone()))
                    .collect(),
                containers: binding.spec.workload.containers.clone().unwrap_or_default(),
            };
            match sync_workloads(binding, api, Some(&projection), &[template]).await {
                Ok((_, failures)) if !failures.is_empty() => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadProjectionFailed",
                    message: failures.join("; "),
                },
                Ok((0, _)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadNotFound",
                    message: "no workload matches".into(),
                },
                Ok((n, _)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(true),
                    reason: "WorkloadProjected",
                    message: format!("projected into {n} workload(s)"),
                },
                Err(Error::Projector(e)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadProjectionFailed",
                    message: e.to_string(),
                },
                Err(e) => return Err(e),
            }
        }
    };
    let service = &observed[0];
    let ready = if service.ok != Some(true) {
        Observed {
            type_: "Ready",
            ok: Some(false),
            reason: service.reason,
            message: service.message.clone(),
        }
    } else {
        Observed {
            type_: "Ready",
            ok: Some(projected.ok == Some(true)),
            reason: if projected.ok == Some(true) {
                "Ready"
            } else {
                projected.reason
            },
            message: projected.message.clone(),
        }
    };
    observed.push(projected);
    observed.push(ready);
    let binding_secret = secret.ok().map(|name| LocalObjectReference { name });
    write_status(&api, binding, binding_secret, observed).await?;
    Ok(Action::requeue(RESYNC))
}

/// The Secret of the binding's service, or why there is none yet: (reason, message).
async fn service_secret(
    binding: &ServiceBinding,
    ctx: &Context,
    namespace: &str,
) -> Result<Result<String, (&'static str, String)>, Error> {
    let service = &binding.spec.service;
    if service.api_version == "v1" && service.kind == "Secret" {
        return Ok(Ok(service.name.clone()));
    }
    let gvk = gvk(&service.api_version, &service.kind);
    let Some(resource) = served(ctx, &gvk).await? else {
        return Ok(Err((
            "ServiceNotFound",
            format!("{} {} is not served", service.api_version, service.kind),
        )));
    };
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &resource);
    let Some(object) = api.get_opt(&service.name).await? else {
        return Ok(Err((
            "ServiceNotFound",
            format!("{} {} does not exist", service.kind, service.name),
        )));
    };
    Ok(
        match object
            .data
            .pointer("/status/binding/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(name) => Ok(name.to_owned()),
            None => Err((
                "ServiceMissingBinding",
                format!(
                    "{} {} has no .status.binding.name yet",
                    service.kind, service.name
                ),
            )),
        },
    )
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// The API resource of `gvk`, if the cluster serves it; its objects are watched from then on,
/// so that a change to one wakes the bindings that name it.
async fn served(ctx: &Context, gvk: &GroupVersionKind) -> Result<Option<ApiResource>, Error> {
    let resource = ctx.workloads.resource(&ctx.client, gvk).await?;
    if let Some(resource) = &resource {
        ctx.workloads.watch(&ctx.client, &ctx.scope, resource);
    }
    Ok(resource)
}

/// Whether the change of a watched object concerns `binding`: its service, a workload it
/// names or selects, or one that carries its projection.
fn concerns(binding: &ServiceBinding, change: &WorkloadChange) -> bool {
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

async fn workload_api(
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
async fn release_previous_kind(
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
        for failure in sync_workloads(binding, &api, None, &[]).await?.1 {
            tracing::warn!(binding = %binding.name_any(), %failure, "not unprojected");
        }
    }
    Ok(())
}

/// The mapping entry for `resource`: its ClusterWorkloadResourceMapping's, else the built-in
/// one, else the `PodSpec`-able default.
async fn mapping_template(ctx: &Context, resource: &ApiResource) -> Result<MappingTemplate, Error> {
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
async fn sync_workloads(
    binding: &ServiceBinding,
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
    for object in api.list(&ListParams::default()).await?.items {
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
        let wanted = templates.first().filter(|_| matched);
        if recorded.is_none() && wanted.is_none() {
            continue;
        }
        let before = serde_json::to_value(&object).expect("a JSON object");
        let mut after = before.clone();
        match edit(
            &mut after,
            binding,
            &record_key,
            recorded.as_ref(),
            wanted,
            projection,
        ) {
            Ok(true) => projected += 1,
            Ok(false) => {}
            // One workload that cannot be edited does not keep the others from being bound.
            Err(e) => {
                failures.push(format!("{}: {e}", object.name_any()));
                continue;
            }
        }
        patch(api, &object, &before, &after).await?;
    }
    Ok((projected, failures))
}

/// Unprojects the recorded projection from `workload` when it is not the wanted one, and
/// projects the wanted one; returns whether the workload carries the projection.
fn edit(
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

/// Sends the difference between `before` and `after`, if any, as a JSON patch that first tests
/// the `resourceVersion` it was computed from, so that an edit made meanwhile is never lost.
pub(crate) async fn patch(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    before: &Value,
    after: &Value,
) -> Result<(), Error> {
    let diff = json_patch::diff(before, after);
    if diff.0.is_empty() {
        return Ok(());
    }
    let mut operations = serde_json::to_value(&diff).expect("a JSON patch");
    if let Value::Array(ops) = &mut operations {
        ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/resourceVersion",
                   "value": object.metadata.resource_version}),
        );
    }
    let patch: json_patch::Patch = serde_json::from_value(operations).expect("a JSON patch");
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await?;
    Ok(())
}

async fn write_status(
    api: &Api<ServiceBinding>,
    binding: &ServiceBinding,
    secret: Option<LocalObjectReference>,
    observed: Vec<Observed>,
) -> Result<(), Error> {
    let old = binding.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let generation = binding.metadata.generation;
    let conditions = observed
        .into_iter()
        .map(|o| {
            let status = match o.ok {
                Some(true) => "True",
                Some(false) => "False",
                None => "Unknown",
            };
            let since = old
                .conditions
                .iter()
                .find(|c| c.type_ == o.type_ && c.status == status)
                .map_or(now.clone(), |c| c.last_transition_time.clone());
            Condition {
                type_: o.type_.into(),
                status: status.into(),
                reason: o.reason.into(),
                message: o.message,
                last_transition_time: since,
                observed_generation: generation,
            }
        })
        .collect();
    let status = ServiceBindingStatus {
        binding: secret.or(old.binding.clone()),
        conditions,
        observed_generation: generation,
    };
    if status == old {
        return Ok(());
    }
    api.patch_status(
        &binding.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}
