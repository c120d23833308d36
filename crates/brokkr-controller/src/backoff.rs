//! Per-object backoff for calls that start something at a broker.
//!
//! A provision or bind that fails in a way worth retrying (a timeout, a 5xx, credentials that
//! cannot become a Secret, each possibly followed by orphan mitigation) is tried again after a
//! delay that starts at one second and doubles with each failure in a row, up to five minutes;
//! a success forgets the object. Status writes wake a controller at once, so the delay is kept
//! here, by the object's uid, and checked before the next call rather than only requeued: no
//! tenant can make the controller hammer a shared broker, however its object fails.
//!
//! The record is in memory: a restarted controller starts again at one second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The first delay.
pub const FIRST: Duration = Duration::from_secs(1);
/// The longest delay.
pub const MAX: Duration = Duration::from_secs(5 * 60);

/// The failures in a row of each object that has some, by uid.
#[derive(Debug, Default)]
pub struct Backoffs(Mutex<HashMap<String, Entry>>);

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    not_before: Instant,
}

impl Backoffs {
    /// How long the object of `uid` must still wait before its next call; `None` when it may
    /// call now.
    pub fn wait(&self, uid: &str) -> Option<Duration> {
        let entries = self.0.lock().expect("backoffs");
        let entry = entries.get(uid)?;
        let now = Instant::now();
        (entry.not_before > now).then(|| entry.not_before - now)
    }

    /// Records a failure of the object of `uid`; returns the delay before its next call.
    pub fn failed(&self, uid: &str) -> Duration {
        let mut entries = self.0.lock().expect("backoffs");
        let failures = entries.get(uid).map_or(0, |e| e.failures) + 1;
        let delay = delay(failures);
        entries.insert(
            uid.to_owned(),
            Entry {
                failures,
                not_before: Instant::now() + delay,
            },
        );
        delay
    }

    /// Forgets the object of `uid`: it succeeded, or is gone.
    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("backoffs").remove(uid);
    }
}

/// The delay after `failures` failures in a row.
fn delay(failures: u32) -> Duration {
    FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_a_second_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(delay(u32::MAX), MAX);
    }

    #[test]
    fn a_failure_makes_the_object_wait_and_a_success_forgets_it() {
        let backoffs = Backoffs::default();
        assert_eq!(backoffs.wait("a"), None);
        assert_eq!(backoffs.failed("a"), FIRST);
        assert_eq!(backoffs.failed("a"), 2 * FIRST);
        let left = backoffs.wait("a").expect("waits");
        assert!(left > FIRST && left <= 2 * FIRST, "{left:?}");
        assert_eq!(backoffs.wait("b"), None, "per object");
        backoffs.forget("a");
        assert_eq!(backoffs.wait("a"), None);
        assert_eq!(backoffs.failed("a"), FIRST, "starts again");
    }
}
