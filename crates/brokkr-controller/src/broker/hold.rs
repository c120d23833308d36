//! A namespaced broker outlives the instances it serves.
//!
//! Deleting a namespace deletes everything in it at once: a ServiceBroker, its ServiceClasses
//! and ServicePlans and the Secret with its credentials would go at once, and the namespace's
//! ServiceInstances — whose finalizers wait for a deprovision — could then never reach their
//! broker, leaving the namespace stuck until an admin abandons them. So the controller keeps a
//! finalizer on a ServiceBroker, on each class and plan it lists and on its credentials Secret,
//! and releases them only once no ServiceInstance of the namespace that uses one of its classes
//! still waits for its finalizer. Deleting a ServiceBroker by itself waits in the same way, with
//! a condition that says for which instances.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use serde_json::json;

use super::bounds::{self, BUSY_RETRY};
use crate::context::Context;
use crate::error::Error;
use crate::names::{BROKER_LABEL, label_value};
use crate::resources::{
    ConditionStatus, ServiceBroker, ServiceClass, ServiceInstance, ServicePlan,
};
use crate::{conditions, finalizer};

use crate::finalizer::SERVICE_BROKER as FINALIZER;
/// How often a broker being deleted looks again at the instances it waits for.
const RECHECK: Duration = Duration::from_secs(5);

/// Holds `broker` and its credentials Secret (if any) with the finalizer.
pub async fn hold(broker: &ServiceBroker, ctx: &Context) -> Result<(), Error> {
    let ns = broker.namespace().unwrap_or_default();
    finalizer::add(&Api::namespaced(ctx.client.clone(), &ns), broker, FINALIZER).await?;
    if let Some(name) = secret_name(broker) {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        if let Some(secret) = secrets.get_opt(&name).await?
            && secret.metadata.deletion_timestamp.is_none()
        {
            finalizer::add(&secrets, &secret, FINALIZER).await?;
        }
    }
    Ok(())
}

/// A ServiceBroker being deleted: waits while instances use its classes, then releases its
/// classes, plans, Secret and itself.
pub async fn release(broker: &ServiceBroker, ctx: &Context) -> Result<Action, Error> {
    if !finalizer::has(broker, FINALIZER) {
        return Ok(Action::await_change());
    }
    // One namespace's brokers are released one at a time, as they are listed: deleting many
    // large catalogs at once takes no more of the controller than listing them.
    let Some(_turn) = bounds::release_turn(broker, ctx) else {
        return Ok(Action::requeue(BUSY_RETRY));
    };
    let ns = broker.namespace().unwrap_or_default();
    let by_broker = ListParams::default().labels(&format!(
        "{BROKER_LABEL}={}",
        label_value(&broker.name_any())
    ));
    let classes = Api::<ServiceClass>::namespaced(ctx.client.clone(), &ns)
        .list(&by_broker)
        .await?
        .items;
    let waiting: Vec<String> = Api::<ServiceInstance>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|i| finalizer::has(i, finalizer::SERVICE_INSTANCE))
        .filter(|i| classes.iter().any(|c| uses(i, c)))
        .map(|i| i.name_any())
        .collect();
    let brokers: Api<ServiceBroker> = Api::namespaced(ctx.client.clone(), &ns);
    if !waiting.is_empty() {
        let mut status = broker.status.clone().unwrap_or_default();
        let message = format!(
            "kept until the ServiceInstances that use its classes are deprovisioned: {}",
            waiting.join(", ")
        );
        let said = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && conditions::says(c, &message));
        if !said {
            conditions::set(
                &mut status.conditions,
                "Ready",
                ConditionStatus::False,
                "DeletionWaitsForInstances",
                message,
            );
            status.last_condition_state = "DeletionWaitsForInstances".into();
            brokers
                .patch_status(
                    &broker.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
        }
        return Ok(Action::requeue(RECHECK));
    }
    let class_api: Api<ServiceClass> = Api::namespaced(ctx.client.clone(), &ns);
    for class in &classes {
        finalizer::remove(&class_api, class, FINALIZER).await?;
    }
    let plan_api: Api<ServicePlan> = Api::namespaced(ctx.client.clone(), &ns);
    // Their metadata is all a finalizer needs: a broker's plans may be thousands of schemas.
    for plan in plan_api.list_metadata(&by_broker).await?.items {
        finalizer::remove(&plan_api, &plan, FINALIZER).await?;
    }
    if let Some(name) = secret_name(broker) {
        let others_use_it = brokers
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|b| {
                b.uid() != broker.uid()
                    && b.metadata.deletion_timestamp.is_none()
                    && secret_name(b).as_deref() == Some(name.as_str())
            });
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        if !others_use_it && let Some(secret) = secrets.get_opt(&name).await? {
            finalizer::remove(&secrets, &secret, FINALIZER).await?;
        }
    }
    finalizer::remove(&brokers, broker, FINALIZER).await?;
    Ok(Action::await_change())
}

/// The name of the Secret with the broker's credentials, if it names one.
fn secret_name(broker: &ServiceBroker) -> Option<String> {
    let auth = broker.spec.auth_info.as_ref()?;
    auth.basic
        .as_ref()
        .map(|b| b.secret_ref.name.clone())
        .or_else(|| auth.bearer.as_ref().map(|b| b.secret_ref.name.clone()))
}

/// Whether `instance` names `class` (by resource name, catalog name or catalog id).
fn uses(instance: &ServiceInstance, class: &ServiceClass) -> bool {
    let spec = &instance.spec;
    spec.service_class_name.as_deref() == Some(class.name_any().as_str())
        || spec.service_class_external_name.as_deref()
            == Some(class.spec.common.external_name.as_str())
        || spec.service_class_external_id.as_deref() == Some(class.spec.common.external_id.as_str())
        || spec.service_class_ref.as_ref().map(|r| r.name.as_str())
            == Some(class.name_any().as_str())
}
