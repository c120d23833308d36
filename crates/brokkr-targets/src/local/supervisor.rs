//! Supervision of the servers a `local` target runs: one task per server watches its process,
//! restarts a server that exited (with a backoff from 250 ms doubling to 10 s) and keeps a flag
//! saying whether the server is usable, which is true only once its protocol answers again.
//!
//! A server that cannot start is not retried forever: after [`MAX_FAILED_STARTS`] starts in a
//! row that ended (the process exited, or could not be started) before the server answered, the
//! supervisor gives up on it, logs a WARN line with the server's own last output lines, and
//! [`Server::starts`] says why; it tries again when the server is applied again (a new
//! provision or update) or brokkr restarts.
//!
//! Each server has a directory `<root>/<name>/` holding `state.json` (its instance, engine,
//! port, admin password, limits and last pid; readable by brokkr only), `server.log` and
//! `data/`. Servers run in a process group of their own with their output in `server.log`, so
//! they outlive a `kill -9` of brokkr; a new broker adopts each server whose pid is alive, whose
//! working directory is the server's `data/` and which answers its protocol on its port, and
//! starts again those that are not running. When brokkr runs as root, servers run as an
//! unprivileged account (PostgreSQL and MariaDB refuse root) that owns `data/`.

use std::collections::BTreeMap;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::engines::{Engine, Limits};
use crate::target::TargetError;

/// How often a server's process is looked at.
const WATCH: Duration = Duration::from_millis(250);
/// The longest wait before a server that keeps exiting is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long a stopping server may take before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(15);
/// How many starts in a row may end before the server answers before the supervisor gives up
/// on it (with the backoff, about 4 s of trying when each start fails at once).
pub(super) const MAX_FAILED_STARTS: u32 = 5;
/// How many of a server's last output lines a failure carries.
const LAST_LINES: usize = 5;
/// The most characters of them a failure carries (the last ones).
const LAST_CHARS: usize = 1000;

/// What is kept on disk about a server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Saved {
    pub instance_id: String,
    pub engine: Engine,
    pub port: u16,
    pub password: String,
    pub limits: Limits,
    #[serde(default)]
    pub pid: Option<u32>,
    /// Whether the server ever answered on `port` (and so its port may have been handed out);
    /// state saved before this was kept counts as answered.
    #[serde(default = "answered_before")]
    pub answered_once: bool,
}

fn answered_before() -> bool {
    true
}

/// The account servers run as (when brokkr is root).
#[derive(Debug, Clone, Copy)]
pub(super) struct Account {
    uid: u32,
    gid: u32,
}

impl Account {
    /// The account servers run as: `run_as` (default `nobody`) when brokkr runs as root, else
    /// none (brokkr's own user).
    pub(super) fn for_servers(run_as: Option<&str>) -> Result<Option<Self>, String> {
        if !rustix::process::geteuid().is_root() {
            return Ok(None);
        }
        let name = run_as.unwrap_or("nobody");
        let passwd = std::fs::read_to_string("/etc/passwd")
            .map_err(|e| format!("cannot read /etc/passwd: {e}"))?;
        passwd
            .lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[0] == name)
            .and_then(|f| Some(Self { uid: f[2].parse().ok()?, gid: f[3].parse().ok()? }))
            .filter(|a| a.uid != 0)
            .map(Some)
            .ok_or_else(|| {
                format!("brokkr runs as root and servers must not: no unprivileged account {name:?} (`run_as`)")
            })
    }

    fn own(self, path: &Path) -> std::io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }
}

/// How the server's recent starts went.
#[derive(Debug, Clone, Default)]
pub(super) struct Starts {
    /// Starts in a row that ended before the server answered.
    pub failed: u32,
    /// Why the last of them ended: the server's last output lines (passwords masked).
    pub last_error: Option<String>,
    /// Given up: no start until the server is applied again or brokkr restarts.
    pub given_up: bool,
}

/// One server and its watcher's view of it.
pub(super) struct Server {
    pub name: String,
    pub dir: PathBuf,
    saved: SyncMutex<Saved>,
    usable: AtomicBool,
    /// Whether the server answered since this broker last started it.
    answered: AtomicBool,
    starts: SyncMutex<Starts>,
    /// Held while the process is started, stopped or looked at.
    process: Mutex<Process>,
    account: Option<Account>,
    bins: Vec<PathBuf>,
}

struct Process {
    /// The process when this broker started it (so it is reaped).
    child: Option<Child>,
    /// Stopped on purpose: not restarted.
    stopped: bool,
    /// When this broker last started it, until its end is accounted for.
    started: Option<Instant>,
    /// The server's log files and their lengths at that start: what it wrote since.
    logs: Vec<(PathBuf, u64)>,
    /// The wait before the next start, and the earliest time for it.
    backoff: Duration,
    next_start: Instant,
}

impl Process {
    fn new() -> Self {
        Self {
            child: None,
            stopped: false,
            started: None,
            logs: Vec::new(),
            backoff: WATCH,
            next_start: Instant::now(),
        }
    }
}

impl Server {
    pub fn saved(&self) -> Saved {
        self.saved.lock().expect("saved lock").clone()
    }

    pub fn usable(&self) -> bool {
        self.usable.load(Ordering::SeqCst)
    }

    pub fn starts(&self) -> Starts {
        self.starts.lock().expect("starts lock").clone()
    }

    /// Forgets failed starts: the next start is due at once.
    fn reset_starts(&self, process: &mut Process) {
        *self.starts.lock().expect("starts lock") = Starts::default();
        process.backoff = WATCH;
        process.next_start = Instant::now();
    }

    /// Records a start that ended before the server answered; gives up after
    /// [`MAX_FAILED_STARTS`] in a row.
    fn failed_start(&self, error: String) {
        let mut starts = self.starts.lock().expect("starts lock");
        starts.failed += 1;
        starts.given_up = starts.failed >= MAX_FAILED_STARTS;
        if starts.given_up {
            warn!(server = %self.name, starts = starts.failed, last_output = %error,
                "local server did not start; giving up until it is applied again or brokkr restarts");
        } else {
            warn!(server = %self.name, start = starts.failed, last_output = %error,
                "local server ended before it answered; starting it again");
        }
        starts.last_error = Some(error);
    }

    /// Accounts, once, for the end of the process this broker last started: a server that had
    /// answered exited (and is started again); one that never answered is a failed start.
    fn ended(&self, process: &mut Process) {
        let was_usable = self.usable.swap(false, Ordering::SeqCst);
        let Some(started) = process.started.take() else {
            if was_usable {
                warn!(server = %self.name, "local server exited; starting it again");
            }
            return;
        };
        if self.answered.swap(false, Ordering::SeqCst) {
            warn!(server = %self.name, "local server exited; starting it again");
            if started.elapsed() > Duration::from_secs(30) {
                process.backoff = WATCH;
            }
            return;
        }
        let output = last_lines(&process.logs, &self.saved().password);
        self.move_off_a_taken_port(&output);
        self.failed_start(match output.is_empty() {
            true => "it exited without a word".to_owned(),
            false => output,
        });
    }

    /// A server that never answered, and ended because another process holds its port (which
    /// may take a port between the moment it was found free and the server's start), gets a
    /// new one for its next start.
    fn move_off_a_taken_port(&self, output: &str) {
        let mut saved = self.saved();
        if saved.answered_once || !output.contains("already in use") {
            return;
        }
        match free_port() {
            Ok(port) => {
                warn!(server = %self.name, taken = saved.port, port, "local server's port is taken; moving it");
                saved.port = port;
                if let Err(e) = self.save(saved) {
                    warn!(server = %self.name, error = %e, "cannot save the local server's new port");
                }
            }
            Err(e) => warn!(server = %self.name, error = %e, "no port to move the local server to"),
        }
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn save(&self, saved: Saved) -> Result<(), String> {
        write_private(
            &self.dir.join("state.json"),
            &serde_json::to_string(&saved).expect("state serializes"),
            None,
        )?;
        *self.saved.lock().expect("saved lock") = saved;
        Ok(())
    }

    /// Whether the server's process runs: this broker's child that has not exited, or a pid
    /// alive whose working directory is the server's `data/`.
    fn running(&self, process: &mut Process) -> Option<u32> {
        if let Some(child) = &mut process.child {
            return match child.try_wait() {
                Ok(None) => Some(child.id()),
                _ => {
                    process.child = None;
                    None
                }
            };
        }
        let pid = self.saved().pid?;
        is_ours(pid, &self.data()).then_some(pid)
    }

    /// Writes the files a start needs and starts the process.
    fn spawn(&self, process: &mut Process) -> Result<(), String> {
        let saved = self.saved();
        let data = self.data();
        for (path, text) in
            saved
                .engine
                .start_files(&data, saved.port, &saved.password, &saved.limits)
        {
            write_private(&path, &text, self.account)?;
        }
        let argv = saved
            .engine
            .start_command(&self.bins, &data, saved.port, &saved.limits);
        process.logs = (saved.engine.log_files(&self.dir))
            .into_iter()
            .map(|log| {
                let length = std::fs::metadata(&log).map_or(0, |m| m.len());
                (log, length)
            })
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| format!("cannot open {}/server.log: {e}", self.dir.display()))?;
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(&data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0);
        if let Some(account) = self.account {
            command.uid(account.uid).gid(account.gid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
        info!(server = %self.name, pid = child.id(), port = saved.port, "local server started");
        self.save(Saved {
            pid: Some(child.id()),
            ..saved
        })?;
        process.child = Some(child);
        process.started = Some(Instant::now());
        self.answered.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Stops the process (fast shutdown), waiting for it to exit, killing it if it does not.
    async fn terminate(&self, process: &mut Process) {
        let Some(pid) = self.running(process) else {
            return;
        };
        // PostgreSQL's SIGTERM waits for every client to leave; SIGINT is its fast shutdown.
        let signal = match self.saved().engine {
            Engine::Postgres => Signal::INT,
            _ => Signal::TERM,
        };
        send(pid, signal);
        let deadline = Instant::now() + STOP_WITHIN;
        while self.running(process).is_some() {
            if Instant::now() > deadline {
                warn!(server = %self.name, pid, "local server did not stop; killing it");
                send(pid, Signal::KILL);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Probes the server; marks it usable when it answers (which forgets failed starts).
    pub async fn probe(&self) -> Result<(), String> {
        let saved = self.saved();
        let result = saved.engine.probe(saved.port, &saved.password).await;
        self.usable.store(result.is_ok(), Ordering::SeqCst);
        if result.is_ok() && !self.answered.swap(true, Ordering::SeqCst) {
            *self.starts.lock().expect("starts lock") = Starts::default();
            let mut saved = self.saved();
            if !saved.answered_once {
                saved.answered_once = true;
                if let Err(e) = self.save(saved) {
                    warn!(server = %self.name, error = %e, "cannot save the local server's state");
                }
            }
        }
        result
    }
}

/// The servers of one `local` target.
pub(super) struct Supervisor {
    root: PathBuf,
    account: Option<Account>,
    servers: SyncMutex<BTreeMap<String, Arc<Server>>>,
}

impl Supervisor {
    pub fn new(root: PathBuf, account: Option<Account>) -> Self {
        Self {
            root,
            account,
            servers: SyncMutex::default(),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Server>> {
        self.servers
            .lock()
            .expect("servers lock")
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Server>> {
        self.servers
            .lock()
            .expect("servers lock")
            .values()
            .cloned()
            .collect()
    }

    /// Watches every server found under the root: adopts those running, starts the others.
    /// A directory without a readable state (a create cut short) is reported and left alone.
    pub fn adopt_all(self: &Arc<Self>) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let state = std::fs::read_to_string(dir.join("state.json"));
            let Ok(saved) = state
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str::<Saved>(&s).map_err(|e| e.to_string()))
            else {
                warn!(dir = %dir.display(), "a local server directory without a readable state.json is left alone");
                continue;
            };
            let bins = match saved.engine.binaries() {
                Ok(bins) => bins,
                Err(missing) => {
                    warn!(server = %name, missing, "cannot run a local server: a program is missing");
                    continue;
                }
            };
            let adopted = saved.pid.is_some_and(|pid| is_ours(pid, &dir.join("data")));
            info!(server = %name, adopted, "local server found");
            self.watch(name, dir, saved, bins);
        }
    }

    /// Creates server `name`: its directory, its data directory (made by the engine's init
    /// program as the servers' account), then starts and watches it. Idempotent: a server
    /// already known is returned as it is.
    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        saved: Saved,
        bins: Vec<PathBuf>,
    ) -> Result<Arc<Server>, String> {
        if let Some(server) = self.get(name) {
            return Ok(server);
        }
        let dir = self.root.join(name);
        // A create cut short (no state.json yet) starts over.
        if dir.exists() && !dir.join("state.json").exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
        }
        let data = dir.join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| format!("cannot create {}: {e}", data.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| e.to_string())?;
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        if let Some(account) = self.account {
            account.own(&data).map_err(|e| {
                format!(
                    "cannot hand {} to the servers' account: {e}",
                    data.display()
                )
            })?;
        }
        let engine = saved.engine;
        let files = engine.initial_files(&data, &saved.password);
        for (path, text) in &files {
            write_private(path, text, self.account)?;
        }
        if let Some(argv) = engine.init_command(&bins, &data) {
            let account = self.account;
            let dir2 = dir.clone();
            let output = tokio::task::spawn_blocking(move || {
                let mut command = Command::new(&argv[0]);
                command
                    .args(&argv[1..])
                    .current_dir(&dir2)
                    .stdin(Stdio::null());
                if let Some(a) = account {
                    command.uid(a.uid).gid(a.gid);
                }
                command.output()
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot run {}: {e}", engine.programs()[0]))?;
            if !output.status.success() {
                // Its errors, or, when it wrote none, what it printed.
                let text = match output.stderr.iter().all(u8::is_ascii_whitespace) {
                    true => output.stdout,
                    false => output.stderr,
                };
                let last = tail(&String::from_utf8_lossy(&text), &saved.password);
                return Err(format!(
                    "{} failed ({}): {last}",
                    engine.programs()[0],
                    output.status
                ));
            }
        }
        for (path, _) in files.iter().filter(|(p, _)| !p.starts_with(&data)) {
            let _ = std::fs::remove_file(path);
        }
        write_private(
            &dir.join("state.json"),
            &serde_json::to_string(&saved).expect("state serializes"),
            None,
        )?;
        Ok(self.watch(name.to_owned(), dir, saved, bins))
    }

    /// Starts watching a server (which starts it if it does not run).
    fn watch(
        self: &Arc<Self>,
        name: String,
        dir: PathBuf,
        saved: Saved,
        bins: Vec<PathBuf>,
    ) -> Arc<Server> {
        let server = Arc::new(Server {
            name: name.clone(),
            dir,
            saved: SyncMutex::new(saved),
            usable: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            starts: SyncMutex::default(),
            process: Mutex::new(Process::new()),
            account: self.account,
            bins,
        });
        self.servers
            .lock()
            .expect("servers lock")
            .insert(name, server.clone());
        tokio::spawn(supervise(server.clone()));
        server
    }

    /// Restarts a server with new limits, its data kept.
    pub async fn change_limits(&self, server: &Server, limits: Limits) -> Result<(), String> {
        let mut process = server.process.lock().await;
        server.usable.store(false, Ordering::SeqCst);
        server.terminate(&mut process).await;
        server.save(Saved {
            limits,
            ..server.saved()
        })?;
        server.reset_starts(&mut process);
        process.started = None;
        server.spawn(&mut process)
    }

    /// Has the watcher of a server it gave up on start it again, from a clean count.
    pub async fn start_again(&self, server: &Server) {
        let mut process = server.process.lock().await;
        server.reset_starts(&mut process);
    }

    /// Stops a server for good and removes its directory.
    pub async fn remove(&self, name: &str) -> Result<(), String> {
        let server = self.get(name);
        if let Some(server) = &server {
            let mut process = server.process.lock().await;
            process.stopped = true;
            server.usable.store(false, Ordering::SeqCst);
            server.terminate(&mut process).await;
        }
        let dir = self.root.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
        }
        self.servers.lock().expect("servers lock").remove(name);
        Ok(())
    }

    /// Stops every server, keeping their directories (the next start starts them again).
    pub async fn stop_all(&self) {
        for server in self.all() {
            let mut process = server.process.lock().await;
            process.stopped = true;
            server.usable.store(false, Ordering::SeqCst);
            server.terminate(&mut process).await;
            info!(server = %server.name, "local server stopped");
        }
    }
}

/// A free TCP port on 127.0.0.1 right now.
pub(super) fn free_port() -> Result<u16, TargetError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| TargetError::Unavailable(format!("no free loopback port: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| TargetError::Unavailable(e.to_string()))?;
    Ok(port.port())
}

/// Watches `server` until it is stopped on purpose: starts it when it is not running (waiting
/// longer after each quick exit, giving up after [`MAX_FAILED_STARTS`] that ended before it
/// answered), probes it until it answers, marks it not usable when it exits.
async fn supervise(server: Arc<Server>) {
    loop {
        let given_up = {
            let mut process = server.process.lock().await;
            if process.stopped {
                return;
            }
            if server.running(&mut process).is_none() {
                server.ended(&mut process);
                if !server.starts().given_up && Instant::now() >= process.next_start {
                    if let Some(pid) = server.saved().pid {
                        kill_leftovers(pid, &server.data());
                    }
                    if let Err(e) = server.spawn(&mut process) {
                        server.failed_start(mask(&e, &server.saved().password));
                    }
                    process.next_start = Instant::now() + process.backoff;
                    process.backoff = (process.backoff * 2).min(MAX_BACKOFF);
                }
            }
            server.starts().given_up
        };
        if !server.usable() && !given_up {
            let _ = server.probe().await;
        }
        tokio::time::sleep(WATCH).await;
    }
}

/// The last lines the server wrote to `logs` since the offsets given, passwords masked.
fn last_lines(logs: &[(PathBuf, u64)], password: &str) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const MOST: u64 = 64 * 1024;
    let mut text = String::new();
    for (path, from) in logs {
        let Ok(mut file) = std::fs::File::open(path) else {
            continue;
        };
        let length = file.metadata().map_or(0, |m| m.len());
        let start = (*from).max(length.saturating_sub(MOST)).min(length);
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(start)).is_ok() && file.read_to_end(&mut bytes).is_ok() {
            text.push_str(&String::from_utf8_lossy(&bytes));
            text.push('\n');
        }
    }
    tail(&text, password)
}

/// The last [`LAST_LINES`] non-empty lines of `text` on one line, at most [`LAST_CHARS`]
/// characters, `password` masked.
fn tail(text: &str, password: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let last = lines[lines.len().saturating_sub(LAST_LINES)..].join(" | ");
    let last = mask(&last, password);
    let chars = last.chars().count();
    match chars > LAST_CHARS {
        true => format!(
            "…{}",
            last.chars().skip(chars - LAST_CHARS).collect::<String>()
        ),
        false => last,
    }
}

/// `text` with every occurrence of `password` masked.
fn mask(text: &str, password: &str) -> String {
    match password.is_empty() {
        true => text.to_owned(),
        false => text.replace(password, "********"),
    }
}

/// Whether `pid` is a live process (not a zombie) working in `data`: a server of this target,
/// not another process that reuses the pid.
fn is_ours(pid: u32, data: &Path) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let zombie = std::fs::read_to_string(proc.join("stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    !zombie && std::fs::read_link(proc.join("cwd")).is_ok_and(|cwd| cwd == data)
}

/// Kills what is left of a server whose main process died: the processes of its process group
/// (the group brokkr started it in) that still work in its `data/` (PostgreSQL's backends, which
/// keep the old shared memory and stop a new server from starting until they exit).
fn kill_leftovers(pgid: u32, data: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // After the command's `)`: state, ppid, pgrp.
        let pgrp = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(2));
        if pgrp == Some(pgid.to_string().as_str()) && is_ours(pid, data) {
            send(pid, Signal::KILL);
        }
    }
}

fn send(pid: u32, signal: Signal) {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Writes `text` to `path` readable by its owner only: brokkr, or `account` when given.
fn write_private(path: &Path, text: &str, account: Option<Account>) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(fail)?;
        file.write_all(text.as_bytes()).map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    if let Some(account) = account {
        account.own(&tmp).map_err(fail)?;
    }
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_carries_the_last_lines_on_one_line_without_the_password() {
        let text = "one\n\n two \nthree\nfour\nfive\nsix has pw-123 in it\n";
        assert_eq!(
            tail(text, "pw-123"),
            "two | three | four | five | six has ******** in it"
        );
        let long = "x".repeat(3 * LAST_CHARS);
        let cut = tail(&long, "pw");
        assert_eq!(cut.chars().count(), LAST_CHARS + 1);
        assert!(cut.starts_with('…'));
    }

    #[test]
    fn only_what_a_server_wrote_since_its_start_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        std::fs::write(&log, "an old run's error\n").unwrap();
        let from = std::fs::metadata(&log).unwrap().len();
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str("FATAL: this run's error\n");
        std::fs::write(&log, text).unwrap();
        let missing = dir.path().join("error.log");
        assert_eq!(
            last_lines(&[(log, from), (missing, 0)], "secret"),
            "FATAL: this run's error"
        );
    }
}
