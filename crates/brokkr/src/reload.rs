//! Hot reload of the configuration while `serve` runs.
//!
//! The configuration is read again on SIGHUP and when its file (or a `*.yaml`/`*.yml` file of its
//! directory) changes, once the changes have been quiet for [`DEBOUNCE`]. The files are looked at
//! every [`POLL`] rather than watched with inotify: a directory that also holds a SQLite store
//! (`brokkr serve -c brokkr.yaml --store sqlite://brokkr.db`) would otherwise wake brokkr for
//! every write to the store's log, thousands a second under load. A configuration that
//! loads and passes the same checks as at start replaces the served one: the catalog and new
//! requests see it at once, while operations already under way keep the steps they were created
//! with. A broken one is logged with all its errors and the running configuration is kept; so
//! is one where a plan makes something other than what the store recorded for its maintenance
//! version (see `versions`).
//!
//! Settings read once at start — `broker` (listen address, credentials), `store` and `targets` —
//! take effect on restart; a reload that changes `targets` says so in a warning.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use brokkr_blueprint::Config;
use brokkr_broker::Broker;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// How long file changes must be quiet before the configuration is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// How often the configuration's files are looked at.
pub const POLL: Duration = Duration::from_millis(500);

/// Checks a loaded configuration further, as at start (e.g. that its step kinds exist).
pub type Check = Box<dyn Fn(&Config) -> anyhow::Result<()> + Send + Sync>;

/// Starts reloading `broker`'s configuration from `path` (the built-in quickstart when `None`,
/// which never changes) on SIGHUP and on file changes.
pub fn spawn(path: Option<PathBuf>, broker: Arc<Broker>, check: Check) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Reason>();
    if let Some(path) = &path {
        watch(path, tx.clone())?;
    }
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
        while let Some(mut reason) = rx.recv().await {
            // Editors write a file in several steps: wait until the changes stop.
            while let Ok(Some(next)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                reason = reason.max(next);
            }
            reload(path.as_deref(), &broker, &check, reason).await;
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

/// Looks at the configuration every [`POLL`] and reports when its files change.
fn watch(path: &Path, tx: mpsc::UnboundedSender<Reason>) -> anyhow::Result<()> {
    let files = ConfigFiles::new(path)?;
    let mut last = files.snapshot();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let now = files.snapshot();
            if now != last {
                last = now;
                if tx.send(Reason::FileChanged).is_err() {
                    break;
                }
            }
        }
    });
    Ok(())
}

/// The files whose changes reload the configuration: the configuration file, or the
/// `*.yaml`/`*.yml` files of the configuration directory, and a Kubernetes ConfigMap or Secret
/// volume's `..data` symlink, which the kubelet swaps by a rename to update the files.
struct ConfigFiles {
    dir: PathBuf,
    file: Option<PathBuf>,
}

/// What a file looked like: where it is (after symlinks), its size and when it was modified.
/// Gone files have none.
type Snapshot = Vec<(PathBuf, Option<FileState>)>;

#[derive(Debug, PartialEq, Eq)]
struct FileState {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: (u64, u64),
}

impl ConfigFiles {
    fn new(path: &Path) -> anyhow::Result<Self> {
        let path = std::path::absolute(path)?;
        Ok(if path.is_dir() {
            Self {
                dir: path,
                file: None,
            }
        } else {
            let dir = path
                .parent()
                .map_or_else(|| PathBuf::from("/"), Path::to_owned);
            Self {
                dir,
                file: Some(path),
            }
        })
    }

    /// The files as they are now, in a stable order; symlinks followed.
    fn snapshot(&self) -> Snapshot {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|p| self.relevant(p))
            .collect();
        if let Some(file) = &self.file
            && !paths.contains(file)
        {
            paths.push(file.clone());
        }
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let state = std::fs::metadata(&p).ok().map(|m| FileState {
                    modified: m.modified().ok(),
                    len: m.len(),
                    #[cfg(unix)]
                    inode: {
                        use std::os::unix::fs::MetadataExt;
                        (m.dev(), m.ino())
                    },
                });
                (p, state)
            })
            .collect()
    }

    fn relevant(&self, p: &Path) -> bool {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name.starts_with("..data")
            || match &self.file {
                Some(file) => p == file,
                None => matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")),
            }
    }
}

/// Loads, checks and, when valid and no plan changed under its maintenance version, serves the
/// configuration at `path`, recording its new maintenance versions.
async fn reload(path: Option<&Path>, broker: &Broker, check: &Check, reason: Reason) {
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
    let store = broker.engine.store().as_ref();
    if let Err(e) = crate::versions::record(store, &config).await {
        error!("{why}: the new configuration is refused; still serving the previous one\n{e:#}");
        return;
    }
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
