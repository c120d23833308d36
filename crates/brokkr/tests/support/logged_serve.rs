//! `brokkr serve` on a free loopback port with a SQLite store in a directory of the test's, its
//! log captured as it comes (and printed if the test fails): what the tests that watch a broker
//! reload or refuse its configuration share.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{BIN, free_port};

/// How long the broker may take to start, to pick up a change, or to exit.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A running `brokkr serve`, killed when dropped.
pub struct LoggedServe {
    pub child: Child,
    log: Arc<Mutex<String>>,
    /// A client of its OSB API, with its credentials.
    pub osb: brokkr_osb::client::Client,
}

impl Drop for LoggedServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- brokkr stderr ---\n{}", self.log.lock().unwrap());
        }
    }
}

impl LoggedServe {
    /// Serves `config` with the store `dir/brokkr.db`, none of the caller's `BROKKR_*`
    /// variables, `RUST_LOG` or `NO_COLOR` set (its log goes to a pipe, as in production).
    pub fn start(config: &Path, dir: &Path) -> Self {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("BROKKR_")) {
            cmd.env_remove(var);
        }
        cmd.env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .env("BROKKR_BROKER_USERNAME", "platform")
            .env("BROKKR_BROKER_PASSWORD", "logged-serve")
            .args(["serve", "--insecure-plaintext-secrets", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--store")
            .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn brokkr");
        let log = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self {
            child,
            log,
            osb: brokkr_osb::client::Client::builder(format!("http://127.0.0.1:{port}"))
                .basic_auth("platform", "logged-serve")
                .timeout(Duration::from_secs(2))
                .build()
                .expect("OSB client"),
        }
    }

    /// Waits until the log contains `needle` `count` times; returns the log. Fails if the
    /// broker exits first.
    pub async fn wait_logged(&mut self, needle: &str, count: usize) -> String {
        let until = Instant::now() + PATIENCE;
        loop {
            let text = self.log.lock().unwrap().clone();
            if text.matches(needle).count() >= count {
                return text;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("brokkr exited with {status} before logging {needle:?}");
            }
            assert!(Instant::now() < until, "never logged {needle:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to end; its exit status and its log.
    pub async fn exited(&mut self) -> (ExitStatus, String) {
        let until = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The log thread ends with the pipe.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return (status, self.log.lock().unwrap().clone());
            }
            assert!(Instant::now() < until, "brokkr serve did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
