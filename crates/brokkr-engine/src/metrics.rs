//! Prometheus metrics of the engine: operations by kind, outcome, service and plan, steps and
//! their durations, steps left behind and the janitor's attempts at them. Services and plans are
//! labelled by the names the catalog gives them ([`EngineMetrics::name_plans`]), by their ids
//! for a plan no longer configured.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// provision, update, deprovision, bind, unbind.
    pub kind: String,
    /// succeeded or failed.
    pub state: String,
    /// The service's name.
    pub service: String,
    /// The plan's name.
    pub plan: String,
}

/// (service name, plan name) by (service id, plan id).
type PlanNames = HashMap<(String, String), (String, String)>;

/// Labels of a step.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// The operation kind.
    pub kind: String,
    /// The step name.
    pub step: String,
}

/// Labels of the steps deprovisions and unbinds left behind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OrphanLabels {
    /// deprovision or unbind.
    pub kind: String,
    /// The step name.
    pub step: String,
}

/// Labels of the janitor's attempts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JanitorLabels {
    /// `resolved` (the step is done), `failed` (tried again later) or `error` (the store
    /// failed; the attempt is repeated when its lease runs out).
    pub result: String,
}

/// The engine's metric families. Cloning shares the underlying values.
#[derive(Clone)]
pub struct EngineMetrics {
    /// Operations that ended, by kind and outcome.
    pub operations: Family<OperationLabels, Counter>,
    /// Operations running in this process.
    pub running: Gauge,
    /// Time from a step's start to its end, in seconds (waits included).
    pub step_seconds: Family<StepLabels, Histogram>,
    /// Times a step asked to be run again later.
    pub step_waits: Family<StepLabels, Counter>,
    /// Steps left behind by deprovisions and unbinds, as the store last counted them.
    pub orphans: Family<OrphanLabels, Gauge>,
    /// The janitor's attempts at steps left behind, by result.
    pub janitor_attempts: Family<JanitorLabels, Counter>,
    /// The catalog's names of services and plans, by their ids.
    names: Arc<RwLock<PlanNames>>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            operations: Family::default(),
            running: Gauge::default(),
            step_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 20))
            }),
            step_waits: Family::default(),
            orphans: Family::default(),
            janitor_attempts: Family::default(),
            names: Arc::default(),
        }
    }
}

impl EngineMetrics {
    /// Labels services and plans from now on by the names `plans` gives them: (service id,
    /// plan id, service name, plan name), the catalog now served.
    pub fn name_plans(&self, plans: impl IntoIterator<Item = (String, String, String, String)>) {
        let names = plans
            .into_iter()
            .map(|(service_id, plan_id, service, plan)| ((service_id, plan_id), (service, plan)))
            .collect();
        *self.names.write().expect("lock") = names;
    }

    /// The names of the service and plan with these ids; the ids themselves for a plan the
    /// catalog does not name.
    pub fn plan_names(&self, service_id: &str, plan_id: &str) -> (String, String) {
        let names = self.names.read().expect("lock");
        names
            .get(&(service_id.to_owned(), plan_id.to_owned()))
            .cloned()
            .unwrap_or_else(|| (service_id.to_owned(), plan_id.to_owned()))
    }

    /// Registers the families under `brokkr_`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "brokkr_operations",
            "Operations that ended, by kind, state, service and plan",
            self.operations.clone(),
        );
        registry.register(
            "brokkr_operations_running",
            "Operations running in this process",
            self.running.clone(),
        );
        registry.register(
            "brokkr_step_duration_seconds",
            "Time from a step's start to its end",
            self.step_seconds.clone(),
        );
        registry.register(
            "brokkr_step_waits",
            "Times a step asked to be run again later",
            self.step_waits.clone(),
        );
        registry.register(
            "brokkr_orphans",
            "Steps deprovisions and unbinds left behind, by kind and step",
            self.orphans.clone(),
        );
        // Every result from the start, at zero: a first failure is an increase.
        for result in ["resolved", "failed", "error"] {
            let result = result.to_owned();
            drop(
                self.janitor_attempts
                    .get_or_create(&JanitorLabels { result }),
            );
        }
        registry.register(
            "brokkr_janitor_attempts",
            "Attempts at steps left behind, by result",
            self.janitor_attempts.clone(),
        );
    }
}
