//! The Kubernetes catalogs end to end through the OSB API: provision, readiness, bind (a
//! servicebinding.io Secret), update, unbind and deprovision of the catalogs/manifests PostgreSQL
//! plan and of a catalogs/kubedb plan.
//!
//! The fast tests run against the in-memory fake API server. The `#[ignore]`d ones run the same
//! flows against a real cluster (`BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr-broker --test
//! kubernetes -- --ignored`) whose node runs Pods (`scripts/e2e-cluster`, with the images of
//! `scripts/images`): the manifests catalog's PostgreSQL turns Ready by its own probe. With no
//! KubeDB operator, the tests set a KubeDB resource's phase and create what KubeDB would (its
//! auth Secret); no test writes a Pod's status.
//!
//! One module per flow: `manifests` and `kubedb` (the two catalogs' lifecycles), `namespaces`
//! (the namespace policies), `requests` (what brokkr asks of the API server) and `upgrades` (an
//! upgrade to a new maintenance version, and what it asks). `cluster` is
//! the fake or real cluster a flow runs against, `support` the broker and the helpers the flows
//! share.

#[path = "../harness/mod.rs"]
mod harness;

mod cluster;
mod kubedb;
mod manifests;
mod namespaces;
mod requests;
mod support;
mod upgrades;
