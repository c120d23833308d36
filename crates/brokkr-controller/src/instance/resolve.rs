//! Which class and plan a ServiceInstance names, found among the catalog resources of its scope,
//! and a client of the broker that offers them.

use std::time::Duration;

use brokkr_osb::client::{Client as OsbClient, PlanRef};
use kube::{Api, ResourceExt as _};

use crate::Context;
use crate::broker::{Error, osb_client};
use crate::resources::{
    ClusterServiceBroker, ClusterServiceClass, ClusterServicePlan, CommonServiceClassSpec,
    CommonServicePlanSpec, ProvisionStatus, ServiceBroker, ServiceClass, ServiceInstance,
    ServicePlan,
};

/// How long to poll an operation when the plan does not say (OSB's recommendation).
const DEFAULT_MAX_POLLING: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The plan an instance names, found in a catalog, and the broker that offers it.
pub(crate) struct Resolved {
    pub osb: OsbClient,
    pub class: CommonServiceClassSpec,
    pub plan: CommonServicePlanSpec,
    /// `ClusterServiceClass/<name>` or `ServiceClass/<name>`, for `kubectl get`.
    pub class_display: String,
    pub plan_display: String,
    pub cluster: bool,
}

impl Resolved {
    pub fn plan_ref(&self) -> PlanRef {
        PlanRef::new(&self.class.external_id, &self.plan.external_id)
    }

    pub fn max_polling(&self) -> Duration {
        self.plan
            .maximum_polling_duration
            .map_or(DEFAULT_MAX_POLLING, Duration::from_secs)
    }
}

/// How the spec names a class or a plan: by catalog name, catalog id or resource name.
struct Named {
    external_name: Option<String>,
    external_id: Option<String>,
    name: Option<String>,
}

impl Named {
    fn new(
        external_name: &Option<String>,
        external_id: &Option<String>,
        name: &Option<String>,
    ) -> Self {
        Self {
            external_name: external_name.clone(),
            external_id: external_id.clone(),
            name: name.clone(),
        }
    }

    fn matches(&self, name: &str, external_name: &str, external_id: &str) -> bool {
        self.external_name.as_deref() == Some(external_name)
            || self.external_id.as_deref() == Some(external_id)
            || self.name.as_deref() == Some(name)
    }

    /// What it names, for messages.
    fn wanted(&self) -> Option<&str> {
        self.external_name
            .as_deref()
            .or(self.external_id.as_deref())
            .or(self.name.as_deref())
    }
}

/// A class resource of either scope.
struct ClassEntry {
    name: String,
    broker: String,
    spec: CommonServiceClassSpec,
    removed: bool,
}

/// A plan resource of either scope.
struct PlanEntry {
    name: String,
    class: String,
    spec: CommonServicePlanSpec,
}

/// The classes and plans of the instance's scope.
async fn catalog(
    ctx: &Context,
    cluster: bool,
    ns: &str,
) -> Result<(Vec<ClassEntry>, Vec<PlanEntry>), Error> {
    let params = kube::api::ListParams::default();
    let removed = |s: Option<bool>| s.unwrap_or(false);
    Ok(if cluster {
        let classes = Api::<ClusterServiceClass>::all(ctx.client.clone())
            .list(&params)
            .await?;
        let plans = Api::<ClusterServicePlan>::all(ctx.client.clone())
            .list(&params)
            .await?;
        (
            classes
                .into_iter()
                .map(|c| ClassEntry {
                    name: c.name_any(),
                    removed: removed(c.status.map(|s| s.removed_from_broker_catalog)),
                    broker: c.spec.cluster_service_broker_name,
                    spec: c.spec.common,
                })
                .collect(),
            plans
                .into_iter()
                .map(|p| PlanEntry {
                    name: p.name_any(),
                    class: p.spec.cluster_service_class_ref.name,
                    spec: p.spec.common,
                })
                .collect(),
        )
    } else {
        let classes = Api::<ServiceClass>::namespaced(ctx.client.clone(), ns)
            .list(&params)
            .await?;
        let plans = Api::<ServicePlan>::namespaced(ctx.client.clone(), ns)
            .list(&params)
            .await?;
        (
            classes
                .into_iter()
                .map(|c| ClassEntry {
                    name: c.name_any(),
                    removed: removed(c.status.map(|s| s.removed_from_broker_catalog)),
                    broker: c.spec.service_broker_name,
                    spec: c.spec.common,
                })
                .collect(),
            plans
                .into_iter()
                .map(|p| PlanEntry {
                    name: p.name_any(),
                    class: p.spec.service_class_ref.name,
                    spec: p.spec.common,
                })
                .collect(),
        )
    })
}

/// The broker resource whose catalog holds the instance's class, e.g. `ClusterServiceBroker/db`,
/// found without calling it: what an abandoned instance leaves behind.
pub(crate) async fn broker_of(instance: &ServiceInstance, ctx: &Context) -> Option<String> {
    let (cluster, class_by, _) = named(instance);
    let (classes, _) = catalog(ctx, cluster, &instance.namespace().unwrap_or_default())
        .await
        .ok()?;
    let class = classes
        .into_iter()
        .find(|c| class_by.matches(&c.name, &c.spec.external_name, &c.spec.external_id))?;
    let kind = if cluster {
        "ClusterServiceBroker"
    } else {
        "ServiceBroker"
    };
    Some(format!("{kind}/{}", class.broker))
}

/// Whether the spec names cluster-scoped catalog resources, and how it names the class and plan.
fn named(instance: &ServiceInstance) -> (bool, Named, Named) {
    let spec = &instance.spec;
    let cluster = spec.cluster_service_class_external_name.is_some()
        || spec.cluster_service_class_external_id.is_some()
        || spec.cluster_service_class_name.is_some();
    let (class_by, plan_by) = if cluster {
        (
            Named::new(
                &spec.cluster_service_class_external_name,
                &spec.cluster_service_class_external_id,
                &spec.cluster_service_class_name,
            ),
            Named::new(
                &spec.cluster_service_plan_external_name,
                &spec.cluster_service_plan_external_id,
                &spec.cluster_service_plan_name,
            ),
        )
    } else {
        (
            Named::new(
                &spec.service_class_external_name,
                &spec.service_class_external_id,
                &spec.service_class_name,
            ),
            Named::new(
                &spec.service_plan_external_name,
                &spec.service_plan_external_id,
                &spec.service_plan_name,
            ),
        )
    };
    (cluster, class_by, plan_by)
}

/// Finds the class and plan the spec names, and a client of their broker. `Ok(Err(message))`
/// when the catalog does not (yet) have them.
pub(crate) async fn resolve(
    instance: &ServiceInstance,
    ctx: &Context,
) -> Result<Result<Resolved, String>, Error> {
    let spec = &instance.spec;
    let ns = instance.namespace().unwrap_or_default();
    let (cluster, class_by, plan_by) = named(instance);
    let (Some(class_wanted), Some(plan_wanted)) = (class_by.wanted(), plan_by.wanted()) else {
        return Ok(Err("the spec names no class or no plan".into()));
    };
    let (class_kind, plan_kind) = if cluster {
        ("ClusterServiceClass", "ClusterServicePlan")
    } else {
        ("ServiceClass", "ServicePlan")
    };
    let (classes, plans) = catalog(ctx, cluster, &ns).await?;
    let provisioned = instance
        .status
        .as_ref()
        .is_some_and(|s| s.provision_status == Some(ProvisionStatus::Provisioned));
    let Some(class) = classes
        .into_iter()
        .find(|c| class_by.matches(&c.name, &c.spec.external_name, &c.spec.external_id))
    else {
        return Ok(Err(format!(
            "no {class_kind} {class_wanted:?} in any broker's catalog"
        )));
    };
    if class.removed && !provisioned {
        return Ok(Err(format!(
            "the {class_kind} {} was removed from its broker's catalog",
            class.name
        )));
    }
    let Some(plan) = plans.into_iter().find(|p| {
        p.class == class.name
            && plan_by.matches(&p.name, &p.spec.external_name, &p.spec.external_id)
    }) else {
        return Ok(Err(format!(
            "no {plan_kind} {plan_wanted:?} of the {class_kind} {:?}",
            class.spec.external_name
        )));
    };
    let osb = if cluster {
        let broker = Api::<ClusterServiceBroker>::all(ctx.client.clone())
            .get(&class.broker)
            .await?;
        osb_client(&broker, ctx).await?
    } else {
        let broker = Api::<ServiceBroker>::namespaced(ctx.client.clone(), &ns)
            .get(&class.broker)
            .await?;
        osb_client(&broker, ctx).await?
    };
    let osb = ctx.user_info.client(osb, spec.user_info.as_ref())?;
    Ok(Ok(Resolved {
        osb,
        class_display: format!("{class_kind}/{}", class.spec.external_name),
        plan_display: format!("{plan_kind}/{}", plan.spec.external_name),
        class: class.spec,
        plan: plan.spec,
        cluster,
    }))
}
