//! What one namespace's ServiceBrokers may make the platform keep, and whose turn it is to list.
//!
//! A namespace is a tenant, and every class and plan its brokers list is kept three times: in
//! etcd, in the API server's watch cache and in the controller's. One broker is bounded by the
//! catalog limits of [`crate::broker_policy::BrokerPolicy`]; a tenant with many brokers is bounded here:
//!
//! - **Brokers.** The brokers of a namespace that are not being deleted are ordered by
//!   `creationTimestamp`, then name; the first [`NamespaceBounds::max_brokers`] are served, a
//!   later one gets `Ready=False`, reason `ErrorTooManyBrokers`, before its catalog is fetched.
//!   A newcomer never displaces an older broker: it comes later in the order.
//! - **Classes and plans.** A listing is written only if the namespace then holds at most
//!   [`NamespaceBounds::max_classes`] classes and [`NamespaceBounds::max_plans`] plans: those of
//!   the namespace's other brokers as they are (entries marked removed included: they are kept
//!   too), and this broker's entries after the listing (the new catalog's and those it marks
//!   removed). Beyond it the broker gets `Ready=False`, reason `ErrorNamespaceCatalogLimit`,
//!   nothing of the catalog written, its earlier entries kept. What is held is never displaced,
//!   so the namespace never holds more than the bounds; among brokers that have never been
//!   listed, older ones go first ([`turn`] holds a broker back while an older one of the bound
//!   has not been tried: no `Ready` condition, and no failure waiting for its floor), so which
//!   of several brokers created together fit does not depend on which the controller happened
//!   to pick first.
//! - **One listing per namespace at a time.** A broker's listing takes its namespace's turn; a
//!   broker whose namespace is busy is looked at again a second later without holding anything
//!   (neither a reconcile slot nor one of the `--max-concurrent-catalogs` permits), so one
//!   namespace with many brokers takes at most one permit and one reconcile at a time, and other
//!   namespaces' brokers are listed meanwhile. Releasing a broker being deleted (its classes'
//!   and plans' finalizers) takes the same turn.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt as _;
use kube::core::PartialObjectMeta;

use crate::broker_kind::BrokerKind;
use crate::broker_policy::Turn;
use crate::context::Context;
use crate::error::Error;
use crate::names::BROKER_LABEL;
use crate::resources::ServiceBroker;

/// How soon a broker whose namespace is busy, or that waits for an older broker's first
/// listing, is looked at again.
pub const BUSY_RETRY: Duration = Duration::from_secs(1);

/// How soon a broker refused by its namespace's class and plan bounds is looked at again (a
/// change of its spec wakes it at once): each look may fetch its catalog.
pub const LIMIT_RETRY: Duration = Duration::from_secs(5 * 60);

/// The turn to list `broker`'s catalog: nothing to take for a ClusterServiceBroker; for a
/// ServiceBroker its namespace's, `None` while that is taken or while an older broker of the
/// namespace, within the bound, has not been tried once (listed, or failed: its failure may
/// still wait to be written) (then look again after [`BUSY_RETRY`]).
pub fn turn<B: BrokerKind>(broker: &B, ctx: &Context) -> Option<Turn> {
    let Some(namespaced) = broker.as_namespaced() else {
        return Some(Turn::nothing());
    };
    let ns = namespaced.namespace().unwrap_or_default();
    let brokers = served_order(namespaced, ctx);
    let me = position(&brokers, namespaced);
    let older_unlisted = brokers
        .iter()
        .take(me.min(ctx.brokers.namespaces.max_brokers))
        .any(|b| {
            let said = b
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready"));
            let uid = b.metadata.uid.as_deref().unwrap_or_default();
            !said && !ctx.brokers.held_failures.holds(uid)
        });
    if older_unlisted {
        return None;
    }
    ctx.brokers.turns.try_take(&ns)
}

/// The turn to release a ServiceBroker being deleted: its namespace's, `None` while taken.
pub fn release_turn(broker: &ServiceBroker, ctx: &Context) -> Option<Turn> {
    ctx.brokers
        .turns
        .try_take(&broker.namespace().unwrap_or_default())
}

/// The ServiceBrokers of `broker`'s namespace that are not being deleted, as the caches know
/// them (with `broker` itself, whether the cache has it yet or not), in the order they are
/// served: by creation, then name.
fn served_order(broker: &ServiceBroker, ctx: &Context) -> Vec<Arc<ServiceBroker>> {
    let ns = broker.namespace();
    let mut brokers: Vec<Arc<ServiceBroker>> = ctx
        .caches
        .brokers
        .state_filter(|b| {
            b.namespace() == ns
                && b.metadata.deletion_timestamp.is_none()
                && b.name_any() != broker.name_any()
        })
        .into_iter()
        .collect();
    brokers.push(Arc::new(broker.clone()));
    brokers.sort_by_key(|b| order_key(b));
    brokers
}

fn order_key(broker: &ServiceBroker) -> (Option<k8s_openapi::jiff::Timestamp>, String) {
    (
        broker.metadata.creation_timestamp.as_ref().map(|t| t.0),
        broker.name_any(),
    )
}

fn position(brokers: &[Arc<ServiceBroker>], broker: &ServiceBroker) -> usize {
    brokers
        .iter()
        .position(|b| b.name_any() == broker.name_any())
        .expect("the broker is in its own order")
}

/// Refuses a ServiceBroker beyond its namespace's bound of brokers, before its catalog is
/// fetched.
pub fn check_broker_count<B: BrokerKind>(broker: &B, ctx: &Context) -> Result<(), Error> {
    let Some(namespaced) = broker.as_namespaced() else {
        return Ok(());
    };
    let max = ctx.brokers.namespaces.max_brokers;
    let brokers = served_order(namespaced, ctx);
    let me = position(&brokers, namespaced);
    if me < max {
        return Ok(());
    }
    Err(Error::TooManyBrokers(format!(
        "the namespace has {} ServiceBrokers and the controller serves the first {max} of a \
         namespace, by creation time and then name (--max-brokers-per-namespace); this one is \
         number {}, so its catalog was not listed (delete another ServiceBroker of the \
         namespace, or ask the platform admin for a larger bound)",
        brokers.len(),
        me + 1
    )))
}

/// The classes or plans that exist in a broker's scope (its namespace, or the cluster), by
/// name: the broker whose label each carries.
pub struct Existing {
    owners: BTreeMap<String, Option<String>>,
}

impl Existing {
    /// Who holds each of `entries` (metadata, as listed).
    pub fn new<K>(entries: Vec<PartialObjectMeta<K>>) -> Self
    where
        K: kube::Resource<DynamicType = ()>,
    {
        Self {
            owners: entries
                .into_iter()
                .map(|e| {
                    let owner = e.labels().get(BROKER_LABEL).cloned();
                    (e.name_any(), owner)
                })
                .collect(),
        }
    }

    /// The owner label of the entry `name`, if it exists: `Some(None)` for one without a label.
    pub fn owner(&self, name: &str) -> Option<Option<&str>> {
        self.owners.get(name).map(Option::as_deref)
    }

    /// The names of the entries labelled as `owner`'s.
    pub fn of<'a>(&'a self, owner: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.owners
            .iter()
            .filter(move |(_, o)| o.as_deref() == Some(owner))
            .map(|(name, _)| name.as_str())
    }

    /// How many entries are labelled as someone else's than `owner` (or not at all).
    pub fn others(&self, owner: &str) -> usize {
        self.owners
            .values()
            .filter(|o| o.as_deref() != Some(owner))
            .count()
    }

    /// How many entries `owner` holds after a listing of `listed` (names): those listed, and
    /// its others, which stay (marked removed).
    pub fn after_listing<'a>(&self, owner: &str, listed: impl Iterator<Item = &'a str>) -> usize {
        let mut names: HashSet<String> = self.of(owner).map(str::to_owned).collect();
        names.extend(listed.map(str::to_owned));
        names.len()
    }
}

/// Refuses a ServiceBroker whose namespace is full already: its other brokers hold the bound
/// of classes or plans, so no catalog of this one would fit (checked before it is fetched).
pub fn check_room(
    broker: &ServiceBroker,
    ctx: &Context,
    classes: &Existing,
    plans: &Existing,
) -> Result<(), Error> {
    let bounds = ctx.brokers.namespaces;
    let owner = crate::names::label_value(&broker.name_any());
    let (other_classes, other_plans) = (classes.others(&owner), plans.others(&owner));
    if other_classes >= bounds.max_classes || other_plans >= bounds.max_plans {
        return Err(Error::NamespaceCatalogLimit(format!(
            "the namespace's other ServiceBrokers hold {other_classes} ServiceClasses and \
             {other_plans} ServicePlans, and the controller keeps at most {} classes \
             (--max-catalog-classes-per-namespace) and {} plans \
             (--max-catalog-plans-per-namespace) of one namespace, so nothing of this broker's \
             catalog was written",
            bounds.max_classes, bounds.max_plans
        )));
    }
    Ok(())
}

/// Refuses a listing that would take the namespace over its bounds: `classes` and `plans` are
/// the names the catalog lists.
pub fn check_listing<'a>(
    broker: &ServiceBroker,
    ctx: &Context,
    held: (&Existing, &Existing),
    listed: (impl Iterator<Item = &'a str>, impl Iterator<Item = &'a str>),
) -> Result<(), Error> {
    let bounds = ctx.brokers.namespaces;
    let owner = crate::names::label_value(&broker.name_any());
    let classes = held.0.others(&owner) + held.0.after_listing(&owner, listed.0);
    let plans = held.1.others(&owner) + held.1.after_listing(&owner, listed.1);
    if classes > bounds.max_classes || plans > bounds.max_plans {
        return Err(Error::NamespaceCatalogLimit(format!(
            "with this catalog the namespace's ServiceBrokers would hold {classes} ServiceClasses \
             and {plans} ServicePlans (those of its other brokers, and this one's, those no \
             longer listed included), and the controller keeps at most {} classes \
             (--max-catalog-classes-per-namespace) and {} plans \
             (--max-catalog-plans-per-namespace) of one namespace, so nothing of it was written",
            bounds.max_classes, bounds.max_plans
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn entry(name: &str, owner: Option<&str>) -> PartialObjectMeta<crate::resources::ServicePlan> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: owner.map(|o| [(BROKER_LABEL.to_owned(), o.to_owned())].into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn a_listing_counts_the_others_entries_and_its_own_old_and_new() {
        let held = Existing::new(vec![
            entry("a1", Some("a")),
            entry("a2", Some("a")),
            entry("b1", Some("b")),
            entry("b-gone", Some("b")),
            entry("stray", None),
        ]);
        assert_eq!(held.others("b"), 3);
        // b lists b1 and b2: b-gone stays, marked removed.
        assert_eq!(held.after_listing("b", ["b1", "b2"].into_iter()), 3);
        assert_eq!(held.owner("stray"), Some(None));
        assert_eq!(held.owner("a1"), Some(Some("a")));
        assert_eq!(held.owner("nothing"), None);
        assert_eq!(held.of("a").collect::<Vec<_>>(), ["a1", "a2"]);
    }
}
