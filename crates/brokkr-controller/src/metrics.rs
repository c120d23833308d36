//! The controllers' Prometheus metrics: reconciles and their errors by controller, the objects
//! due and waiting for a reconcile, whether this replica leads, OSB calls by verb and status,
//! objects released with their namespace, writes that met another writer's change, and
//! whether `spec.userInfo` is checked and forwarded, and rotations made to wait for their floor.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The labels of a reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The kind the controller reconciles, e.g. `ClusterServiceBroker`.
    pub controller: String,
}

/// The labels of an OSB call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OsbCallLabels {
    /// `catalog`, `provision`, `update`, `deprovision`, `bind`, `unbind`, `last_operation`.
    pub verb: String,
    /// The HTTP status, or `error` when the broker could not be reached.
    pub status: String,
}

/// The labels of a counter of released objects.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `ServiceInstance` or `ServiceBinding`.
    pub kind: String,
}

/// The counters and gauges the controllers update; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    osb_calls: Family<OsbCallLabels, Counter>,
    released_with_namespace: Family<KindLabels, Counter>,
    conflicts: Family<ControllerLabels, Counter>,
    user_info_withheld: Family<KindLabels, Counter>,
    user_info_checked: Gauge,
    queue: Family<ControllerLabels, Gauge>,
    leader: Gauge,
    rotations_deferred: Family<AskedByLabels, Counter>,
}

/// The labels of the deferred rotations' counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AskedByLabels {
    /// Who asked for the rotation: `broker` (its `renew_before` or `expires_at`) or
    /// `annotation`.
    pub asked_by: String,
}

impl Metrics {
    /// The families, registered in `registry` under `brokkr_controller_*`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // Each kind at zero from the start, so that the first release is an increase.
        for kind in ["ServiceInstance", "ServiceBinding"] {
            let kind = kind.to_owned();
            drop(
                metrics
                    .released_with_namespace
                    .get_or_create(&KindLabels { kind }),
            );
        }
        let sub = registry.sub_registry_with_prefix("brokkr_controller");
        sub.register("reconciles", "Reconciles run", metrics.reconciles.clone());
        sub.register(
            "reconcile_errors",
            "Reconciles that ended with an error",
            metrics.reconcile_errors.clone(),
        );
        sub.register(
            "osb_calls",
            "Calls to OSB brokers by verb and HTTP status",
            metrics.osb_calls.clone(),
        );
        sub.register(
            "released_with_namespace",
            "Instances and bindings released without their broker because their namespace's deletion waited too long; the broker may keep what they were",
            metrics.released_with_namespace.clone(),
        );
        sub.register(
            "conflicts",
            "Writes refused because their object (a workload, or the controller's own object) changed after it was read; an ordinary conflict, made again on the newer version, not a reconcile error",
            metrics.conflicts.clone(),
        );
        sub.register(
            "user_info_withheld",
            "Calls whose object's spec.userInfo was not forwarded to the broker because the API server's check of it (the brokkr-user-info policy as shipped) was not in force for the object",
            metrics.user_info_withheld.clone(),
        );
        sub.register(
            "user_info_checked",
            "1 while the brokkr-user-info policy and its binding check spec.userInfo as brokkr ships them, else 0",
            metrics.user_info_checked.clone(),
        );
        sub.register(
            "queue",
            "Objects due for a reconcile and waiting for a free slot, by controller",
            metrics.queue.clone(),
        );
        sub.register(
            "leader",
            "1 while this replica holds the leader-election Lease (or runs without election), else 0",
            metrics.leader.clone(),
        );
        sub.register(
            "rotations_deferred",
            "ServiceBinding rotations asked for sooner than --min-rotation-interval after the last one, and made to wait, by who asked",
            metrics.rotations_deferred.clone(),
        );
        metrics
    }

    /// Counts one write of `controller` refused because its object changed after it was read
    /// (an ordinary conflict, not a reconcile error).
    pub fn conflict(&self, controller: &str) {
        self.conflicts
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// Counts one call of an object of `kind` whose `spec.userInfo` was withheld.
    pub fn user_info_withheld(&self, kind: &str) {
        self.user_info_withheld
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counts one rotation made to wait for the floor between rotations.
    pub fn rotation_deferred(&self, asked_by: &str) {
        self.rotations_deferred
            .get_or_create(&AskedByLabels {
                asked_by: asked_by.to_owned(),
            })
            .inc();
    }

    /// Records whether the API server checks `spec.userInfo` as shipped.
    pub fn set_user_info_checked(&self, checked: bool) {
        self.user_info_checked.set(i64::from(checked));
    }

    /// Counts one reconcile of `controller`, failed or not.
    pub fn reconciled(&self, controller: &str, failed: bool) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        // The errors' series exists from the first reconcile, at zero: a share of errors, and
        // the first error, are computed over it.
        let errors = self.reconcile_errors.get_or_create(&labels);
        if failed {
            errors.inc();
        }
    }

    /// The gauge of the objects of `controller` due for a reconcile and waiting.
    pub fn queue(&self, controller: &str) -> Gauge {
        self.queue
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Counts one OSB call and how the broker answered.
    pub fn osb_call<T>(
        &self,
        verb: &str,
        result: &Result<brokkr_osb::client::Response<T>, brokkr_osb::client::Error>,
    ) {
        let status = match result {
            Ok(response) => response.status.as_u16().to_string(),
            Err(e) => e
                .status()
                .map_or_else(|| "error".to_owned(), |s| s.as_u16().to_string()),
        };
        self.osb_calls
            .get_or_create(&OsbCallLabels {
                verb: verb.to_owned(),
                status,
            })
            .inc();
    }

    /// Counts one object of `kind` released with its namespace.
    pub fn released_with_namespace(&self, kind: &str) {
        self.released_with_namespace
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }
}
