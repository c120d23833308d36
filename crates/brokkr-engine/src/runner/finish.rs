//! Ending an operation: the changes a successful one makes ([`Engine::complete`]), saving its
//! end with its events ([`Engine::finish`]), and the events an operation records on its way.

use tracing::{info, warn};

use super::engine::{Engine, ms};
use super::failure::{Failure, RunError};
use crate::clock::now_ms;
use crate::metrics::OperationLabels;
use crate::model::{Event, Key, OpKind, Resource, Status};
use crate::store::{Finish, StoreError};

impl Engine {
    /// The changes a successful operation makes, or why it cannot succeed.
    pub(super) async fn complete(&self, r: &Resource) -> Result<Finish, RunError> {
        let ok = Finish::success;
        Ok(match r.op.kind {
            OpKind::Provision => ok("provisioned", Status::Ready),
            OpKind::Deprovision | OpKind::Unbind => {
                // Keep only the steps this operation skipped: those of an earlier one were
                // retried by this one.
                let mut outputs = r.outputs.clone();
                outputs.keep_skipped_of(&r.op.id);
                let done = match r.op.kind {
                    OpKind::Deprovision => "deprovisioned",
                    _ => "unbound",
                };
                let description = self.left_behind_description(r, done).await?;
                Finish {
                    outputs: Some(outputs),
                    ..ok(&description, Status::Deleted)
                }
            }
            OpKind::Update | OpKind::Upgrade => Finish {
                update: r.op.update.clone(),
                ..ok("updated", Status::Ready)
            },
            OpKind::Bind => {
                let instance = self
                    .inner
                    .store
                    .get(&Key::instance(&r.key.instance_id))
                    .await?;
                let Some(instance) = instance.filter(|i| i.status == Status::Ready) else {
                    return Err(Failure::InstanceGone.into());
                };
                let credentials = self
                    .credentials(&instance, r)
                    .map_err(Failure::Credentials)?;
                let mut outputs = r.outputs.clone();
                self.publish(r, &credentials, &mut outputs).await?;
                outputs.credentials = Some(credentials);
                // A lifetime counts from when the credentials are handed out.
                if let Some(expiry) = &r.op.plan.expiry
                    && let Some(lifetime) = expiry.lifetime
                {
                    let expires_at = now_ms().saturating_add(ms(lifetime));
                    outputs.expires_at = Some(expires_at);
                    outputs.renew_before = expiry
                        .renew_before
                        .map(|before| expires_at.saturating_sub(ms(before)));
                }
                Finish {
                    outputs: Some(outputs),
                    ..ok("bound", Status::Ready)
                }
            }
        })
    }

    /// Saves the end of operation `op_id` of `r` — succeeded with the changes of `outcome`, or
    /// failed for its reason — together with its events, unless it is not this engine's any more.
    pub(super) async fn finish(
        &self,
        r: &Resource,
        op_id: &str,
        outcome: Result<Finish, Failure>,
    ) -> Result<(), StoreError> {
        self.forget_operation(op_id);
        let mut finish = outcome.unwrap_or_else(|reason| Finish {
            succeeded: false,
            description: reason.to_string(),
            status: match r.op.kind {
                OpKind::Provision | OpKind::Bind => Status::Failed,
                OpKind::Update | OpKind::Upgrade | OpKind::Deprovision | OpKind::Unbind => r.status,
            },
            update: None,
            outputs: None,
        });
        if let Some(reason) = &r.op.plan.reason {
            finish.description = format!("{reason}: {}", finish.description);
        }
        let kind = if finish.succeeded {
            "succeeded"
        } else {
            "failed"
        };
        // The steps' events and the last one are written with the operation's end.
        self.event(op_id, kind, None, Some(finish.description.clone()))
            .await;
        let events = self.take_events(op_id).unwrap_or_default();
        let saved = self
            .inner
            .store
            .finish(&r.key, op_id, &self.inner.owner, &finish, &events)
            .await?;
        if !saved {
            // Superseded: what its steps did still happened; the end is another's to tell.
            self.write_events(op_id, &events[..events.len() - 1]).await;
            return Ok(());
        }
        let (service, plan) = (self.inner.metrics).plan_names(&r.service_id, &r.plan_id);
        let labels = OperationLabels {
            kind: r.op.kind.as_str().to_owned(),
            state: kind.to_owned(),
            service,
            plan,
        };
        self.inner.metrics.operations.get_or_create(&labels).inc();
        if finish.succeeded {
            info!(kind = r.op.kind.as_str(), "operation succeeded");
        } else {
            warn!(kind = r.op.kind.as_str(), reason = %finish.description, "operation failed");
        }
        Ok(())
    }

    /// Records an event of operation `op_id`. Events are written in batches (see
    /// [`Engine::flush_events`]); one that a crash catches unwritten is lost, the operation not.
    pub(super) async fn event(
        &self,
        op_id: &str,
        kind: &str,
        step: Option<&str>,
        message: Option<String>,
    ) {
        let event = Event {
            at: now_ms(),
            kind: kind.to_owned(),
            step: step.map(str::to_owned),
            message,
        };
        let mut pending = self.inner.events.lock().expect("lock");
        pending.entry(op_id.to_owned()).or_default().push(event);
    }

    /// Writes the events of `op_id` recorded so far: before a wait of a second or more, and when
    /// the operation stops running here (its end writes them with it). A store failure is
    /// logged, never fatal.
    pub(super) async fn flush_events(&self, op_id: &str) {
        if let Some(events) = self.take_events(op_id) {
            self.write_events(op_id, &events).await;
        }
    }

    /// The events of `op_id` not yet written, now taken out of the pending ones.
    fn take_events(&self, op_id: &str) -> Option<Vec<Event>> {
        self.inner.events.lock().expect("lock").remove(op_id)
    }

    /// Appends `events` to the log of `op_id`; a store failure is logged, never fatal.
    async fn write_events(&self, op_id: &str, events: &[Event]) {
        if let Err(e) = self.inner.store.append_events(op_id, events).await {
            warn!(error = %e, "cannot record operation events");
        }
    }
}
