//! The engine's lifecycle: starting it, the background worker that claims due operations (and
//! sweeps steps left behind and purges old tombstones), shutting down, and entering one
//! operation — at most once per process — to run its steps.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tracing::{Instrument, debug, info, info_span, warn};

use super::engine::{Engine, ms};
use crate::clock::now_ms;
use crate::model::{Key, Resource};
use crate::store::StoreError;

impl Engine {
    /// Starts the background worker: loads the broker's names key (see [`Engine::names_key`])
    /// and, on a single-process store, first takes over every lease left by a previous run.
    pub async fn start(&self) -> Result<(), StoreError> {
        self.names_key().await?;
        if !self.inner.store.shared() {
            let released = self.inner.store.release_all().await?;
            if released > 0 {
                info!(operations = released, "resuming operations left running");
            }
        }
        let engine = self.clone();
        self.inner.tasks.spawn(async move { engine.worker().await });
        Ok(())
    }

    /// Stops claiming work, lets running steps reach a save point, and waits for them, then
    /// shuts the targets down (a `local` target stops its servers unless configured to keep
    /// them). Unfinished operations stay in the store and resume on the next start.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.targets.shutdown().await;
    }

    /// Runs the operation of `key` in the background; it must be leased to this engine.
    pub fn spawn(&self, key: Key) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        self.inner
            .tasks
            .spawn(async move { engine.run(key, Entry::Read).await })
    }

    /// Runs, in the background, the operation of the resource `written` that a request of this
    /// process has just committed (created, or started on an existing resource) with
    /// [`crate::model::Operation::new`]. `written` is the resource exactly as that commit left it (the
    /// store returns it from a start): the engine starts from it instead of reading it back.
    pub fn spawn_new(&self, written: Resource) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        let key = written.key.clone();
        self.inner
            .tasks
            .spawn(async move { engine.run(key, Entry::New(Box::new(written))).await })
    }

    /// Runs the operation of `key` to its end (or to a long wait) in its own task and waits for
    /// it: the operation goes on even if the caller (a request whose client left) is dropped.
    pub async fn run_to_end(&self, key: Key) {
        if let Err(e) = self.spawn(key).await {
            warn!(error = %e, "an operation task ended abnormally; it will be resumed");
        }
    }

    async fn run(&self, key: Key, entry: Entry) {
        let span = info_span!("operation", instance_id = %key.instance_id,
            binding_id = key.binding_id.as_deref().unwrap_or(""),
            operation = tracing::field::Empty, kind = tracing::field::Empty);
        if let Err(e) = self.drive(&key, entry).instrument(span).await {
            warn!(%key, error = %e, "operation interrupted by a store error; it will be resumed");
        }
    }

    /// Waits until the operation `op_id` of `key` is no longer in progress, or `timeout` passes.
    /// Returns the resource as last read.
    pub async fn wait(
        &self,
        key: &Key,
        op_id: &str,
        timeout: Duration,
    ) -> Result<Option<Resource>, StoreError> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let r = self.inner.store.get(key).await?;
            let running = r
                .as_ref()
                .is_some_and(|r| r.op.id == op_id && r.op.in_progress());
            if !running || tokio::time::Instant::now() >= until {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn worker(&self) {
        let inner = &self.inner;
        let mut last_purge = 0;
        loop {
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                () = tokio::time::sleep(inner.options.poll_interval) => {}
                () = inner.wake.notified() => {}
                () = inner.store.work_released() => {}
            }
            let lease_until = self.lease_until(now_ms());
            match inner
                .store
                .claim_due(&inner.owner, lease_until, inner.options.claim_batch)
                .await
            {
                Ok(keys) => {
                    for key in keys {
                        debug!(%key, "claimed operation");
                        self.spawn(key);
                    }
                }
                Err(e) => warn!(error = %e, "cannot claim due operations"),
            }
            self.sweep_orphans().await;
            // Purge at most every minute, and often enough for short retentions.
            let purge_every = ms(inner.options.retention).clamp(1, 60_000);
            if now_ms() - last_purge >= purge_every {
                last_purge = now_ms();
                let before = last_purge - ms(inner.options.retention);
                match inner.store.purge_deleted(before).await {
                    Ok(0) => {}
                    Ok(n) => info!(resources = n, "purged deleted resources past retention"),
                    Err(e) => warn!(error = %e, "cannot purge deleted resources"),
                }
            }
        }
    }

    /// Runs the operation of `key` if it is in progress, leased to this engine and not already
    /// running here.
    async fn drive(&self, key: &Key, entry: Entry) -> Result<(), StoreError> {
        let inner = &self.inner;
        let owner = inner.owner.as_str();
        let (resource, new) = match entry {
            Entry::New(written) => (*written, true),
            Entry::Read => {
                let Some(resource) = inner.store.get(key).await? else {
                    return Ok(());
                };
                (resource, false)
            }
        };
        let mut op = resource.op.clone();
        if !op.in_progress() || op.lease_owner.as_deref() != Some(owner) {
            return Ok(());
        }
        let Some(_running) = Running::enter(&inner.running, key, &op.id) else {
            return Ok(()); // already running in this process
        };
        let span = tracing::Span::current();
        span.record("operation", op.id.as_str());
        span.record("kind", op.kind.as_str());
        if !new && (op.step > 0 || op.step_started_at.is_some()) {
            self.event(&op.id, "resumed", None, None).await;
        }
        inner.metrics.running.inc();
        let mut resource = resource;
        let result = self.drive_steps(&mut resource, &mut op, new).await;
        self.flush_events(&op.id).await;
        inner.metrics.running.dec();
        result
    }
}

/// How the engine comes to run an operation.
enum Entry {
    /// Claimed, or asked for by key: read from the store; if it had begun, it is resumed.
    Read,
    /// Just committed by a request of this process, its first step started by that commit;
    /// with the resource as written.
    New(Box<Resource>),
}

/// Marks an operation as running in this process for as long as it lives, even if the task
/// running it is dropped midway.
struct Running<'a> {
    set: &'a Mutex<HashSet<(Key, String)>>,
    entry: (Key, String),
}

impl<'a> Running<'a> {
    /// `None` when the operation already runs here. (The guard is built only after the lock
    /// is released: one built and dropped under it would lock it again, and remove the entry of
    /// the run that holds it.)
    fn enter(set: &'a Mutex<HashSet<(Key, String)>>, key: &Key, op_id: &str) -> Option<Self> {
        let entry = (key.clone(), op_id.to_owned());
        let inserted = set.lock().expect("lock").insert(entry.clone());
        inserted.then(|| Self { set, entry })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.set.lock().expect("lock").remove(&self.entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_already_running_here_is_not_entered_twice() {
        let set = Mutex::new(HashSet::new());
        let key = Key::instance("i-1");
        let first = Running::enter(&set, &key, "op-1").expect("entered");
        assert!(Running::enter(&set, &key, "op-1").is_none());
        assert_eq!(
            set.lock().unwrap().len(),
            1,
            "the first run keeps its entry"
        );
        drop(first);
        assert!(set.lock().unwrap().is_empty());
    }
}
