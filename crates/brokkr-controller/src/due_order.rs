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
//! as it is then.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Semaphore;

/// Turns for one controller's reconciles, handed out in the order they were asked for.
#[derive(Clone)]
pub struct Turns {
    permits: Arc<Semaphore>,
    closed: Arc<AtomicBool>,
}

impl Turns {
    /// `concurrency` turns at once (at least one).
    pub fn new(concurrency: u16) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(usize::from(concurrency.max(1)))),
            closed: Arc::default(),
        }
    }

    /// From now on, a reconcile whose turn comes does nothing: the controllers are stopping,
    /// and what waited is reconciled again when they start.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// `reconcile`, each call waiting for its turn and then reading its object again from
    /// `store`.
    pub fn reconciler<K, C, E, F, Fut>(
        &self,
        store: Store<K>,
        reconcile: F,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> futures::future::BoxFuture<'static, Result<Action, E>>
    + use<K, C, E, F, Fut>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
        C: Send + Sync + 'static,
        E: Send + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let turns = self.clone();
        move |object, ctx| {
            let (turns, store, reconcile) = (turns.clone(), store.clone(), reconcile.clone());
            Box::pin(async move {
                let _turn = turns.permits.acquire().await.expect("never closed");
                if turns.closed.load(Ordering::Relaxed) {
                    return Ok(Action::await_change());
                }
                let object = store.get(&ObjectRef::from_obj(&*object)).unwrap_or(object);
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
}
