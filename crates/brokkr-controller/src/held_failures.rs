//! What a namespaced broker's status says fails no sooner than a floor after the attempt
//! started (the broker policy's `failure_floor`): a refused connection is as slow to
//! show as an answer that is not a catalog, so how soon a failure is written does not tell a
//! tenant what listens where. A failure that came sooner is held here, by the broker's uid, and
//! written by the reconcile that comes back for it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The failures of namespaced brokers not written yet, by the broker's uid: a reconcile that
/// fails sooner than the floor after it started keeps the condition here and is requeued for
/// the rest of the time, holding no reconcile slot; the next reconcile writes it (or, if the
/// spec changed meanwhile, forgets it and tries again).
#[derive(Debug, Default)]
pub struct HeldFailures(Mutex<HashMap<String, HeldFailure>>);

#[derive(Debug)]
pub(crate) struct HeldFailure {
    pub(crate) generation: i64,
    pub(crate) due: Instant,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// How long a held failure nobody came back for is kept.
const HELD_AT_MOST: Duration = Duration::from_secs(300);

/// What to do with a broker's held failure.
pub(crate) enum Held {
    /// Nothing held for this generation.
    Nothing,
    /// Written in this long.
    Waiting(Duration),
    /// To be written now.
    Due(&'static str, String),
}

impl HeldFailures {
    pub(crate) fn hold(&self, uid: String, failure: HeldFailure) {
        let mut held = self.0.lock().expect("lock");
        let now = Instant::now();
        held.retain(|_, f| f.due + HELD_AT_MOST > now);
        held.insert(uid, failure);
    }

    pub(crate) fn take(&self, uid: &str, generation: i64) -> Held {
        let mut held = self.0.lock().expect("lock");
        let Some(failure) = held.remove(uid) else {
            return Held::Nothing;
        };
        if failure.generation != generation {
            return Held::Nothing;
        }
        let left = failure.due.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Held::Due(failure.reason, failure.message)
        } else {
            held.insert(uid.to_owned(), failure);
            Held::Waiting(left)
        }
    }

    pub(crate) fn forget(&self, uid: &str) {
        self.0.lock().expect("lock").remove(uid);
    }

    /// Whether a failure of the broker `uid` waits to be written: its listing was tried.
    pub(crate) fn holds(&self, uid: &str) -> bool {
        self.0.lock().expect("lock").contains_key(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::UNUSABLE;

    #[test]
    fn a_held_failure_waits_its_time_and_goes_with_a_new_spec() {
        let held = HeldFailures::default();
        let failure = |due| HeldFailure {
            generation: 2,
            due,
            reason: "ErrorFetchingCatalog",
            message: UNUSABLE.into(),
        };
        assert!(matches!(held.take("uid", 2), Held::Nothing));
        held.hold(
            "uid".into(),
            failure(Instant::now() + Duration::from_secs(5)),
        );
        assert!(
            matches!(held.take("uid", 2), Held::Waiting(left) if left > Duration::from_secs(4))
        );
        // Still held: a wake-up before its time finds it again.
        assert!(matches!(held.take("uid", 2), Held::Waiting(_)));
        // The spec changed: forgotten, and the broker is tried again.
        assert!(matches!(held.take("uid", 3), Held::Nothing));
        assert!(matches!(held.take("uid", 2), Held::Nothing));
        held.hold("uid".into(), failure(Instant::now()));
        assert!(
            matches!(held.take("uid", 2), Held::Due(reason, message) if reason == "ErrorFetchingCatalog" && message == UNUSABLE)
        );
        assert!(matches!(held.take("uid", 2), Held::Nothing));
    }
}
