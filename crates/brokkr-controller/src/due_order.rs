//! Reconciles run in the order their objects came due.
//!
//! kube-runtime's controller, once it runs as many reconciles as its concurrency allows, moves
//! every object that comes due into a set and hands them out in hash order. Under a burst (a
//! cold start, thousands of objects due at once) an instance whose provision poll is due in a
//! second then waits behind thousands of objects that came due later, and instances become
//! Ready in waves. So the instance and binding controllers run kube-runtime's controller
//! without a limit, and each reconcile first takes its turn at a fair semaphore (first come,
//! first served) of [`Context::concurrency`](crate::context::Context::concurrency) turns:
//! reconciles start in the order they came due, at most that many at once. An object that
//! waited for its turn is read again from the cache when its turn comes, so it is reconciled
//! as it is then; and a wake for an object already waiting for its turn is dropped
//! ([`Turns::unless_waiting`]): that turn will see the change anyway, where kube-runtime would
//! hold the wake and reconcile the object once more after it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt as _};

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Semaphore;

/// Turns for the reconciles of one controller of `K`, handed out in the order they were asked
/// for.
pub struct Turns<K: Resource<DynamicType = ()>> {
    permits: Arc<Semaphore>,
    closed: Arc<AtomicBool>,
    /// The objects whose reconcile waits for its turn.
    waiting: Arc<Mutex<HashSet<ObjectRef<K>>>>,
}

impl<K: Resource<DynamicType = ()>> Clone for Turns<K> {
    fn clone(&self) -> Self {
        Self {
            permits: self.permits.clone(),
            closed: self.closed.clone(),
            waiting: self.waiting.clone(),
        }
    }
}

/// Takes an object off the waiting list when its reconcile takes its turn, or is dropped.
struct Waiting<K: Resource<DynamicType = ()>> {
    waiting: Arc<Mutex<HashSet<ObjectRef<K>>>>,
    object: Option<ObjectRef<K>>,
}

impl<K: Resource<DynamicType = ()>> Waiting<K> {
    fn end(&mut self) {
        if let Some(object) = self.object.take() {
            self.waiting.lock().expect("lock").remove(&object);
        }
    }
}

impl<K: Resource<DynamicType = ()>> Drop for Waiting<K> {
    fn drop(&mut self) {
        self.end();
    }
}

impl<K> Turns<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// `concurrency` turns at once (at least one).
    pub fn new(concurrency: u16) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(usize::from(concurrency.max(1)))),
            closed: Arc::default(),
            waiting: Arc::default(),
        }
    }

    /// `wakes`, less those of objects whose reconcile waits for its turn (it reads the object
    /// when the turn comes, so it sees what the wake is about).
    pub fn unless_waiting<S>(&self, wakes: S) -> impl Stream<Item = ObjectRef<K>> + Send + use<K, S>
    where
        S: Stream<Item = ObjectRef<K>> + Send + 'static,
    {
        let waiting = self.waiting.clone();
        wakes.filter(move |object| {
            futures::future::ready(!waiting.lock().expect("lock").contains(object))
        })
    }

    /// From now on, a reconcile whose turn comes does nothing: the controllers are stopping,
    /// and what waited is reconciled again when they start.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// `reconcile`, each call waiting for its turn and then reading its object again from
    /// `store`.
    pub fn reconciler<C, E, F, Fut>(
        &self,
        store: Store<K>,
        reconcile: F,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> futures::future::BoxFuture<'static, Result<Action, E>>
    + use<K, C, E, F, Fut>
    where
        C: Send + Sync + 'static,
        E: Send + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let turns = self.clone();
        move |object, ctx| {
            let (turns, store, reconcile) = (turns.clone(), store.clone(), reconcile.clone());
            Box::pin(async move {
                let key = ObjectRef::from_obj(&*object);
                turns.waiting.lock().expect("lock").insert(key.clone());
                let mut waiting = Waiting {
                    waiting: turns.waiting.clone(),
                    object: Some(key.clone()),
                };
                let _turn = turns.permits.acquire().await.expect("never closed");
                waiting.end();
                if turns.closed.load(Ordering::Relaxed) {
                    return Ok(Action::await_change());
                }
                let object = store.get(&key).unwrap_or(object);
                reconcile(object, ctx).await
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    use super::*;

    fn named(name: &str) -> Arc<ConfigMap> {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = Some("default".into());
        Arc::new(map)
    }

    #[tokio::test]
    async fn turns_go_in_the_order_they_were_asked_for_and_no_more_at_once() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(Mutex::new((0, 0)));
        let turns = Turns::new(2);
        let mut reconcile = turns.reconciler(store, {
            let (order, running) = (order.clone(), running.clone());
            move |object: Arc<ConfigMap>, _: Arc<()>| {
                let (order, running) = (order.clone(), running.clone());
                async move {
                    {
                        let mut r = running.lock().unwrap();
                        r.0 += 1;
                        r.1 = r.1.max(r.0);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    order
                        .lock()
                        .unwrap()
                        .push(object.metadata.name.clone().unwrap());
                    running.lock().unwrap().0 -= 1;
                    Ok::<_, ()>(Action::await_change())
                }
            }
        });
        let calls: Vec<_> = (0..6)
            .map(|i| tokio::spawn(reconcile(named(&format!("o{i}")), Arc::new(()))))
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        let order = order.lock().unwrap().clone();
        // Two at a time: each pair ends before the next starts, in the order asked.
        assert_eq!(order.len(), 6);
        let (first, rest) = order.split_at(2);
        assert!(first.iter().all(|n| n == "o0" || n == "o1"), "{order:?}");
        assert!(
            rest[..2].iter().all(|n| n == "o2" || n == "o3"),
            "{order:?}"
        );
        assert_eq!(running.lock().unwrap().1, 2, "never more than two at once");
    }

    #[tokio::test]
    async fn a_turn_that_comes_after_closing_does_nothing() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let turns = Turns::new(1);
        let ran = Arc::new(AtomicBool::new(false));
        let mut reconcile = turns.reconciler(store, {
            let ran = ran.clone();
            move |_: Arc<ConfigMap>, _: Arc<()>| {
                let ran = ran.clone();
                async move {
                    ran.store(true, Ordering::Relaxed);
                    Ok::<_, ()>(Action::await_change())
                }
            }
        });
        turns.close();
        reconcile(named("late"), Arc::new(())).await.unwrap();
        assert!(!ran.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_wake_for_an_object_waiting_for_its_turn_is_dropped() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let turns = Turns::new(1);
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut reconcile = turns.reconciler(store, {
            let gate = gate.clone();
            move |_: Arc<ConfigMap>, _: Arc<()>| {
                let gate = gate.clone();
                async move {
                    gate.notified().await;
                    Ok::<_, ()>(Action::await_change())
                }
            }
        });
        // "busy" holds the one turn; "queued" waits for it.
        let busy = tokio::spawn(reconcile(named("busy"), Arc::new(())));
        let queued = tokio::spawn(reconcile(named("queued"), Arc::new(())));
        tokio::task::yield_now().await;
        let wakes = futures::stream::iter(
            ["queued", "busy", "other"].map(|n| ObjectRef::<ConfigMap>::new(n).within("default")),
        );
        let passed: Vec<String> = turns.unless_waiting(wakes).map(|r| r.name).collect().await;
        // The busy one's turn began: a change now may come after it read its object.
        assert_eq!(passed, ["busy", "other"]);
        gate.notify_one();
        busy.await.unwrap().unwrap();
        gate.notify_one();
        queued.await.unwrap().unwrap();
        let wakes =
            futures::stream::iter([ObjectRef::<ConfigMap>::new("queued").within("default")]);
        assert_eq!(
            turns.unless_waiting(wakes).count().await,
            1,
            "no longer waiting"
        );
    }
}
