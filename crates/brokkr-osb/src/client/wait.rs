//! Polling `last_operation` until an asynchronous operation ends.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use super::{Client, Error, PlanRef, binding_path, instance_path};
use crate::catalog::Plan;
use crate::messages::{LastOperation, OperationState};

/// Whose operation to poll, and with what: the `operation` the broker returned, the plan, and
/// whether the operation deletes (so that 410 Gone means it succeeded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub(super) resource: Resource,
    pub(super) operation: Option<String>,
    pub(super) plan: Option<PlanRef>,
    pub(super) deleting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resource {
    Instance(String),
    Binding(String, String),
}

impl Resource {
    pub(super) fn path(&self) -> String {
        match self {
            Self::Instance(id) => instance_path(id),
            Self::Binding(instance, binding) => binding_path(instance, binding),
        }
    }
}

impl Poll {
    /// The operation of an instance.
    pub fn instance(instance_id: impl Into<String>) -> Self {
        Self::of(Resource::Instance(instance_id.into()))
    }

    /// The operation of a binding.
    pub fn binding(instance_id: impl Into<String>, binding_id: impl Into<String>) -> Self {
        Self::of(Resource::Binding(instance_id.into(), binding_id.into()))
    }

    fn of(resource: Resource) -> Self {
        Self {
            resource,
            operation: None,
            plan: None,
            deleting: false,
        }
    }

    /// The `operation` the broker returned with its 202 (pass it on, as the specification asks).
    #[must_use]
    pub fn operation(mut self, operation: Option<String>) -> Self {
        self.operation = operation;
        self
    }

    /// The service offering and plan, sent as `service_id` and `plan_id`.
    #[must_use]
    pub fn plan(mut self, plan: PlanRef) -> Self {
        self.plan = Some(plan);
        self
    }

    /// The operation deletes the resource: a 410 Gone while polling means it succeeded.
    #[must_use]
    pub fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// Whether the operation deletes the resource.
    pub fn is_deleting(&self) -> bool {
        self.deleting
    }
}

/// How often and how long to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitOptions {
    /// The first pause between polls.
    pub interval: Duration,
    /// The longest pause: each pause is 1.5 times the previous one, up to this.
    pub max_interval: Duration,
    /// When to give up (the plan's `maximum_polling_duration`); `None` polls until the end.
    pub max_duration: Option<Duration>,
}

impl Default for WaitOptions {
    /// From 250 ms to 15 s between polls, with no time limit.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            max_interval: Duration::from_secs(15),
            max_duration: None,
        }
    }
}

impl WaitOptions {
    /// These options, stopping at `plan`'s `maximum_polling_duration` if it has one.
    #[must_use]
    pub fn for_plan(mut self, plan: &Plan) -> Self {
        if let Some(seconds) = plan.maximum_polling_duration {
            self.max_duration = Some(Duration::from_secs(seconds));
        }
        self
    }
}

impl Client {
    /// Polls `poll`'s last_operation until the operation succeeds or fails, and returns its last
    /// state (a failed operation is `Ok` with [`OperationState::Failed`]). `on_poll` sees every
    /// state the broker reports. Between polls it waits the broker's `Retry-After` if it sent one,
    /// else a pause that grows from `options.interval` to `options.max_interval`. With a deleting
    /// poll, 410 Gone ends the wait as `succeeded`. Past `options.max_duration` it stops with
    /// [`Error::PollingTimedOut`]; any error of a poll ends the wait with that error.
    pub async fn wait(
        &self,
        poll: &Poll,
        options: &WaitOptions,
        mut on_poll: impl FnMut(&LastOperation),
    ) -> Result<LastOperation, Error> {
        let started = Instant::now();
        let deadline = options.max_duration.map(|d| started + d);
        let mut pause = options.interval;
        loop {
            let answer = match self.last_operation(poll).await {
                Ok(answer) => answer,
                Err(Error::Broker(e)) if poll.deleting && e.status == StatusCode::GONE => {
                    let gone = LastOperation {
                        state: OperationState::Succeeded,
                        description: e.description,
                        instance_usable: None,
                        update_repeatable: None,
                    };
                    on_poll(&gone);
                    return Ok(gone);
                }
                Err(e) => return Err(e),
            };
            on_poll(&answer.body);
            if answer.body.state != OperationState::InProgress {
                return Ok(answer.body);
            }
            let mut sleep = answer.retry_after.unwrap_or(pause);
            pause = options.max_interval.min(pause.mul_f64(1.5));
            if let Some(deadline) = deadline {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::PollingTimedOut {
                        after: started.elapsed(),
                        last: Some(answer.body),
                    });
                }
                sleep = sleep.min(deadline - now);
            }
            tokio::time::sleep(sleep).await;
        }
    }
}
