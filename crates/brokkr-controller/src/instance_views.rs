//! What the bindings of an instance read of it, kept as a digest per instance, so that an
//! instance's change is handed to its bindings only when that changed — it came or went, became
//! Ready or failed, stopped being on its way to Ready; once Ready, started or ended an operation,
//! got other OSB ids or another plan — and not for each of its other writes (its finalizer, the
//! ids recorded before its provision, a condition's message, what an upgrade offers).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use kube::runtime::watcher;

use crate::conditions::is_true;
use crate::resources::{ServiceInstance, ServiceInstanceStatus};
use crate::status::uid_key;

/// The digests, by instance uid ([`uid_key`]).
#[derive(Debug, Default)]
pub(crate) struct InstanceViews(Mutex<HashMap<u128, u64>>);

impl InstanceViews {
    /// Takes note of `event`; whether it changes what the instance's bindings read (always for
    /// an instance that came or went; never for a relist, which wakes every binding anyway).
    pub(crate) fn concerns_bindings(&self, event: &watcher::Event<ServiceInstance>) -> bool {
        let mut views = self.0.lock().expect("lock");
        match event {
            watcher::Event::Apply(instance) | watcher::Event::InitApply(instance) => {
                let Some(uid) = instance.metadata.uid.as_deref().map(uid_key) else {
                    return true;
                };
                let digest = digest(instance);
                let before = views.insert(uid, digest);
                matches!(event, watcher::Event::Apply(_)) && before != Some(digest)
            }
            watcher::Event::Delete(instance) => {
                if let Some(uid) = instance.metadata.uid.as_deref().map(uid_key) {
                    views.remove(&uid);
                }
                true
            }
            watcher::Event::Init | watcher::Event::InitDone => false,
        }
    }
}

/// Whether `instance` is on its way to Ready, as far as a binding waiting for it can tell: not
/// Ready, not failed, not being deleted, and it has not said anything yet (its controller has
/// not reached it) or says it is being provisioned. Its own status tells the user how that
/// goes; a binding waiting for it need not.
pub(crate) fn on_its_way(instance: &ServiceInstance) -> bool {
    let none = ServiceInstanceStatus::default();
    let status = instance.status.as_ref().unwrap_or(&none);
    instance.metadata.deletion_timestamp.is_none()
        && !is_true(&status.conditions, "Ready")
        && !is_true(&status.conditions, "Failed")
        && (status.async_op_in_progress
            || status.last_condition_state == "Provisioning"
            || !status.conditions.iter().any(|c| c.type_ == "Ready"))
}

/// A digest of what a binding reads of its instance. Until the instance is Ready a binding only
/// waits, and reads whether the instance goes, failed, or is on its way; once it is Ready, the
/// binding binds with its ids and plan, and an operation of the instance concerns it.
fn digest(instance: &ServiceInstance) -> u64 {
    let none = ServiceInstanceStatus::default();
    let status = instance.status.as_ref().unwrap_or(&none);
    let deleting = instance.metadata.deletion_timestamp.is_some();
    let ready = is_true(&status.conditions, "Ready");
    let failed = is_true(&status.conditions, "Failed");
    let mut hasher = DefaultHasher::new();
    (deleting, ready, failed).hash(&mut hasher);
    if !ready {
        on_its_way(instance).hash(&mut hasher);
        return hasher.finish();
    }
    let external = status.external_properties.as_ref();
    (
        instance.metadata.generation,
        status.async_op_in_progress,
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
    use crate::resources::{Condition, ConditionStatus};

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

    #[test]
    fn an_instance_on_its_way_concerns_its_bindings_once_it_is_ready_or_stops() {
        let views = InstanceViews::default();
        let apply = |i: ServiceInstance| views.concerns_bindings(&watcher::Event::Apply(i));
        let mut unsaid = instance(false, "");
        unsaid.status = None;
        assert!(apply(unsaid), "a new instance");
        // Its ids recorded before the provision, then the operation it started.
        let mut provisioning = instance(false, "The instance is being provisioned");
        let status = provisioning.status.as_mut().unwrap();
        status.external_id = Some("id".into());
        status.last_condition_state = "Provisioning".into();
        assert!(!apply(provisioning.clone()), "the ids recorded");
        provisioning.status.as_mut().unwrap().async_op_in_progress = true;
        assert!(!apply(provisioning.clone()), "the operation started");
        // Waiting for something else: a binding may say so.
        let mut stuck = instance(false, "the parameters name a Secret that does not exist");
        stuck.status.as_mut().unwrap().last_condition_state = "ErrorWithParameters".into();
        assert!(apply(stuck), "no longer on its way");
        assert!(apply(provisioning), "on its way again");
        let mut ready = instance(true, "ready");
        ready.status.as_mut().unwrap().external_id = Some("id".into());
        assert!(apply(ready.clone()), "Ready");
        ready.status.as_mut().unwrap().async_op_in_progress = true;
        assert!(apply(ready), "an update of a Ready instance");
    }
}
