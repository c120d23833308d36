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

    /// Whether the binding waits for its instance without saying so yet: it is new (no Ready
    /// condition, created less than [`QUIET_WAIT`] ago) and the instance is on its way (not
    /// failed). Bindings created with their instances then cost no status write for a wait of
    /// seconds; the instance becoming Ready wakes them.
    pub(super) fn quietly_waits_for(&self, instance: &ServiceInstance) -> bool {
        let new = !self.status.conditions.iter().any(|c| c.type_ == "Ready")
            && platform::elapsed_since(self.binding.metadata.creation_timestamp.as_ref())
                < QUIET_WAIT;
        let failed = instance.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == ConditionStatus::True)
        });
        new && !failed
    }
}
