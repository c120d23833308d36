//! A controller's reconciles, run in the order their objects fell due.
//!
//! kube-runtime's `Controller` holds the objects that fall due while all its reconcile slots
//! are taken in a hash set, and takes the first one it finds there whenever a slot frees. Under
//! a steady stream of wakes (a cold start of thousands of instances), an object in a late
//! bucket waits until the stream ends: a binding whose bind had finished waited two minutes
//! for its poll. [`Runner`] keeps due objects in queues instead, each in the order its objects
//! fell due: the requeued (a poll of an operation in flight, a retry) take three turns of four
//! while objects woken by a change wait, so that neither waits behind the other's backlog.
//!
//! What it keeps of `Controller`'s contract:
//! - an object is never reconciled twice at once; a wake during its reconcile runs it again
//!   once that ends, without waiting for the requeue its reconcile asked for;
//! - an object waits in one place: woken while it waits for its requeue time, it is queued
//!   (and moves up to the requeued if that time comes first); a requeue keeps the earlier of
//!   two times; when its reconcile starts, its time is dropped (the reconcile says the next);
//! - a reconcile reads the object as the store holds it when the reconcile starts; an object
//!   no longer in the store is not reconciled;
//! - at most `concurrency` reconciles at once, and no future for an object that waits;
//! - on shutdown no reconcile starts, and those in progress finish.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Display;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, Stream, StreamExt as _};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

/// What a reconcile asks for next: to run again after a while, or only when woken.
/// The same as kube-runtime's `controller::Action`, whose duration only its own runner can
/// read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile the object again `after` this long, unless a wake comes sooner.
    pub const fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile the object again only when a change wakes it.
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }
}

/// The reconciles of one kind: its objects as `store` holds them, at most `concurrency` at
/// once, named `what` in logs; how many are due and wait, in `queue`.
pub struct Runner<K: Resource<DynamicType = ()> + 'static> {
    what: &'static str,
    store: Store<K>,
    concurrency: u16,
    queue: Gauge,
}

impl<K> Runner<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Reconciles of the objects of `store`, at most `concurrency` at once (at least one), named
    /// `what` in logs.
    pub fn new(what: &'static str, store: Store<K>, concurrency: u16) -> Self {
        Self {
            what,
            store,
            concurrency,
            queue: Gauge::default(),
        }
    }

    /// Keeps `queue` at the number of objects due and waiting for a reconcile slot.
    pub fn counting_in(self, queue: Gauge) -> Self {
        Self { queue, ..self }
    }

    /// Reconciles the objects that `wakes` names or their reconciles requeue, in the order they
    /// fell due (the requeued before the woken, three turns of four), until `shutdown`
    /// completes and the reconciles in progress end (or `wakes` ends and nothing is left to
    /// do). A failed reconcile is logged (at debug) and requeued as `error_policy` says.
    pub async fn run<C, E, F>(
        self,
        wakes: impl Stream<Item = ObjectRef<K>>,
        reconcile: impl Fn(Arc<K>, Arc<C>) -> F,
        error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
        ctx: Arc<C>,
        shutdown: impl Future<Output = ()>,
    ) where
        E: Display,
        F: Future<Output = Result<Action, E>>,
    {
        let Self {
            what,
            store,
            concurrency,
            queue,
        } = self;
        let mut wakes = pin!(wakes.fuse());
        let mut shutdown = pin!(shutdown.fuse());
        let mut due = Due::default();
        let mut running = FuturesUnordered::new();
        let mut busy = HashSet::new();
        let mut woken_while_busy = HashSet::new();
        let (mut stopping, mut wakes_ended) = (false, false);
        let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
        let mut armed = None;
        loop {
            while !stopping && running.len() < usize::from(concurrency.max(1)) {
                let Some(reference) = due.pop() else { break };
                let Some(object) = store.get(&reference) else {
                    continue;
                };
                busy.insert(reference.clone());
                let (ctx, reconcile, error_policy) = (ctx.clone(), &reconcile, &error_policy);
                running.push(async move {
                    let action = match reconcile(object.clone(), ctx.clone()).await {
                        Ok(action) => action,
                        Err(error) => {
                            tracing::debug!(%error, object = %reference, "{what}");
                            error_policy(object, &error, ctx)
                        }
                    };
                    (reference, action)
                });
            }
            queue.set(i64::try_from(due.queued.len()).unwrap_or(i64::MAX));
            if running.is_empty() && (stopping || (wakes_ended && due.is_empty())) {
                return;
            }
            let next = due.next_timer();
            if next != armed
                && let Some(at) = next
            {
                timer.as_mut().reset(at);
            }
            armed = next;
            tokio::select! {
                biased;
                Some((reference, action)) = running.next(), if !running.is_empty() => {
                    busy.remove(&reference);
                    // A time beyond what a clock can say is no time.
                    if let Some(at) = action.requeue_after.and_then(|a| Instant::now().checked_add(a)) {
                        due.requeue_at(reference.clone(), at);
                    }
                    if woken_while_busy.remove(&reference) {
                        due.wake(reference);
                    }
                }
                () = &mut shutdown, if !stopping => stopping = true,
                wake = wakes.next(), if !wakes_ended => match wake {
                    Some(reference) if busy.contains(&reference) => {
                        woken_while_busy.insert(reference);
                    }
                    Some(reference) => due.wake(reference),
                    None => wakes_ended = true,
                },
                () = &mut timer, if armed.is_some() => due.expire(Instant::now()),
            }
        }
    }
}

/// The objects due now and those due later.
///
/// Those due now wait in two queues, each in the order its objects fell due: the requeued,
/// whose reconcile asked to be run again at a time that came (an operation in flight polled,
/// a retry), and the woken, by a change. The requeued go first, but while woken objects wait
/// every fourth turn is theirs: a poll is not kept waiting behind a backlog of changes (the
/// thousands of first reconciles of a cold start), and a change is not kept waiting forever
/// behind polls. A woken object whose requeue time comes while it waits moves to the
/// requeued.
struct Due<T> {
    requeued: VecDeque<(u64, T)>,
    woken: VecDeque<(u64, T)>,
    /// Each queued object's entry: its number, and whether it is in `requeued`. An entry of
    /// the queues whose number is not its object's here was moved, and is skipped.
    queued: HashMap<T, (u64, bool)>,
    later: BTreeMap<(Instant, u64), T>,
    timers: HashMap<T, (Instant, u64)>,
    next: u64,
    /// Turns taken by requeued objects in a row while woken ones waited.
    streak: u8,
}

/// Turns requeued objects take in a row while woken ones wait.
const REQUEUED_TURNS: u8 = 3;

impl<T> Default for Due<T> {
    fn default() -> Self {
        Self {
            requeued: VecDeque::new(),
            woken: VecDeque::new(),
            queued: HashMap::new(),
            later: BTreeMap::new(),
            timers: HashMap::new(),
            next: 0,
            streak: 0,
        }
    }
}

impl<T: std::hash::Hash + Eq + Clone> Due<T> {
    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// `item` was woken by a change: at the end of the woken, unless it waits already.
    fn wake(&mut self, item: T) {
        if self.queued.contains_key(&item) {
            return;
        }
        let n = self.number();
        self.queued.insert(item.clone(), (n, false));
        self.woken.push_back((n, item));
    }

    /// `item` asks to be run again at `at`, unless it is due sooner already.
    fn requeue_at(&mut self, item: T, at: Instant) {
        if self
            .queued
            .get(&item)
            .is_some_and(|&(_, requeued)| requeued)
        {
            return;
        }
        if let Some(&(earlier, _)) = self.timers.get(&item) {
            if earlier <= at {
                return;
            }
            self.cancel_timer(&item);
        }
        let key = (at, self.number());
        self.timers.insert(item.clone(), key);
        self.later.insert(key, item);
    }

    fn cancel_timer(&mut self, item: &T) {
        if let Some(key) = self.timers.remove(item) {
            self.later.remove(&key);
        }
    }

    /// Moves the objects whose time came by `now` to the end of the requeued, earliest first.
    fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.later.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let item = entry.remove();
            self.timers.remove(&item);
            let n = self.number();
            self.queued.insert(item.clone(), (n, true));
            self.requeued.push_back((n, item));
        }
    }

    /// The object whose turn it is. Its time, if it had one, is dropped: its reconcile says
    /// when it is due next.
    fn pop(&mut self) -> Option<T> {
        loop {
            let requeued_turn = !self.requeued.is_empty()
                && (self.woken.is_empty() || self.streak < REQUEUED_TURNS);
            let (n, item) = match requeued_turn {
                true => {
                    self.streak = self.streak.saturating_add(1);
                    self.requeued.pop_front()?
                }
                false => {
                    self.streak = 0;
                    self.woken.pop_front()?
                }
            };
            if self.queued.get(&item).is_some_and(|&(m, _)| m == n) {
                self.queued.remove(&item);
                self.cancel_timer(&item);
                return Some(item);
            }
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.later.keys().next().map(|&(at, _)| at)
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.later.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use tokio::sync::mpsc;

    fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("tenant".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn reference(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("tenant")
    }

    /// A store holding config maps `names`.
    fn store(names: &[String]) -> (Store<ConfigMap>, Writer<ConfigMap>) {
        let mut writer = Writer::default();
        for name in names {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name)));
        }
        (writer.as_reader(), writer)
    }

    /// What the runner did, in order: each reconcile's start and end.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Log {
        fn push(&self, entry: String) {
            self.0.lock().unwrap().push(entry);
        }
        fn entries(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
        fn starts(&self) -> Vec<String> {
            self.entries()
                .into_iter()
                .filter_map(|e| e.strip_prefix("start ").map(String::from))
                .collect()
        }
    }

    /// Runs until `wakes` ends and nothing is due; each reconcile logs its start and end,
    /// takes `took`, and asks for `next`.
    async fn run_all(
        store: Store<ConfigMap>,
        wakes: impl Stream<Item = ObjectRef<ConfigMap>>,
        concurrency: u16,
        took: Duration,
        next: impl Fn(&str) -> Result<Action, String>,
    ) -> Arc<Log> {
        let log = Arc::new(Log::default());
        let next = &next;
        Runner::new("test", store, concurrency)
            .run(
                wakes,
                |object: Arc<ConfigMap>, log: Arc<Log>| async move {
                    let name = object.metadata.name.clone().unwrap();
                    log.push(format!("start {name}"));
                    if !took.is_zero() {
                        tokio::time::sleep(took).await;
                    }
                    log.push(format!("end {name}"));
                    next(&name)
                },
                |object, error: &String, log: Arc<Log>| {
                    log.push(format!(
                        "failed {} {error}",
                        object.metadata.name.clone().unwrap()
                    ));
                    Action::requeue(Duration::from_secs(1))
                },
                log.clone(),
                std::future::pending(),
            )
            .await;
        log
    }

    #[tokio::test(start_paused = true)]
    async fn objects_woken_while_every_slot_is_taken_are_reconciled_in_the_order_they_were_woken() {
        // 200 objects woken over ten seconds, each reconcile a second, two at once: most wait.
        let names: Vec<String> = (0..200).map(|i| format!("cm-{i:03}")).collect();
        let (store, _writer) = store(&names);
        let (tx, rx) = mpsc::unbounded_channel();
        let feeder = {
            let names = names.clone();
            async move {
                for name in &names {
                    tx.send(reference(name)).unwrap();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let wakes = tokio_stream_of(rx);
        let (log, ()) = tokio::join!(
            run_all(store, wakes, 2, Duration::from_secs(1), |_| Ok(
                Action::await_change()
            )),
            feeder
        );
        assert_eq!(log.starts(), names);
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_is_never_reconciled_twice_at_once_and_a_wake_during_its_reconcile_runs_it_again()
     {
        let names = vec!["a".to_string()];
        let (store, _writer) = store(&names);
        let (tx, rx) = mpsc::unbounded_channel();
        let feeder = async move {
            tx.send(reference("a")).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Twice during the first reconcile: one more run, not two, and not at once.
            tx.send(reference("a")).unwrap();
            tx.send(reference("a")).unwrap();
        };
        let runs = Mutex::new(0);
        let started = Instant::now();
        let (log, ()) = tokio::join!(
            run_all(
                store,
                tokio_stream_of(rx),
                4,
                Duration::from_secs(1),
                |_| {
                    let mut runs = runs.lock().unwrap();
                    *runs += 1;
                    // The first asks for an hour's requeue, which the wake does not wait for.
                    Ok(match *runs {
                        1 => Action::requeue(Duration::from_secs(3600)),
                        _ => Action::await_change(),
                    })
                }
            ),
            feeder
        );
        assert_eq!(log.entries(), ["start a", "end a", "start a", "end a"]);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_runs_the_object_again_after_its_delay_and_a_failure_as_the_error_policy_says()
     {
        let names = vec!["ok".to_string(), "failing".to_string()];
        let (store, _writer) = store(&names);
        let wakes = futures::stream::iter(vec![reference("ok"), reference("failing")]);
        let runs = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
        let started = Instant::now();
        let log = {
            let runs = runs.clone();
            run_all(store, wakes, 4, Duration::ZERO, move |name| {
                let mut runs = runs.lock().unwrap();
                let n = runs.entry(name.to_string()).or_default();
                *n += 1;
                match (name, *n) {
                    ("ok", 1) => Ok(Action::requeue(Duration::from_secs(30))),
                    ("failing", 1) => Err("broker down".to_string()),
                    _ => Ok(Action::await_change()),
                }
            })
            .await
        };
        assert_eq!(
            log.entries(),
            [
                "start ok",
                "end ok",
                "start failing",
                "end failing",
                "failed failing broker down",
                // The error policy's second, then the requeue's thirty.
                "start failing",
                "end failing",
                "start ok",
                "end ok",
            ]
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn requeued_objects_go_before_a_backlog_of_woken_ones_which_still_get_every_fourth_turn()
    {
        let mut due = Due::default();
        let start = Instant::now();
        for woken in ["w1", "w2", "w3"] {
            due.wake(woken);
        }
        for (i, requeued) in ["r1", "r2", "r3", "r4", "r5"].into_iter().enumerate() {
            due.requeue_at(requeued, start + Duration::from_secs(i as u64 + 1));
        }
        due.expire(start + Duration::from_secs(10));
        let order: Vec<_> = std::iter::from_fn(|| due.pop()).collect();
        assert_eq!(order, ["r1", "r2", "r3", "w1", "r4", "r5", "w2", "w3"]);
        assert!(due.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_woken_object_whose_time_comes_moves_up_and_a_later_requeue_keeps_the_earlier_time() {
        let mut due = Due::default();
        let start = Instant::now();
        due.wake("backlog");
        due.wake("polled");
        due.requeue_at("polled", start + Duration::from_secs(60));
        due.requeue_at("polled", start + Duration::from_secs(90));
        assert_eq!(due.next_timer(), Some(start + Duration::from_secs(60)));
        due.expire(start + Duration::from_secs(60));
        assert_eq!(due.pop(), Some("polled"));
        assert_eq!(due.pop(), Some("backlog"));
        // Its old place among the woken is gone with it.
        assert_eq!(due.pop(), None);
        assert!(due.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_woken_objects_reconcile_replaces_the_time_its_last_reconcile_asked_for() {
        let names = vec!["a".to_string()];
        let (store, _writer) = store(&names);
        let (tx, rx) = mpsc::unbounded_channel();
        let feeder = async move {
            tx.send(reference("a")).unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            tx.send(reference("a")).unwrap();
        };
        let runs = Mutex::new(0);
        let started = Instant::now();
        let (log, ()) = tokio::join!(
            run_all(store, tokio_stream_of(rx), 4, Duration::ZERO, |_| {
                let mut runs = runs.lock().unwrap();
                *runs += 1;
                Ok(match *runs {
                    1 => Action::requeue(Duration::from_secs(60)),
                    _ => Action::await_change(),
                })
            }),
            feeder
        );
        // Woken after 10 s, it says it awaits a change: the minute asked for before is dropped.
        assert_eq!(log.starts(), ["a", "a"]);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_gone_from_the_store_is_not_reconciled() {
        let names = vec!["kept".to_string(), "gone".to_string()];
        let (store, mut writer) = store(&names);
        writer.apply_watcher_event(&watcher::Event::Delete(config_map("gone")));
        let wakes = futures::stream::iter(vec![reference("gone"), reference("kept")]);
        let log = run_all(store, wakes, 4, Duration::ZERO, |_| {
            Ok(Action::await_change())
        })
        .await;
        assert_eq!(log.starts(), ["kept"]);
    }

    #[tokio::test(start_paused = true)]
    async fn on_shutdown_no_reconcile_starts_and_those_in_progress_finish() {
        let names: Vec<String> = (0..4).map(|i| format!("cm-{i}")).collect();
        let (store, _writer) = store(&names);
        let wakes = futures::stream::iter(names.iter().map(|n| reference(n)).collect::<Vec<_>>())
            .chain(futures::stream::pending());
        let log = Arc::new(Log::default());
        Runner::new("test", store, 2)
            .run(
                wakes,
                |object: Arc<ConfigMap>, log: Arc<Log>| async move {
                    let name = object.metadata.name.clone().unwrap();
                    log.push(format!("start {name}"));
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    log.push(format!("end {name}"));
                    Ok::<_, String>(Action::await_change())
                },
                |_, _: &String, _| Action::await_change(),
                log.clone(),
                tokio::time::sleep(Duration::from_secs(1)),
            )
            .await;
        let mut entries = log.entries();
        entries[2..].sort();
        assert_eq!(
            entries,
            ["start cm-0", "start cm-1", "end cm-0", "end cm-1"]
        );
    }

    fn tokio_stream_of<T>(mut rx: mpsc::UnboundedReceiver<T>) -> impl Stream<Item = T> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
