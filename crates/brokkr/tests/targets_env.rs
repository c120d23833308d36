//! A configuration whose targets read their admin URLs from the environment, on a machine where
//! none is set: `serve` refuses and names every missing variable at once, `check` warns about
//! each (and fails with `--strict`), `render` says which placeholder host it used.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::BIN;

const VARS: [&str; 3] = [
    "BROKKR_SHARED_MYSQL_URL",
    "BROKKR_SHARED_PG_URL",
    "BROKKR_SHARED_REDIS_URL",
];

fn shared_catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../catalogs/shared/shared.yaml")
}

/// `brokkr ARGS --config <shared catalog>` with none of the admin URL variables set.
fn brokkr(args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .arg("--config")
        .arg(shared_catalog())
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE");
    for var in VARS {
        command.env_remove(var);
    }
    command.output().expect("run brokkr")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_names_every_missing_variable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("brokkr.db").display());
    let out = brokkr(&["serve", "--listen", "127.0.0.1:0", "--store", &store]);
    assert!(!out.status.success());
    let err = stderr(&out);
    for (target, var) in [
        ("shared-mysql", VARS[0]),
        ("shared-pg", VARS[1]),
        ("shared-redis", VARS[2]),
    ] {
        assert!(
            err.contains(&format!(
                "target {target}: environment variable {var} is not set"
            )),
            "{err}"
        );
    }
}

#[test]
fn check_warns_about_each_and_fails_only_when_strict() {
    let out = brokkr(&["check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("warning: target shared-").count(), 3, "{err}");
    for var in VARS {
        assert!(err.contains(var), "{err}");
    }
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: 3 services"));

    let strict = brokkr(&["check", "--strict"]);
    assert!(!strict.status.success());
    assert!(
        stderr(&strict).contains("--strict: the admin URL of 3 targets cannot be read here"),
        "{}",
        stderr(&strict)
    );
}

#[test]
fn render_says_which_placeholder_host_it_used() {
    let out = brokkr(&[
        "render",
        "--service",
        "postgresql",
        "--plan",
        "small",
        "--binding",
        "--seed",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "warning: target shared-pg: environment variable BROKKR_SHARED_PG_URL is not set; \
             rendering with the host shared-pg.invalid"
        ),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("shared-pg.invalid"));
}
