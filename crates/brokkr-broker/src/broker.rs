//! What every handler shares: the [`Broker`] (the configuration it serves, the engine, who may
//! call it and its metrics) as the [`AppState`], and the defaults of its limits.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use brokkr_blueprint::Config;
use brokkr_engine::Engine;

use crate::credentials::Auth;
use crate::registry::Metrics;

/// Default largest request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default time a synchronous request waits for its operation.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Default operation deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Everything the handlers share.
pub struct Broker {
    /// The validated configuration; replaced whole when `serve` reloads it. A request works with
    /// the configuration it started with.
    config: ArcSwap<Config>,
    /// The operation engine (and through it, the store).
    pub engine: Engine,
    /// Who may call the OSB API.
    pub auth: Auth,
    /// Who may call the admin API; `None` turns it off.
    pub admin_auth: Option<Auth>,
    /// Prometheus metrics.
    pub metrics: Metrics,
}

impl Broker {
    /// A broker over `engine` serving `config`.
    pub fn new(config: Arc<Config>, engine: Engine, auth: Auth, admin_auth: Option<Auth>) -> Self {
        let metrics = Metrics::new(&engine);
        name_plans(&engine, &config);
        Self {
            config: ArcSwap::new(config),
            engine,
            auth,
            admin_auth,
            metrics,
        }
    }

    /// The configuration now served.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Serves `config` from now on: the catalog and new requests see it; operations already
    /// under way keep the steps they were created with.
    pub fn replace_config(&self, config: Arc<Config>) {
        name_plans(&self.engine, &config);
        self.config.store(config);
    }

    pub(crate) fn max_body_bytes(&self) -> usize {
        self.config
            .load()
            .broker
            .max_body_bytes
            .unwrap_or(DEFAULT_MAX_BODY_BYTES)
    }

    pub(crate) fn sync_timeout(&self) -> Duration {
        self.config
            .load()
            .broker
            .sync_timeout
            .unwrap_or(DEFAULT_SYNC_TIMEOUT)
    }
}

/// Shared handler state.
pub type AppState = Arc<Broker>;

/// Labels the engine's metrics with the names `config`'s catalog gives services and plans.
fn name_plans(engine: &Engine, config: &Config) {
    engine.metrics().name_plans(config.plans().map(|e| {
        let (service, plan) = (&e.service, &e.plan);
        (
            service.id.clone(),
            plan.id.clone(),
            service.name.clone(),
            plan.name.clone(),
        )
    }));
}
