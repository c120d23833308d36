//! The engine itself: [`Engine`], cheap to clone, over the state its workers and steps share
//! (the store, its lease owner id, [`EngineOptions`], the template evaluator, step kinds and
//! targets, running operations and events not yet written), and the setting that keeps the
//! broker's names key ([`NAMES_KEY_SETTING`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use brokkr_blueprint::NamesKey;
use brokkr_blueprint::evaluate::Evaluator;
use brokkr_blueprint::template::Renderer;
use brokkr_targets::Targets;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::EngineMetrics;
use crate::model::{Event, Key};
use crate::step::StepKind;
use crate::store::{Store, StoreError};

/// The store setting that holds the broker's names key (see [`Engine::names_key`]).
pub const NAMES_KEY_SETTING: &str = "broker.names_key";

/// Tunables of the engine; every duration can go down to milliseconds for tests.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How long a claim on an operation holds without being renewed.
    pub lease: Duration,
    /// How often the worker looks for due operations.
    pub poll_interval: Duration,
    /// Most operations claimed per poll.
    pub claim_batch: i64,
    /// How long tombstones of deleted resources are kept.
    pub retention: Duration,
    /// How long after a deprovision or unbind left a step behind the janitor first tries it
    /// again; each failed attempt doubles the wait.
    pub orphan_backoff: Duration,
    /// The longest wait between two attempts at a step left behind.
    pub orphan_backoff_max: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            claim_batch: 256,
            retention: Duration::from_secs(24 * 3600),
            orphan_backoff: Duration::from_secs(60),
            orphan_backoff_max: Duration::from_secs(3600),
        }
    }
}

/// Runs operations. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) store: Arc<dyn Store>,
    pub(super) owner: String,
    pub(super) options: EngineOptions,
    pub(super) evaluator: Evaluator,
    pub(super) shutdown: CancellationToken,
    pub(super) tasks: TaskTracker,
    /// Operations running in this process, by resource and operation id.
    pub(super) running: Mutex<HashSet<(Key, String)>>,
    pub(super) wake: Notify,
    pub(super) metrics: EngineMetrics,
    pub(super) steps: RwLock<HashMap<String, Arc<dyn StepKind>>>,
    pub(super) targets: Targets,
    /// Events not yet written, by operation id.
    pub(super) events: Mutex<HashMap<String, Vec<Event>>>,
    /// What each `target` step did on its earlier runs, and since when, by operation id and
    /// step name: the resources a step waiting for readiness applied, which its retries do not
    /// apply again, or those a deprovision or unbind deleted, which its retries do not ask
    /// about again (for up to [`REDO_AFTER`]). Kept in memory only: after a restart the step
    /// does it all once more, which server-side apply and deletes of what is gone make harmless.
    pub(super) done: Mutex<HashMap<(String, String), Done>>,
}

/// What a `target` step did, and since when.
type Done = (Vec<Value>, std::time::Instant);

/// How long a `target` step trusts what its earlier runs did: after that it applies (or
/// deletes) again, which puts back an object someone deleted meanwhile.
pub(super) const REDO_AFTER: Duration = Duration::from_secs(120);

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
    /// The targets `target` steps act on.
    pub fn targets(&self) -> &Targets {
        &self.inner.targets
    }

    /// Creates an engine with a fresh owner id and no targets.
    pub fn new(store: Arc<dyn Store>, options: EngineOptions) -> Self {
        Self::with_targets(store, options, Targets::default())
    }

    /// Creates an engine with a fresh owner id whose `target` steps act on `targets`.
    pub fn with_targets(store: Arc<dyn Store>, options: EngineOptions, targets: Targets) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                owner: format!("brokkr-{}", uuid::Uuid::new_v4()),
                options,
                evaluator: Evaluator::new(Renderer::new(), targets.facts()),
                shutdown: CancellationToken::new(),
                tasks: TaskTracker::new(),
                running: Mutex::new(HashSet::new()),
                wake: Notify::new(),
                metrics: EngineMetrics::default(),
                steps: RwLock::new(HashMap::from([(
                    crate::http::NAME.to_owned(),
                    Arc::new(crate::http::Http::default()) as Arc<dyn StepKind>,
                )])),
                targets,
                events: Mutex::new(HashMap::new()),
                done: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The broker's names key, behind `opaque_name` and the marks of owner records on shared
    /// servers: 32 random bytes made by the first broker that asks and kept in the store's
    /// settings as [`NAMES_KEY_SETTING`], so every replica on one store, and every restart, has
    /// the same. It is kept as it is, not sealed with the encryption keys: rotating those never
    /// changes it, and it hides nothing the store does not already show in plain text (instances'
    /// ids beside the names made from them).
    pub async fn names_key(&self) -> Result<&NamesKey, StoreError> {
        let renderer = &self.inner.evaluator.renderer;
        if let Some(key) = renderer.names_key() {
            return Ok(key);
        }
        let fresh = NamesKey::generate().to_base64();
        let stored = self
            .inner
            .store
            .init_setting(NAMES_KEY_SETTING, &fresh)
            .await?;
        let key = NamesKey::from_base64(&stored).map_err(|e| StoreError::Corrupt {
            key: format!("setting {NAMES_KEY_SETTING}"),
            message: e.to_string(),
        })?;
        // Two tasks may load it at once; both read the same stored key.
        let _ = renderer.set_names_key(key);
        Ok(renderer.names_key().expect("the names key was just set"))
    }

    /// The store the engine runs on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Makes a step kind available to blueprints as `run: <name>`.
    pub fn register(&self, name: &str, kind: Arc<dyn StepKind>) {
        let mut steps = self.inner.steps.write().expect("lock");
        steps.insert(name.to_owned(), kind);
    }

    /// The engine's metrics, to register with a Prometheus registry.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    /// This engine's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The lease length in milliseconds, for operations created for this engine.
    pub fn lease_ms(&self) -> i64 {
        ms(self.inner.options.lease)
    }

    /// When a lease taken or renewed at `now` runs out.
    pub(super) fn lease_until(&self, now: i64) -> i64 {
        now + ms(self.inner.options.lease)
    }
}
