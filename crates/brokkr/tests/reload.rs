//! Hot reload of a running `brokkr serve`: a changed configuration file reaches `/v2/catalog`
//! without a restart; a broken one is logged with its errors while the previous catalog is still
//! served; SIGHUP reads the configuration again.
//!
//! The test runs the real binary (`CARGO_BIN_EXE_brokkr`) on a free local port with its own
//! temporary directory for the configuration and the store.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_brokkr");
/// How long the broker may take to start, or to pick up a change.
const PATIENCE: Duration = Duration::from_secs(15);

/// A configuration with plans `names` of one service, each with an empty blueprint.
fn config(names: &[&str]) -> String {
    let plans: String = names
        .iter()
        .map(|n| format!("    - {{name: {n}, id: plan-{n}, description: Plan {n}}}\n"))
        .collect();
    let blueprints: String = names
        .iter()
        .map(|n| format!("- {{service: db, plan: {n}}}\n"))
        .collect();
    format!(
        "catalog:\n  services:\n  - name: db\n    id: svc-db\n    description: A database\n    \
         bindable: false\n    plans:\n{plans}blueprints:\n{blueprints}"
    )
}

/// Replaces the file the way editors do: write a sibling, then rename it over the original.
fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

struct Serve {
    child: Child,
    stderr: Arc<Mutex<String>>,
    osb: brokkr_osb::client::Client,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- brokkr stderr ---\n{}", self.stderr.lock().unwrap());
        }
    }
}

impl Serve {
    fn start(config: &Path, dir: &Path) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(BIN);
        for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("BROKKR_")) {
            cmd.env_remove(var);
        }
        cmd.env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .env("BROKKR_BROKER_USERNAME", "platform")
            .env("BROKKR_BROKER_PASSWORD", "reload-test")
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--store")
            .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
            .arg("--insecure-plaintext-secrets")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn brokkr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self {
            child,
            stderr,
            osb: brokkr_osb::client::Client::builder(format!("http://127.0.0.1:{port}"))
                .basic_auth("platform", "reload-test")
                .timeout(Duration::from_secs(2))
                .build()
                .expect("OSB client"),
        }
    }

    /// The plan names of the served catalog, or `None` while the broker does not answer.
    async fn plans(&self) -> Option<Vec<String>> {
        let catalog = self.osb.catalog().await.ok()?.body;
        let plans = &catalog.services.first()?.plans;
        Some(plans.iter().map(|p| p.name.clone()).collect())
    }

    /// Waits until the catalog lists exactly `names`.
    async fn wait_plans(&mut self, names: &[&str]) {
        let until = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("brokkr exited with {status}");
            }
            let plans = self.plans().await;
            if plans.as_deref().is_some_and(|p| p == names) {
                return;
            }
            assert!(
                Instant::now() < until,
                "the catalog still lists {plans:?}, not {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the log contains `needle` `count` times.
    async fn wait_logged(&self, needle: &str, count: usize) -> String {
        let until = Instant::now() + PATIENCE;
        loop {
            let text = self.stderr.lock().unwrap().clone();
            if text.matches(needle).count() >= count {
                return text;
            }
            assert!(Instant::now() < until, "never logged {needle:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn changed_broken_and_signalled_configurations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brokkr.yaml");
    std::fs::write(&path, config(&["small"])).unwrap();
    let mut serve = Serve::start(&path, dir.path());
    serve.wait_plans(&["small"]).await;

    // A new plan reaches the catalog without a restart.
    write_config(&path, &config(&["small", "large"]));
    serve.wait_plans(&["small", "large"]).await;
    serve.wait_logged("configuration reloaded", 1).await;

    // A broken configuration is reported in full; the previous one is still served.
    let broken = config(&["small", "large", "huge"]).replace(
        "- {service: db, plan: huge}\n",
        "- service: db\n  plan: huge\n  instance:\n    steps:\n    - {name: db, target: nope, templates: [db]}\n",
    );
    write_config(&path, &broken);
    let log = serve.wait_logged("still serving the previous one", 1).await;
    assert!(
        log.contains("blueprints[2].instance.steps[0].target: unknown target \"nope\""),
        "{log}"
    );
    assert!(log.contains("blueprints[2].instance.steps[0].templates[0]: unknown template"));
    assert!(log.contains(&format!("--> {}:", path.display())), "{log}");
    assert_eq!(
        serve.plans().await.unwrap(),
        ["small", "large"],
        "the previous catalog is kept"
    );

    // SIGHUP reads the (still broken) configuration again.
    let hup = Command::new("kill")
        .arg("-HUP")
        .arg(serve.child.id().to_string())
        .status()
        .unwrap();
    assert!(hup.success());
    let log = serve
        .wait_logged("SIGHUP: the new configuration is not valid", 1)
        .await;
    assert!(
        serve.child.try_wait().unwrap().is_none(),
        "SIGHUP must not stop the broker\n{log}"
    );

    // Fixed: served at once, with a plan fewer.
    write_config(&path, &config(&["small", "huge"]));
    serve.wait_plans(&["small", "huge"]).await;
}
