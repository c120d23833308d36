//! How the controllers call brokers, and what brokers may cost them: per call, per catalog
//! ([`BrokerPolicy`]) and per namespace ([`NamespaceBounds`]), and whose turn it is to list a
//! namespace's catalogs ([`Turns`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brokkr_osb::client::BodyLimits;

use crate::held_failures::HeldFailures;
use crate::url_policy::UrlPolicy;

/// How the controllers call brokers, and what one broker may cost them.
#[derive(Debug, Clone)]
pub struct BrokerPolicy {
    /// The most bytes read of each kind of answer.
    pub body_limits: BodyLimits,
    /// The time limit of one call, the whole answer included.
    pub timeout: Duration,
    /// The time limit of connecting.
    pub connect_timeout: Duration,
    /// The most service offerings one catalog may list.
    pub max_services: usize,
    /// The most plans one catalog may list, over all its services.
    pub max_plans: usize,
    /// Where namespaced ServiceBrokers may point the controller.
    pub namespaced_urls: UrlPolicy,
    /// How many catalogs may be read and written at once (each may hold up to the catalog
    /// limit in memory, so this bounds what many brokers listed together cost).
    pub catalog_permits: Arc<tokio::sync::Semaphore>,
    /// How long after an attempt started a namespaced broker's failure is written, at the
    /// soonest: a refused connection and an answer that is not a catalog both take this long.
    pub failure_floor: Duration,
    /// The failures of namespaced brokers waiting for [`BrokerPolicy::failure_floor`].
    pub held_failures: Arc<HeldFailures>,
    /// What the ServiceBrokers of one namespace may list together.
    pub namespaces: NamespaceBounds,
    /// Whose turn it is to list, per namespace.
    pub turns: Arc<Turns>,
}

impl BrokerPolicy {
    /// The default of [`BrokerPolicy::max_services`].
    pub const DEFAULT_MAX_SERVICES: usize = 200;
    /// The default of [`BrokerPolicy::max_plans`].
    pub const DEFAULT_MAX_PLANS: usize = 1000;
    /// The default of [`BrokerPolicy::timeout`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// The default number of [`BrokerPolicy::catalog_permits`].
    pub const DEFAULT_CONCURRENT_CATALOGS: usize = 4;
    /// The default of [`BrokerPolicy::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for BrokerPolicy {
    /// 8 MiB catalogs, 1 MiB other answers, 64 KiB error answers; 60 s a call (10 s to
    /// connect); 200 services and 1,000 plans a catalog, 4 catalogs at once; the default URL
    /// policy; namespaced brokers' failures written 10 s (the connect timeout) after the
    /// attempt started, at the soonest; the default [`NamespaceBounds`].
    fn default() -> Self {
        Self {
            body_limits: BodyLimits::default(),
            timeout: Self::DEFAULT_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            max_services: Self::DEFAULT_MAX_SERVICES,
            max_plans: Self::DEFAULT_MAX_PLANS,
            namespaced_urls: UrlPolicy::default(),
            catalog_permits: Arc::new(tokio::sync::Semaphore::new(
                Self::DEFAULT_CONCURRENT_CATALOGS,
            )),
            failure_floor: Self::DEFAULT_CONNECT_TIMEOUT,
            held_failures: Arc::default(),
            namespaces: NamespaceBounds::default(),
            turns: Arc::default(),
        }
    }
}

/// What the ServiceBrokers of one namespace may make the platform keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceBounds {
    /// The most ServiceBrokers served in one namespace.
    pub max_brokers: usize,
    /// The most ServiceClasses the brokers of one namespace may list, together.
    pub max_classes: usize,
    /// The most ServicePlans the brokers of one namespace may list, together.
    pub max_plans: usize,
}

impl NamespaceBounds {
    /// The default of [`NamespaceBounds::max_brokers`].
    pub const DEFAULT_MAX_BROKERS: usize = 5;
    /// The default of [`NamespaceBounds::max_classes`].
    pub const DEFAULT_MAX_CLASSES: usize = 400;
    /// The default of [`NamespaceBounds::max_plans`].
    pub const DEFAULT_MAX_PLANS: usize = 2000;
}

impl Default for NamespaceBounds {
    /// 5 brokers, 400 classes and 2,000 plans a namespace.
    fn default() -> Self {
        Self {
            max_brokers: Self::DEFAULT_MAX_BROKERS,
            max_classes: Self::DEFAULT_MAX_CLASSES,
            max_plans: Self::DEFAULT_MAX_PLANS,
        }
    }
}

/// The namespaces whose turn is taken: one listing (or release) per namespace at a time.
#[derive(Debug, Default)]
pub struct Turns {
    busy: Mutex<HashSet<String>>,
}

/// A namespace's turn, given back when dropped. A ClusterServiceBroker's holds nothing.
#[derive(Debug)]
pub struct Turn {
    taken: Option<(Arc<Turns>, String)>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((turns, namespace)) = self.taken.take() {
            turns.busy.lock().expect("lock").remove(&namespace);
        }
    }
}

impl Turn {
    /// A turn that holds no namespace: a ClusterServiceBroker's.
    pub fn nothing() -> Self {
        Self { taken: None }
    }
}

impl Turns {
    /// Takes `namespace`'s turn, unless it is taken.
    pub fn try_take(self: &Arc<Self>, namespace: &str) -> Option<Turn> {
        self.busy
            .lock()
            .expect("lock")
            .insert(namespace.to_owned())
            .then(|| Turn {
                taken: Some((self.clone(), namespace.to_owned())),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_has_one_turn_at_a_time() {
        let turns = Arc::new(Turns::default());
        let first = turns.try_take("team-a").expect("free");
        assert!(turns.try_take("team-a").is_none());
        let other = turns.try_take("team-b");
        assert!(other.is_some());
        drop(first);
        assert!(turns.try_take("team-a").is_some());
    }
}
