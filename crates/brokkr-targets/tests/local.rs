//! The `local` target on its own, with the servers installed here: its `root` given as a user
//! may give it — relative to the working directory, with `..`, through a symbolic link,
//! absolute — each runs a Redis server (and the relative one, the default's shape, also a
//! PostgreSQL server), and a broker killed and started again over the symbolic link adopts its
//! server. A server that cannot start (a PostgreSQL with a limit it refuses; a Redis whose port
//! another process took while it was down) is given up on after its bounded number of starts:
//! readiness fails with the server's own last lines, without its password, and applying it again
//! (with good limits, or once the port is free) starts it again.
//!
//! Every server a test starts is killed when the test ends, even when it fails.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brokkr_blueprint::TargetConfig;
use brokkr_targets::local::Local;
use brokkr_targets::{NamesKey, Readiness, Scope, Target, TargetError};
use serde_json::{Value, json};

fn scope(instance: &str) -> Scope<'_> {
    Scope {
        instance_id: instance,
        binding_id: None,
        service_id: "s",
        plan_id: "p",
        step: "server",
        context: &Value::Null,
        // The local target names nothing with the broker's key.
        names_key: &NamesKey::RENDER_ONLY,
    }
}

fn config() -> TargetConfig {
    serde_json::from_value(json!({"kind": "local"})).unwrap()
}

fn server(engine: &str, name: &str, max_connections: u32) -> Value {
    json!({"kind": "Server", "engine": engine, "name": name, "memory_mb": 32,
           "max_connections": max_connections})
}

/// A test directory the servers' account can pass through (it is `nobody` when the tests run
/// as root), whose servers are killed when it is dropped.
struct TestDir(tempfile::TempDir);

impl TestDir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let open = std::os::unix::fs::PermissionsExt::from_mode(0o711);
        std::fs::set_permissions(dir.path(), open).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        for state in states(self.path(), 4) {
            let pid = std::fs::read_to_string(&state)
                .ok()
                .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                .and_then(|v| v["pid"].as_u64());
            if let Some(pid) = pid {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}

/// The `state.json` files up to `depth` directories below `dir` (symbolic links not followed).
fn states(dir: &Path, depth: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == "state.json" {
            found.push(path);
        } else if depth > 0 && entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(states(&path, depth - 1));
        }
    }
    found
}

/// Waits until `resource` is ready, or returns why it will not be.
async fn ready(
    target: &Local,
    resource: &Value,
    instance: &str,
    within: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match target.ready(resource, &scope(instance)).await {
            Ok(Readiness::Ready) => return Ok(()),
            Ok(Readiness::Waiting(why)) if Instant::now() > deadline => {
                return Err(format!("still waiting: {why}"));
            }
            Ok(Readiness::Waiting(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(TargetError::Invalid(why) | TargetError::Unavailable(why)) => return Err(why),
        }
    }
}

/// The pid and password `state.json` holds for server `name` under `root`.
fn saved(root: &Path, name: &str) -> (u32, String) {
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(name).join("state.json")).unwrap())
            .unwrap();
    let pid = u32::try_from(state["pid"].as_u64().unwrap()).unwrap();
    (pid, state["password"].as_str().unwrap().to_owned())
}

#[test]
fn servers_run_whatever_the_root_path_looks_like_and_are_adopted_through_a_symbolic_link() {
    let dir = TestDir::new();
    let real = std::fs::canonicalize(dir.path()).unwrap().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    // The only test of this binary that changes the working directory; the others use absolute
    // paths only.
    std::env::set_current_dir(&real).unwrap();
    let roots = [
        ("relative", PathBuf::from("brokkr.db.d")),
        ("dot-dot", PathBuf::from("sub/../dotdot.d")),
        ("symlink", dir.path().join("link/linked.d")),
        ("absolute", real.join("absolute.d")),
    ];

    let first = tokio::runtime::Runtime::new().unwrap();
    let pids = first.block_on(async {
        let mut pids = Vec::new();
        for (i, (what, root)) in roots.iter().enumerate() {
            let target = Local::new("local", &config(), root.clone());
            let instance = format!("i-{i}");
            let redis = server("redis", &format!("redis-{i}"), 10);
            target.apply(&redis, &scope(&instance)).await.unwrap();
            ready(&target, &redis, &instance, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{what} root {root:?}: {e}"));
            if *what == "relative" {
                let pg = server("postgres", "pg-0", 10);
                (target.apply(&pg, &scope(&instance)).await)
                    .unwrap_or_else(|e| panic!("{what} root {root:?}: {e}"));
                ready(&target, &pg, &instance, Duration::from_secs(60))
                    .await
                    .unwrap_or_else(|e| panic!("{what} root {root:?}: {e}"));
            }
            pids.push(saved(&std::fs::canonicalize(root).unwrap(), &format!("redis-{i}")).0);
        }
        pids
    });
    // A broker killed: its watchers are gone, its servers still run.
    drop(first);

    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let (i, root) = (2, &roots[2].1);
        let target = Local::new("local", &config(), root.clone());
        let redis = server("redis", &format!("redis-{i}"), 10);
        let instance = format!("i-{i}");
        ready(&target, &redis, &instance, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(target.instance_usable(&instance), Some(true));
        let (pid, _) = saved(&real.join("linked.d"), "redis-2");
        assert_eq!(
            pid, pids[i],
            "the server under the symbolic link was not adopted"
        );
        target.delete(&redis, &scope(&instance)).await.unwrap();
        assert!(!real.join("linked.d/redis-2").exists());
    });
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_with_its_own_words_and_starts_when_applied_again() {
    let dir = TestDir::new();
    let root = dir.path().join("servers");
    let target = Local::new("local", &config(), root.clone());
    // PostgreSQL refuses max_connections above 262143, and exits at once.
    let refused = server("postgres", "pg-refused", 1_000_000);
    target.apply(&refused, &scope("i-pg")).await.unwrap();
    let started = Instant::now();
    let e = ready(&target, &refused, "i-pg", Duration::from_secs(60))
        .await
        .unwrap_err();
    let took = started.elapsed();
    let (_, password) = saved(&root.canonicalize().unwrap(), "pg-refused");
    assert!(
        e.contains("server pg-refused did not start: 5 starts"),
        "{e}"
    );
    assert!(e.contains("max_connections"), "{e}");
    assert!(!e.contains(&password), "{e}");
    assert!(took < Duration::from_secs(30), "gave up after {took:?}");
    assert_eq!(target.instance_usable("i-pg"), Some(false));

    // The same server with a limit it takes: started again, its data kept.
    let good = server("postgres", "pg-refused", 10);
    target.apply(&good, &scope("i-pg")).await.unwrap();
    ready(&target, &good, "i-pg", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(target.instance_usable("i-pg"), Some(true));
    target.delete(&good, &scope("i-pg")).await.unwrap();
}

#[tokio::test]
async fn a_running_server_whose_port_was_taken_is_given_up_on_until_applied_again() {
    let dir = TestDir::new();
    let root = dir.path().join("servers");
    let target = Local::new("local", &config(), root.clone());
    let redis = server("redis", "redis-taken", 10);
    target.apply(&redis, &scope("i-r")).await.unwrap();
    ready(&target, &redis, "i-r", Duration::from_secs(30))
        .await
        .unwrap();
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("redis-taken/state.json")).unwrap(),
    )
    .unwrap();
    let (pid, port) = (
        state["pid"].as_u64().unwrap(),
        state["port"].as_u64().unwrap(),
    );

    // Killed, and its port taken before it is started again.
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let squatter = loop {
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
            break listener;
        }
        assert!(Instant::now() < deadline, "the port was not freed");
        std::thread::sleep(Duration::from_millis(2));
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while target.instance_usable("i-r") != Some(false) {
        assert!(
            Instant::now() < deadline,
            "the killed server is still usable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = ready(&target, &redis, "i-r", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(e.contains("did not start: 5 starts"), "{e}");
    assert!(e.contains("Address already in use"), "{e}");
    assert_eq!(target.instance_usable("i-r"), Some(false));

    // The port free again and the server applied again: it starts.
    drop(squatter);
    target.apply(&redis, &scope("i-r")).await.unwrap();
    ready(&target, &redis, "i-r", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(target.instance_usable("i-r"), Some(true));
    target.delete(&redis, &scope("i-r")).await.unwrap();
}
