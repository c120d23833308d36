//! The changes the caches broadcast, and how a controller that follows them finds what to
//! wake: each instance, binding, Secret and plan created, changed or deleted, as a reference
//! (a follower that falls behind keeps no object alive), or [`Seen::Missed`] where the follower
//! fell behind or the kind was listed anew.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::broadcast;

use crate::resources::{ServiceBinding, ServiceInstance};

/// How many changes of a kind a controller that follows them may be behind before it is told
/// it missed some.
pub(crate) const CHANGES_BUFFER: usize = 4096;

/// Changes, as broadcast: what an object created, changed or deleted says, or `None` when its
/// kind was listed anew (what changed in between is not known).
pub(crate) type Broadcast<T> = broadcast::Sender<Option<Arc<T>>>;

/// A ServiceInstance created, changed or deleted. (Followers get references, not objects: a
/// follower that falls behind keeps no copy of an object alive.)
#[derive(Debug)]
pub struct InstanceChange {
    /// The instance.
    pub instance: ObjectRef<ServiceInstance>,
    /// Whether this is a version of it this process wrote (its last write or an earlier one),
    /// delivered back by the watch ([`crate::status::Written::is_own`]): the reconcile that
    /// wrote it chose what comes next, so the instance's own controller need not look again
    /// (its followers, the bindings, still do).
    pub own_write: bool,
    /// Whether it changed what its bindings read of it (it came or went, became Ready or
    /// failed, started or ended an operation, got its ids or another plan): its bindings are
    /// woken only then.
    pub concerns_bindings: bool,
}

/// A ServiceBinding created, changed or deleted: what its followers need of it.
#[derive(Debug)]
pub struct BindingChange {
    /// The binding.
    pub binding: ObjectRef<ServiceBinding>,
    /// The instance it names.
    pub instance: ObjectRef<ServiceInstance>,
    /// Whether it is gone (deleted): what may unblock its instance's deletion.
    pub gone: bool,
    /// Whether this is a version of it this process wrote, delivered back by the watch (see
    /// [`InstanceChange::own_write`]).
    pub own_write: bool,
}

/// A Secret (its metadata) created, changed or deleted.
#[derive(Debug)]
pub struct SecretChange {
    /// The Secret, as the change left it (as it was last, for a deletion).
    pub secret: PartialObjectMeta<Secret>,
    /// Whether it was deleted.
    pub gone: bool,
}

/// A ClusterServicePlan or ServicePlan created, changed or deleted: what the instances of the
/// plan need to know that their plan may offer another maintenance version.
#[derive(Debug)]
pub struct PlanChange {
    /// The plan's namespace; `None` for a ClusterServicePlan.
    pub namespace: Option<String>,
    /// The plan's catalog id.
    pub external_id: String,
}

/// What a follower of a broadcast of changes gets.
#[derive(Debug, Clone)]
pub enum Seen<T> {
    /// Something was created, changed or deleted.
    Changed(T),
    /// Changes may have been missed (the follower fell behind, or the kind was listed anew):
    /// whatever depends on the kind should be looked at again.
    Missed,
}

/// The changes `sender` broadcasts from now on: each object, or [`Seen::Missed`] where the
/// follower fell behind or the kind was listed anew. Subscribed when called, so that a
/// follower made before the watch starts misses nothing.
pub fn follow<T: Send + Sync + 'static>(
    sender: &broadcast::Sender<Option<Arc<T>>>,
) -> impl futures::Stream<Item = Seen<Arc<T>>> + Send + use<T> {
    futures::stream::unfold(sender.subscribe(), |mut receiver| async move {
        let seen = match receiver.recv().await {
            Ok(Some(change)) => Seen::Changed(change),
            Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => Seen::Missed,
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((seen, receiver))
    })
}

/// Broadcasts what a watch event says changed: an object applied or deleted (as `change` makes
/// it of the object and whether it was deleted), or (at the end of a listing) that anything may have. The objects of a listing are not
/// broadcast one by one: a follower that fell behind during a listing could not find them in a
/// store not yet filled, and a listing wakes every follower's objects anyway.
pub(crate) fn broadcast<K, T>(
    sender: &broadcast::Sender<Option<Arc<T>>>,
    event: watcher::Event<K>,
    change: impl FnOnce(K, bool) -> T,
) {
    // Nobody following is no failure: followers subscribe before the watch starts.
    match event {
        watcher::Event::Apply(object) => {
            let _ = sender.send(Some(Arc::new(change(object, false))));
        }
        watcher::Event::Delete(object) => {
            let _ = sender.send(Some(Arc::new(change(object, true))));
        }
        watcher::Event::InitDone => {
            let _ = sender.send(None);
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
}

/// A reference to each object of `store` that `wakes`: what a follower maps a change to.
pub fn woken<K>(store: &Store<K>, wakes: impl Fn(&K) -> bool) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    // `state_filter` clones only the references it keeps (`state` clones every one).
    store
        .state_filter(wakes)
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// What a change of an object wakes in the object's own controller: the object, unless the
/// change is one of this process's own writes delivered back (the reconcile that wrote it chose
/// what comes next).
pub fn unless_own<K>(object: &ObjectRef<K>, own_write: bool) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    match own_write {
        true => Vec::new(),
        false => vec![object.clone()],
    }
}

/// A reference to every object of `store`: what a follower that missed changes wakes.
pub fn every<K>(store: &Store<K>) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    woken(store, |_| true)
}

/// The objects of `store` that `changes` wake: what `wakes` maps each change to, and every
/// object where changes may have been missed.
pub fn waking<K, T>(
    store: Store<K>,
    changes: impl futures::Stream<Item = Seen<T>> + Send + 'static,
    wakes: impl Fn(&Store<K>, T) -> Vec<ObjectRef<K>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    waking_or(store, changes, wakes, every)
}

/// [`waking`], with `missed` choosing what to wake where changes may have been missed (the
/// objects that may have something to do).
pub fn waking_or<K, T>(
    store: Store<K>,
    changes: impl futures::Stream<Item = Seen<T>> + Send + 'static,
    wakes: impl Fn(&Store<K>, T) -> Vec<ObjectRef<K>> + Send + 'static,
    missed: impl Fn(&Store<K>) -> Vec<ObjectRef<K>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    changes.flat_map(move |seen| {
        futures::stream::iter(match seen {
            Seen::Changed(change) => wakes(&store, change),
            Seen::Missed => missed(&store),
        })
    })
}
