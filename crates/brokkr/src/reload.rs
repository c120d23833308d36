//! Hot reload of the configuration while `serve` runs.
//!
//! The configuration is read again on SIGHUP and when its file (or a `*.yaml`/`*.yml` file of its
//! directory) changes, once the changes have been quiet for [`DEBOUNCE`]. A configuration that
//! loads and passes the same checks as at start replaces the served one: the catalog and new
//! requests see it at once, while operations already under way keep the steps they were created
//! with. A broken one is logged with all its errors and the running configuration is kept.
//!
//! Settings read once at start — `broker` (listen address, credentials), `store` and `targets` —
//! take effect on restart; a reload that changes `targets` says so in a warning.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use brokkr_blueprint::Config;
use brokkr_broker::Broker;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// How long file changes must be quiet before the configuration is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Checks a loaded configuration further, as at start (e.g. that its step kinds exist).
pub type Check = Box<dyn Fn(&Config) -> anyhow::Result<()> + Send + Sync>;

/// Starts reloading `broker`'s configuration from `path` (the built-in quickstart when `None`,
/// which never changes) on SIGHUP and on file changes.
pub fn spawn(path: Option<PathBuf>, broker: Arc<Broker>, check: Check) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Reason>();
    let watcher = match &path {
        Some(path) => Some(watch(path, tx.clone())?),
        None => None,
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                if tx.send(Reason::Signal).is_err() {
                    break;
                }
            }
        });
    }
    tokio::spawn(async move {
        // Owned by the task so that watching lasts as long as the server.
        let _watcher = watcher;
        while let Some(mut reason) = rx.recv().await {
            // Editors write a file in several steps: wait until the changes stop.
            while let Ok(Some(next)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                reason = reason.max(next);
            }
            reload(path.as_deref(), &broker, &check, reason);
        }
    });
    Ok(())
}

/// What asked for a reload; a signal outranks file changes in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    FileChanged,
    Signal,
}

/// Watches the configuration file's directory (so that files replaced by a rename are seen),
/// or the configuration directory, and reports changes to configuration files.
fn watch(
    path: &Path,
    tx: mpsc::UnboundedSender<Reason>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    let path = std::path::absolute(path)?;
    let (dir, file) = if path.is_dir() {
        (path.clone(), None)
    } else {
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_owned);
        (dir, Some(path.clone()))
    };
    // Kubernetes ConfigMap and Secret volumes update files by swapping a `..data` symlink.
    let relevant = move |p: &Path| {
        let swapped = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("..data"));
        swapped
            || match &file {
                Some(file) => p == file,
                None => matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")),
            }
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let changes = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
        );
        if changes && event.paths.iter().any(|p| relevant(p)) {
            let _ = tx.send(Reason::FileChanged);
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Loads, checks and, when valid, serves the configuration at `path`.
fn reload(path: Option<&Path>, broker: &Broker, check: &Check, reason: Reason) {
    let why = match reason {
        Reason::Signal => "SIGHUP",
        Reason::FileChanged => "a configuration file changed",
    };
    let loaded = crate::config::load_config(path)
        .map_err(|e| e.to_string())
        .and_then(|config| {
            check(&config)
                .map(|()| config)
                .map_err(|e| format!("error: {e:#}"))
        });
    let config = match loaded {
        Ok(config) => config,
        Err(errors) => {
            error!(
                "{why}: the new configuration is not valid; still serving the previous one\n{errors}"
            );
            return;
        }
    };
    let previous = broker.config();
    if config.targets != previous.targets {
        warn!("{why}: `targets` changed; targets take effect when brokkr restarts");
    }
    let plans: usize = config.catalog.services.iter().map(|s| s.plans.len()).sum();
    info!(
        services = config.catalog.services.len(),
        plans, "{why}: configuration reloaded"
    );
    broker.replace_config(Arc::new(config));
}
