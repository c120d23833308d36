//! `brokkr check`: validates a configuration and reports every problem.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
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
    /// Also compare the plans with what this store recorded for their maintenance versions
    /// (sqlite://PATH or postgres://…), reading only: every plan whose blueprint changed under
    /// its version is an error.
    #[arg(long, env = "BROKKR_STORE")]
    store: Option<String>,
}

/// Loads the configuration; every error it has makes the command fail. What only the machine
/// that serves must have (the targets' admin URLs) is a warning, or with `--strict` an error.
/// With a `local` target, says which server programs it found here (a missing one is not an
/// error: its plans answer provision with 400 naming the package to install). A plan whose
/// maintenance version has no description is a warning. With `--store`, a plan whose blueprint
/// changed under the maintenance version the store recorded is an error.
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
    for plan in config.plans() {
        let undescribed = plan
            .plan
            .maintenance_info
            .as_ref()
            .filter(|m| m.description.as_deref().is_none_or(|d| d.trim().is_empty()));
        if let Some(info) = undescribed {
            eprintln!(
                "warning: plan {:?} of service {:?}: maintenance_info.version {:?} has no \
                 description of what upgrading to it does",
                plan.plan.name, plan.service.name, info.version
            );
        }
    }
    if let Some(url) = &args.store {
        compare_with_store(url, &config).await?;
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

/// Fails, naming each of them, when a plan's blueprint differs from the one the store at `url`
/// recorded for its maintenance version. Opens the store without migrating it or writing to it.
async fn compare_with_store(url: &str, config: &brokkr_blueprint::Config) -> Result<()> {
    let shown = brokkr_engine::redact_url(url);
    if let Some(path) = sqlite_file(url)
        && !std::path::Path::new(path).exists()
    {
        anyhow::bail!("the store {shown} does not exist");
    }
    let store = brokkr_engine::store::SqlStore::connect(url, None)
        .await
        .with_context(|| format!("cannot open the store {shown}"))?;
    let changed = crate::versions::changed(&store, config)
        .await
        .with_context(|| format!("cannot read the store {shown}"))?;
    if !changed.is_empty() {
        for plan in &changed {
            eprintln!("error: {plan}");
        }
        anyhow::bail!(
            "{} changed under an unchanged maintenance version (compared with {shown})",
            count(changed.len(), "plan")
        );
    }
    println!("store {shown}: every recorded maintenance version matches its plan");
    Ok(())
}

/// The file of a `sqlite://PATH` (or `sqlite:PATH`) store URL, unless it is in memory.
fn sqlite_file(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && !path.starts_with(':')).then_some(path)
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
    fn a_sqlite_store_url_names_its_file() {
        assert_eq!(
            super::sqlite_file("sqlite:///srv/brokkr.db?mode=rwc"),
            Some("/srv/brokkr.db")
        );
        assert_eq!(super::sqlite_file("sqlite:brokkr.db"), Some("brokkr.db"));
        assert_eq!(super::sqlite_file("sqlite::memory:"), None);
        assert_eq!(super::sqlite_file("postgres://db/brokkr"), None);
    }

    #[test]
    fn counts_read_as_english() {
        assert_eq!(super::count(1, "service"), "1 service");
        assert_eq!(super::count(0, "plan"), "0 plans");
        assert_eq!(super::count(17, "plan"), "17 plans");
    }
}
