//! The broker controller: a ClusterServiceBroker or ServiceBroker is reconciled by fetching its
//! catalog and writing one class per service offering and one plan per plan, named by their
//! catalog ids and owned by the broker. Entries the catalog no longer lists are marked
//! `status.removedFromBrokerCatalog: true`, never deleted, so instances that use them keep them.
//! The catalog is listed again every `relistDuration` (default 15 minutes) unless
//! `relistBehavior` is `Manual`, and whenever the broker's spec changes.
//!
//! What a broker can cost the controller is bounded ([`BrokerPolicy`]): each kind of answer's
//! body, the time of a call, and the services and plans of one catalog (a larger catalog is
//! refused with a condition, nothing written). A namespaced ServiceBroker is a tenant's: its URL
//! must pass the [`UrlPolicy`] before any connection, and its status never says what the other
//! end did (whether it answered, its status code, error text or address), only
//! [`crate::error::UNUSABLE`]; the controller's log has the details. Its failures are written no
//! sooner than [`BrokerPolicy::failure_floor`] after the attempt started, so that how soon one
//! is written does not tell a closed port from an open one either ([`crate::held_failures`]).
//!
//! What the ServiceBrokers of one namespace may list together, and whose turn it is to list,
//! is [`crate::catalog_bounds`]'s.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brokkr_osb::catalog::Catalog;
use brokkr_osb::client::{Auth, BodyLimits, Client as OsbClient};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Context;
use crate::broker_hold;
use crate::catalog_bounds::{self, Existing, NamespaceBounds, Turns};
use crate::conditions;
use crate::error::{Error, detail};
use crate::held_failures::{Held, HeldFailure, HeldFailures};
use crate::names::{label_value, object_name};
use crate::resources::{
    BrokerAuthInfo, ClusterServiceBroker, ClusterServiceClass, ClusterServiceClassSpec,
    ClusterServicePlan, ClusterServicePlanSpec, CommonServiceBrokerSpec, CommonServiceClassSpec,
    CommonServicePlanSpec, ConditionStatus, LocalObjectReference, ObjectReference, RelistBehavior,
    ServiceBroker, ServiceBrokerStatus, ServiceClass, ServiceClassSpec, ServicePlan,
    ServicePlanSpec,
};
use crate::url_policy::UrlPolicy;

/// How often a catalog is listed again when the broker does not say.
pub const DEFAULT_RELIST_DURATION: Duration = Duration::from_secs(15 * 60);
/// The label on every class and plan that names the broker whose catalog lists it.
pub const BROKER_LABEL: &str = "services.brokkr.dev/broker";
/// The field manager of everything the controllers write.
pub const FIELD_MANAGER: &str = "brokkr-controller";
/// How long to wait before trying a broker again after a failure.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);

/// How the controllers call brokers, and what one broker may cost them.
#[derive(Debug, Clone)]
pub struct BrokerPolicy {
    /// The most bytes read of each kind of answer.
    pub body_limits: BodyLimits,
    /// The time limit of one call, the whole answer included.
    pub timeout: Duration,
    /// The time limit of connecting.
    pub connect_timeout: Duration,
    /// The most service offerings one catalog may list.
    pub max_services: usize,
    /// The most plans one catalog may list, over all its services.
    pub max_plans: usize,
    /// Where namespaced ServiceBrokers may point the controller.
    pub namespaced_urls: UrlPolicy,
    /// How many catalogs may be read and written at once (each may hold up to the catalog
    /// limit in memory, so this bounds what many brokers listed together cost).
    pub catalog_permits: Arc<tokio::sync::Semaphore>,
    /// How long after an attempt started a namespaced broker's failure is written, at the
    /// soonest: a refused connection and an answer that is not a catalog both take this long.
    pub failure_floor: Duration,
    /// The failures of namespaced brokers waiting for [`BrokerPolicy::failure_floor`].
    pub held_failures: Arc<HeldFailures>,
    /// What the ServiceBrokers of one namespace may list together.
    pub namespaces: NamespaceBounds,
    /// Whose turn it is to list, per namespace.
    pub turns: Arc<Turns>,
}

impl BrokerPolicy {
    /// The default of [`BrokerPolicy::max_services`].
    pub const DEFAULT_MAX_SERVICES: usize = 200;
    /// The default of [`BrokerPolicy::max_plans`].
    pub const DEFAULT_MAX_PLANS: usize = 1000;
    /// The default of [`BrokerPolicy::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// The default number of [`BrokerPolicy::catalog_permits`].
    pub const DEFAULT_CONCURRENT_CATALOGS: usize = 4;
    /// The default of [`BrokerPolicy::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for BrokerPolicy {
    /// 8 MiB catalogs, 1 MiB other answers, 64 KiB error answers; 60 s a call (10 s to
    /// connect); 200 services and 1,000 plans a catalog, 4 catalogs at once; the default URL
    /// policy; namespaced brokers' failures written 10 s (the connect timeout) after the
    /// attempt started, at the soonest; the default [`NamespaceBounds`].
    fn default() -> Self {
        Self {
            body_limits: BodyLimits::default(),
            timeout: Self::DEFAULT_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            max_services: Self::DEFAULT_MAX_SERVICES,
            max_plans: Self::DEFAULT_MAX_PLANS,
            namespaced_urls: UrlPolicy::default(),
            catalog_permits: Arc::new(tokio::sync::Semaphore::new(
                Self::DEFAULT_CONCURRENT_CATALOGS,
            )),
            failure_floor: Self::DEFAULT_CONNECT_TIMEOUT,
            held_failures: Arc::default(),
            namespaces: NamespaceBounds::default(),
            turns: Arc::default(),
        }
    }
}

/// What differs between a ClusterServiceBroker and a ServiceBroker: where their Secrets, classes
/// and plans live, and which kinds those are.
pub trait BrokerKind:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The class kind its catalog is written to.
    type Class: CatalogEntry;
    /// The plan kind its catalog is written to.
    type Plan: CatalogEntry;
    /// URL, TLS and relisting.
    fn common(&self) -> &CommonServiceBrokerSpec;
    /// The Secret with its credentials: namespace, name and whether it holds basic auth.
    fn auth_secret(&self) -> Result<Option<(String, String, bool)>, Error>;
    /// Its status, if written.
    fn broker_status(&self) -> Option<&ServiceBrokerStatus>;
    /// An API for brokers of its kind, where it lives.
    fn broker_api(&self, client: &Client) -> Api<Self>;
    /// An API for its classes.
    fn class_api(&self, client: &Client) -> Api<Self::Class>;
    /// An API for its plans.
    fn plan_api(&self, client: &Client) -> Api<Self::Plan>;
    /// A class of its catalog.
    fn class(&self, name: &str, spec: CommonServiceClassSpec) -> Self::Class;
    /// A plan of its catalog, of the class named `class`.
    fn plan(&self, name: &str, class: &str, spec: CommonServicePlanSpec) -> Self::Plan;
    /// The broker as a ServiceBroker, when it is one: it is then kept while its namespace's
    /// instances use it ([`crate::broker_hold`]).
    fn as_namespaced(&self) -> Option<&ServiceBroker> {
        None
    }
}

/// A class or plan resource.
pub trait CatalogEntry:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Whether it is marked removed from its broker's catalog.
    fn removed(&self) -> bool;
}

macro_rules! catalog_entry {
    ($($kind:ty),*) => {$(
        impl CatalogEntry for $kind {
            fn removed(&self) -> bool {
                self.status.as_ref().is_some_and(|s| s.removed_from_broker_catalog)
            }
        }
    )*};
}
catalog_entry!(
    ClusterServiceClass,
    ClusterServicePlan,
    ServiceClass,
    ServicePlan
);

fn auth_secret<R>(
    auth: Option<&BrokerAuthInfo<R>>,
    namespace: impl Fn(&R) -> Result<(String, String), Error>,
) -> Result<Option<(String, String, bool)>, Error> {
    let Some(auth) = auth else { return Ok(None) };
    match (&auth.basic, &auth.bearer) {
        (Some(_), Some(_)) => Err(Error::Credentials(
            "authInfo names both basic and bearer; choose one".into(),
        )),
        (Some(basic), None) => namespace(&basic.secret_ref).map(|(ns, n)| Some((ns, n, true))),
        (None, Some(bearer)) => namespace(&bearer.secret_ref).map(|(ns, n)| Some((ns, n, false))),
        (None, None) => Ok(None),
    }
}

/// The objects a broker writes: labelled with its name and owned by it; a namespaced broker's
/// are held by [`broker_hold::FINALIZER`] while instances may need them.
fn entry_meta<B: BrokerKind>(broker: &B, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: broker.namespace(),
        labels: Some([(BROKER_LABEL.to_owned(), label_value(&broker.name_any()))].into()),
        owner_references: broker.controller_owner_ref(&()).map(|o| vec![o]),
        finalizers: broker
            .as_namespaced()
            .map(|_| vec![broker_hold::FINALIZER.to_owned()]),
        ..ObjectMeta::default()
    }
}

impl BrokerKind for ClusterServiceBroker {
    type Class = ClusterServiceClass;
    type Plan = ClusterServicePlan;

    fn common(&self) -> &CommonServiceBrokerSpec {
        &self.spec.common
    }

    fn auth_secret(&self) -> Result<Option<(String, String, bool)>, Error> {
        auth_secret(self.spec.auth_info.as_ref(), |r: &ObjectReference| {
            let ns = r.namespace.clone().ok_or_else(|| {
                Error::Credentials(format!(
                    "the Secret {:?} of a ClusterServiceBroker needs a namespace",
                    r.name
                ))
            })?;
            Ok((ns, r.name.clone()))
        })
    }

    fn broker_status(&self) -> Option<&ServiceBrokerStatus> {
        self.status.as_ref()
    }

    fn broker_api(&self, client: &Client) -> Api<Self> {
        Api::all(client.clone())
    }

    fn class_api(&self, client: &Client) -> Api<ClusterServiceClass> {
        Api::all(client.clone())
    }

    fn plan_api(&self, client: &Client) -> Api<ClusterServicePlan> {
        Api::all(client.clone())
    }

    fn class(&self, name: &str, spec: CommonServiceClassSpec) -> ClusterServiceClass {
        let mut class = ClusterServiceClass::new(
            name,
            ClusterServiceClassSpec {
                cluster_service_broker_name: self.name_any(),
                common: spec,
            },
        );
        class.metadata = entry_meta(self, name);
        class
    }

    fn plan(&self, name: &str, class: &str, spec: CommonServicePlanSpec) -> ClusterServicePlan {
        let mut plan = ClusterServicePlan::new(
            name,
            ClusterServicePlanSpec {
                cluster_service_broker_name: self.name_any(),
                cluster_service_class_ref: LocalObjectReference { name: class.into() },
                common: spec,
            },
        );
        plan.metadata = entry_meta(self, name);
        plan
    }
}

impl BrokerKind for ServiceBroker {
    type Class = ServiceClass;
    type Plan = ServicePlan;

    fn common(&self) -> &CommonServiceBrokerSpec {
        &self.spec.common
    }

    fn auth_secret(&self) -> Result<Option<(String, String, bool)>, Error> {
        let ns = self.namespace().unwrap_or_default();
        auth_secret(self.spec.auth_info.as_ref(), |r: &LocalObjectReference| {
            Ok((ns.clone(), r.name.clone()))
        })
    }

    fn broker_status(&self) -> Option<&ServiceBrokerStatus> {
        self.status.as_ref()
    }

    fn broker_api(&self, client: &Client) -> Api<Self> {
        Api::namespaced(client.clone(), &self.namespace().unwrap_or_default())
    }

    fn class_api(&self, client: &Client) -> Api<ServiceClass> {
        Api::namespaced(client.clone(), &self.namespace().unwrap_or_default())
    }

    fn plan_api(&self, client: &Client) -> Api<ServicePlan> {
        Api::namespaced(client.clone(), &self.namespace().unwrap_or_default())
    }

    fn class(&self, name: &str, spec: CommonServiceClassSpec) -> ServiceClass {
        let mut class = ServiceClass::new(
            name,
            ServiceClassSpec {
                service_broker_name: self.name_any(),
                common: spec,
            },
        );
        class.metadata = entry_meta(self, name);
        class
    }

    fn plan(&self, name: &str, class: &str, spec: CommonServicePlanSpec) -> ServicePlan {
        let mut plan = ServicePlan::new(
            name,
            ServicePlanSpec {
                service_broker_name: self.name_any(),
                service_class_ref: LocalObjectReference { name: class.into() },
                common: spec,
            },
        );
        plan.metadata = entry_meta(self, name);
        plan
    }

    fn as_namespaced(&self) -> Option<&ServiceBroker> {
        Some(self)
    }
}

/// Reconciles one broker: lists its catalog and writes its status.
pub async fn reconcile<B: BrokerKind>(broker: Arc<B>, ctx: Arc<Context>) -> Result<Action, Error> {
    let uid = broker.meta().uid.clone().unwrap_or_default();
    let generation = broker.meta().generation.unwrap_or_default();
    let held = &ctx.brokers.held_failures;
    if let Some(namespaced) = broker.as_namespaced()
        && namespaced.metadata.deletion_timestamp.is_some()
    {
        held.forget(&uid);
        return broker_hold::release(namespaced, &ctx).await;
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
    let Some(_turn) = catalog_bounds::turn(&*broker, &ctx) else {
        return Ok(Action::requeue(catalog_bounds::BUSY_RETRY));
    };
    if let Some(namespaced) = broker.as_namespaced() {
        broker_hold::hold(namespaced, &ctx).await?;
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

/// Writes `Ready=False` with `reason` and `message` into the broker's status.
async fn write_failure<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
    reason: &'static str,
    message: String,
) -> Result<(), Error> {
    let mut status = broker.broker_status().cloned().unwrap_or_default();
    status.observed_generation = broker.meta().generation.unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        "Ready",
        ConditionStatus::False,
        reason,
        message,
    );
    status.last_condition_state = reason.into();
    patch_status(broker, ctx, &status).await
}

async fn patch_status<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
    status: &ServiceBrokerStatus,
) -> Result<(), Error> {
    // A status as it was is not written again: a broker refused the same way at each look
    // (its namespace's bounds, say) costs no write, and wakes nothing.
    if broker.broker_status() == Some(status) {
        return Ok(());
    }
    broker
        .broker_api(&ctx.client)
        .patch_status(
            &broker.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    Ok(())
}

/// When the broker's catalog was listed for its current spec and the next relist is not due
/// yet: what to wait for.
fn not_due<B: BrokerKind>(broker: &B) -> Option<Action> {
    let status = broker.broker_status()?;
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True);
    if !ready || status.reconciled_generation != broker.meta().generation.unwrap_or_default() {
        return None;
    }
    let common = broker.common();
    match common.relist_behavior {
        RelistBehavior::Manual => Some(Action::await_change()),
        RelistBehavior::Duration => {
            let every = common
                .relist_duration
                .map_or(DEFAULT_RELIST_DURATION, Duration::from);
            let last = status.last_catalog_retrieval_time.as_ref()?.0;
            let since = k8s_openapi::jiff::Timestamp::now().duration_since(last);
            let left = every.checked_sub(since.try_into().ok()?)?;
            (!left.is_zero()).then(|| Action::requeue(left))
        }
    }
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy<B: BrokerKind>(_: Arc<B>, error: &Error, _: Arc<Context>) -> Action {
    match error {
        // Each look may fetch the catalog again; a spec change wakes the broker at once.
        Error::NamespaceCatalogLimit(_) => Action::requeue(catalog_bounds::LIMIT_RETRY),
        _ => Action::requeue(RETRY_AFTER_FAILURE),
    }
}

/// A client for the broker, with the credentials of its Secret, the bounds of `ctx`'s
/// [`BrokerPolicy`], and, for a namespaced broker, its URL policy.
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

/// Fetches the broker's catalog and writes it as classes and plans.
///
/// What exists already is read once, as metadata, before anything is written (whose each
/// entry is, what the namespace holds): a listing costs no more memory than the catalog it
/// reads, however large the classes and plans already written are.
async fn list_catalog<B: BrokerKind>(broker: &B, ctx: &Context) -> Result<(), Error> {
    catalog_bounds::check_broker_count(broker, ctx)?;
    let osb = osb_client(broker, ctx).await?;
    let class_api = broker.class_api(&ctx.client);
    let plan_api = broker.plan_api(&ctx.client);
    let everything = ListParams::default();
    let held_classes = Existing::new(class_api.list_metadata(&everything).await?.items);
    let held_plans = Existing::new(plan_api.list_metadata(&everything).await?.items);
    if let Some(namespaced) = broker.as_namespaced() {
        catalog_bounds::check_room(namespaced, ctx, &held_classes, &held_plans)?;
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
        catalog_bounds::check_listing(
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
                },
            ));
        }
    }
    Ok(CatalogEntries { classes, plans })
}
