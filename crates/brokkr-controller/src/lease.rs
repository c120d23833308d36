//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas of the controller
//! can run and only one reconciles.
//!
//! A replica holds the lease while it renews it within `leaseDurationSeconds`; another takes it
//! over once a renewal is that late. Every write carries the lease's `resourceVersion`, so of two
//! replicas racing for it, the API server lets exactly one win. A replica that stops releases the
//! lease so the other takes over at once.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// How often a replica waiting for the lease looks whether it expired: one GET a second.
const ACQUIRE_EVERY: Duration = Duration::from_secs(1);

/// One replica's hold on a named Lease.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

/// How a leader stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another replica holds the lease now, or it could not be renewed in time.
    #[error("lost the lease {0}: another replica may be reconciling now")]
    Lost(String),
}

impl LeaseLock {
    /// The lease `name` in `namespace`, held as `identity` (e.g. the pod's name) for `duration`
    /// after each renewal.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    /// Takes the lease if it is free or expired, renews it if this replica holds it. `Ok(true)`
    /// when this replica holds it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.held_spec(now, 0)),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let spec = if holder == Some(self.identity.as_str()) {
            LeaseSpec {
                renew_time: Some(now),
                lease_duration_seconds: Some(self.seconds()),
                ..spec
            }
        } else if holder.is_none() || expired(&spec, &now) {
            self.held_spec(now, spec.lease_transitions.unwrap_or(0) + 1)
        } else {
            return Ok(false);
        };
        lease.spec = Some(spec);
        // The resourceVersion read above makes this a compare-and-swap.
        conflict_is_false(
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await,
        )
    }

    /// Gives the lease up if this replica holds it, so another takes over without waiting.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = None;
        conflict_is_false(
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await,
        )
        .map(drop)
    }

    /// Waits until this replica holds the lease, trying every `ACQUIRE_EVERY` (or every third
    /// of the lease's duration, if that is shorter): a replica waiting takes over within that
    /// of the lease's expiry.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot read the lease"),
            }
            tokio::time::sleep(ACQUIRE_EVERY.min(self.duration / 3)).await;
        }
        tracing::info!(lease = %self.name, identity = %self.identity, "holding the lease");
    }

    /// Runs `work` while renewing the lease every third of its duration (call [`Self::acquire`]
    /// first). Ends with `work`'s output, releasing the lease, or with [`LeaseError::Lost`] as
    /// soon as another replica holds it or renewals have failed for as long as the lease lasts.
    pub async fn hold<F: Future>(&self, work: F) -> Result<F::Output, LeaseError> {
        let period = self.duration / 3;
        let renew = async {
            let mut last = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(period).await;
                match self.try_acquire_or_renew().await {
                    Ok(true) => last = tokio::time::Instant::now(),
                    Ok(false) => return,
                    Err(e) => {
                        tracing::warn!(lease = %self.name, error = %e, "cannot renew the lease")
                    }
                }
                if last.elapsed() >= self.duration {
                    return;
                }
            }
        };
        tokio::select! {
            output = work => {
                if let Err(e) = self.release().await {
                    tracing::warn!(lease = %self.name, error = %e, "cannot release the lease");
                }
                Ok(output)
            }
            () = renew => Err(LeaseError::Lost(self.name.clone())),
        }
    }

    fn held_spec(&self, now: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: Some(self.seconds()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Whether the holder's last renewal is older than the lease's duration.
fn expired(spec: &LeaseSpec, now: &MicroTime) -> bool {
    let Some(renewed) = &spec.renew_time else {
        return true;
    };
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    renewed.0 + duration < now.0
}

/// A 409 (another replica wrote first) means this replica does not hold the lease.
fn conflict_is_false<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
