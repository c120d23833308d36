//! A broker's catalog, fetched and written as classes and plans: within the bounds of one
//! catalog and of the broker's namespace, each entry named by its id, entries the catalog no
//! longer lists marked removed.

use std::collections::BTreeSet;

use brokkr_osb::catalog::Catalog;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use super::bounds::{self, Existing};
use crate::broker_kind::{BrokerKind, CatalogEntry};
use crate::broker_policy::BrokerPolicy;
use crate::context::Context;
use crate::error::Error;
use crate::names::{FIELD_MANAGER, label_value, object_name};
use crate::resolve::osb_client;
use crate::resources::{CommonServiceClassSpec, CommonServicePlanSpec, PlanMaintenanceInfo};

/// Fetches the broker's catalog and writes it as classes and plans.
///
/// What exists already is read once, as metadata, before anything is written (whose each
/// entry is, what the namespace holds): a listing costs no more memory than the catalog it
/// reads, however large the classes and plans already written are.
pub(super) async fn list_catalog<B: BrokerKind>(broker: &B, ctx: &Context) -> Result<(), Error> {
    bounds::check_broker_count(broker, ctx)?;
    let osb = osb_client(broker, ctx).await?;
    let class_api = broker.class_api(&ctx.client);
    let plan_api = broker.plan_api(&ctx.client);
    let everything = ListParams::default();
    let held_classes = Existing::new(class_api.list_metadata(&everything).await?.items);
    let held_plans = Existing::new(plan_api.list_metadata(&everything).await?.items);
    if let Some(namespaced) = broker.as_namespaced() {
        bounds::check_room(namespaced, ctx, &held_classes, &held_plans)?;
    }
    // Held while the catalog is in memory: many brokers listed together wait their turn.
    let _permit = ctx
        .brokers
        .catalog_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let answer = osb.catalog().await;
    ctx.metrics.osb_call("catalog", &answer);
    let catalog = answer?.body;
    within_bounds(&catalog, &ctx.brokers)?;
    let CatalogEntries { classes, plans } = catalog_entries(broker, &catalog)?;
    drop(catalog);
    if let Some(namespaced) = broker.as_namespaced() {
        bounds::check_listing(
            namespaced,
            ctx,
            (&held_classes, &held_plans),
            (
                classes
                    .iter()
                    .map(|c| c.meta().name.as_deref().unwrap_or_default()),
                plans
                    .iter()
                    .map(|p| p.meta().name.as_deref().unwrap_or_default()),
            ),
        )?;
    }

    let params = PatchParams::apply(FIELD_MANAGER).force();
    let owner = label_value(&broker.name_any());
    let mut taken = taken_by_others(&held_classes, &classes, &owner);
    taken.extend(taken_by_others(&held_plans, &plans, &owner));
    if !taken.is_empty() {
        return Err(Error::Catalog(format!(
            "the catalog offers ids whose {} already belong to another broker: {}; a broker never takes over another's classes and plans (give the services and plans ids of their own)",
            if broker.namespace().is_some() {
                "ServiceClasses/ServicePlans"
            } else {
                "ClusterServiceClasses/ClusterServicePlans"
            },
            taken.join(", ")
        )));
    }
    let mut class_names = BTreeSet::new();
    for class in classes {
        let name = class.name_any();
        let written = class_api
            .patch(&name, &params, &Patch::Apply(&class))
            .await?;
        mark_removed(&class_api, &written, false).await?;
        class_names.insert(name);
    }
    let mut plan_names = BTreeSet::new();
    for plan in plans {
        let name = plan.name_any();
        let written = plan_api.patch(&name, &params, &Patch::Apply(&plan)).await?;
        mark_removed(&plan_api, &written, false).await?;
        plan_names.insert(name);
    }

    // The broker's entries the catalog no longer lists: every entry of the broker existed
    // before this listing or was written by it (one reconcile of a broker runs at a time).
    for name in held_classes.of(&owner) {
        if !class_names.contains(name)
            && let Some(class) = class_api.get_opt(name).await?
        {
            mark_removed(&class_api, &class, true).await?;
        }
    }
    for name in held_plans.of(&owner) {
        if !plan_names.contains(name)
            && let Some(plan) = plan_api.get_opt(name).await?
        {
            mark_removed(&plan_api, &plan, true).await?;
        }
    }
    Ok(())
}

/// Refuses a catalog with more services or plans than `policy` keeps of one broker.
fn within_bounds(catalog: &Catalog, policy: &BrokerPolicy) -> Result<(), Error> {
    let services = catalog.services.len();
    let plans: usize = catalog.services.iter().map(|s| s.plans.len()).sum();
    if services > policy.max_services || plans > policy.max_plans {
        return Err(Error::CatalogTooLarge(format!(
            "the catalog lists {services} services and {plans} plans; this controller keeps at \
             most {} services and {} plans of one broker, so nothing of it was written",
            policy.max_services, policy.max_plans
        )));
    }
    Ok(())
}

/// The entries of `entries` that exist already (in `held`), written by a broker other than
/// `broker`, as `Kind/name (broker …)`.
fn taken_by_others<K: CatalogEntry>(held: &Existing, entries: &[K], broker: &str) -> Vec<String> {
    entries
        .iter()
        .filter_map(|entry| {
            let name = entry.name_any();
            let owner = held.owner(&name)??;
            (owner != broker).then(|| format!("{}/{name} (broker {owner:?})", K::kind(&())))
        })
        .collect()
}

/// Sets `status.removedFromBrokerCatalog` where it differs.
async fn mark_removed<K: CatalogEntry>(
    api: &Api<K>,
    entry: &K,
    removed: bool,
) -> Result<(), Error> {
    if entry.removed() != removed {
        if removed {
            tracing::info!(kind = %K::kind(&()), name = %entry.name_any(), "removed from the broker's catalog");
        }
        let status = json!({ "status": { "removedFromBrokerCatalog": removed } });
        api.patch_status(
            &entry.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await?;
    }
    Ok(())
}

/// A catalog as the resources a broker writes.
struct CatalogEntries<B: BrokerKind> {
    classes: Vec<B::Class>,
    plans: Vec<B::Plan>,
}

/// The classes and plans of `catalog`, each named by its id as a DNS name.
fn catalog_entries<B: BrokerKind>(
    broker: &B,
    catalog: &Catalog,
) -> Result<CatalogEntries<B>, Error> {
    let mut taken = BTreeSet::new();
    let mut name_for = |what: &str, id: &str| {
        let name = object_name(id).ok_or_else(|| {
            Error::Catalog(format!(
                "the {what} id {id:?} cannot be made a resource name"
            ))
        })?;
        if !taken.insert(name.clone()) {
            return Err(Error::Catalog(format!(
                "the {what} id {id:?} becomes the resource name {name:?}, which another id of the catalog already has"
            )));
        }
        Ok(name)
    };
    let mut classes = Vec::new();
    let mut plans = Vec::new();
    for service in &catalog.services {
        let class_name = name_for("service", &service.id)?;
        classes.push(broker.class(
            &class_name,
            CommonServiceClassSpec {
                external_name: service.name.clone(),
                external_id: service.id.clone(),
                description: service.description.clone(),
                bindable: service.bindable,
                binding_retrievable: service.bindings_retrievable.unwrap_or(false),
                instances_retrievable: service.instances_retrievable.unwrap_or(false),
                plan_updatable: service.plan_updateable.unwrap_or(false),
                external_metadata: service.metadata.clone().map(Value::Object),
                tags: service.tags.clone(),
                requires: service.requires.clone(),
                default_provision_parameters: None,
            },
        ));
        for plan in &service.plans {
            let plan_name = name_for("plan", &plan.id)?;
            plans.push(broker.plan(
                &plan_name,
                &class_name,
                CommonServicePlanSpec {
                    external_name: plan.name.clone(),
                    external_id: plan.id.clone(),
                    description: plan.description.clone(),
                    bindable: plan.bindable,
                    free: plan.free.unwrap_or(true),
                    external_metadata: plan.metadata.clone().map(Value::Object),
                    instance_create_parameter_schema: plan.instance_create_schema().cloned(),
                    instance_update_parameter_schema: plan.instance_update_schema().cloned(),
                    service_binding_create_parameter_schema: plan.binding_create_schema().cloned(),
                    service_binding_create_response_schema: None,
                    default_provision_parameters: None,
                    maximum_polling_duration: plan.maximum_polling_duration,
                    binding_rotatable: plan.binding_rotatable,
                    maintenance_info: plan.maintenance_info.as_ref().map(|m| PlanMaintenanceInfo {
                        version: m.version.clone(),
                        description: m.description.clone(),
                    }),
                },
            ));
        }
    }
    Ok(CatalogEntries { classes, plans })
}
