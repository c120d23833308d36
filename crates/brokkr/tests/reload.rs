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
            .env_remove("NO_COLOR")
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
    let log = serve.wait_logged("configuration reloaded", 1).await;
    // Written to a pipe, the log is plain text: no terminal colour codes.
    assert!(!log.contains('\u{1b}'), "{log}");

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

/// A ConfigMap volume as the kubelet writes it: the data in a timestamped directory, a `..data`
/// symlink to that directory, and each key a symlink through `..data`.
struct ConfigMapVolume {
    dir: std::path::PathBuf,
    generation: usize,
}

impl ConfigMapVolume {
    fn new(dir: &Path, files: &[(&str, String)]) -> Self {
        let mut volume = Self {
            dir: dir.to_owned(),
            generation: 0,
        };
        volume.update(files);
        for (key, _) in files {
            std::os::unix::fs::symlink(format!("..data/{key}"), dir.join(key)).unwrap();
        }
        volume
    }

    /// Publishes new contents the way the kubelet's atomic writer does: a new timestamped
    /// directory, a `..data_tmp` symlink to it renamed over `..data`, the old directory removed.
    fn update(&mut self, files: &[(&str, String)]) {
        self.generation += 1;
        let data = format!(
            "..2026_11_23_20_00_{:02}.{}",
            self.generation,
            1000 + self.generation
        );
        std::fs::create_dir(self.dir.join(&data)).unwrap();
        for (key, text) in files {
            std::fs::write(self.dir.join(&data).join(key), text).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        let previous = std::fs::read_link(self.dir.join("..data")).ok();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(previous) = previous {
            std::fs::remove_dir_all(self.dir.join(previous)).unwrap();
        }
    }
}

/// deploy/ mounts the ConfigMap `brokkr-config` at /etc/brokkr and runs `serve --config
/// /etc/brokkr`: an update of the ConfigMap (a `..data` symlink swap, no file written in the
/// watched directory itself) reaches the catalog, and so it does with `--config` naming the
/// key's file.
#[tokio::test]
async fn config_map_volume_updates_are_reloaded() {
    for by_file in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let volume_dir = tmp.path().join("etc-brokkr");
        std::fs::create_dir(&volume_dir).unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let mut volume = ConfigMapVolume::new(&volume_dir, &[("brokkr.yaml", config(&["small"]))]);
        let config_path = if by_file {
            volume_dir.join("brokkr.yaml")
        } else {
            volume_dir.clone()
        };
        let mut serve = Serve::start(&config_path, &state);
        serve.wait_plans(&["small"]).await;

        volume.update(&[("brokkr.yaml", config(&["small", "large"]))]);
        serve.wait_plans(&["small", "large"]).await;
        serve.wait_logged("configuration reloaded", 1).await;

        // A second swap, removing a plan, is seen too (the watch survives the first).
        volume.update(&[("brokkr.yaml", config(&["large"]))]);
        serve.wait_plans(&["large"]).await;
    }
}
