//! A binding waiting for its instance: until the instance is Ready, quietly at first.

use super::state::{QUIET_WAIT, Reconcile};
use crate::error::Error;
use crate::platform;
use crate::resources::{ConditionStatus, ServiceInstance};

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
                let ready = i.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True)
                });
                if ready {
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
    /// anything (no Ready condition), the instance is on its way (not failed), and either the
    /// binding is new (created less than [`QUIET_WAIT`] ago) or the instance says it is being
    /// provisioned (its own status tells the user how that goes). Bindings created with their
    /// instances then cost no status write while the instances are provisioned; the instance
    /// becoming Ready wakes them.
    pub(super) fn quietly_waits_for(&self, instance: &ServiceInstance) -> bool {
        let unsaid = !self.status.conditions.iter().any(|c| c.type_ == "Ready");
        let young =
            platform::elapsed_since(self.binding.metadata.creation_timestamp.as_ref()) < QUIET_WAIT;
        let status = instance.status.as_ref();
        let failed = status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == ConditionStatus::True)
        });
        let provisioning = status
            .is_some_and(|s| s.async_op_in_progress || s.last_condition_state == "Provisioning");
        unsaid && !failed && (young || provisioning)
    }
}
