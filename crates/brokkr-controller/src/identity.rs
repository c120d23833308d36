//! The OSB ids of instances and bindings: recorded, never re-read.
//!
//! A tenant can edit every field of its resources' specs, so an id taken from the spec on each
//! reconcile would let it point its own resource at another tenant's instance. The controllers
//! therefore record, in status (which tenants cannot write), the ids they first called the broker
//! with — an instance's OSB id and its class's service id, a binding's OSB id and the instance
//! it was bound to — and from then on use only those. A spec that no longer agrees with the
//! record is refused with a condition that says what to change back; the CustomResourceDefinitions
//! also make those fields immutable where the API server checks CEL rules (Kubernetes 1.25+).
//!
//! Instances and bindings provisioned before the record existed get it at their next reconcile,
//! from the spec as it is then.

use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;

use crate::resources::{
    BoundInstance, DeprovisionStatus, ProvisionStatus, ServiceBinding, ServiceInstance,
    ServiceInstanceStatus, UnbindStatus, valid_external_id,
};

/// Condition reason: the spec names other ids than those recorded.
pub const CHANGED: &str = "ExternalIDChanged";
/// Condition reason: `spec.externalID` is not an id the OSB API can carry.
pub const INVALID: &str = "InvalidExternalID";
/// Condition reason: another ServiceInstance already has that OSB instance id.
pub const IN_USE: &str = "ExternalIDInUse";

/// The OSB instance id of `instance`: the recorded one, else `spec.externalID`, else its uid.
pub fn instance_id(instance: &ServiceInstance) -> String {
    recorded_instance_id(instance)
        .map(str::to_owned)
        .unwrap_or_else(|| wanted_instance_id(instance))
}

/// The OSB binding id of `binding`: the recorded one, else `spec.externalID`, else its uid.
pub fn binding_id(binding: &ServiceBinding) -> String {
    binding
        .status
        .as_ref()
        .and_then(|s| s.external_id.clone())
        .or_else(|| binding.spec.external_id.clone())
        .unwrap_or_else(|| binding.uid().unwrap_or_default())
}

/// The name of the ServiceInstance a binding is for: the one it was bound to, else
/// `spec.instanceRef`.
pub fn bound_instance_name(binding: &ServiceBinding) -> &str {
    binding
        .status
        .as_ref()
        .and_then(|s| s.instance.as_ref())
        .map_or(&binding.spec.instance_ref.name, |i| &i.name)
}

fn recorded_instance_id(instance: &ServiceInstance) -> Option<&str> {
    instance.status.as_ref()?.external_id.as_deref()
}

fn wanted_instance_id(instance: &ServiceInstance) -> String {
    instance
        .spec
        .external_id
        .clone()
        .unwrap_or_else(|| instance.uid().unwrap_or_default())
}

/// Whether the broker may have something of `status`'s instance: a call was made.
fn instance_called(status: &ServiceInstanceStatus) -> bool {
    status.provision_status == Some(ProvisionStatus::Provisioned)
        || status.async_op_in_progress
        || status.orphan_mitigation_in_progress
        || matches!(
            status.deprovision_status,
            Some(DeprovisionStatus::Required | DeprovisionStatus::Failed)
        )
}

/// Why the instance's spec cannot be acted on, as a condition's reason and message; `None` when
/// it agrees with what is recorded. `class_id` is the service id of the class the spec names
/// now, when it resolves. An instance being deleted is deprovisioned with its recorded id
/// whatever its spec says now; only a changed class stops that (the deprovision call names the
/// class).
pub fn instance_mismatch(
    instance: &ServiceInstance,
    class_id: Option<&str>,
) -> Option<(&'static str, String)> {
    let status = instance.status.as_ref();
    let recorded = status.and_then(|s| s.external_id.as_deref());
    let deleting = instance.metadata.deletion_timestamp.is_some();
    if deleting {
        // Only the class matters, below.
    } else if let Some(recorded) = recorded {
        if instance
            .spec
            .external_id
            .as_deref()
            .is_some_and(|id| id != recorded)
        {
            return Some((
                CHANGED,
                format!(
                    "spec.externalID was changed after the instance was provisioned as {recorded:?}; the controller only ever uses that id: change spec.externalID back (or remove it, if it was never set)"
                ),
            ));
        }
        if instance.spec.external_id.is_none() && instance.uid().as_deref() != Some(recorded) {
            return Some((
                CHANGED,
                format!(
                    "spec.externalID was removed after the instance was provisioned as {recorded:?}: set it back"
                ),
            ));
        }
    } else if let Some(id) = &instance.spec.external_id
        && !valid_external_id(id)
    {
        return Some(invalid(id));
    }
    let recorded_class = status.and_then(|s| s.service_class_external_id.as_deref());
    if let (Some(recorded), Some(now)) = (recorded_class, class_id)
        && recorded != now
    {
        return Some((
            CHANGED,
            format!(
                "the instance's class was changed after it was provisioned; a class cannot change: name the class it was provisioned from again{}",
                if deleting {
                    " (or annotate the instance with services.brokkr.dev/abandon=true to release it without deprovisioning)"
                } else {
                    ""
                }
            ),
        ));
    }
    None
}

/// The refusal of a `spec.externalID` the OSB API cannot carry.
fn invalid(id: &str) -> (&'static str, String) {
    (
        INVALID,
        format!(
            "spec.externalID {id:?} is not an OSB id: use letters, digits and '-._~', not starting with '.', at most {} characters",
            crate::resources::EXTERNAL_ID_MAX_LEN
        ),
    )
}

/// Records the ids the broker is about to be (or, for instances from before the record
/// existed, was) called with. Returns whether `status` changed.
pub fn record_instance(
    instance: &ServiceInstance,
    status: &mut ServiceInstanceStatus,
    class_id: &str,
) -> bool {
    let mut changed = false;
    if status.external_id.is_none() {
        status.external_id = Some(wanted_instance_id(instance));
        changed = true;
    }
    if status.service_class_external_id.is_none() {
        status.service_class_external_id = Some(class_id.to_owned());
        changed = true;
    }
    changed
}

/// Records the ids of an instance the broker already has (it was provisioned before the
/// record existed). Returns whether `status` changed.
pub fn adopt_instance(
    instance: &ServiceInstance,
    status: &mut ServiceInstanceStatus,
    class_id: &str,
) -> bool {
    instance_called(status) && record_instance(instance, status, class_id)
}

/// Whether an instance other than `instance` is among `holders`, the instances that have, or
/// will be provisioned with, its OSB id ([`crate::cache::Caches::instances_with_id`]).
pub fn instance_id_in_use(
    holders: &[ObjectRef<ServiceInstance>],
    instance: &ServiceInstance,
) -> bool {
    let itself = ObjectRef::from_obj(instance);
    holders.iter().any(|other| *other != itself)
}

/// Why the binding cannot be acted on with `instance` (the instance of the name it is bound
/// to), as a condition's reason and message; `None` when the spec and the instance agree with
/// the record.
pub fn binding_mismatch(
    binding: &ServiceBinding,
    instance: Option<&ServiceInstance>,
) -> Option<(&'static str, String)> {
    let status = binding.status.as_ref();
    if let Some(recorded) = status.and_then(|s| s.external_id.as_deref()) {
        let spec = binding.spec.external_id.as_deref();
        if spec.is_some_and(|id| id != recorded)
            || (spec.is_none() && binding.uid().as_deref() != Some(recorded))
        {
            return Some((
                CHANGED,
                format!(
                    "spec.externalID was changed after the binding was bound as {recorded:?}; the controller only ever uses that id: change it back"
                ),
            ));
        }
    } else if let Some(id) = &binding.spec.external_id
        && !valid_external_id(id)
    {
        return Some(invalid(id));
    }
    let bound = status.and_then(|s| s.instance.as_ref())?;
    if binding.spec.instance_ref.name != bound.name {
        return Some((
            CHANGED,
            format!(
                "spec.instanceRef was changed after the binding was bound to the ServiceInstance {:?}: change it back",
                bound.name
            ),
        ));
    }
    instance
        .and_then(|instance| instance_replaced(binding, instance))
        .map(|message| (CHANGED, message))
}

/// Why `instance`, of the name the binding was bound to, is not the instance it was bound to
/// (it was deleted and created again); `None` when it is, or nothing is recorded.
pub fn instance_replaced(binding: &ServiceBinding, instance: &ServiceInstance) -> Option<String> {
    let bound = binding.status.as_ref()?.instance.as_ref()?;
    (instance_id(instance) != bound.external_id).then(|| {
        format!(
            "the ServiceInstance {:?} was re-created since this binding was bound: the binding belongs to the instance that is gone; delete it (with the services.brokkr.dev/abandon annotation if the broker no longer has that instance)",
            bound.name
        )
    })
}

/// Records the ids of a bind about to be made with `instance` (or, for bindings from before
/// the record existed, made). Returns whether the status changed.
pub fn record_binding(
    binding: &ServiceBinding,
    status: &mut crate::resources::ServiceBindingStatus,
    instance: &ServiceInstance,
) -> bool {
    let mut changed = false;
    if status.external_id.is_none() {
        status.external_id = Some(binding_id(binding));
        changed = true;
    }
    if status.instance.is_none() {
        status.instance = Some(BoundInstance {
            name: binding.spec.instance_ref.name.clone(),
            external_id: instance_id(instance),
        });
        changed = true;
    }
    changed
}

/// Whether the broker may have something of the binding: a call was made.
pub fn binding_called(status: &crate::resources::ServiceBindingStatus) -> bool {
    matches!(
        status.unbind_status,
        Some(UnbindStatus::Required | UnbindStatus::Failed)
    ) || status.async_op_in_progress
        || status.orphan_mitigation_in_progress
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ServiceInstanceSpec, ServiceInstanceStatus};

    fn instance(spec_id: Option<&str>, recorded: Option<&str>) -> ServiceInstance {
        let mut i = ServiceInstance::new(
            "db",
            ServiceInstanceSpec {
                external_id: spec_id.map(Into::into),
                ..Default::default()
            },
        );
        i.metadata.uid = Some("uid-1".into());
        i.status = Some(ServiceInstanceStatus {
            external_id: recorded.map(Into::into),
            service_class_external_id: recorded.map(|_| "class-1".into()),
            ..Default::default()
        });
        i
    }

    #[test]
    fn the_recorded_id_wins_over_an_edited_spec() {
        let edited = instance(Some("victim"), Some("mine"));
        assert_eq!(instance_id(&edited), "mine");
        assert_eq!(
            instance_mismatch(&edited, Some("class-1")).unwrap().0,
            CHANGED
        );
        let added = instance(Some("victim"), Some("uid-1"));
        assert_eq!(
            instance_mismatch(&added, Some("class-1")).unwrap().0,
            CHANGED
        );
        let removed = instance(None, Some("chosen"));
        assert_eq!(
            instance_mismatch(&removed, Some("class-1")).unwrap().0,
            CHANGED
        );
        let kept = instance(Some("mine"), Some("mine"));
        assert_eq!(instance_mismatch(&kept, Some("class-1")), None);
    }

    #[test]
    fn an_instance_being_deleted_is_deprovisioned_with_its_recorded_id() {
        let mut edited = instance(Some("victim"), Some("mine"));
        edited.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(instance_mismatch(&edited, Some("class-1")), None);
        assert_eq!(instance_id(&edited), "mine");
        assert_eq!(
            instance_mismatch(&edited, Some("class-2")).unwrap().0,
            CHANGED
        );
    }

    #[test]
    fn a_changed_class_is_refused() {
        let i = instance(None, Some("uid-1"));
        assert_eq!(instance_mismatch(&i, Some("class-2")).unwrap().0, CHANGED);
        assert_eq!(instance_mismatch(&i, None), None);
    }

    #[test]
    fn ids_the_osb_path_cannot_carry_are_refused_before_any_call() {
        for bad in ["", ".", "..", "../x", "a/b", "a b", "%2e%2e"] {
            let i = instance(Some(bad), None);
            assert_eq!(instance_mismatch(&i, None).unwrap().0, INVALID, "{bad:?}");
        }
        let ok = instance(Some("3f0e-4c.9_~"), None);
        assert_eq!(instance_mismatch(&ok, None), None);
    }

    #[test]
    fn an_instance_is_recorded_once_with_the_id_it_asks_for() {
        let i = instance(Some("chosen"), None);
        let mut status = ServiceInstanceStatus::default();
        assert!(!adopt_instance(&i, &mut status, "class-1"), "never called");
        assert!(record_instance(&i, &mut status, "class-1"));
        assert_eq!(status.external_id.as_deref(), Some("chosen"));
        assert!(!record_instance(&i, &mut status, "class-2"));
        assert_eq!(status.service_class_external_id.as_deref(), Some("class-1"));
    }
}
