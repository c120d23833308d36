//! The ServiceBindingUsage controller: injects the Secret of a brokkr ServiceBinding into the
//! workload a usage names, through the [`projector`], and removes exactly that
//! injection when the usage goes or names another workload.
//!
//! A usage waits, with its `Ready` condition saying why (`ServiceBindingNotReady`,
//! `SecretNotFound`, `UsageKindNotFound`, `InvalidUsageKind`, `TargetNotFound`), until the
//! binding has a Secret, the UsageKind exists and the workload exists; then it is `Injected`.
//! The usage gets an ownerReference to its ServiceBinding (deleting the binding deletes its
//! usages) and a finalizer under which the injection is removed. `status.injected` records the
//! workload and the mapping used, so a removal uses them even after `usedBy` or the UsageKind
//! changed. The workload is changed with a JSON patch of exactly the projector's edit, guarded
//! by a `test` of its `resourceVersion`: a concurrent change makes it fail and retry, and
//! everybody else's fields are kept.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::cache::{self, BindingChange, Seen};
use crate::context::Context;
use crate::finalizer;
use crate::platform;
use crate::projector::{self, Injection, Mapping};
use crate::resources::{
    ConditionStatus, InjectedTarget, ServiceBinding, ServiceBindingUsage,
    ServiceBindingUsageStatus, UsageCondition, UsageKind, UsageKindResource, UsageKindSpec,
    WorkloadMapping,
};

/// The finalizer under which a usage's injection is removed.
pub const FINALIZER: &str = "services.brokkr.dev/service-binding-usage";
/// How soon a waiting usage looks again, at first: the pause grows with the wait (a tenth of it)
/// up to [`MAX_RECHECK`], so that a usage whose workload is deployed much later costs little.
const RECHECK: Duration = Duration::from_secs(10);
/// The longest pause between two looks of a waiting usage.
const MAX_RECHECK: Duration = Duration::from_secs(120);
/// How often an injected usage checks its workload still carries the injection (a change to
/// the workload wakes it at once: this is a safety net).
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// Why a reconcile failed: the API server, or a workload the projector cannot edit (the same
/// failures as a servicebinding.io projection's).
pub use crate::workloads::Error;

/// Reconciles one ServiceBindingUsage.
pub async fn reconcile(
    usage: Arc<ServiceBindingUsage>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let result = reconcile_inner(&usage, &ctx).await;
    ctx.metrics
        .reconciled("ServiceBindingUsage", result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %usage.namespace().unwrap_or_default(), usage = %usage.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceBindingUsage>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

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

/// The ServiceBindingUsage controller, after creating the shipped UsageKinds that are missing.
/// A usage is looked at again when its ServiceBinding, that binding's Secret or its UsageKind
/// changes: bindings and Secrets as the context's caches follow them ([`crate::cache`]; the
/// caller starts them), from the moment `run` is called.
pub fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let bindings = ctx.caches.binding_changes();
    let secrets = ctx.caches.secret_changes();
    async move {
        if let Err(e) = create_shipped_usage_kinds(&ctx.client).await {
            tracing::warn!(error = %e, "creating the shipped UsageKinds");
        }
        following(ctx, bindings, secrets, shutdown).await;
    }
}

/// The controller of [`run`], woken by `bindings` and `secrets`.
async fn following(
    ctx: Arc<Context>,
    bindings: impl futures::Stream<Item = Seen<Arc<BindingChange>>> + Send + 'static,
    secrets: impl futures::Stream<Item = Seen<Arc<PartialObjectMeta<Secret>>>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let client = &ctx.client.clone();
    let controller = ctx.controller(
        ctx.scope.api::<ServiceBindingUsage>(client),
        ctx.scope.watch_config(),
    );
    let usages = controller.store();
    let of_kinds = usages.clone();
    let controller = controller
        .reconcile_on(cache::waking(usages.clone(), bindings, |usages, change| {
            let (namespace, name) = (&change.binding.namespace, &change.binding.name);
            cache::woken(usages, |u| {
                u.metadata.namespace == *namespace && u.spec.service_binding_ref.name == *name
            })
        }))
        .reconcile_on(cache::waking(usages.clone(), secrets, |usages, secret| {
            let namespace = secret.namespace();
            let owners: Vec<String> = secret
                .owner_references()
                .iter()
                .filter(|o| {
                    o.kind == "ServiceBinding" && o.api_version.starts_with(crate::resources::GROUP)
                })
                .map(|o| o.name.clone())
                .collect();
            cache::woken(usages, |u| {
                u.namespace() == namespace && owners.contains(&u.spec.service_binding_ref.name)
            })
        }))
        .watches(
            Api::<UsageKind>::all(client.clone()),
            watcher::Config::default(),
            move |kind| {
                let name = kind.name_any();
                cache::woken(&of_kinds, |u| u.spec.used_by.kind == name)
            },
        )
        // A workload that appears, goes or changes wakes the usages that name it.
        .reconcile_on(cache::waking(
            usages,
            ctx.workloads.changes(),
            |usages, change| {
                let (namespace, name) = (&change.metadata.namespace, &change.metadata.name);
                cache::woken(usages, |u| {
                    u.metadata.namespace == *namespace
                        && Some(&u.spec.used_by.name) == name.as_ref()
                })
            },
        ))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "usage controller");
            }
        });
    crate::context::stopping_on(controller, shutdown).await;
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

/// Where a usage stands, for its `Ready` condition.
struct Outcome {
    status: ConditionStatus,
    reason: &'static str,
    message: String,
}

fn waiting(reason: &'static str, message: String) -> Outcome {
    Outcome {
        status: ConditionStatus::False,
        reason,
        message,
    }
}

async fn reconcile_inner(usage: &ServiceBindingUsage, ctx: &Context) -> Result<Action, Error> {
    let namespace = usage.namespace().unwrap_or_default();
    let api = Api::<ServiceBindingUsage>::namespaced(ctx.client.clone(), &namespace);
    let mut status = usage.status.clone().unwrap_or_default();

    if usage.metadata.deletion_timestamp.is_some() {
        if let Some(target) = &status.injected {
            match remove(ctx, &namespace, &usage.name_any(), target).await {
                // A workload nobody can edit back would keep the usage forever: let it go.
                Err(Error::Projector(e)) => {
                    tracing::warn!(usage = %usage.name_any(), error = %e, "injection not removed");
                }
                result => result?,
            }
        }
        finalizer::remove(&api, usage, FINALIZER).await?;
        return Ok(Action::await_change());
    }
    finalizer::add(&api, usage, FINALIZER).await?;

    let (outcome, action) = inject(usage, ctx, &namespace, &mut status).await?;
    write_status(&api, usage, status, outcome).await?;
    Ok(action)
}

/// The pause before a usage that has waited `waited` looks again.
fn recheck_after(waited: Duration) -> Duration {
    (waited / 10).clamp(RECHECK, MAX_RECHECK)
}

/// Injects, or says what it waits for; `status.injected` follows what the workload carries.
async fn inject(
    usage: &ServiceBindingUsage,
    ctx: &Context,
    namespace: &str,
    status: &mut ServiceBindingUsageStatus,
) -> Result<(Outcome, Action), Error> {
    let name = usage.name_any();
    let waited = platform::elapsed_since(
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
            .and_then(|c| c.last_transition_time.as_ref()),
    );
    let wait = |outcome| Ok((outcome, Action::requeue(recheck_after(waited))));

    let bindings = Api::<ServiceBinding>::namespaced(ctx.client.clone(), namespace);
    let binding_name = &usage.spec.service_binding_ref.name;
    let Some(binding) = bindings.get_opt(binding_name).await? else {
        return wait(waiting(
            "ServiceBindingNotReady",
            format!("ServiceBinding {binding_name} does not exist"),
        ));
    };
    own(usage, &binding, ctx, namespace).await?;
    let Some(secret_name) = binding
        .status
        .as_ref()
        .and_then(|s| s.binding.as_ref())
        .map(|b| b.name.clone())
    else {
        return wait(waiting(
            "ServiceBindingNotReady",
            format!("ServiceBinding {binding_name} has no Secret yet"),
        ));
    };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    let Some(secret) = secrets.get_opt(&secret_name).await? else {
        return wait(waiting(
            "SecretNotFound",
            format!("Secret {secret_name} of ServiceBinding {binding_name} does not exist"),
        ));
    };

    let kind_name = &usage.spec.used_by.kind;
    let Some(kind) = Api::<UsageKind>::all(ctx.client.clone())
        .get_opt(kind_name)
        .await?
    else {
        return wait(waiting(
            "UsageKindNotFound",
            format!("UsageKind {kind_name} does not exist"),
        ));
    };
    let wanted = InjectedTarget {
        resource: kind.spec.resource.clone(),
        name: usage.spec.used_by.name.clone(),
        mapping: kind.spec.mapping.clone(),
    };
    let mapping = match wanted.mapping.mapping() {
        Ok(mapping) => mapping,
        Err(e) => {
            return wait(waiting(
                "InvalidUsageKind",
                format!("UsageKind {kind_name}: {e}"),
            ));
        }
    };

    // Another workload, or the same one through another mapping: remove the old injection first.
    if let Some(old) = status.injected.clone().filter(|old| *old != wanted) {
        remove(ctx, namespace, &name, &old).await?;
        status.injected = None;
    }

    let Some((workloads, workload)) = workload(ctx, namespace, &wanted).await? else {
        return wait(waiting(
            "TargetNotFound",
            format!("{} {} does not exist", wanted.resource.kind, wanted.name),
        ));
    };
    let injection = Injection {
        usage: name.clone(),
        secret: secret_name.clone(),
        prefix: usage.spec.env_prefix().to_owned(),
        digest: projector::secret_digest(secret.data.as_ref()),
    };
    // Recorded before the workload changes, so that a failure in between still leaves the way
    // back to removing it.
    let recorded = usage.status.as_ref().and_then(|s| s.injected.as_ref());
    if recorded != Some(&wanted) {
        Api::<ServiceBindingUsage>::namespaced(ctx.client.clone(), namespace)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"injected": injected_patch(Some(&wanted))}})),
            )
            .await?;
    }
    status.injected = Some(wanted.clone());
    edit(&workloads, &workload, |w| {
        projector::inject(w, &mapping, &injection)
    })
    .await?;
    Ok((
        Outcome {
            status: ConditionStatus::True,
            reason: "Injected",
            message: format!(
                "Secret {secret_name} is injected into {} {}",
                wanted.resource.kind, wanted.name
            ),
        },
        Action::requeue(RESYNC),
    ))
}

/// The workload `target` names and an API for its kind, if both exist.
async fn workload(
    ctx: &Context,
    namespace: &str,
    target: &InjectedTarget,
) -> Result<Option<(Api<DynamicObject>, DynamicObject)>, Error> {
    let gvk = GroupVersionKind::gvk(
        &target.resource.group,
        &target.resource.version,
        &target.resource.kind,
    );
    // A kind not served (yet) is as good as a missing workload.
    let Some(resource) = ctx.workloads.resource(&ctx.client, &gvk).await? else {
        return Ok(None);
    };
    ctx.workloads.watch(&ctx.client, &ctx.scope, &resource);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &resource);
    Ok(api.get_opt(&target.name).await?.map(|w| (api, w)))
}

/// Removes the usage `usage`'s injection from `target`, if the workload is still there.
async fn remove(
    ctx: &Context,
    namespace: &str,
    usage: &str,
    target: &InjectedTarget,
) -> Result<(), Error> {
    let Some((api, workload)) = workload(ctx, namespace, target).await? else {
        return Ok(());
    };
    let mapping: Mapping = target.mapping.mapping().map_err(projector::Error::from)?;
    edit(&api, &workload, |w| projector::uninject(w, &mapping, usage)).await
}

/// Applies `change` to `workload` and sends exactly the difference, if there is one, as a JSON
/// patch that first tests the `resourceVersion` it was computed from.
async fn edit(
    api: &Api<DynamicObject>,
    workload: &DynamicObject,
    change: impl FnOnce(&mut Value) -> Result<(), projector::Error>,
) -> Result<(), Error> {
    let before = serde_json::to_value(workload).expect("a JSON object");
    let mut after = before.clone();
    change(&mut after)?;
    crate::workloads::patch(api, workload, &before, &after).await
}

/// Makes `binding` an owner of `usage`, so that deleting the binding deletes its usages.
async fn own(
    usage: &ServiceBindingUsage,
    binding: &ServiceBinding,
    ctx: &Context,
    namespace: &str,
) -> Result<(), Error> {
    let Some(uid) = binding.meta().uid.clone() else {
        return Ok(());
    };
    let mut owners = usage.owner_references().to_vec();
    if owners.iter().any(|o| o.uid == uid) {
        return Ok(());
    }
    owners.push(OwnerReference {
        api_version: ServiceBinding::api_version(&()).into_owned(),
        kind: ServiceBinding::kind(&()).into_owned(),
        name: binding.name_any(),
        uid,
        controller: None,
        block_owner_deletion: None,
    });
    Api::<ServiceBindingUsage>::namespaced(ctx.client.clone(), namespace)
        .patch(
            &usage.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "ownerReferences": owners,
                "resourceVersion": usage.metadata.resource_version,
            }})),
        )
        .await?;
    Ok(())
}

/// Writes the status when anything but its times changed.
async fn write_status(
    api: &Api<ServiceBindingUsage>,
    usage: &ServiceBindingUsage,
    mut status: ServiceBindingUsageStatus,
    outcome: Outcome,
) -> Result<(), Error> {
    let old = usage.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let condition = UsageCondition {
        type_: "Ready".into(),
        status: outcome.status,
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
        reason: outcome.reason.into(),
        message: outcome.message,
    };
    match status.conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(c) => {
            let same = c.status == condition.status;
            let since = c.last_transition_time.clone();
            *c = UsageCondition {
                last_transition_time: if same {
                    since
                } else {
                    condition.last_transition_time
                },
                ..condition
            };
        }
        None => status.conditions.push(condition),
    }
    status.observed_generation = usage.metadata.generation;
    let unchanged = |s: &ServiceBindingUsageStatus| {
        let mut s = s.clone();
        s.last_update_time = None;
        for c in &mut s.conditions {
            c.last_update_time = None;
            c.last_transition_time = None;
        }
        s
    };
    if unchanged(&old) == unchanged(&status) {
        return Ok(());
    }
    status.last_update_time = Some(now);
    let mut value = serde_json::to_value(&status).expect("a status");
    if let Value::Object(fields) = &mut value {
        fields.insert("injected".into(), injected_patch(status.injected.as_ref()));
    }
    api.patch_status(
        &usage.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": value })),
    )
    .await?;
    Ok(())
}

/// `status.injected` for a JSON merge patch: a field the target leaves out is cleared, not kept
/// from the last one.
fn injected_patch(target: Option<&InjectedTarget>) -> Value {
    let Some(target) = target else {
        return Value::Null;
    };
    let mut value = serde_json::to_value(target).expect("a target");
    if let Value::Object(fields) = &mut value {
        for optional in ["podTemplatePath", "annotationsPath", "containers"] {
            fields.entry(optional).or_insert(Value::Null);
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::recheck_after;

    #[test]
    fn a_waiting_usage_looks_again_less_often_the_longer_it_waits() {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(recheck_after(Duration::ZERO), Duration::from_secs(10));
        assert_eq!(recheck_after(minutes(5)), Duration::from_secs(30));
        assert_eq!(recheck_after(minutes(20)), Duration::from_secs(120));
        assert_eq!(recheck_after(minutes(60 * 24)), Duration::from_secs(120));
    }
}
