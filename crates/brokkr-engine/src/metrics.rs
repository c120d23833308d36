//! Prometheus metrics of the engine: operations by kind and outcome, steps and their durations,
//! steps left behind and the janitor's attempts at them.

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
}

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
        }
    }
}

impl EngineMetrics {
    /// Registers the families under `brokkr_`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "brokkr_operations",
            "Operations that ended, by kind and state",
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
        registry.register(
            "brokkr_janitor_attempts",
            "Attempts at steps left behind, by result",
            self.janitor_attempts.clone(),
        );
    }
}
