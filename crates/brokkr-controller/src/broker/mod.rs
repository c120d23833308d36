//! The broker controller: a ClusterServiceBroker or ServiceBroker is reconciled by fetching its
//! catalog and writing one class per service offering and one plan per plan, named by their
//! catalog ids and owned by the broker. Entries the catalog no longer lists are marked
//! `status.removedFromBrokerCatalog: true`, never deleted, so instances that use them keep them.
//! The catalog is listed again every `relistDuration` (default 15 minutes) unless
//! `relistBehavior` is `Manual`, and whenever the broker's spec changes.
//!
//! What a broker can cost the controller is bounded
//! ([`BrokerPolicy`](crate::broker_policy::BrokerPolicy)): each kind of answer's
//! body, the time of a call, and the services and plans of one catalog (a larger catalog is
//! refused with a condition, nothing written). A namespaced ServiceBroker is a tenant's: its URL
//! must pass the [`UrlPolicy`](crate::url_policy::UrlPolicy) before any connection, and its status never says what the other
//! end did (whether it answered, its status code, error text or address), only
//! [`crate::error::UNUSABLE`]; the controller's log has the details. Its failures are written no
//! sooner than [`BrokerPolicy::failure_floor`](crate::broker_policy::BrokerPolicy::failure_floor) after the attempt started, so that how soon one
//! is written does not tell a closed port from an open one either ([`crate::held_failures`]).
//!
//! What the ServiceBrokers of one namespace may list together, and whose turn it is to list,
//! is `bounds.rs`'s; keeping a namespaced broker while its instances need it, `hold.rs`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;

mod bounds;
mod catalog;
mod hold;
mod status;

use crate::broker_kind::BrokerKind;
use crate::conditions;
use crate::context::Context;
use crate::error::{Error, detail};
use crate::held_failures::{Held, HeldFailure};
use crate::resources::{ConditionStatus, RelistBehavior};
use catalog::list_catalog;
use status::{DEFAULT_RELIST_DURATION, not_due, patch_status, write_failure};

/// How long to wait before trying a broker again after a failure.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);

/// Reconciles one broker: lists its catalog and writes its status.
pub async fn reconcile<B: BrokerKind>(broker: Arc<B>, ctx: Arc<Context>) -> Result<Action, Error> {
    let uid = broker.meta().uid.clone().unwrap_or_default();
    let generation = broker.meta().generation.unwrap_or_default();
    let held = &ctx.brokers.held_failures;
    if let Some(namespaced) = broker.as_namespaced()
        && namespaced.metadata.deletion_timestamp.is_some()
    {
        held.forget(&uid);
        return hold::release(namespaced, &ctx).await;
    }
    match held.take(&uid, generation) {
        Held::Nothing => {}
        Held::Waiting(left) => return Ok(Action::requeue(left)),
        Held::Due(reason, message) => {
            write_failure(&*broker, &ctx, reason, message).await?;
            return Ok(Action::requeue(RETRY_AFTER_FAILURE));
        }
    }
    // Writing the status wakes the controller again: list only when a relist is due.
    if let Some(wait) = not_due(&*broker) {
        return Ok(wait);
    }
    // One listing per namespace at a time; a busy namespace's broker waits without holding
    // a reconcile.
    let Some(_turn) = bounds::turn(&*broker, &ctx) else {
        return Ok(Action::requeue(bounds::BUSY_RETRY));
    };
    if let Some(namespaced) = broker.as_namespaced() {
        hold::hold(namespaced, &ctx).await?;
    }
    let started = Instant::now();
    let result = list_catalog(&*broker, &ctx).await;
    ctx.metrics.reconciled(&B::kind(&()), result.is_err());
    if let Err(e) = &result {
        tracing::warn!(
            broker = %broker.name_any(),
            namespace = broker.namespace().unwrap_or_default(),
            error = %detail(e),
            "cannot list the broker's catalog"
        );
        if broker.namespace().is_none() {
            write_failure(&*broker, &ctx, e.reason(), e.to_string()).await?;
            return result.map(|()| Action::await_change());
        }
        let message = e.tenant_message();
        // Only a call to the broker can tell what listens at its URL; the tenant's own
        // limits are said at once.
        let left = match e {
            Error::Osb(_) => ctx.brokers.failure_floor.saturating_sub(started.elapsed()),
            _ => Duration::ZERO,
        };
        if left.is_zero() {
            write_failure(&*broker, &ctx, e.reason(), message).await?;
            return Ok(error_policy(broker, e, ctx.clone()));
        }
        let due = Instant::now() + left;
        let failure = HeldFailure {
            generation,
            due,
            reason: e.reason(),
            message,
        };
        held.hold(uid, failure);
        return Ok(Action::requeue(left));
    }
    let mut status = broker.broker_status().cloned().unwrap_or_default();
    status.observed_generation = generation;
    conditions::set(
        &mut status.conditions,
        "Ready",
        ConditionStatus::True,
        "FetchedCatalog",
        "Successfully fetched catalog entries from broker.",
    );
    status.last_condition_state = "Ready".into();
    status.reconciled_generation = status.observed_generation;
    status.last_catalog_retrieval_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    patch_status(&*broker, &ctx, &status).await?;
    let common = broker.common();
    Ok(match common.relist_behavior {
        RelistBehavior::Manual => Action::await_change(),
        RelistBehavior::Duration => Action::requeue(
            common
                .relist_duration
                .map_or(DEFAULT_RELIST_DURATION, Duration::from),
        ),
    })
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy<B: BrokerKind>(_: Arc<B>, error: &Error, _: Arc<Context>) -> Action {
    match error {
        // Each look may fetch the catalog again; a spec change wakes the broker at once.
        Error::NamespaceCatalogLimit(_) => Action::requeue(bounds::LIMIT_RETRY),
        _ => Action::requeue(RETRY_AFTER_FAILURE),
    }
}
