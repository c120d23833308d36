//! Which namespaces one run of the controllers serves.
//!
//! A cluster's controller serves every namespace, possibly but a few that run their own; a
//! team's or a tenant's controller serves its namespace alone, with a Role in it (and read
//! access to the cluster's catalog), and leaves ClusterServiceBrokers to the cluster's. Both
//! are expressed in the watches themselves, so that nothing outside the scope is read, held in
//! memory or written: a namespace's own controller watches through its namespace's URLs, and
//! the cluster's leaves the others out with a field selector (`metadata.namespace!=…`).

use kube::Api;
use kube::core::NamespaceResourceScope;
use kube::runtime::watcher;
use kube::{Client, Resource};

/// The namespaces one run of the controllers serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace but those listed (which run controllers of their own); the
    /// cluster-scoped brokers are reconciled too.
    Cluster {
        /// The namespaces left out.
        except: Vec<String>,
    },
    /// One namespace; cluster-scoped brokers and their catalogs are only read.
    Namespace(String),
}

impl Default for Scope {
    fn default() -> Self {
        Self::Cluster { except: Vec::new() }
    }
}

impl Scope {
    /// An API for a namespaced kind over the scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        match self {
            Self::Cluster { .. } => Api::all(client.clone()),
            Self::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }

    /// The watch configuration of a namespaced kind over the scope.
    pub fn watch_config(&self) -> watcher::Config {
        match self {
            Self::Cluster { except } if !except.is_empty() => {
                let fields: Vec<String> = except
                    .iter()
                    .map(|ns| format!("metadata.namespace!={ns}"))
                    .collect();
                watcher::Config::default().fields(&fields.join(","))
            }
            _ => watcher::Config::default(),
        }
    }

    /// Whether this run reconciles the cluster-scoped brokers.
    pub fn reconciles_cluster_brokers(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_scope_leaves_out_namespaces_by_field_selector() {
        let scope = Scope::Cluster {
            except: vec!["team-a".into(), "team-b".into()],
        };
        assert_eq!(
            scope.watch_config().field_selector.as_deref(),
            Some("metadata.namespace!=team-a,metadata.namespace!=team-b")
        );
        assert_eq!(Scope::default().watch_config().field_selector, None);
    }

    #[test]
    fn a_namespace_scope_leaves_the_cluster_brokers_alone() {
        let scope = Scope::Namespace("team-a".into());
        assert_eq!(scope.watch_config().field_selector, None);
        assert!(!scope.reconciles_cluster_brokers());
        assert!(Scope::default().reconciles_cluster_brokers());
    }
}
