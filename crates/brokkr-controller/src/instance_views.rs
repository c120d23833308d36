//! What the bindings of an instance read of it, kept as a digest per instance, so that an
//! instance's change is handed to its bindings only when that changed — it came or went, became
//! Ready or failed, started or ended an operation, got its OSB ids or another plan — and not for
//! each of its other writes (its finalizer, a condition's message, what an upgrade offers).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use kube::runtime::watcher;

use crate::resources::{ConditionStatus, ServiceInstance};

/// The digests, by instance uid.
#[derive(Debug, Default)]
pub(crate) struct InstanceViews(Mutex<HashMap<String, u64>>);

impl InstanceViews {
    /// Takes note of `event`; whether it changes what the instance's bindings read (always for
    /// an instance that came or went; never for a relist, which wakes every binding anyway).
    pub(crate) fn concerns_bindings(&self, event: &watcher::Event<ServiceInstance>) -> bool {
        let mut views = self.0.lock().expect("lock");
        match event {
            watcher::Event::Apply(instance) | watcher::Event::InitApply(instance) => {
                let Some(uid) = instance.metadata.uid.clone() else {
                    return true;
                };
                let digest = digest(instance);
                let before = views.insert(uid, digest);
                matches!(event, watcher::Event::Apply(_)) && before != Some(digest)
            }
            watcher::Event::Delete(instance) => {
                if let Some(uid) = &instance.metadata.uid {
                    views.remove(uid);
                }
                true
            }
            watcher::Event::Init | watcher::Event::InitDone => false,
        }
    }
}

/// A digest of what a binding reads of its instance.
fn digest(instance: &ServiceInstance) -> u64 {
    let status = instance.status.clone().unwrap_or_default();
    let condition = |type_: &str| {
        (status.conditions.iter())
            .find(|c| c.type_ == type_)
            .map(|c| c.status == ConditionStatus::True)
    };
    let external = status.external_properties.as_ref();
    let mut hasher = DefaultHasher::new();
    (
        instance.metadata.deletion_timestamp.is_some(),
        instance.metadata.generation,
        condition("Ready"),
        condition("Failed"),
        status.async_op_in_progress,
        status.last_condition_state == "Provisioning",
        &status.external_id,
        &status.service_class_external_id,
        external.and_then(|p| p.cluster_service_plan_external_id.as_ref()),
        external.and_then(|p| p.service_plan_external_id.as_ref()),
        &status.provision_status,
    )
        .hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Condition, ServiceInstanceStatus};

    fn instance(ready: bool, message: &str) -> ServiceInstance {
        let mut i = ServiceInstance::new("db", Default::default());
        i.metadata.uid = Some("u1".into());
        i.metadata.namespace = Some("ns".into());
        i.status = Some(ServiceInstanceStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: match ready {
                    true => ConditionStatus::True,
                    false => ConditionStatus::False,
                },
                message: message.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        i
    }

    #[test]
    fn only_what_bindings_read_concerns_them() {
        let views = InstanceViews::default();
        let apply = |i: ServiceInstance| views.concerns_bindings(&watcher::Event::Apply(i));
        assert!(apply(instance(false, "provisioning")), "a new instance");
        assert!(!apply(instance(false, "still provisioning")), "a message");
        let mut finalized = instance(false, "still provisioning");
        finalized.metadata.finalizers = Some(vec!["f".into()]);
        assert!(!apply(finalized), "a finalizer");
        assert!(apply(instance(true, "ready")), "Ready");
        let deleted = watcher::Event::Delete(instance(true, "ready"));
        assert!(views.concerns_bindings(&deleted));
        // A relist records what it lists, and hands nothing on by itself.
        let listed = watcher::Event::InitApply(instance(true, "ready"));
        assert!(!views.concerns_bindings(&listed));
        assert!(!apply(instance(true, "ready again")));
    }
}
