//! Records what `brokkr version` prints: the commit and the build date.
//!
//! `BROKKR_COMMIT` and `BROKKR_BUILD_DATE` (RFC 3339), when set, are used as given — the
//! Dockerfile passes them, since its build context has no `.git`. Otherwise the commit is asked
//! of git (and this script runs again when HEAD moves), and the date is when this script ran;
//! without git the commit is `unknown`.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's days-to-civil).
fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn main() {
    println!("cargo:rerun-if-env-changed=BROKKR_COMMIT");
    println!("cargo:rerun-if-env-changed=BROKKR_BUILD_DATE");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = match std::env::var("BROKKR_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => {
            // Run again when HEAD moves: HEAD itself, the branch it names, or packed refs.
            for path in ["HEAD", "packed-refs"]
                .into_iter()
                .filter_map(|p| git(&["rev-parse", "--git-path", p]))
                .chain(
                    git(&["symbolic-ref", "-q", "HEAD"])
                        .and_then(|r| git(&["rev-parse", "--git-path", &r])),
                )
            {
                if std::path::Path::new(&path).exists() {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    let date = match std::env::var("BROKKR_BUILD_DATE") {
        Ok(date) if !date.is_empty() => date,
        _ => {
            let secs = std::env::var("SOURCE_DATE_EPOCH")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| {
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                });
            rfc3339(secs)
        }
    };
    println!("cargo:rustc-env=BROKKR_COMMIT={commit}");
    println!("cargo:rustc-env=BROKKR_BUILD_DATE={date}");
}
