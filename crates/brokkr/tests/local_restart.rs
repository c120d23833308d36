//! The local catalog served by the real `brokkr serve` with no `--config` (the built-in default):
//! ten Redis instances survive a `kill -9` of brokkr — the next broker adopts the nine servers
//! still running (same pids) and starts again the one killed meanwhile, each answering with its
//! data — and a graceful stop stops them all, unless the target says `keep_running: true`, when
//! they outlive it and are adopted by the next broker. A plan whose server program is not
//! installed is refused with 400 naming the Debian package, and `brokkr check` says what it
//! found. A server that cannot start fails its provision after its bounded number of starts,
//! with its own last lines in the description, a WARN log line and `brokkr osb instance`.
//!
//! Every server started here is killed when the test ends, even when it fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_brokkr");
const REDIS: (&str, &str) = (
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d61",
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d62",
);
const USER: &str = "platform";
const PASSWORD: &str = "local-restart-password";

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A test directory the servers' unprivileged account (tests run as root in CI) may pass.
fn test_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

/// `brokkr serve` with the built-in configuration, its store in `dir`; killed on drop.
struct Broker {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Broker {
    async fn start(dir: &Path, path_env: Option<&str>) -> Self {
        Self::start_with(dir, path_env, None).await
    }

    /// Starts `brokkr serve` on `config`, or the built-in configuration when `None`.
    async fn start_with(dir: &Path, path_env: Option<&str>, config: Option<&Path>) -> Self {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.env_remove("BROKKR_CONFIG")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .env("BROKKR_BROKER_USERNAME", USER)
            .env("BROKKR_BROKER_PASSWORD", PASSWORD)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--store",
                &format!("sqlite://{}", dir.join("brokkr.db").display()),
            ])
            .args(["--poll-interval", "50ms"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("brokkr-{port}.log"))).unwrap());
        if let Some(path) = path_env {
            cmd.env("PATH", path);
        }
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let base = format!("http://127.0.0.1:{port}");
        // Building brokkr's OSB client installs the process's TLS provider, which a plain
        // reqwest client (without a default provider) needs.
        brokkr_osb::client::Client::builder(&base).build().unwrap();
        let mut broker = Self {
            child: cmd.spawn().unwrap(),
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            assert!(broker.child.try_wait().unwrap().is_none(), "brokkr exited");
            let r = broker
                .client
                .get(format!("{}/healthz", broker.base))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return broker;
            }
            assert!(Instant::now() < until, "brokkr did not answer /healthz");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = (self.client)
            .request(method, format!("{}{path}", self.base))
            .basic_auth(USER, Some(PASSWORD))
            .header("X-Broker-API-Version", "2.17");
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Polls `path` (a last_operation) until it is no longer in progress.
    async fn wait_done(&self, path: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, body) = self.call(reqwest::Method::GET, path, None).await;
            if body["state"] != "in progress" {
                return body;
            }
            assert!(Instant::now() < until, "{path} still in progress");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills, when dropped, every server whose state is under `root`.
struct Servers(PathBuf);

impl Servers {
    /// Each server's `state.json`.
    fn states(&self) -> Vec<Value> {
        let Ok(entries) = std::fs::read_dir(&self.0) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("state.json")).ok())
            .filter_map(|s| serde_json::from_str::<Value>(&s).ok())
            .collect()
    }

    /// Instance id → server pid.
    fn pids(&self) -> Vec<(String, u32)> {
        let mut pids: Vec<(String, u32)> = (self.states().into_iter())
            .filter_map(|v| {
                let pid = u32::try_from(v["pid"].as_u64()?).ok()?;
                Some((v["instance_id"].as_str()?.to_owned(), pid))
            })
            .collect();
        pids.sort();
        pids
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for (_, pid) in self.pids() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Runs Redis inline commands on `credentials`' server after logging in as its user; returns
/// the last reply line.
fn redis(credentials: &Value, commands: &[String]) -> String {
    let port = u16::try_from(credentials["port"].as_u64().unwrap()).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let user = credentials["username"].as_str().unwrap();
    let password = credentials["password"].as_str().unwrap();
    let mut text = format!("AUTH {user} {password}\r\n");
    for c in commands {
        text.push_str(c);
        text.push_str("\r\n");
    }
    s.write_all(text.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let mut last = String::new();
    // AUTH's +OK, then one reply per command (a bulk string is a `$n` line and its data).
    for _ in 0..=commands.len() {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.starts_with('$') && line.trim() != "$-1" {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
        last = line.trim().to_owned();
    }
    last
}

#[tokio::test]
async fn ten_local_servers_survive_kill_9_of_brokkr_and_stop_with_it() {
    let dir = test_dir();
    let servers = Servers(dir.path().join("brokkr.db.d"));
    let mut broker = Broker::start(dir.path(), None).await;
    let ids: Vec<String> = (0..10).map(|i| format!("redis-{i}")).collect();
    for id in &ids {
        let body = json!({"service_id": REDIS.0, "plan_id": REDIS.1, "organization_guid": "o", "space_guid": "s"});
        let path = format!("/v2/service_instances/{id}?accepts_incomplete=true");
        let (status, body) = broker.call(reqwest::Method::PUT, &path, Some(body)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let mut credentials = Vec::new();
    for id in &ids {
        let done = broker
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let path = format!("/v2/service_instances/{id}/service_bindings/b?accepts_incomplete=true");
        let body = json!({"service_id": REDIS.0, "plan_id": REDIS.1});
        let (status, body) = broker.call(reqwest::Method::PUT, &path, Some(body)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let done = (broker)
            .wait_done(&format!(
                "/v2/service_instances/{id}/service_bindings/b/last_operation"
            ))
            .await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let path = format!("/v2/service_instances/{id}/service_bindings/b");
        let (_, body) = broker.call(reqwest::Method::GET, &path, None).await;
        let c = body["credentials"].clone();
        assert_eq!(redis(&c, &[format!("SET app:owner {id}")]), "+OK");
        credentials.push(c);
    }
    let before = servers.pids();
    assert_eq!(before.len(), 10);

    // kill -9 of brokkr leaves the servers running; one of them dies while brokkr is down.
    broker.kill9();
    assert!(before.iter().all(|(_, pid)| alive(*pid)));
    let (killed_instance, killed_pid) = before[0].clone();
    Command::new("kill")
        .args(["-KILL", &killed_pid.to_string()])
        .status()
        .unwrap();

    let mut broker = Broker::start(dir.path(), None).await;
    let until = Instant::now() + Duration::from_secs(20);
    for id in &ids {
        loop {
            let path = format!("/v2/service_instances/{id}/last_operation");
            let (_, body) = broker.call(reqwest::Method::GET, &path, None).await;
            if body["instance_usable"] == true {
                break;
            }
            assert!(Instant::now() < until, "{id} is not usable again: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let after = servers.pids();
    for ((id, old), (_, new)) in before.iter().zip(&after) {
        match id == &killed_instance {
            true => assert_ne!(old, new, "the dead server of {id} was not started again"),
            false => assert_eq!(old, new, "the running server of {id} was not adopted"),
        }
    }
    for (id, c) in ids.iter().zip(&credentials) {
        assert_eq!(&redis(c, &["GET app:owner".to_owned()]), id);
    }

    // A graceful stop stops the servers (the default), keeping their directories.
    broker.terminate();
    for (id, pid) in &after {
        assert!(
            !alive(*pid),
            "the server of {id} still runs after brokkr stopped"
        );
    }
    assert_eq!(servers.pids().len(), 10);
}

#[tokio::test]
async fn a_plan_whose_program_is_missing_is_refused_naming_the_debian_package() {
    let dir = test_dir();
    let _servers = Servers(dir.path().join("brokkr.db.d"));
    // A PATH without redis-server (it lives in /usr/bin, which is not searched then).
    let empty = dir.path().join("empty-path");
    std::fs::create_dir(&empty).unwrap();
    let path = empty.display().to_string();

    let output = Command::new(BIN)
        .env_remove("BROKKR_CONFIG")
        .env("PATH", &path)
        .arg("check")
        .output()
        .unwrap();
    let mut stdout = String::new();
    output
        .stdout
        .as_slice()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "local redis: redis-server not found: install the Debian package redis-server"
        ),
        "{stdout}"
    );

    let broker = Broker::start(dir.path(), Some(&path)).await;
    let body = json!({"service_id": REDIS.0, "plan_id": REDIS.1, "organization_guid": "o", "space_guid": "s"});
    let (status, body) = (broker)
        .call(
            reqwest::Method::PUT,
            "/v2/service_instances/r?accepts_incomplete=true",
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let description = body["description"].as_str().unwrap_or_default();
    assert!(description.contains("redis-server"), "{description}");
    assert!(
        description.contains("Debian package redis-server"),
        "{description}"
    );
    let (status, _) = (broker)
        .call(reqwest::Method::GET, "/v2/service_instances/r", None)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a refused provision left an instance"
    );
}

#[tokio::test]
async fn with_keep_running_servers_outlive_a_graceful_stop_and_are_adopted() {
    let dir = test_dir();
    let servers = Servers(dir.path().join("brokkr.db.d"));
    let local = include_str!("../../../catalogs/local/local.yaml");
    assert!(local.contains("local: {kind: local}"));
    let config = dir.path().join("local.yaml");
    let yaml = local.replace(
        "local: {kind: local}",
        "local: {kind: local, keep_running: true}",
    );
    std::fs::write(&config, yaml).unwrap();

    let mut broker = Broker::start_with(dir.path(), None, Some(&config)).await;
    let body = json!({"service_id": REDIS.0, "plan_id": REDIS.1, "organization_guid": "o", "space_guid": "s"});
    let (status, body) = (broker)
        .call(
            reqwest::Method::PUT,
            "/v2/service_instances/kept?accepts_incomplete=true",
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = broker
        .wait_done("/v2/service_instances/kept/last_operation")
        .await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let before = servers.pids();
    broker.terminate();
    assert!(
        alive(before[0].1),
        "the server stopped with brokkr despite keep_running"
    );

    let broker = Broker::start_with(dir.path(), None, Some(&config)).await;
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let path = "/v2/service_instances/kept/last_operation";
        let (_, body) = broker.call(reqwest::Method::GET, path, None).await;
        if body["instance_usable"] == true {
            break;
        }
        assert!(Instant::now() < until, "not usable again: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(servers.pids(), before, "the running server was not adopted");
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_the_provision_with_its_own_words_and_the_cli_tells() {
    let dir = test_dir();
    let servers = Servers(dir.path().join("brokkr.db.d"));
    // PostgreSQL refuses max_connections above 262143, and exits at once.
    let local = include_str!("../../../catalogs/local/local.yaml");
    let limit = "\"{{ 100 if plan_id == '7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d43' else 20 }}\"";
    assert!(local.contains(limit));
    let config = dir.path().join("local.yaml");
    std::fs::write(&config, local.replace(limit, "1000000")).unwrap();
    let broker = Broker::start_with(dir.path(), None, Some(&config)).await;
    let osb = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("osb")
            .args(args)
            .env("BROKKR_OSB_URL", &broker.base)
            .env("BROKKR_OSB_USERNAME", USER)
            .env("BROKKR_OSB_PASSWORD", PASSWORD)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };

    let started = Instant::now();
    let (code, stdout, stderr) = osb(&[
        "provision",
        "my-db",
        "--service",
        "local-postgresql",
        "--plan",
        "small",
        "--wait",
    ]);
    let took = started.elapsed();
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    for words in ["failed", "did not start: 5 starts", "max_connections"] {
        assert!(stdout.contains(words), "{words}: {stdout}");
    }
    assert!(
        took < Duration::from_secs(30),
        "the provision failed after {took:?}"
    );

    // The instance does not exist for OSB (404), but the CLI says what happened to it.
    let (code, stdout, stderr) = osb(&["instance", "my-db"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("LAST OPERATION"), "{stdout}");
    assert!(stdout.contains("did not start"), "{stdout}");
    assert!(stderr.contains("its last operation failed"), "{stderr}");
    let (code, stdout, _) = osb(&["last-operation", "my-db"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("failed") && stdout.contains("max_connections"),
        "{stdout}"
    );
    let (code, _, stderr) = osb(&["instance", "never-provisioned"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("does not exist"), "{stderr}");

    // The log says it at WARN, and no description or log line holds the server's password.
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("brokkr-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("giving up"))
        .unwrap_or_else(|| panic!("no WARN line: {log}"));
    assert!(warning.contains("max_connections"), "{warning}");
    for state in servers.states() {
        let password = state["password"].as_str().unwrap();
        assert!(!log.contains(password) && !stdout.contains(password));
    }
}

#[tokio::test]
async fn a_running_server_that_cannot_start_again_is_reported_until_brokkr_restarts() {
    let dir = test_dir();
    let servers = Servers(dir.path().join("brokkr.db.d"));
    let mut broker = Broker::start(dir.path(), None).await;
    let body = json!({"service_id": REDIS.0, "plan_id": REDIS.1, "organization_guid": "o", "space_guid": "s"});
    let path = "/v2/service_instances/down?accepts_incomplete=true";
    let (status, body) = broker.call(reqwest::Method::PUT, path, Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let poll = "/v2/service_instances/down/last_operation";
    assert_eq!(broker.wait_done(poll).await["state"], "succeeded");

    // Killed, and its port taken before it is started again.
    let state = servers.states().pop().unwrap();
    let (pid, port) = (
        state["pid"].as_u64().unwrap(),
        state["port"].as_u64().unwrap(),
    );
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let squatter = loop {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", u16::try_from(port).unwrap())) {
            break listener;
        }
        assert!(Instant::now() < until, "the port was not freed");
        std::thread::sleep(Duration::from_millis(2));
    };
    let until = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (_, body) = broker.call(reqwest::Method::GET, poll, None).await;
        if body["description"]
            .as_str()
            .is_some_and(|d| d.contains("not usable since"))
        {
            break body;
        }
        assert!(Instant::now() < until, "not reported: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["state"], "succeeded", "{body}");
    assert_eq!(body["instance_usable"], false, "{body}");
    let description = body["description"].as_str().unwrap();
    assert!(description.contains("Address already in use"), "{body}");
    assert!(!description.contains(state["password"].as_str().unwrap()));
    let out = Command::new(BIN)
        .args(["osb", "instance", "down"])
        .env("BROKKR_OSB_URL", &broker.base)
        .env("BROKKR_OSB_USERNAME", USER)
        .env("BROKKR_OSB_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("is not usable now"), "{stderr}");
    assert!(stderr.contains("Address already in use"), "{stderr}");

    // The port free again, a restarted brokkr starts the server again.
    drop(squatter);
    broker.terminate();
    let broker = Broker::start(dir.path(), None).await;
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = broker.call(reqwest::Method::GET, poll, None).await;
        if body["instance_usable"] == true && body["description"] == "provisioned" {
            break;
        }
        assert!(Instant::now() < until, "not usable again: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
