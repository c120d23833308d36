//! The two broker kinds, ClusterServiceBroker and ServiceBroker, as the controllers see them:
//! where their credentials, classes and plans live, and the classes and plans their catalogs
//! are written as.

use std::fmt::Debug;

use kube::api::ObjectMeta;
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::finalizer;
use crate::names::{BROKER_LABEL, label_value};
use crate::resources::{
    BrokerAuthInfo, ClusterServiceBroker, ClusterServiceClass, ClusterServiceClassSpec,
    ClusterServicePlan, ClusterServicePlanSpec, CommonServiceBrokerSpec, CommonServiceClassSpec,
    CommonServicePlanSpec, LocalObjectReference, ObjectReference, ServiceBroker,
    ServiceBrokerStatus, ServiceClass, ServiceClassSpec, ServicePlan, ServicePlanSpec,
};

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
    /// instances use it (the broker controller holds it).
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
/// are held by [`finalizer::SERVICE_BROKER`] while instances may need them.
fn entry_meta<B: BrokerKind>(broker: &B, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: broker.namespace(),
        labels: Some([(BROKER_LABEL.to_owned(), label_value(&broker.name_any()))].into()),
        owner_references: broker.controller_owner_ref(&()).map(|o| vec![o]),
        finalizers: broker
            .as_namespaced()
            .map(|_| vec![finalizer::SERVICE_BROKER.to_owned()]),
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
