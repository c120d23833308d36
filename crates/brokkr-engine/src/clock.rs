//! The engine's clock: the current time in milliseconds since the Unix epoch, the time unit
//! of every timestamp the store keeps.

/// Milliseconds since the Unix epoch, the time unit of the store.
pub fn now_ms() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}
