//! `brokkr osb` end to end: the real binary against a running brokkr (sync and async plans,
//! credentials out with `-o json`, exit codes and messages of failures) and against the Python
//! openbrokerapi broker of bench/baselines, so that the client is known to work with a broker that
//! is not brokkr.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use brokkr_blueprint::QUICKSTART;
use serde_json::Value;
use support::director::Director;

const BIN: &str = env!("CARGO_BIN_EXE_brokkr");
const USER: &str = "platform";
const PASSWORD: &str = "cli-test-password";
const PARAMS: &str = r#"{"credentials":{"type":"postgresql","host":"db.example.com","port":5432,"username":"app","password":"pw-1"}}"#;

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A server process, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Waits until `brokkr osb catalog` succeeds against it.
    fn wait_ready(self) -> Self {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if osb(&self.url, &["catalog"]).status.success() {
                return self;
            }
            assert!(Instant::now() < deadline, "{} never became ready", self.url);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `brokkr serve` on the quickstart, with short step delays.
fn brokkr(dir: &Path) -> Server {
    brokkr_with(dir, &QUICKSTART.replace("delay: 2s", "delay: 300ms"))
}

/// `brokkr serve` on the configuration `yaml`.
fn brokkr_with(dir: &Path, yaml: &str) -> Server {
    let config = dir.join("brokkr.yaml");
    std::fs::write(&config, yaml).unwrap();
    let port = free_port();
    let child = Command::new(BIN)
        .args([
            "serve",
            "--insecure-plaintext-secrets",
            "--poll-interval",
            "50ms",
        ])
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--store")
        .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
        .env("BROKKR_BROKER_USERNAME", USER)
        .env("BROKKR_BROKER_PASSWORD", PASSWORD)
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start brokkr serve");
    Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
    .wait_ready()
}

/// Runs `brokkr osb ARGS` against `url` with the test credentials.
fn osb(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("osb")
        .args(args)
        .env("BROKKR_OSB_URL", url)
        .env("BROKKR_OSB_USERNAME", USER)
        .env("BROKKR_OSB_PASSWORD", PASSWORD)
        .env_remove("BROKKR_OSB_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run brokkr osb")
}

/// Runs `brokkr osb ARGS -o json`, expects success and returns the JSON it printed.
fn osb_json(url: &str, args: &[&str]) -> Value {
    let out = osb(url, &[args, &["-o", "json"]].concat());
    assert!(out.status.success(), "brokkr osb {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Provision, bind (credentials out), fetch, unbind and deprovision on `plan` of `service`,
/// waiting for each operation; the same steps for any broker.
fn lifecycle(url: &str, service: &str, plan: &str, id: &str) {
    let provisioned = osb_json(
        url,
        &[
            "provision",
            id,
            "--service",
            service,
            "--plan",
            plan,
            "--params",
            PARAMS,
            "--wait",
        ],
    );
    assert_eq!(provisioned["state"], "succeeded", "{provisioned}");
    let binding = format!("{id}-b");
    let bound = osb_json(url, &["bind", id, &binding, "--wait"]);
    assert_eq!(bound["state"], "succeeded", "{bound}");
    assert_eq!(
        bound["binding"]["credentials"]["host"], "db.example.com",
        "{bound}"
    );
    let fetched = osb_json(url, &["binding", id, &binding]);
    assert_eq!(fetched["credentials"]["port"], 5432, "{fetched}");
    let unbound = osb_json(url, &["unbind", id, &binding, "--wait"]);
    assert_eq!(unbound["state"], "succeeded", "{unbound}");
    let deprovisioned = osb_json(url, &["deprovision", id, "--wait"]);
    assert_eq!(deprovisioned["state"], "succeeded", "{deprovisioned}");
}

#[test]
fn drives_brokkr_through_async_and_sync_plans() {
    let dir = tempfile::tempdir().unwrap();
    let server = brokkr(dir.path());
    let url = server.url.as_str();

    let catalog = osb(url, &["catalog"]);
    let table = String::from_utf8_lossy(&catalog.stdout);
    assert!(table.starts_with("SERVICE "), "{table}");
    assert!(
        table.contains("user-provided") && table.contains("async"),
        "{table}"
    );

    lifecycle(url, "user-provided", "async", "cli-async");

    // The sync plan answers 201 at once; an id is generated when none is given.
    let sync = osb_json(
        url,
        &[
            "provision",
            "--service",
            "user-provided",
            "--plan",
            "sync",
            "--params",
            PARAMS,
        ],
    );
    assert_eq!(sync["status"], 201, "{sync}");
    assert_eq!(sync["state"], "succeeded", "{sync}");
    let id = sync["instance_id"].as_str().expect("a generated id");
    let shown = osb_json(url, &["instance", id]);
    assert_eq!(shown["parameters"]["credentials"]["host"], "db.example.com");

    // Without --wait, an async provision is left in progress with its operation to poll.
    let started = osb_json(
        url,
        &[
            "provision",
            "cli-poll",
            "--service",
            "user-provided",
            "--plan",
            "async",
            "--params",
            PARAMS,
        ],
    );
    assert_eq!(started["status"], 202, "{started}");
    assert_eq!(started["state"], "in progress", "{started}");
    let op = started["operation"].as_str().expect("an operation");
    let done = osb_json(
        url,
        &["last-operation", "cli-poll", "--operation", op, "--wait"],
    );
    assert_eq!(done["state"], "succeeded", "{done}");

    // A deprovision of what is gone succeeds, as 410 says.
    let gone = osb_json(
        url,
        &[
            "deprovision",
            "cli-async",
            "--service",
            "user-provided",
            "--plan",
            "async",
        ],
    );
    assert_eq!(gone["status"], 410, "{gone}");
}

#[test]
fn shows_the_dashboard_url_a_step_learnt_from_the_director() {
    let director = Director::start();
    let dir = tempfile::tempdir().unwrap();
    let server = brokkr_with(dir.path(), &director.config()).wait_ready();
    let url = server.url.as_str();
    let provision = [
        "provision",
        "rt-1",
        "--service",
        "kyma",
        "--plan",
        "runtime",
    ];
    let provisioned = osb_json(url, &[&provision[..], &["--wait"]].concat());
    assert_eq!(provisioned["state"], "succeeded", "{provisioned}");
    assert_eq!(
        director.calls("rt-1"),
        3,
        "two 'in progress', then 'finished'"
    );
    let console = Director::dashboard("rt-1");
    let fetched = osb_json(url, &["instance", "rt-1"]);
    assert_eq!(fetched["dashboard_url"], console.as_str(), "{fetched}");
    let table = osb(url, &["instance", "rt-1"]);
    assert!(table.status.success(), "{}", text(&table));
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(
        shown.contains("DASHBOARD") && shown.contains(&console),
        "{shown}"
    );

    // A fixed pattern is known at once: the provision's answer has it.
    let provision = [
        "provision",
        "g-1",
        "--service",
        "kyma",
        "--plan",
        "grafana",
        "--wait",
    ];
    let provisioned = osb_json(url, &provision);
    assert_eq!(provisioned["state"], "succeeded", "{provisioned}");
    let grafana = "https://grafana.example.com/d/g-1";
    assert_eq!(provisioned["dashboard_url"], grafana, "{provisioned}");
    assert_eq!(
        osb_json(url, &["instance", "g-1"])["dashboard_url"],
        grafana
    );
}

#[test]
fn rotates_a_binding_and_shows_its_expiry() {
    let dir = tempfile::tempdir().unwrap();
    // The async plan's credentials live 30 days; the sync plan's bindings do not rotate.
    let yaml = QUICKSTART
        .replace("delay: 2s", "delay: 300ms")
        .replacen(
            "rotation: {}",
            "rotation: {lifetime: 30d, renew_before: 7d}",
            1,
        )
        .replacen("rotation: {}", "", 1);
    let server = brokkr_with(dir.path(), &yaml);
    let url = server.url.as_str();
    for (id, plan) in [("rot", "async"), ("fixed", "sync")] {
        let provisioned = osb_json(
            url,
            &[
                "provision",
                id,
                "--service",
                "user-provided",
                "--plan",
                plan,
                "--params",
                PARAMS,
                "--wait",
            ],
        );
        assert_eq!(provisioned["state"], "succeeded", "{provisioned}");
    }
    let first = osb_json(url, &["bind", "rot", "first", "--wait"]);
    assert_eq!(
        first["binding"]["credentials"]["password"], "pw-1",
        "{first}"
    );
    let expires_at = first["binding"]["metadata"]["expires_at"].as_str().unwrap();
    let table = osb(url, &["binding", "rot", "first"]);
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(
        shown.contains("EXPIRES AT")
            && shown.contains("RENEW BEFORE")
            && shown.contains(expires_at),
        "{shown}"
    );

    // The successor carries new credentials; both bindings exist until the first is unbound.
    let new_password = r#"{"credentials":{"password":"pw-2"}}"#;
    let second = osb_json(
        url,
        &[
            "bind",
            "rot",
            "second",
            "--predecessor",
            "first",
            "--params",
            new_password,
            "--wait",
        ],
    );
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(
        second["binding"]["credentials"]["password"], "pw-2",
        "{second}"
    );
    assert!(
        second["binding"]["metadata"]["renew_before"].is_string(),
        "{second}"
    );
    let fetched = osb_json(url, &["binding", "rot", "first"]);
    assert_eq!(fetched["credentials"]["password"], "pw-1");

    let fails = |args: &[&str], expected: &str| {
        let out = osb(url, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in\n{stderr}"
        );
    };
    fails(
        &["bind", "rot", "third", "--predecessor", "nope"],
        "predecessor binding nope does not exist for instance rot",
    );
    osb_json(url, &["bind", "fixed", "only"]);
    fails(
        &["bind", "fixed", "next", "--predecessor", "only"],
        "plan \"sync\" of service \"user-provided\" does not declare binding_rotatable",
    );
    fails(
        &["bind", "rot", "first", "--predecessor", "first"],
        "cannot be its own predecessor",
    );
    let table = osb(url, &["binding", "fixed", "only"]);
    let shown = String::from_utf8_lossy(&table.stdout);
    let row = shown.lines().nth(1).unwrap_or_default();
    assert!(row.contains(" - "), "no expiry shows as -: {shown}");
}

#[test]
fn failures_exit_non_zero_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let server = brokkr(dir.path());
    let url = server.url.as_str();
    let fails = |args: &[&str], expected: &str| {
        let out = osb(url, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in\n{stderr}"
        );
    };
    osb_json(
        url,
        &[
            "provision",
            "taken",
            "--service",
            "user-provided",
            "--plan",
            "sync",
            "--params",
            PARAMS,
        ],
    );
    fails(
        &[
            "provision",
            "taken",
            "--service",
            "user-provided",
            "--plan",
            "async",
            "--params",
            PARAMS,
        ],
        "409 Conflict",
    );
    fails(
        &[
            "provision",
            "bad",
            "--service",
            "user-provided",
            "--plan",
            "sync",
            "--params",
            r#"{"credentials":{"type":"postgresql","port":"x"}}"#,
        ],
        "400 Bad Request",
    );
    fails(&["instance", "missing"], "not found (404 Not Found)");
    fails(&["bind", "missing", "b"], "give --service and --plan");
    fails(
        &["catalog", "--password", "wrong"],
        "refused the credentials (check the user name and password or the token) (401 Unauthorized)",
    );
    fails(
        &["catalog", "--url", "http://127.0.0.1:1"],
        "cannot reach the broker",
    );
    fails(
        &["provision", "x", "--service", "nope", "--plan", "async"],
        "no service \"nope\"",
    );
}

#[test]
fn drives_the_openbrokerapi_broker() {
    let Some(venv) = support::python_venv() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The Python broker serves brokkr's quickstart catalog, as in bench/run.
    let reference = brokkr(dir.path());
    let catalog = osb_json(&reference.url, &["catalog"]);
    drop(reference);
    let catalog_path = dir.path().join("catalog.json");
    std::fs::write(&catalog_path, catalog.to_string()).unwrap();
    let port = free_port();
    let child = Command::new(venv.join("bin/gunicorn"))
        .arg("--chdir")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/baselines"))
        .args(["-k", "gthread", "--workers", "1", "--threads", "4"])
        .args([
            "-b",
            &format!("127.0.0.1:{port}"),
            "openbrokerapi_broker:app",
        ])
        .env("BENCH_CATALOG", &catalog_path)
        .env("BENCH_DELAY_MS", "200")
        .env("BROKKR_BROKER_USERNAME", USER)
        .env("BROKKR_BROKER_PASSWORD", PASSWORD)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gunicorn");
    let server = Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
    .wait_ready();
    lifecycle(&server.url, "user-provided", "async", "py-1");
}
