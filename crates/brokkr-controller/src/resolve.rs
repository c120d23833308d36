//! What one object names, as the controllers find it: the class and plan a ServiceInstance
//! names, found among the catalog resources of its scope; a client of the broker that offers
//! them, built from the broker's spec, its credentials and the
//! [`BrokerPolicy`](crate::broker_policy::BrokerPolicy); and the
//! ServiceBindings that name an instance.

use std::time::Duration;

use brokkr_osb::client::{Auth, Client as OsbClient, PlanRef};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt as _};

use crate::broker_kind::BrokerKind;
use crate::catalog_index::CatalogName;
use crate::context::Context;
use crate::error::Error;
use crate::identity;
use crate::resources::{
    CommonServiceClassSpec, CommonServicePlanSpec, ProvisionStatus, ServiceBinding,
    ServiceClassStatus, ServiceInstance,
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
    /// What a status says of the failed call `e` to this broker: for a namespaced broker,
    /// nothing of what the other end did ([`crate::error::said`]); the log has it.
    pub fn said(&self, e: &brokkr_osb::client::Error) -> String {
        if !self.cluster {
            tracing::warn!(error = %crate::error::detail(e), "a call to a namespaced broker failed");
        }
        crate::error::said(e, !self.cluster)
    }

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

    /// The names it gives, to look up in that order.
    fn names(&self) -> Vec<CatalogName<'_>> {
        let external = self.external_name.as_deref().map(CatalogName::External);
        let id = self.external_id.as_deref().map(CatalogName::Id);
        let resource = self.name.as_deref().map(CatalogName::Resource);
        [external, id, resource].into_iter().flatten().collect()
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
    spec: CommonServicePlanSpec,
}

/// The class of the instance's scope that `by` names, from the caches' catalog index.
fn find_class(ctx: &Context, cluster: bool, ns: &str, by: &Named) -> Option<ClassEntry> {
    let removed = |s: Option<&ServiceClassStatus>| s.is_some_and(|s| s.removed_from_broker_catalog);
    let (caches, names) = (&ctx.caches, by.names());
    if cluster {
        let c = caches
            .catalog
            .cluster_class(&caches.cluster_classes, &names)?;
        Some(ClassEntry {
            name: c.name_any(),
            removed: removed(c.status.as_ref()),
            broker: c.spec.cluster_service_broker_name.clone(),
            spec: c.spec.common.clone(),
        })
    } else {
        let c = caches.catalog.class(&caches.classes, ns, &names)?;
        Some(ClassEntry {
            name: c.name_any(),
            removed: removed(c.status.as_ref()),
            broker: c.spec.service_broker_name.clone(),
            spec: c.spec.common.clone(),
        })
    }
}

/// The plan of the class `class` that `by` names, from the caches' catalog index.
fn find_plan(ctx: &Context, cluster: bool, ns: &str, class: &str, by: &Named) -> Option<PlanEntry> {
    let (caches, names) = (&ctx.caches, by.names());
    let spec = match cluster {
        true => caches
            .catalog
            .cluster_plan(&caches.cluster_plans, class, &names)?
            .spec
            .common
            .clone(),
        false => caches
            .catalog
            .plan(&caches.plans, ns, class, &names)?
            .spec
            .common
            .clone(),
    };
    Some(PlanEntry { spec })
}

/// The broker resource whose catalog holds the instance's class, e.g. `ClusterServiceBroker/db`,
/// found without calling it: what an abandoned instance leaves behind.
pub(crate) async fn broker_of(instance: &ServiceInstance, ctx: &Context) -> Option<String> {
    let (cluster, class_by, _) = named(instance);
    let class = find_class(
        ctx,
        cluster,
        &instance.namespace().unwrap_or_default(),
        &class_by,
    )?;
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

/// A class and plan found in the caches, and their kinds' names.
struct Found {
    class: ClassEntry,
    plan: PlanEntry,
    class_kind: &'static str,
    plan_kind: &'static str,
}

/// The class and plan the spec names, from the caches; `Err(message)` when the catalog does
/// not (yet) have them.
fn find(instance: &ServiceInstance, ctx: &Context) -> Result<Found, String> {
    let ns = instance.namespace().unwrap_or_default();
    let (cluster, class_by, plan_by) = named(instance);
    let (Some(class_wanted), Some(plan_wanted)) = (class_by.wanted(), plan_by.wanted()) else {
        return Err("the spec names no class or no plan".into());
    };
    let (class_kind, plan_kind) = if cluster {
        ("ClusterServiceClass", "ClusterServicePlan")
    } else {
        ("ServiceClass", "ServicePlan")
    };
    let provisioned = instance
        .status
        .as_ref()
        .is_some_and(|s| s.provision_status == Some(ProvisionStatus::Provisioned));
    let Some(class) = find_class(ctx, cluster, &ns, &class_by) else {
        return Err(format!(
            "no {class_kind} {class_wanted:?} in any broker's catalog"
        ));
    };
    if class.removed && !provisioned {
        return Err(format!(
            "the {class_kind} {} was removed from its broker's catalog",
            class.name
        ));
    }
    let Some(plan) = find_plan(ctx, cluster, &ns, &class.name, &plan_by) else {
        return Err(format!(
            "no {plan_kind} {plan_wanted:?} of the {class_kind} {:?}",
            class.spec.external_name
        ));
    };
    Ok(Found {
        class,
        plan,
        class_kind,
        plan_kind,
    })
}

/// The plan the spec names, from the caches alone (no broker client is built).
pub(crate) fn plan_of(instance: &ServiceInstance, ctx: &Context) -> Option<CommonServicePlanSpec> {
    find(instance, ctx).ok().map(|found| found.plan.spec)
}

/// Finds the class and plan the spec names, and a client of their broker. `Ok(Err(message))`
/// when the catalog does not (yet) have them.
pub(crate) async fn resolve(
    instance: &ServiceInstance,
    ctx: &Context,
) -> Result<Result<Resolved, String>, Error> {
    let ns = instance.namespace().unwrap_or_default();
    let cluster = named(instance).0;
    let Found {
        class,
        plan,
        class_kind,
        plan_kind,
    } = match find(instance, ctx) {
        Ok(found) => found,
        Err(missing) => return Ok(Err(missing)),
    };
    let gone = || {
        Error::Credentials(format!(
            "the broker {:?} of the {class_kind} {} does not exist",
            class.broker, class.name
        ))
    };
    let osb = if cluster {
        let broker = ctx
            .caches
            .cluster_brokers
            .get(&ObjectRef::new(&class.broker))
            .ok_or_else(gone)?;
        osb_client(broker.as_ref(), ctx).await?
    } else {
        let broker = ctx
            .caches
            .brokers
            .get(&ObjectRef::new(&class.broker).within(&ns))
            .ok_or_else(gone)?;
        osb_client(broker.as_ref(), ctx).await?
    };
    Ok(Ok(Resolved {
        osb,
        class_display: format!("{class_kind}/{}", class.spec.external_name),
        plan_display: format!("{plan_kind}/{}", plan.spec.external_name),
        class: class.spec,
        plan: plan.spec,
        cluster,
    }))
}

/// A client for the broker, with the credentials of its Secret, the bounds of `ctx`'s
/// [`BrokerPolicy`](crate::broker_policy::BrokerPolicy), and, for a namespaced broker, its URL policy.
pub(crate) async fn osb_client<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
) -> Result<OsbClient, Error> {
    let secret = broker.auth_secret()?;
    let secret_ref = secret
        .as_ref()
        .map(|(ns, name, _)| (ns.clone(), name.clone()));
    ctx.caches
        .osb_client(broker, secret_ref, async || {
            build_osb_client(broker, ctx, secret).await
        })
        .await
}

/// A new client of `broker`, with the credentials of its Secret `secret`.
async fn build_osb_client<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
    secret: Option<(String, String, bool)>,
) -> Result<OsbClient, Error> {
    let client = &ctx.client;
    let common = broker.common();
    let policy = &ctx.brokers;
    let mut builder = OsbClient::builder(&common.url)
        .insecure_skip_tls_verify(common.insecure_skip_tls_verify)
        .timeout(policy.timeout)
        .connect_timeout(policy.connect_timeout)
        .body_limits(policy.body_limits);
    if broker.namespace().is_some()
        && let Some(filter) = policy.namespaced_urls.filter_for(&common.url)
    {
        builder = builder.connect_only_to(filter);
    }
    if let Some(bundle) = &common.ca_bundle {
        use base64::Engine as _;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle.trim())
            .map_err(|e| Error::Credentials(format!("caBundle is not valid base64: {e}")))?;
        builder = builder.ca_bundle(pem);
    }
    if let Some((ns, name, basic)) = secret {
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt(&name)
            .await?
            .ok_or_else(|| Error::Credentials(format!("the Secret {ns}/{name} does not exist")))?;
        let key = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| {
                    Error::Credentials(format!(
                        "the Secret {ns}/{name} has no text under the key {key:?}"
                    ))
                })
        };
        builder = builder.auth(Some(if basic {
            Auth::Basic {
                username: key("username")?,
                password: key("password")?,
            }
        } else {
            Auth::Bearer(key("token")?)
        }));
    }
    Ok(builder.build()?)
}

/// The ServiceBindings of `namespace` that name `instance`.
pub async fn bindings_of(
    client: &kube::Client,
    namespace: &str,
    instance: &str,
) -> Result<Vec<ServiceBinding>, kube::Error> {
    let all = Api::<ServiceBinding>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await?;
    Ok(all
        .into_iter()
        .filter(|b| identity::bound_instance_name(b) == instance)
        .collect())
}
