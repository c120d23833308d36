//! The configuration index: a loaded, validated configuration as the broker and the engine read
//! it — the catalog, the targets, and each plan with its blueprint and compiled parameter schemas.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use brokkr_osb::{Catalog, Plan, Service};
use serde_json::Value;

use crate::config::{
    BINDING_STEP_DEFAULTS, Blueprint, BrokerConfig, INSTANCE_STEP_DEFAULTS, Phase, Step,
    TargetConfig,
};
use crate::schema::ParameterSchema;

/// A plan with everything needed to serve it.
#[derive(Debug)]
pub struct PlanEntry {
    /// The service offering (its `plans` list is left empty here).
    pub service: Service,
    /// The plan.
    pub plan: Plan,
    /// What the plan does.
    pub blueprint: Blueprint,
    /// Compiled `service_instance.create` schema.
    pub instance_create_schema: Option<ParameterSchema>,
    /// Compiled `service_instance.update` schema.
    pub instance_update_schema: Option<ParameterSchema>,
    /// Compiled `service_binding.create` schema.
    pub binding_create_schema: Option<ParameterSchema>,
}

impl PlanEntry {
    /// Whether instances of the plan can be bound.
    pub fn bindable(&self) -> bool {
        self.plan.is_bindable(&self.service)
    }

    /// Whether the plan may be changed by an update.
    pub fn plan_updateable(&self) -> bool {
        self.plan.is_plan_updateable(&self.service)
    }

    /// The steps an instance operation of `phase` runs, in order. For [`Phase::Upgrade`], an
    /// update to a new maintenance version: the update's steps and those `on: [upgrade]`.
    pub fn instance_steps(&self, phase: Phase) -> Vec<Step> {
        let steps = &self.blueprint.instance.steps;
        if phase != Phase::Upgrade {
            return select(steps, phase, INSTANCE_STEP_DEFAULTS);
        }
        let upgrade = |s: &&Step| {
            s.runs_in(Phase::Update, INSTANCE_STEP_DEFAULTS)
                || s.runs_in(Phase::Upgrade, INSTANCE_STEP_DEFAULTS)
        };
        steps.iter().filter(upgrade).cloned().collect()
    }

    /// The steps a binding operation of `phase` runs, in order.
    pub fn binding_steps(&self, phase: Phase) -> Vec<Step> {
        let steps = self.blueprint.binding.as_ref().map(|b| b.steps.as_slice());
        select(steps.unwrap_or_default(), phase, BINDING_STEP_DEFAULTS)
    }
}

/// The steps of `phase`, in order; teardown phases run them last to first.
fn select(steps: &[Step], phase: Phase, defaults: &[Phase]) -> Vec<Step> {
    let mut selected: Vec<Step> = steps
        .iter()
        .filter(|s| s.runs_in(phase, defaults))
        .cloned()
        .collect();
    if phase.is_teardown() {
        selected.reverse();
    }
    selected
}

/// A validated configuration.
#[derive(Debug)]
pub struct Config {
    /// Broker settings.
    pub broker: BrokerConfig,
    /// Store URL, if the configuration names one.
    pub store: Option<String>,
    /// The catalog as served.
    pub catalog: Catalog,
    /// Where plans create resources, by name.
    pub targets: BTreeMap<String, TargetConfig>,
    pub(crate) catalog_json: Arc<[u8]>,
    pub(crate) plans: HashMap<(String, String), Arc<PlanEntry>>,
}

impl Config {
    /// Looks up a plan by service offering id and plan id.
    pub fn plan(&self, service_id: &str, plan_id: &str) -> Option<&Arc<PlanEntry>> {
        self.plans.get(&(service_id.to_owned(), plan_id.to_owned()))
    }

    /// Every plan.
    pub fn plans(&self) -> impl Iterator<Item = &Arc<PlanEntry>> {
        self.plans.values()
    }

    /// The serialized `GET /v2/catalog` body.
    pub fn catalog_json(&self) -> Arc<[u8]> {
        self.catalog_json.clone()
    }
}

/// Builds the served form of a plan; its schemas have already been checked.
pub(crate) fn plan_entry(service: &Service, plan: &Plan, blueprint: Blueprint) -> PlanEntry {
    let compile = |s: Option<&Value>| s.and_then(|s| ParameterSchema::compile(s).ok());
    PlanEntry {
        service: Service {
            plans: Vec::new(),
            ..service.clone()
        },
        plan: plan.clone(),
        instance_create_schema: compile(plan.instance_create_schema()),
        instance_update_schema: compile(plan.instance_update_schema()),
        binding_create_schema: compile(plan.binding_create_schema()),
        blueprint,
    }
}
