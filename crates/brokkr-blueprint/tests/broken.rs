//! Snapshot tests of broken configurations: each `tests/broken/NAME.yaml` (or directory `NAME/`)
//! must fail to load with exactly the errors in `tests/broken/NAME.stderr`, as `brokkr check`
//! prints them. Run with `BROKKR_BLESS=1` to rewrite the snapshots after a deliberate change,
//! and review the diff.

use std::path::Path;

use brokkr_blueprint::load::load_path;

#[test]
fn broken_configs_report_every_error_with_its_place() {
    let dir = Path::new("tests/broken");
    let bless = std::env::var_os("BROKKR_BLESS").is_some();
    let mut cases: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 12, "only {} broken configs", cases.len());
    let mut mismatches = Vec::new();
    for case in &cases {
        let errors = match load_path(case) {
            Ok(_) => panic!("{} loads, but it is meant to be broken", case.display()),
            Err(e) => format!("{e}\n"),
        };
        let snapshot = case.with_extension("stderr");
        if bless {
            std::fs::write(&snapshot, &errors).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&snapshot).unwrap_or_default();
        if expected != errors {
            mismatches.push(format!(
                "{}:\n--- expected\n{expected}--- actual\n{errors}",
                snapshot.display()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{}\n(BROKKR_BLESS=1 rewrites the snapshots)",
        mismatches.join("\n")
    );
}
