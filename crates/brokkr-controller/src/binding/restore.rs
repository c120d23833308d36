//! Getting a deleted Secret back: a bound binding whose Secret is gone gets its credentials
//! fetched again where the class is `bindingRetrievable`; else the condition says the binding
//! must be re-created.

use crate::runner::Action;

use super::state::{Expiry, Reconcile};
use crate::error::Error;
use crate::identity;
use crate::identity::instance_id;
use crate::resolve::resolve;
use crate::resources::ConditionStatus;

impl Reconcile<'_> {
    /// The Secret of a bound binding went: fetch the credentials again where the broker keeps
    /// them (`bindings_retrievable`), else say how to get them back.
    pub(super) async fn restore_secret(&mut self) -> Result<Action, Error> {
        let name = identity::bound_instance_name(self.binding).to_owned();
        let resolved = match self.instance_named(&name).await? {
            Some(instance) => match resolve(&instance, self.ctx).await? {
                Ok(resolved) => Some((instance, resolved)),
                Err(_) => None,
            },
            None => None,
        };
        let Some((instance, resolved)) = resolved else {
            return self
                .secret_lost("its instance or plan cannot be found")
                .await;
        };
        if identity::instance_replaced(self.binding, &instance).is_some() {
            return self
                .secret_lost("its ServiceInstance was re-created since it was bound")
                .await;
        }
        if !resolved.class.binding_retrievable {
            return self
                .secret_lost("the broker does not let bindings be fetched again")
                .await;
        }
        let fetched = resolved
            .osb
            .binding(
                &instance_id(&instance),
                &self.current_id(),
                Some(&resolved.plan_ref()),
            )
            .await;
        self.ctx.metrics.osb_call("fetch_binding", &fetched);
        let binding = fetched?.body;
        let expiry = Expiry::of(binding.metadata.as_ref());
        let credentials = binding.credentials.unwrap_or_default();
        self.publish(&instance, &resolved, credentials, expiry)
            .await
    }

    async fn secret_lost(&mut self, why: &str) -> Result<Action, Error> {
        let message = format!(
            "the Secret {:?} was deleted and cannot be written again: {why}; delete and re-create this ServiceBinding",
            self.current_secret()
        );
        self.set("Ready", ConditionStatus::False, "SecretDeleted", message);
        self.write_status().await?;
        Ok(Action::await_change())
    }
}
