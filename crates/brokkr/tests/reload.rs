//! Hot reload of a running `brokkr serve`: a changed configuration file reaches `/v2/catalog`
//! without a restart; a broken one is logged with its errors while the previous catalog is still
//! served; SIGHUP reads the configuration again.
//!
//! The test runs the real binary (`CARGO_BIN_EXE_brokkr`) on a free local port with its own
//! temporary directory for the configuration and the store.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::logged_serve::{LoggedServe, PATIENCE};

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

/// The plan names of the served catalog, or `None` while the broker does not answer.
async fn plans(serve: &LoggedServe) -> Option<Vec<String>> {
    let catalog = serve.osb.catalog().await.ok()?.body;
    let plans = &catalog.services.first()?.plans;
    Some(plans.iter().map(|p| p.name.clone()).collect())
}

/// Waits until the catalog lists exactly `names`.
async fn wait_plans(serve: &mut LoggedServe, names: &[&str]) {
    let until = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            panic!("brokkr exited with {status}");
        }
        let plans = plans(serve).await;
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

#[tokio::test]
async fn changed_broken_and_signalled_configurations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brokkr.yaml");
    std::fs::write(&path, config(&["small"])).unwrap();
    let mut serve = LoggedServe::start(&path, dir.path());
    wait_plans(&mut serve, &["small"]).await;

    // A new plan reaches the catalog without a restart.
    write_config(&path, &config(&["small", "large"]));
    wait_plans(&mut serve, &["small", "large"]).await;
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
        plans(&serve).await.unwrap(),
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
    wait_plans(&mut serve, &["small", "huge"]).await;
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
        let mut serve = LoggedServe::start(&config_path, &state);
        wait_plans(&mut serve, &["small"]).await;

        volume.update(&[("brokkr.yaml", config(&["small", "large"]))]);
        wait_plans(&mut serve, &["small", "large"]).await;
        serve.wait_logged("configuration reloaded", 1).await;

        // A second swap, removing a plan, is seen too (the watch survives the first).
        volume.update(&[("brokkr.yaml", config(&["large"]))]);
        wait_plans(&mut serve, &["large"]).await;
    }
}
