//! `brokkr check`: validates a configuration and reports every problem.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct CheckArgs {
    /// Configuration file or directory (default: the built-in quickstart and local catalogs).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<PathBuf>,
    /// Also fail on warnings: a target whose admin URL cannot be read here (an environment
    /// variable not set, a `url_file` missing), which `brokkr serve` would refuse.
    #[arg(long)]
    strict: bool,
}

/// Loads the configuration; every error it has makes the command fail. What only the machine
/// that serves must have (the targets' admin URLs) is a warning, or with `--strict` an error.
/// With a `local` target, says which server programs it found here (a missing one is not an
/// error: its plans answer provision with 400 naming the package to install).
pub async fn run(args: CheckArgs) -> Result<()> {
    let config = crate::config::load_config(args.config.as_deref())?;
    let unreadable = brokkr_targets::unreadable_admin_urls(&config.targets);
    for (_, problem) in &unreadable {
        eprintln!("warning: {problem}");
    }
    if args.strict && !unreadable.is_empty() {
        anyhow::bail!(
            "--strict: the admin URL of {} cannot be read here",
            count(unreadable.len(), "target")
        );
    }
    let local = (config.targets.values()).any(|t| t.kind == brokkr_blueprint::TargetKind::Local);
    if local {
        for (engine, found) in brokkr_targets::local::programs_report() {
            match found {
                Ok(paths) => {
                    let paths: Vec<String> =
                        paths.iter().map(|p| p.display().to_string()).collect();
                    println!("local {}: {}", engine.as_str(), paths.join(", "));
                }
                Err(missing) => println!("local {}: {missing}", engine.as_str()),
            }
        }
    }
    let services = config.catalog.services.len();
    let plans: usize = config.catalog.services.iter().map(|s| s.plans.len()).sum();
    println!(
        "ok: {}, {}, every plan with a blueprint",
        count(services, "service"),
        count(plans, "plan")
    );
    Ok(())
}

/// `n` and `noun`, plural unless `n` is 1: `1 service`, `2 plans`.
fn count(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_read_as_english() {
        assert_eq!(super::count(1, "service"), "1 service");
        assert_eq!(super::count(0, "plan"), "0 plans");
        assert_eq!(super::count(17, "plan"), "17 plans");
    }
}
