//! The watch caches the controllers read instead of the API server.
//!
//! A reconcile needs the catalog (classes, plans and the brokers that listed them, of both
//! scopes), whether a Secret exists and which version of it, and whether a namespace is being
//! deleted. Asking the API server each time costs requests that grow with instances × catalog
//! size; here each kind is watched once (kube-runtime reflectors) and read from memory.
//!
//! - Catalog kinds, ServiceInstances and ServiceBindings are cached whole; Secrets and
//!   Namespaces by their metadata alone (a `PartialObjectMetadata` watch), so that no
//!   credential is held in memory for the cache's sake and a cluster's many Secrets cost a few
//!   hundred bytes each.
//! - Every cached object drops its `managedFields`, which the controllers never read and which
//!   are often the largest part of an object.
//! - Classes and plans of both scopes keep only what reconciles read (`slim_catalog_entry`):
//!   names, ids, flags, the broker and class they belong to, whether they were removed from
//!   the catalog. Schemas, descriptions, the catalog's `metadata` and annotations go: a plan
//!   of 8 KB in the API server is a few hundred bytes here.
//! - ServiceInstances, ServiceBindings and Secrets are also followed: every change is broadcast
//!   ([`Caches::instance_changes`], [`Caches::binding_changes`], [`Caches::secret_changes`]), so
//!   that each controller that reacts to a kind follows the one watch of it instead of watching
//!   it again; instances and bindings as references, so that a follower that falls behind
//!   keeps no object alive. The instance and binding controllers are woken from there too. A
//!   listing is not broadcast object by object but as one "anything may have changed" at its
//!   end, once the store holds it all ([`Seen::Missed`]).
//! - [`Caches::start`] drives the reflectors (once, when the controllers start), and
//!   [`Caches::ready`] waits for their first complete listing: a controller that started before
//!   would take an empty catalog for a missing one.
//! - OSB clients are built once per broker and reused while neither the broker nor its
//!   credentials Secret changed ([`Caches::osb_client`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use brokkr_osb::client::Client as OsbClient;
use futures::future::BoxFuture;
use std::sync::atomic::Ordering;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::catalog_index::CatalogIndex;
use crate::changes::{
    BindingChange, Broadcast, CHANGES_BUFFER, InstanceChange, PlanChange, SecretChange, Seen,
    broadcast, follow, woken,
};
use crate::index::Index;
use crate::instance_views::InstanceViews;
use crate::resources::{
    ClusterServiceBroker, ClusterServiceClass, ClusterServicePlan, ServiceBinding, ServiceBroker,
    ServiceClass, ServiceInstance, ServicePlan,
};
use crate::resources::{parameter_secrets, transform_sources};
use crate::scope::Scope;
use crate::status::Written;

/// The caches, read by every reconcile.
pub struct Caches {
    /// Every ServiceInstance of the watched namespaces.
    pub instances: Store<ServiceInstance>,
    /// Every ServiceBinding of the watched namespaces.
    pub bindings: Store<ServiceBinding>,
    /// Every ClusterServiceBroker (none in a namespace's own scope, nor the cluster's classes
    /// and plans, nor Namespaces).
    pub cluster_brokers: Store<ClusterServiceBroker>,
    /// Every ServiceBroker of the watched namespaces.
    pub brokers: Store<ServiceBroker>,
    /// Every ClusterServiceClass.
    pub cluster_classes: Store<ClusterServiceClass>,
    /// Every ClusterServicePlan.
    pub cluster_plans: Store<ClusterServicePlan>,
    /// Every ServiceClass of the watched namespaces.
    pub classes: Store<ServiceClass>,
    /// Every ServicePlan of the watched namespaces.
    pub plans: Store<ServicePlan>,
    /// The metadata of every Secret of the watched namespaces.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// The metadata of every Namespace.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    writers: Mutex<Option<Writers>>,
    /// Whether cluster-scoped kinds are watched: not in a namespace's own scope, whose
    /// controller may not list them and serves only its namespace's brokers.
    cluster_watched: std::sync::atomic::AtomicBool,
    osb_clients: Mutex<HashMap<ObjectRef<ClusterServiceBroker>, CachedClient>>,
    instances_changed: Broadcast<InstanceChange>,
    bindings_changed: Broadcast<BindingChange>,
    secrets_changed: Broadcast<SecretChange>,
    plans_changed: Broadcast<PlanChange>,
    /// Bindings by the instance they name.
    bindings_by_instance: Arc<Index<ServiceBinding>>,
    /// Bindings by the Secrets they read (`parametersFrom`, `addKeysFrom`).
    bindings_by_secret: Arc<Index<ServiceBinding>>,
    /// Instances by the Secrets their `parametersFrom` names.
    instances_by_secret: Arc<Index<ServiceInstance>>,
    /// Instances by their OSB id, whatever their namespace.
    instances_by_id: Arc<Index<ServiceInstance>>,
    /// What the bindings of each instance read of it.
    instance_views: Arc<InstanceViews>,
    /// The classes and plans of both scopes by the names an instance may give them.
    pub catalog: Arc<CatalogIndex>,
}

/// The writing halves of the stores, until [`Caches::start`] takes them.
struct Writers {
    instances: Writer<ServiceInstance>,
    bindings: Writer<ServiceBinding>,
    cluster_brokers: Writer<ClusterServiceBroker>,
    brokers: Writer<ServiceBroker>,
    cluster_classes: Writer<ClusterServiceClass>,
    cluster_plans: Writer<ClusterServicePlan>,
    classes: Writer<ServiceClass>,
    plans: Writer<ServicePlan>,
    secrets: Writer<PartialObjectMeta<Secret>>,
    namespaces: Writer<PartialObjectMeta<Namespace>>,
}

/// An OSB client, and the versions of the broker and of its credentials Secret it was built
/// from.
struct CachedClient {
    versions: (Option<String>, Option<String>),
    client: OsbClient,
}

impl Default for Caches {
    fn default() -> Self {
        let (instances, w_instances) = reflector::store();
        let (bindings, w_bindings) = reflector::store();
        let (cluster_brokers, w_cluster_brokers) = reflector::store();
        let (brokers, w_brokers) = reflector::store();
        let (cluster_classes, w_cluster_classes) = reflector::store();
        let (cluster_plans, w_cluster_plans) = reflector::store();
        let (classes, w_classes) = reflector::store();
        let (plans, w_plans) = reflector::store();
        let (secrets, w_secrets) = reflector::store();
        let (namespaces, w_namespaces) = reflector::store();
        Self {
            instances,
            bindings,
            cluster_brokers,
            brokers,
            cluster_classes,
            cluster_plans,
            classes,
            plans,
            secrets,
            namespaces,
            writers: Mutex::new(Some(Writers {
                instances: w_instances,
                bindings: w_bindings,
                cluster_brokers: w_cluster_brokers,
                brokers: w_brokers,
                cluster_classes: w_cluster_classes,
                cluster_plans: w_cluster_plans,
                classes: w_classes,
                plans: w_plans,
                secrets: w_secrets,
                namespaces: w_namespaces,
            })),
            cluster_watched: std::sync::atomic::AtomicBool::new(false),
            osb_clients: Mutex::new(HashMap::new()),
            instances_changed: broadcast::channel(CHANGES_BUFFER).0,
            bindings_changed: broadcast::channel(CHANGES_BUFFER).0,
            secrets_changed: broadcast::channel(CHANGES_BUFFER).0,
            plans_changed: broadcast::channel(CHANGES_BUFFER).0,
            bindings_by_instance: Arc::new(Index::new(|b| {
                vec![crate::identity::bound_instance_name(b).to_owned()]
            })),
            bindings_by_secret: Arc::new(Index::new(|b| {
                parameter_secrets(&b.spec.parameters_from)
                    .map(str::to_owned)
                    .chain(transform_sources(&b.spec.secret_transforms))
                    .collect()
            })),
            instance_views: Arc::default(),
            instances_by_secret: Arc::new(Index::new(|i| {
                parameter_secrets(&i.spec.parameters_from)
                    .map(str::to_owned)
                    .collect()
            })),
            instances_by_id: Arc::new(Index::cluster_wide(|i| {
                vec![crate::identity::instance_id(i)]
            })),
            catalog: Arc::default(),
        }
    }
}

impl Caches {
    /// The ServiceInstances created, changed or deleted from now on.
    pub fn instance_changes(
        &self,
    ) -> impl futures::Stream<Item = Seen<Arc<InstanceChange>>> + Send + use<> {
        follow(&self.instances_changed)
    }

    /// The ServiceBindings created, changed or deleted from now on.
    pub fn binding_changes(
        &self,
    ) -> impl futures::Stream<Item = Seen<Arc<BindingChange>>> + Send + use<> {
        follow(&self.bindings_changed)
    }

    /// The Secrets (metadata) created, changed or deleted from now on.
    pub fn secret_changes(
        &self,
    ) -> impl futures::Stream<Item = Seen<Arc<SecretChange>>> + Send + use<> {
        follow(&self.secrets_changed)
    }

    /// The ClusterServicePlans and ServicePlans created, changed or deleted from now on.
    pub fn plan_changes(
        &self,
    ) -> impl futures::Stream<Item = Seen<Arc<PlanChange>>> + Send + use<> {
        follow(&self.plans_changed)
    }

    /// The futures that fill the caches from watches of `client`, namespaced kinds within
    /// `scope`; they run until dropped. Only the first call gets them; later calls get none.
    /// `written` is told what the instance and binding watches deliver.
    pub fn start(
        &self,
        client: &Client,
        scope: &Scope,
        written: &Arc<Written>,
    ) -> Vec<BoxFuture<'static, ()>> {
        let Some(w) = self.writers.lock().expect("lock").take() else {
            return Vec::new();
        };
        let config = scope.watch_config();
        let (instances, bindings, secrets) = (
            self.instances_changed.clone(),
            self.bindings_changed.clone(),
            self.secrets_changed.clone(),
        );
        let (plans, cluster_plans) = (self.plans_changed.clone(), self.plans_changed.clone());
        let (instances_written, bindings_written) = (written.clone(), written.clone());
        let instances_by_secret = self.instances_by_secret.clone();
        let instances_by_id = self.instances_by_id.clone();
        let instance_views = self.instance_views.clone();
        let (bindings_by_instance, bindings_by_secret) = (
            self.bindings_by_instance.clone(),
            self.bindings_by_secret.clone(),
        );
        let mut drivers = vec![
            reflect(
                scope.api(client),
                config.clone(),
                w.instances,
                move |event| {
                    instances_written.watched(&event);
                    instances_by_secret.apply(&event);
                    instances_by_id.apply(&event);
                    let concerns_bindings = instance_views.concerns_bindings(&event);
                    broadcast(&instances, event, |i: ServiceInstance, deleted| {
                        InstanceChange {
                            own_write: !deleted && instances_written.is_own(&i),
                            concerns_bindings,
                            instance: ObjectRef::from_obj(&i),
                        }
                    });
                },
            ),
            reflect(
                scope.api(client),
                config.clone(),
                w.bindings,
                move |event| {
                    bindings_written.watched(&event);
                    bindings_by_instance.apply(&event);
                    bindings_by_secret.apply(&event);
                    broadcast(&bindings, event, |b: ServiceBinding, deleted| {
                        BindingChange {
                            own_write: !deleted && bindings_written.is_own(&b),
                            gone: deleted,
                            instance: ObjectRef::new(crate::identity::bound_instance_name(&b))
                                .within(b.metadata.namespace.as_deref().unwrap_or_default()),
                            binding: ObjectRef::from_obj(&b),
                        }
                    });
                },
            ),
            reflect(scope.api(client), config.clone(), w.brokers, drop),
            reflect_with(
                scope.api(client),
                config.clone(),
                w.classes,
                |c: &mut ServiceClass| slim_catalog_entry(c, |c| &mut c.spec.common),
                {
                    let catalog = self.catalog.clone();
                    move |event| catalog.class_event(&event)
                },
            ),
            reflect_with(
                scope.api(client),
                config.clone(),
                w.plans,
                |p: &mut ServicePlan| slim_catalog_entry(p, |p| &mut p.spec.common),
                {
                    let catalog = self.catalog.clone();
                    move |event| {
                        catalog.plan_event(&event);
                        broadcast(&plans, event, |p: ServicePlan, _| PlanChange {
                            namespace: p.metadata.namespace,
                            external_id: p.spec.common.external_id,
                        });
                    }
                },
            ),
            reflect(
                scope.api::<PartialObjectMeta<Secret>>(client),
                config,
                w.secrets,
                move |event| {
                    broadcast(&secrets, event, |secret, gone| SecretChange {
                        secret,
                        gone,
                    });
                },
            ),
        ];
        if scope.reconciles_cluster_brokers() {
            self.cluster_watched.store(true, Ordering::Relaxed);
            let all = watcher::Config::default;
            let namespaces = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
            drivers.extend([
                reflect(Api::all(client.clone()), all(), w.cluster_brokers, drop),
                reflect_with(
                    Api::all(client.clone()),
                    all(),
                    w.cluster_classes,
                    |c: &mut ClusterServiceClass| slim_catalog_entry(c, |c| &mut c.spec.common),
                    {
                        let catalog = self.catalog.clone();
                        move |event| catalog.cluster_class_event(&event)
                    },
                ),
                reflect_with(
                    Api::all(client.clone()),
                    all(),
                    w.cluster_plans,
                    |p: &mut ClusterServicePlan| slim_catalog_entry(p, |p| &mut p.spec.common),
                    {
                        let catalog = self.catalog.clone();
                        move |event| {
                            catalog.cluster_plan_event(&event);
                            broadcast(&cluster_plans, event, |p: ClusterServicePlan, _| {
                                PlanChange {
                                    namespace: None,
                                    external_id: p.spec.common.external_id,
                                }
                            });
                        }
                    },
                ),
                reflect(namespaces, all(), w.namespaces, drop),
            ]);
        }
        drivers
    }

    /// Waits until every cache has listed its kind once.
    pub async fn ready(&self) {
        // `wait_until_ready` fails only when the writer is dropped, i.e. at shutdown.
        let _ = futures::join!(
            self.instances.wait_until_ready(),
            self.bindings.wait_until_ready(),
            self.brokers.wait_until_ready(),
            self.classes.wait_until_ready(),
            self.plans.wait_until_ready(),
            self.secrets.wait_until_ready(),
        );
        if self.cluster_watched.load(Ordering::Relaxed) {
            let _ = futures::join!(
                self.cluster_brokers.wait_until_ready(),
                self.cluster_classes.wait_until_ready(),
                self.cluster_plans.wait_until_ready(),
                self.namespaces.wait_until_ready(),
            );
        }
    }

    /// The ServiceInstances, of any namespace served, that have or will be provisioned with
    /// the OSB instance id `id`.
    pub fn instances_with_id(&self, id: &str) -> Vec<ObjectRef<ServiceInstance>> {
        self.instances_by_id.get("", id)
    }

    /// The ServiceBindings that name `instance`.
    pub fn bindings_of_instance(
        &self,
        instance: &ObjectRef<ServiceInstance>,
    ) -> Vec<ObjectRef<ServiceBinding>> {
        let namespace = instance.namespace.as_deref().unwrap_or_default();
        self.bindings_by_instance.get(namespace, &instance.name)
    }

    /// The ServiceBindings a change to a Secret concerns: those that read it (`parametersFrom`,
    /// `addKeysFrom`), and, when it was deleted, the one whose credentials it held (its
    /// controller), which restores it unless it is being deleted itself. The binding writes its
    /// Secret itself and does not read it back, so its other changes (its creation by that
    /// binding, first of all) are no news to it.
    pub fn bindings_of_secret(&self, change: &SecretChange) -> Vec<ObjectRef<ServiceBinding>> {
        let secret = &change.secret;
        let namespace = secret.metadata.namespace.as_deref().unwrap_or_default();
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        // A binding being deleted deletes its Secrets itself.
        let owners = (secret.owner_references().iter())
            .filter(|o| {
                change.gone && o.controller == Some(true) && o.kind == ServiceBinding::kind(&())
            })
            .map(|o| ObjectRef::new(&o.name).within(namespace))
            .filter(|owner| {
                (self.bindings.get(owner)).is_some_and(|b| b.metadata.deletion_timestamp.is_none())
            });
        let mut bindings: Vec<_> = owners
            .chain(self.bindings_by_secret.get(namespace, name))
            .collect();
        bindings.sort_by(|a, b| a.name.cmp(&b.name));
        bindings.dedup();
        bindings
    }

    /// The ServiceInstances whose `parametersFrom` names `secret`: a change to it may change
    /// their parameters.
    pub fn instances_of_secret(
        &self,
        secret: &PartialObjectMeta<Secret>,
    ) -> Vec<ObjectRef<ServiceInstance>> {
        let namespace = secret.metadata.namespace.as_deref().unwrap_or_default();
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        self.instances_by_secret.get(namespace, name)
    }

    /// The provisioned ServiceInstances of the plan that changed: a scan, as plans change
    /// seldom (an instance not yet provisioned reads its plan when it is).
    pub fn instances_of_plan(&self, plan: &PlanChange) -> Vec<ObjectRef<ServiceInstance>> {
        woken(&self.instances, |i| {
            let Some(sent) = i
                .status
                .as_ref()
                .and_then(|s| s.external_properties.as_ref())
            else {
                return false;
            };
            match &plan.namespace {
                None => sent.cluster_service_plan_external_id.as_ref() == Some(&plan.external_id),
                Some(ns) => {
                    i.metadata.namespace.as_ref() == Some(ns)
                        && sent.service_plan_external_id.as_ref() == Some(&plan.external_id)
                }
            }
        })
    }

    /// Whether the namespace is being deleted (nothing new may be written into it).
    pub fn terminating(&self, namespace: &str) -> bool {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .is_some_and(|ns| ns.metadata.deletion_timestamp.is_some())
    }

    /// The metadata of the Secret `namespace/name`, as last watched.
    pub fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<PartialObjectMeta<Secret>>> {
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The OSB client of a broker: the one built before when neither the broker nor its
    /// credentials Secret changed since, else one `build` makes (and that is kept).
    pub async fn osb_client<B, F>(
        &self,
        broker: &B,
        secret: Option<(String, String)>,
        build: F,
    ) -> Result<OsbClient, crate::error::Error>
    where
        B: Resource<DynamicType = ()>,
        F: AsyncFnOnce() -> Result<OsbClient, crate::error::Error>,
    {
        let key = ObjectRef::<ClusterServiceBroker>::new(&broker.name_any())
            .within(broker.namespace().as_deref().unwrap_or_default());
        let secret_version = secret
            .and_then(|(ns, name)| self.secret(&ns, &name))
            .and_then(|s| s.metadata.resource_version.clone());
        let versions = (broker.meta().resource_version.clone(), secret_version);
        if let Some(cached) = self.osb_clients.lock().expect("lock").get(&key)
            && cached.versions == versions
            && versions.0.is_some()
        {
            return Ok(cached.client.clone());
        }
        let client = build().await?;
        self.osb_clients.lock().expect("lock").insert(
            key,
            CachedClient {
                versions,
                client: client.clone(),
            },
        );
        Ok(client)
    }
}

/// A kind the caches and controllers can watch, keep and share between tasks.
pub(crate) trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Strips what no controller reads from a watched object.
fn slim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Strips what no reconcile reads from a class or plan: its `managedFields` and annotations
/// (`kubectl apply`'s copy of the object, for one), and of its spec (`common`) all but what
/// resolving and calling its broker needs.
pub(crate) fn slim_catalog_entry<K: Resource, S: Slim>(
    object: &mut K,
    common: impl FnOnce(&mut K) -> &mut S,
) {
    slim(object);
    object.meta_mut().annotations = None;
    common(object).keep_what_reconciles_read();
}

/// A class's or plan's spec, which the caches keep only in part.
pub(crate) trait Slim {
    /// Drops what no reconcile reads.
    fn keep_what_reconciles_read(&mut self);
}

impl Slim for crate::resources::CommonServiceClassSpec {
    fn keep_what_reconciles_read(&mut self) {
        Self::keep_what_reconciles_read(self);
    }
}

impl Slim for crate::resources::CommonServicePlanSpec {
    fn keep_what_reconciles_read(&mut self) {
        Self::keep_what_reconciles_read(self);
    }
}

/// Fills `writer` from a watch of `api`'s objects (whole, or their metadata with an
/// `Api<PartialObjectMeta<_>>`), and hands every event to `seen` after the store took it.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    seen: impl FnMut(watcher::Event<K>) + Send + 'static,
) -> BoxFuture<'static, ()>
where
    K: Watched,
{
    reflect_with(api, config, writer, slim, seen)
}

/// [`reflect`], each object stripped by `modify` before the store takes it.
fn reflect_with<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    modify: impl FnMut(&mut K) + Send + 'static,
    mut seen: impl FnMut(watcher::Event<K>) + Send + 'static,
) -> BoxFuture<'static, ()>
where
    K: Watched,
{
    watcher(api, config)
        .default_backoff()
        .modify(modify)
        .reflect(writer)
        .for_each(move |event| {
            match event {
                Ok(event) => seen(event),
                Err(e) => tracing::debug!(error = %e, "cache watch"),
            }
            futures::future::ready(())
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> watcher::Event<PartialObjectMeta<Secret>> {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some(name.to_owned());
        watcher::Event::Apply(secret)
    }

    fn seen(s: Seen<Arc<PartialObjectMeta<Secret>>>) -> String {
        match s {
            Seen::Changed(secret) => secret.name_any(),
            Seen::Missed => "missed".to_owned(),
        }
    }

    #[tokio::test]
    async fn a_listing_is_one_wake_at_its_end_and_a_follower_that_fell_behind_is_told() {
        let (sender, _) = broadcast::channel(4);
        let mut follower = Box::pin(follow(&sender));
        broadcast(&sender, watcher::Event::Init, |s, _| s);
        broadcast(
            &sender,
            watcher::Event::InitApply(PartialObjectMeta::default()),
            |s, _| s,
        );
        broadcast(&sender, watcher::Event::InitDone, |s, _| s);
        broadcast(&sender, event("a"), |s, _| s);
        assert_eq!(seen(follower.next().await.unwrap()), "missed");
        assert_eq!(seen(follower.next().await.unwrap()), "a");
        // Six changes into a buffer of four: the oldest are lost, and the follower hears so
        // before the ones it still gets.
        for name in ["b", "c", "d", "e", "f", "g"] {
            broadcast(&sender, event(name), |s, _| s);
        }
        let mut names = Vec::new();
        for _ in 0..5 {
            names.push(seen(follower.next().await.unwrap()));
        }
        assert_eq!(names, ["missed", "d", "e", "f", "g"]);
    }
}
