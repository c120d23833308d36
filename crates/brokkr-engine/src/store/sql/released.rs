//! PostgreSQL: replicas tell each other when they release operations, so that another replica
//! claims them at once instead of at its next look for due work.
//!
//! A release (a replica shutting down, or an operation handed back for a long wait) commits with
//! `NOTIFY brokkr_released`, whose payload is the store's schema: several stores may share a
//! database, one schema each. Every store listens on a connection of its own and wakes its
//! engine's worker ([`Store::work_released`](crate::store::Store::work_released)) on a
//! notification for its schema, its own included (one more look at due work, which finds
//! nothing). A notification lost while the connection is down costs nothing but the wait until
//! the worker's next look.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The channel releases are announced on.
pub(super) const CHANNEL: &str = "brokkr_released";

/// The statement, run in a release's transaction, that announces it to every replica. (As
/// text: sqlx's `Any` driver refuses a result of type `void`.)
pub(super) const NOTIFY: &str = "SELECT pg_notify('brokkr_released', current_schema())::text";

/// Listens for releases on the store at `url`, whose schema is `schema`, and wakes `released`
/// for each, until `stop` is cancelled (the store is gone).
pub(super) async fn listen(
    url: String,
    schema: String,
    released: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut listener = None;
    while !stop.is_cancelled() {
        let current = match listener.as_mut() {
            Some(current) => current,
            None => match connect(&url).await {
                Ok(connected) => listener.insert(connected),
                Err(e) => {
                    warn!(error = %e, "cannot listen for released operations; retrying");
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    continue;
                }
            },
        };
        tokio::select! {
            () = stop.cancelled() => {}
            received = current.recv() => match received {
                Ok(notification) if notification.payload() == schema => released.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, "lost the connection that listens for released operations");
                    listener = None;
                }
            },
        }
    }
}

async fn connect(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}
