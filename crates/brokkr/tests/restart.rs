//! Process-lifecycle tests of the `brokkr` binary: asynchronous operations survive a `kill -9`
//! and a graceful `SIGTERM` and finish after a restart on the same SQLite store; a broken
//! configuration is refused before anything starts; and the platform password generated on a
//! fresh store is printed once and keeps working across restarts.
//!
//! Every test runs the real binary (`CARGO_BIN_EXE_brokkr`) on a free local port with its own
//! temporary directory for the configuration and the store.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use brokkr_test_support::PgSchema;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_brokkr");
const QUICKSTART: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../catalogs/quickstart/quickstart.yaml"
));
const SERVICE_ID: &str = "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10";
const ASYNC_PLAN_ID: &str = "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21";
const USERNAME: &str = "platform";
const PASSWORD: &str = "restart-test-password";
/// The step delay of the asynchronous plan: long enough to interrupt, short enough to wait for.
const DELAY: Duration = Duration::from_millis(3000);
/// How long a started broker may take to answer `/healthz`.
const STARTUP: Duration = Duration::from_secs(15);

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Writes the quickstart catalog with `delay` for every step and returns its path.
fn quickstart_config(dir: &Path, delay: Duration) -> PathBuf {
    assert!(
        QUICKSTART.contains("delay: 2s"),
        "the quickstart catalog no longer has `delay: 2s` steps to shorten"
    );
    let text = QUICKSTART.replace("delay: 2s", &format!("delay: {}ms", delay.as_millis()));
    let path = dir.join("brokkr.yaml");
    std::fs::write(&path, text).expect("write the configuration");
    path
}

/// A SQLite store URL with an absolute path inside `dir`.
fn store_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("brokkr.db").display())
}

/// Provision parameters that satisfy the quickstart schema.
fn provision_body() -> Value {
    json!({
        "organization_guid": "org", "space_guid": "space", "service_id": SERVICE_ID,
        "plan_id": ASYNC_PLAN_ID,
        "parameters": {"credentials": {
            "type": "postgresql",
            "host": "db.example.com",
            "port": 5432,
            "username": "app",
            "password": "pw",
        }},
    })
}

fn instance_ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A `brokkr` command with none of its settings inherited from the environment.
fn brokkr_command() -> Command {
    let mut cmd = Command::new(BIN);
    for var in [
        "BROKKR_CONFIG",
        "BROKKR_LISTEN",
        "BROKKR_STORE",
        "BROKKR_BROKER_USERNAME",
        "BROKKR_BROKER_PASSWORD",
        "BROKKR_LOG_FORMAT",
        "BROKKR_POLL_INTERVAL",
        "BROKKR_ADMIN_USERNAME",
        "BROKKR_LEASE",
        "BROKKR_ADMIN_PASSWORD",
        "BROKKR_ENCRYPTION_KEY",
        "BROKKR_ENCRYPTION_KEY_FILE",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    // Plain logs: they are shown when a test fails.
    cmd.env("NO_COLOR", "1");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Lines read so far from a child's output.
type Lines = Arc<Mutex<Vec<String>>>;

/// Reads `stream` line by line into `lines` until it closes, so the child never blocks on a full
/// pipe.
fn drain(stream: impl Read + Send + 'static, lines: Lines) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            lines.lock().expect("lines lock").push(line);
        }
    })
}

fn text(lines: &Lines) -> String {
    lines.lock().expect("lines lock").join("\n")
}

/// A spawned process with its output collected; killed on drop.
struct Proc {
    child: Child,
    stdout: Lines,
    stderr: Lines,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn brokkr");
        let stdout = Lines::default();
        let stderr = Lines::default();
        let readers = vec![
            drain(child.stdout.take().expect("piped stdout"), stdout.clone()),
            drain(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        Self {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Waits up to `timeout` for the process to exit, then for its output to be read in full.
    async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let until = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < until,
                "brokkr (pid {}) did not exit within {timeout:?}",
                self.child.id()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for reader in self.readers.drain(..) {
            reader.join().expect("output reader");
        }
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- brokkr (pid {}) stdout ---\n{}\n--- stderr ---\n{}\n---",
                self.child.id(),
                text(&self.stdout),
                text(&self.stderr)
            );
        }
    }
}

/// `brokkr serve` on a free port, ready to answer.
struct Broker {
    proc: Proc,
    base: String,
    /// The OSB client, with the broker's credentials.
    osb: brokkr_osb::client::Client,
    /// For requests that are not OSB (health).
    client: reqwest::Client,
}

impl Broker {
    /// Starts `brokkr serve` and waits until `/healthz` answers. With `auth`, the credentials
    /// are given through the environment and used for every request; without, none are set.
    async fn start(config: &Path, store: &str, auth: Option<(&str, &str)>) -> Self {
        Self::start_with(config, store, auth, |_| {}).await
    }

    /// Starts a broker after `customize` adds flags or environment to its command.
    async fn start_with(
        config: &Path,
        store: &str,
        auth: Option<(&str, &str)>,
        customize: impl FnOnce(&mut Command),
    ) -> Self {
        let port = free_port();
        let mut cmd = brokkr_command();
        customize(&mut cmd);
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--store", store]);
        // Tests look for due operations often, unless they set how often.
        if !cmd
            .get_envs()
            .any(|(name, _)| name == "BROKKR_POLL_INTERVAL")
        {
            cmd.args(["--poll-interval", "50ms"]);
        }
        if let Some((user, password)) = auth {
            cmd.env("BROKKR_BROKER_USERNAME", user)
                .env("BROKKR_BROKER_PASSWORD", password);
        }
        let base = format!("http://127.0.0.1:{port}");
        let osb = brokkr_osb::client::Client::builder(&base)
            .timeout(Duration::from_secs(10))
            .auth(
                auth.map(|(username, password)| brokkr_osb::client::Auth::Basic {
                    username: username.to_owned(),
                    password: password.to_owned(),
                }),
            )
            .build()
            .expect("OSB client");
        let mut broker = Self {
            proc: Proc::spawn(cmd),
            base,
            osb,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("HTTP client"),
        };
        broker.wait_healthy().await;
        broker
    }

    async fn wait_healthy(&mut self) {
        let until = Instant::now() + STARTUP;
        let url = format!("{}/healthz", self.base);
        loop {
            if let Some(status) = self.proc.child.try_wait().expect("try_wait") {
                panic!("brokkr exited during startup with {status}");
            }
            let answer = self
                .client
                .get(&url)
                .timeout(Duration::from_millis(500))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status() == StatusCode::OK) {
                return;
            }
            assert!(
                Instant::now() < until,
                "brokkr did not answer /healthz within {STARTUP:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// An OSB request with the API version header and the broker's credentials.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.osb.request(method, path)
    }

    /// Sends `user` and `password` from now on.
    fn use_credentials(&mut self, user: &str, password: &str) {
        self.osb = brokkr_osb::client::Client::builder(&self.base)
            .timeout(Duration::from_secs(10))
            .basic_auth(user, password)
            .build()
            .expect("OSB client");
    }

    fn provision_request(&self, id: &str) -> RequestBuilder {
        self.request(
            Method::PUT,
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
        )
        .json(&provision_body())
    }

    async fn provision(&self, id: &str) -> (StatusCode, Value) {
        send(self.provision_request(id)).await
    }

    /// Provisions every instance concurrently, asserting each is accepted (202 with an operation).
    async fn provision_all_async(&self, ids: &[String]) {
        let mut requests = tokio::task::JoinSet::new();
        for id in ids {
            let request = self.provision_request(id);
            let id = id.clone();
            requests.spawn(async move { (id, send(request).await) });
        }
        while let Some(done) = requests.join_next().await {
            let (id, (status, body)) = done.expect("provision task");
            assert_eq!(status, StatusCode::ACCEPTED, "provision {id}: {body}");
            assert!(
                body["operation"].as_str().is_some_and(|op| !op.is_empty()),
                "provision {id} answered no operation: {body}"
            );
        }
    }

    async fn last_operation(&self, id: &str) -> Value {
        let path = format!("/v2/service_instances/{id}/last_operation");
        let (status, body) = send(self.request(Method::GET, &path)).await;
        assert_eq!(status, StatusCode::OK, "last_operation of {id}: {body}");
        body
    }

    async fn assert_in_progress(&self, ids: &[String]) {
        for id in ids {
            let body = self.last_operation(id).await;
            assert_eq!(body["state"], "in progress", "instance {id}: {body}");
        }
    }

    /// Polls every instance until its last operation is no longer `in progress`; returns the
    /// final `last_operation` bodies in the order of `ids`.
    async fn wait_terminal(&self, ids: &[String], timeout: Duration) -> Vec<Value> {
        let until = Instant::now() + timeout;
        let mut done: Vec<Option<Value>> = vec![None; ids.len()];
        loop {
            for (id, slot) in ids.iter().zip(done.iter_mut()) {
                if slot.is_none() {
                    let body = self.last_operation(id).await;
                    if body["state"] != "in progress" {
                        *slot = Some(body);
                    }
                }
            }
            if done.iter().all(Option::is_some) {
                return done.into_iter().flatten().collect();
            }
            let pending: Vec<&String> = ids
                .iter()
                .zip(&done)
                .filter_map(|(id, d)| d.is_none().then_some(id))
                .collect();
            assert!(
                Instant::now() < until,
                "still in progress after {timeout:?}: {pending:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM, the signal a platform uses to stop a pod.
    fn sigterm(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
    }

    /// Sends SIGKILL and reaps the process.
    fn kill9(&mut self) {
        self.proc.child.kill().expect("SIGKILL brokkr");
        self.proc.child.wait().expect("reap brokkr");
    }
}

/// Sends a request, returning its status and JSON body (`null` when the body is not JSON).
async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("request to brokkr");
    let status = response.status();
    let bytes = response.bytes().await.expect("response body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn assert_all_succeeded(ids: &[String], results: &[Value]) {
    let failed: Vec<String> = ids
        .iter()
        .zip(results)
        .filter(|(_, body)| body["state"] != "succeeded")
        .map(|(id, body)| format!("{id}: {body}"))
        .collect();
    assert!(failed.is_empty(), "operations did not succeed: {failed:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn operations_survive_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let store = store_url(dir.path());
    let auth = Some((USERNAME, PASSWORD));
    let ids = instance_ids("kill9", 20);

    let mut first = Broker::start(&config, &store, auth).await;
    let started = Instant::now();
    first.provision_all_async(&ids).await;
    first.assert_in_progress(&ids).await;
    // The kill must land while the steps are still waiting, or nothing is interrupted.
    let before_kill = started.elapsed();
    assert!(
        before_kill < DELAY * 3 / 4,
        "provisioning took {before_kill:?}, too close to the {DELAY:?} step to interrupt it"
    );
    first.kill9();

    let second = Broker::start(&config, &store, auth).await;
    let results = second.wait_terminal(&ids, Duration::from_secs(20)).await;
    assert_all_succeeded(&ids, &results);
    eprintln!(
        "kill -9: {} operations finished {:?} after they started",
        ids.len(),
        started.elapsed()
    );

    // An identical repeat now finds the instance fully provisioned: 200, not a new operation.
    for id in &ids {
        let (status, body) = second.provision(id).await;
        assert_eq!(status, StatusCode::OK, "repeated provision of {id}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_and_resumes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let store = store_url(dir.path());
    let auth = Some((USERNAME, PASSWORD));
    let ids = instance_ids("sigterm", 5);

    let mut first = Broker::start(&config, &store, auth).await;
    let started = Instant::now();
    first.provision_all_async(&ids).await;
    first.assert_in_progress(&ids).await;
    let before_stop = started.elapsed();
    assert!(
        before_stop < DELAY * 3 / 4,
        "provisioning took {before_stop:?}, too close to the {DELAY:?} step to interrupt it"
    );
    let stopping = Instant::now();
    first.sigterm();
    let status = first.proc.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "brokkr exited with {status} on SIGTERM");
    eprintln!("SIGTERM: exited after {:?}", stopping.elapsed());
    drop(first);

    let second = Broker::start(&config, &store, auth).await;
    let results = second.wait_terminal(&ids, Duration::from_secs(20)).await;
    assert_all_succeeded(&ids, &results);
    for id in &ids {
        let (status, body) = second.provision(id).await;
        assert_eq!(status, StatusCode::OK, "repeated provision of {id}: {body}");
    }
}

/// Runs a short-lived `brokkr` command to its end, failing if it takes longer than `timeout`.
async fn run_to_end(cmd: Command, timeout: Duration) -> (ExitStatus, String, String) {
    let mut proc = Proc::spawn(cmd);
    let status = proc.wait_exit(timeout).await;
    (status, text(&proc.stdout), text(&proc.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_a_broken_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let valid = quickstart_config(dir.path(), DELAY);
    let broken = dir.path().join("broken.yaml");
    let valid_text = std::fs::read_to_string(&valid).expect("read the configuration");
    assert!(
        valid_text.contains("plan: sync"),
        "the quickstart catalog no longer has a blueprint for plan `sync`"
    );
    std::fs::write(
        &broken,
        valid_text.replace("plan: sync", "plan: no-such-plan"),
    )
    .expect("write the broken configuration");
    let broken_name = broken.display().to_string();

    let mut serve = brokkr_command();
    serve
        .arg("serve")
        .arg("--config")
        .arg(&broken)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--store", &store_url(dir.path())])
        .env("BROKKR_BROKER_USERNAME", USERNAME)
        .env("BROKKR_BROKER_PASSWORD", PASSWORD);
    let started = Instant::now();
    let (status, _, stderr) = run_to_end(serve, Duration::from_secs(5)).await;
    eprintln!("serve refused the configuration in {:?}", started.elapsed());
    assert!(!status.success(), "serve accepted a broken configuration");
    assert!(
        stderr.contains(&broken_name) && stderr.contains("blueprints["),
        "serve's error does not name {broken_name} and the blueprint:\n{stderr}"
    );

    let mut check = brokkr_command();
    check.arg("check").arg("--config").arg(&broken);
    let (status, _, stderr) = run_to_end(check, Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(1), "check of the broken file: {stderr}");
    assert!(
        stderr.contains(&broken_name) && stderr.contains("blueprints["),
        "check's error does not name {broken_name} and the blueprint:\n{stderr}"
    );

    let mut check = brokkr_command();
    check.arg("check").arg("--config").arg(&valid);
    let (status, stdout, stderr) = run_to_end(check, Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0), "check of the valid file: {stderr}");
    assert!(stdout.contains("ok:"), "check printed no `ok:`: {stdout}");
}

/// The value after `password:` on the first stdout line that has one, once it appears.
async fn printed_password(broker: &Broker, timeout: Duration) -> String {
    let until = Instant::now() + timeout;
    loop {
        let found = broker
            .proc
            .stdout
            .lock()
            .expect("lines lock")
            .iter()
            .find_map(|line| {
                line.split_once("password:")
                    .map(|(_, p)| p.trim().to_owned())
            });
        if let Some(password) = found {
            return password;
        }
        assert!(
            Instant::now() < until,
            "no `password:` line on stdout within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_password_is_printed_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let store = store_url(dir.path());

    let mut first = Broker::start(&config, &store, None).await;
    let password = printed_password(&first, Duration::from_secs(5)).await;
    assert!(!password.is_empty(), "the printed password is empty");
    assert!(
        text(&first.proc.stdout).contains("username: brokkr"),
        "the generated user name is not printed"
    );
    let (status, _) = send(first.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "catalog without credentials"
    );
    first.use_credentials("brokkr", &format!("{password}x"));
    let (status, _) = send(first.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "catalog with a wrong password"
    );
    first.use_credentials("brokkr", &password);
    let (status, catalog) = send(first.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(status, StatusCode::OK, "catalog with the printed password");
    assert!(catalog["services"].is_array(), "not a catalog: {catalog}");
    first.sigterm();
    let status = first.proc.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "brokkr exited with {status} on SIGTERM");
    drop(first);

    let mut second = Broker::start(&config, &store, None).await;
    second.use_credentials("brokkr", &password);
    let (status, _) = send(second.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "catalog with the first run's password"
    );
    second.sigterm();
    let status = second.proc.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "brokkr exited with {status} on SIGTERM");
    let stdout = text(&second.proc.stdout);
    assert!(
        !stdout.contains("password:"),
        "the password was printed again on restart:\n{stdout}"
    );
    drop(second);

    // A lost password: `brokkr store reset-password`, and the next start prints a new one.
    let mut reset = brokkr_command();
    reset.args(["store", "reset-password", "--store", &store]);
    let (status, stdout, stderr) = run_to_end(reset, Duration::from_secs(10)).await;
    assert!(status.success(), "reset-password: {stderr}");
    assert!(
        stdout.contains("forgot the generated platform password"),
        "{stdout}"
    );
    let mut third = Broker::start(&config, &store, None).await;
    let new_password = printed_password(&third, Duration::from_secs(5)).await;
    assert_ne!(new_password, password);
    third.use_credentials("brokkr", &password);
    let (status, _) = send(third.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the forgotten password");
    third.use_credentials("brokkr", &new_password);
    let (status, _) = send(third.request(Method::GET, "/v2/catalog")).await;
    assert_eq!(status, StatusCode::OK, "the new password");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sqlite_store_serves_one_process() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let store = store_url(dir.path());
    let first = Broker::start(&config, &store, Some((USERNAME, PASSWORD))).await;
    let mut second = brokkr_command();
    second
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--store", &store])
        .env("BROKKR_BROKER_USERNAME", USERNAME)
        .env("BROKKR_BROKER_PASSWORD", PASSWORD);
    let (status, _, stderr) = run_to_end(second, Duration::from_secs(5)).await;
    assert!(
        !status.success(),
        "a second broker started on the same SQLite store"
    );
    assert!(
        stderr.contains("in use by another brokkr process"),
        "{stderr}"
    );
    // The first broker is unaffected.
    let (status, _) = first.provision("after-refusal").await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

/// Two replicas on one PostgreSQL schema, sharing the store's key, each with `setting` set.
async fn two_replicas(config: &Path, url: &str, setting: (&str, &str)) -> (Broker, Broker) {
    let replica = |cmd: &mut Command| {
        cmd.env(
            "BROKKR_ENCRYPTION_KEY",
            "bT6nqzW0bkQ2b0Ck3KQ3pRXvYJ1mR2c6uO2Q1Qk5Wl4=",
        )
        .env(setting.0, setting.1);
    };
    let a = Broker::start_with(config, url, Some((USERNAME, PASSWORD)), replica).await;
    let b = Broker::start_with(config, url, Some((USERNAME, PASSWORD)), replica).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_on_postgres_take_over_a_dead_replicas_operations() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let pg = PgSchema::create().await;
    let (mut a, b) = two_replicas(&config, &pg.url, ("BROKKR_LEASE", "4s")).await;

    // Operations accepted by replica A are leased to A.
    let ids = instance_ids("replica", 20);
    a.provision_all_async(&ids).await;
    a.assert_in_progress(&ids).await;
    a.kill9();

    // B answers for them at once and finishes them once A's lease has expired.
    let started = Instant::now();
    let results = b.wait_terminal(&ids, Duration::from_secs(20)).await;
    assert_all_succeeded(&ids, &results);
    eprintln!(
        "replica B finished A's operations {:?} after the kill",
        started.elapsed()
    );
    drop(b);
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_default_settings_a_dead_replicas_operations_are_taken_over_when_the_lease_ends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let pg = PgSchema::create().await;
    // serve's defaults: a 30 s lease, a look for due operations every second.
    let (lease, poll) = (Duration::from_secs(30), Duration::from_secs(1));
    let (mut a, b) = two_replicas(&config, &pg.url, ("BROKKR_POLL_INTERVAL", "1s")).await;
    let ids = instance_ids("default-lease", 20);
    let accepted = Instant::now();
    a.provision_all_async(&ids).await;
    a.kill9();
    let killed = Instant::now();

    // Their leases, taken when A accepted them, end `lease` later; B claims them at its next
    // look and runs what is left of the step.
    let results = b.wait_terminal(&ids, lease + poll + DELAY * 2).await;
    assert_all_succeeded(&ids, &results);
    let taken_over = killed.elapsed();
    eprintln!(
        "replica B finished A's operations {taken_over:?} after the kill, {:?} after A accepted \
         them (lease {lease:?}, poll interval {poll:?}, step {DELAY:?})",
        accepted.elapsed()
    );
    assert!(
        accepted.elapsed() >= lease,
        "B ran A's operations before A's lease ended"
    );
    drop(b);
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_stops_hands_its_operations_to_another_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), DELAY);
    let pg = PgSchema::create().await;
    // B looks for due operations only every minute on its own: only A's release, announced to
    // B, can make it take them over sooner.
    let (mut a, b) = two_replicas(&config, &pg.url, ("BROKKR_POLL_INTERVAL", "60s")).await;
    let ids = instance_ids("handover", 10);
    a.provision_all_async(&ids).await;
    a.assert_in_progress(&ids).await;
    let stopping = Instant::now();
    a.sigterm();
    let status = a.proc.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "brokkr exited with {status} on SIGTERM");

    let results = b.wait_terminal(&ids, DELAY + Duration::from_secs(10)).await;
    assert_all_succeeded(&ids, &results);
    eprintln!(
        "replica B finished the operations A released {:?} after A was told to stop",
        stopping.elapsed()
    );
    drop(b);
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_drives_lifecycles_and_reports_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = quickstart_config(dir.path(), Duration::from_millis(10));
    let broker = Broker::start(&config, &store_url(dir.path()), Some((USERNAME, PASSWORD))).await;
    for (scenario, count) in [("lifecycle", "3"), ("poll", "20"), ("catalog", "20")] {
        let mut bench = brokkr_command();
        bench
            .args(["bench", "--url", &broker.base, "--scenario", scenario])
            .args(["--concurrency", "2", "--count", count, "-o", "json"])
            .env("BROKKR_BROKER_USERNAME", USERNAME)
            .env("BROKKR_BROKER_PASSWORD", PASSWORD);
        let (status, stdout, stderr) = run_to_end(bench, Duration::from_secs(60)).await;
        assert!(status.success(), "{scenario}: {stderr}");
        let report: Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
        assert_eq!(report["errors"], 0, "{scenario}: {report}");
        assert!(report["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
        match scenario {
            // Each lifecycle: provision, bind, unbind, deprovision, each polled at least once.
            "lifecycle" => {
                assert_eq!(report["lifecycles"], 3);
                assert!(report["requests"].as_u64().unwrap() >= 24, "{report}");
            }
            _ => assert_eq!(report["requests"], 20, "{scenario}: {report}"),
        }
    }
}

/// Two brokers that share nothing: with `--affinity` each client keeps to one of them, so that
/// every operation is polled where it runs; without it, each request goes to the next broker,
/// whose answer to a poll of an operation it never saw fails the lifecycle.
#[tokio::test(flavor = "multi_thread")]
async fn bench_affinity_keeps_each_client_on_one_url() {
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let mut brokers = Vec::new();
    for dir in &dirs {
        let config = quickstart_config(dir.path(), Duration::from_millis(10));
        let auth = Some((USERNAME, PASSWORD));
        brokers.push(Broker::start(&config, &store_url(dir.path()), auth).await);
    }
    for affinity in [true, false] {
        let mut bench = brokkr_command();
        bench
            .args(["bench", "--scenario", "lifecycle", "--concurrency", "2"])
            .args(["--url", &brokers[0].base, "--url", &brokers[1].base])
            .args(["--count", "4", "-o", "json"])
            .args(affinity.then_some("--affinity"))
            .env("BROKKR_BROKER_USERNAME", USERNAME)
            .env("BROKKR_BROKER_PASSWORD", PASSWORD);
        let (_, stdout, stderr) = run_to_end(bench, Duration::from_secs(60)).await;
        let report: Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
        let errors = report["errors"].as_u64().unwrap();
        match affinity {
            true => {
                assert_eq!(errors, 0, "{report} {stderr}");
                assert_eq!(report["lifecycles"], 4, "{report}");
            }
            false => assert!(errors > 0, "{report}"),
        }
    }
}
