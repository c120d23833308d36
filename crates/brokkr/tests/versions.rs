//! A plan's maintenance version says what made its instances: the store records each version's
//! blueprint the first time it is served, and a blueprint changed under an unchanged version is
//! refused by a reload (the previous configuration still served), by `serve` at start and by
//! `brokkr check --store`, each naming the plan, the version and the path that changed, never
//! its value. A new version is accepted and recorded; the old one keeps its record.
//!
//! The test runs the real binary (`CARGO_BIN_EXE_brokkr`) on a free local port with its own
//! temporary directory for the configuration and the SQLite store.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::BIN;
use support::logged_serve::LoggedServe;
/// The path of the edited template value, as the refusals name it.
const PATH: &str = "instance.steps[0].templates[0].data.max_connections (changed)";

/// A configuration whose plan `small` (described as `description`) has maintenance version
/// `version` and creates a ConfigMap with `max_connections`.
fn config(version: &str, description: &str, max_connections: u32) -> String {
    format!(
        "catalog:
  services:
  - name: db
    id: svc-db
    description: A database
    bindable: false
    plans:
    - name: small
      id: plan-small
      description: {description}
      maintenance_info: {{version: {version}, description: Tunes the server}}
targets:
  cluster: {{kind: kubernetes, namespace: {{fixed: databases}}}}
blueprints:
- service: db
  plan: small
  instance:
    steps:
    - name: objects
      target: cluster
      templates:
      - apiVersion: v1
        kind: ConfigMap
        metadata: {{name: settings}}
        data: {{max_connections: 'limit-{max_connections}'}}
"
    )
}

/// Replaces the file the way editors do: write a sibling, then rename it over the original.
fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn store_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("brokkr.db").display())
}

/// `brokkr` with `args`, with no `BROKKR_*` variable of the caller's environment.
fn brokkr(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("BROKKR_")) {
        cmd.env_remove(var);
    }
    cmd.env_remove("RUST_LOG").env("NO_COLOR", "1").args(args);
    cmd
}

/// `brokkr check` of `config`, against the store in `dir` when `store` is set.
fn check(config: &Path, dir: &Path, store: bool) -> Output {
    let mut cmd = brokkr(&["check", "--config"]);
    cmd.arg(config);
    if store {
        cmd.arg("--store").arg(store_url(dir));
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The served plan's description.
async fn description(serve: &LoggedServe) -> String {
    let catalog = serve.osb.catalog().await.unwrap().body;
    catalog.services[0].plans[0].description.clone()
}

#[tokio::test]
async fn a_blueprint_changed_under_its_version_is_refused_and_a_new_version_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brokkr.yaml");
    std::fs::write(&path, config("1.0.0", "Small", 100)).unwrap();

    // A store that does not exist is an error, and is not created.
    let out = check(&path, dir.path(), true);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(!dir.path().join("brokkr.db").exists());

    // Served once: version 1.0.0 is recorded with its blueprint.
    let mut serve = LoggedServe::start(&path, dir.path());
    serve.wait_logged("brokkr is serving the OSB API", 1).await;
    assert_eq!(description(&serve).await, "Small");

    // A reload that changes the template under 1.0.0 is refused; the old catalog stays.
    write_config(&path, &config("1.0.0", "Tuned", 200));
    let log = serve
        .wait_logged(
            "the new configuration is refused; still serving the previous one",
            1,
        )
        .await;
    for needle in [r#"plan "small" of service "db""#, r#""1.0.0""#, PATH] {
        assert!(
            log.contains(needle),
            "the reload's refusal lacks {needle:?}:\n{log}"
        );
    }
    assert!(!log.contains("limit-200"), "a value was logged:\n{log}");
    assert_eq!(description(&serve).await, "Small");
    drop(serve);

    // Started with it, serve refuses to start.
    let mut serve = LoggedServe::start(&path, dir.path());
    let (status, log) = serve.exited().await;
    assert_eq!(status.code(), Some(1), "{log}");
    for needle in [r#"plan "small" of service "db""#, r#""1.0.0""#, PATH] {
        assert!(
            log.contains(needle),
            "serve's refusal lacks {needle:?}:\n{log}"
        );
    }
    assert!(!log.contains("limit-"), "a value was printed:\n{log}");
    drop(serve);

    // `check --store` fails the same way; `check` alone knows no store and passes.
    let out = check(&path, dir.path(), true);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(PATH), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 plan changed under an unchanged maintenance version"),
        "{}",
        stderr(&out)
    );
    let out = check(&path, dir.path(), false);
    assert!(out.status.success(), "{}", stderr(&out));

    // A new version is accepted by a reload, and recorded.
    std::fs::write(&path, config("1.0.0", "Small", 100)).unwrap();
    let mut serve = LoggedServe::start(&path, dir.path());
    serve.wait_logged("brokkr is serving the OSB API", 1).await;
    write_config(&path, &config("1.1.0", "Tuned", 200));
    serve.wait_logged("configuration reloaded", 1).await;
    assert_eq!(description(&serve).await, "Tuned");
    drop(serve);
    let out = check(&path, dir.path(), true);
    assert!(out.status.success(), "{}", stderr(&out));

    // 1.0.0 keeps what it made: going back to it is accepted, changing it is still refused.
    std::fs::write(&path, config("1.0.0", "Small", 100)).unwrap();
    let out = check(&path, dir.path(), true);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&path, config("1.0.0", "Small", 300)).unwrap();
    let out = check(&path, dir.path(), true);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn check_warns_about_a_maintenance_version_without_description() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brokkr.yaml");
    let described = config("1.0.0", "Small", 100);
    std::fs::write(&path, &described).unwrap();
    let out = check(&path, dir.path(), false);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    std::fs::write(
        &path,
        described.replace(", description: Tunes the server", ""),
    )
    .unwrap();
    let out = check(&path, dir.path(), false);
    assert!(out.status.success(), "a warning only: {}", stderr(&out));
    assert!(
        stderr(&out).contains(
            r#"warning: plan "small" of service "db": maintenance_info.version "1.0.0" has no description"#
        ),
        "{}",
        stderr(&out)
    );
}
