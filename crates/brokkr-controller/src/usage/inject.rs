//! Injecting a binding's Secret into the workload a usage names, and removing exactly that
//! injection: through the projector, with a JSON patch guarded by the workload's
//! `resourceVersion`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use super::status::{Outcome, injected_patch, waiting};
use crate::context::Context;
use crate::platform;
use crate::projector::{self, Injection, Mapping};
use crate::resources::{
    ConditionStatus, InjectedTarget, ServiceBinding, ServiceBindingUsage,
    ServiceBindingUsageStatus, UsageKind,
};
use crate::workloads::{Editor, Error};

/// The controller's name in its metrics.
pub(super) const CONTROLLER: &str = "ServiceBindingUsage";
/// How soon a waiting usage looks again, at first: the pause grows with the wait (a tenth of it)
/// up to [`MAX_RECHECK`], so that a usage whose workload is deployed much later costs little.
pub(super) const RECHECK: Duration = Duration::from_secs(10);
/// The longest pause between two looks of a waiting usage.
const MAX_RECHECK: Duration = Duration::from_secs(120);
/// How often an injected usage checks its workload still carries the injection (a change to
/// the workload wakes it at once: this is a safety net).
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// The pause before a usage that has waited `waited` looks again.
pub(super) fn recheck_after(waited: Duration) -> Duration {
    (waited / 10).clamp(RECHECK, MAX_RECHECK)
}

/// Injects, or says what it waits for; `status.injected` follows what the workload carries.
pub(super) async fn inject(
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
    edit(ctx, &workloads, workload, |w| {
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
pub(super) async fn workload(
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
pub(super) async fn remove(
    ctx: &Context,
    namespace: &str,
    usage: &str,
    target: &InjectedTarget,
) -> Result<(), Error> {
    let Some((api, workload)) = workload(ctx, namespace, target).await? else {
        return Ok(());
    };
    let mapping: Mapping = target.mapping.mapping().map_err(projector::Error::from)?;
    edit(ctx, &api, workload, |w| {
        projector::uninject(w, &mapping, usage)
    })
    .await
}

/// Applies `change` to `workload` and sends exactly the difference, if there is one, as a JSON
/// patch that first tests the `resourceVersion` it was computed from; made anew on the workload
/// as read again when another writer changed it in between ([`crate::workloads::edit`]).
pub(super) async fn edit(
    ctx: &Context,
    api: &Api<DynamicObject>,
    workload: DynamicObject,
    change: impl Fn(&mut Value) -> Result<(), projector::Error>,
) -> Result<(), Error> {
    let editor = Editor {
        metrics: &ctx.metrics,
        controller: CONTROLLER,
    };
    crate::workloads::edit(api, workload, editor, |_, w| change(w)).await?;
    Ok(())
}

/// Makes `binding` an owner of `usage`, so that deleting the binding deletes its usages.
pub(super) async fn own(
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
