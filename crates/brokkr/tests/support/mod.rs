//! What the tests of `brokkr controller` share: processes, ports, polling, a broker on the
//! shared-server catalog, logging in with a binding Secret's credentials, and a local server
//! playing the Director; and (`upgrade`) what the tests of `brokkr upgrade` share.

#![allow(dead_code)]

pub mod cluster;
pub mod director;
pub mod logged_serve;
pub mod node;
pub mod upgrade;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_brokkr");

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A process, killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` until it returns something, for up to 60 seconds.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `brokkr serve` with more arguments and environment variables.
pub fn serve_with(dir: &Path, args: &[&str], env: &[(&str, String)]) -> (Process, String) {
    serve_logged(dir, args, env, Stdio::null())
}

/// `brokkr serve` as [`serve_with`], its log (`RUST_LOG` as the caller sets it) written to `log`.
pub fn serve_logged(
    dir: &Path,
    args: &[&str],
    env: &[(&str, String)],
    log: impl Into<Stdio>,
) -> (Process, String) {
    let port = free_port();
    let child = Command::new(BIN)
        .args(["serve", "--insecure-plaintext-secrets"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--store")
        .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
        .env("BROKKR_BROKER_USERNAME", "platform")
        .env("BROKKR_BROKER_PASSWORD", "s3cret")
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start brokkr serve");
    (Process(child), format!("http://127.0.0.1:{port}"))
}

pub fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// An entry of a Secret as the fake API server holds it.
pub fn entry(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    let encoded = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// Logs in with a binding Secret's entries and creates a table.
pub async fn log_in(secret: &Value) -> Result<(), sqlx::Error> {
    use sqlx::Connection as _;
    let options = sqlx::postgres::PgConnectOptions::new()
        .host(&entry(secret, "host"))
        .port(entry(secret, "port").parse().unwrap())
        .database(&entry(secret, "database"))
        .username(&entry(secret, "username"))
        .password(&entry(secret, "password"));
    let mut conn = sqlx::PgConnection::connect_with(&options).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id int)")
        .execute(&mut conn)
        .await?;
    conn.close().await
}

/// `brokkr serve` on brokkr's shared-server catalog, its admin URLs those of the test servers.
pub fn serve_shared(dir: &Path) -> (Process, String) {
    serve_shared_logged(dir, &[], Stdio::null())
}

/// [`serve_shared`] with more environment variables, its log written to `log`.
pub fn serve_shared_logged(
    dir: &Path,
    env: &[(&str, String)],
    log: impl Into<Stdio>,
) -> (Process, String) {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../catalogs/shared/shared.yaml");
    let mut env = env.to_vec();
    env.extend(shared_servers_env());
    serve_logged(dir, &["--config", config.to_str().unwrap()], &env, log)
}

/// The admin URLs of the shared-server catalog: the test servers'.
pub fn shared_servers_env() -> [(&'static str, String); 3] {
    [
        (
            "BROKKR_SHARED_PG_URL",
            env_or(
                "BROKKR_TEST_POSTGRES_URL",
                "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test",
            ),
        ),
        (
            "BROKKR_SHARED_MYSQL_URL",
            env_or(
                "BROKKR_TEST_MYSQL_URL",
                "mysql://brokkr:brokkr@127.0.0.1:3306/mysql",
            ),
        ),
        (
            "BROKKR_SHARED_REDIS_URL",
            env_or("BROKKR_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
        ),
    ]
}

/// `brokkr controller` without leader election against the cluster of `kubeconfig`, its log
/// written to `log`.
pub fn controller(kubeconfig: &Path, log: impl Into<Stdio>) -> Process {
    Process(
        Command::new(BIN)
            .args(["controller", "--no-leader-election"])
            .args(["--broker-url-allow", "127.0.0.0/8"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            // A namespace a test deletes while its broker is dead ends within the test's wait.
            .args(["--namespace-deletion-timeout", "30s"])
            .env("KUBECONFIG", kubeconfig)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start brokkr controller"),
    )
}

/// A Python virtual environment with bench/baselines/requirements.txt, made once per target
/// directory; `None` (with the reason printed) when python3 or its venv module cannot make one.
pub fn python_venv() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openbrokerapi-venv");
    let gunicorn = venv.join("bin/gunicorn");
    if gunicorn.exists() {
        return Some(venv);
    }
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .output();
    match made {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!("skipped: python3 -m venv failed: {}", output_text(&out));
            return None;
        }
        Err(e) => {
            eprintln!("skipped: python3 is not available: {e}");
            return None;
        }
    }
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "-r"])
        .arg(root.join("bench/baselines/requirements.txt"))
        .output()
        .expect("run pip");
    assert!(
        installed.status.success(),
        "pip install: {}",
        output_text(&installed)
    );
    Some(venv)
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
