//! A binding waiting for its instance: until the instance is Ready, quietly at first.

use kube::runtime::reflector::ObjectRef;

use super::state::{QUIET_WAIT, Reconcile};
use crate::cache::Caches;
use crate::conditions::is_true;
use crate::error::Error;
use crate::resources::{ServiceBinding, ServiceInstance};
use crate::{identity, instance_views, platform};

/// Whether `binding` has nothing to do until its instance changes: it has done nothing yet (no
/// condition, no call made, not being deleted, a valid spec) and its instance, as cached, is on
/// its way to Ready (it has said nothing yet, or says it is being provisioned; not Ready, not
/// failed, not being deleted). Its reconcile would only wait quietly, and the instance's next
/// change that concerns it wakes it (the caches' digest of what bindings read of an instance).
/// So a relist, which may have hidden any change, need not wake it: at a controller's start,
/// bindings created with their instances cost no reconcile until the instances are Ready.
pub fn waits_for_its_instance(binding: &ServiceBinding, caches: &Caches) -> bool {
    let untouched = binding.metadata.deletion_timestamp.is_none()
        && binding.status.as_ref().is_none_or(|s| {
            s.conditions.is_empty()
                && !identity::binding_called(s)
                && s.binding.is_none()
                && s.instance.is_none()
        })
        && identity::binding_mismatch(binding, None).is_none();
    if !untouched {
        return false;
    }
    let namespace = binding.metadata.namespace.as_deref().unwrap_or_default();
    let reference = ObjectRef::new(&binding.spec.instance_ref.name).within(namespace);
    (caches.instances.get(&reference)).is_some_and(|instance| instance_views::on_its_way(&instance))
}

impl Reconcile<'_> {
    /// The instance, once it exists and is Ready; else the binding waits (and `None`).
    pub(super) async fn ready_instance(&mut self) -> Result<Option<ServiceInstance>, Error> {
        let name = &self.binding.spec.instance_ref.name;
        let (reason, message) = match self.instance_named(name).await? {
            None => (
                "ReferencesNonexistentInstance",
                format!("the ServiceInstance {name:?} does not exist; waiting for it"),
            ),
            Some(i) if i.metadata.deletion_timestamp.is_some() => (
                "ReferencesDeletedInstance",
                format!("the ServiceInstance {name:?} is being deleted"),
            ),
            Some(i) => {
                if i.status
                    .as_ref()
                    .is_some_and(|s| is_true(&s.conditions, "Ready"))
                {
                    return Ok(Some(i));
                }
                if self.quietly_waits_for(&i) {
                    return Ok(None);
                }
                (
                    "ErrorInstanceNotReady",
                    format!("the ServiceInstance {name:?} is not Ready yet; waiting for it"),
                )
            }
        };
        self.wait(reason, message).await?;
        Ok(None)
    }

    /// Whether the binding waits for its instance without saying so yet: it has not said
    /// anything (no Ready condition), the instance has not failed, and either the binding is
    /// new (created less than [`QUIET_WAIT`] ago) or the instance is on its way
    /// ([`instance_views::on_its_way`]: it has said nothing yet, or says it is being
    /// provisioned; its own status tells the user how that goes). Bindings created with their
    /// instances then cost no status write while the instances are provisioned; the instance
    /// becoming Ready, failing or stopping on its way wakes them.
    pub(super) fn quietly_waits_for(&self, instance: &ServiceInstance) -> bool {
        let unsaid = !self.status.conditions.iter().any(|c| c.type_ == "Ready");
        let young =
            platform::elapsed_since(self.binding.metadata.creation_timestamp.as_ref()) < QUIET_WAIT;
        let failed = (instance.status.as_ref()).is_some_and(|s| is_true(&s.conditions, "Failed"));
        unsaid && !failed && (young || instance_views::on_its_way(instance))
    }
}
