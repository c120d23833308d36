//! `brokkr upgrade`: fleet upgrades through a broker's admin API — start one (or see what it
//! would do), follow it, pause, resume or cancel it.
//!
//! This module holds the command line and runs it; `client` talks to the admin API and `show`
//! draws progress bars and tables.

mod client;
mod show;

use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::commands::osb::output::{Format, print};
use client::{Admin, AdminArgs};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct UpgradeArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Option<UpgradeCommand>,
    #[command(flatten)]
    start: StartArgs,
}

/// Start a fleet upgrade.
#[derive(Args)]
struct StartArgs {
    /// The service, by name or id.
    #[arg(long, required = true)]
    service: Option<String>,
    /// The plan whose instances move to its maintenance version, by name or id.
    #[arg(long, required = true)]
    plan: Option<String>,
    /// Most instances upgraded at once.
    #[arg(long, default_value_t = 1)]
    max_parallel: i64,
    /// How many instances go first, as a wave that must all succeed before the rest start.
    #[arg(long, default_value_t = 0)]
    canary: i64,
    /// Stop once this many instances failed.
    #[arg(long, default_value_t = 1)]
    max_failures: i64,
    /// Only list the instances that would be upgraded, with their versions.
    #[arg(long)]
    dry_run: bool,
    /// Follow the upgrade until it ends; exit 1 unless it succeeded.
    #[arg(long)]
    wait: bool,
}

#[derive(Subcommand)]
enum UpgradeCommand {
    /// Show one upgrade and its instances, or list the upgrades.
    Status {
        /// The upgrade's id.
        id: Option<String>,
    },
    /// Start no more instances; those under way finish.
    Pause {
        /// The upgrade's id.
        id: String,
    },
    /// Go on with a paused upgrade.
    Resume {
        /// The upgrade's id.
        id: String,
    },
    /// Stop for good; instances under way finish.
    Cancel {
        /// The upgrade's id.
        id: String,
    },
}

/// Runs one `brokkr upgrade` command.
pub async fn run(args: UpgradeArgs) -> Result<()> {
    let admin = Admin::connect(&args.admin)?;
    let out = args.output;
    let (action, id) = match args.command {
        None => return start(&admin, args.start, out).await,
        Some(UpgradeCommand::Status { id: None }) => {
            let all = admin.call(Method::GET, "/admin/v1/upgrades", None).await?;
            return print(out, &all, || show::list(&all));
        }
        Some(UpgradeCommand::Status { id: Some(id) }) => {
            let upgrade = admin.call(Method::GET, &path(&id)?, None).await?;
            return show_upgrade(out, &upgrade);
        }
        Some(UpgradeCommand::Pause { id }) => ("pause", id),
        Some(UpgradeCommand::Resume { id }) => ("resume", id),
        Some(UpgradeCommand::Cancel { id }) => ("cancel", id),
    };
    let path = format!("{}/{action}", path(&id)?);
    let upgrade = admin.call(Method::POST, &path, None).await?;
    show_upgrade(out, &upgrade)
}

/// The admin API path of upgrade `id` (ids are UUIDs: anything else is refused).
fn path(id: &str) -> Result<String> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        bail!("{id:?} is not an upgrade id (see `brokkr upgrade status`)");
    }
    Ok(format!("/admin/v1/upgrades/{id}"))
}

fn show_upgrade(out: Format, upgrade: &Value) -> Result<()> {
    match out {
        Format::Table => {
            println!("{}", show::upgrade(upgrade));
            Ok(())
        }
        _ => print(out, upgrade, || unreachable!("not a table")),
    }
}

async fn start(admin: &Admin, args: StartArgs, out: Format) -> Result<()> {
    let body = json!({
        "service": args.service,
        "plan": args.plan,
        "max_parallel": args.max_parallel,
        "canary": args.canary,
        "max_failures": args.max_failures,
        "dry_run": args.dry_run,
    });
    let answer = admin
        .call(Method::POST, "/admin/v1/upgrades", Some(&body))
        .await?;
    if args.dry_run {
        return print(out, &answer, || show::dry_run(&answer));
    }
    let id = answer["id"].as_str().unwrap_or_default().to_owned();
    if !args.wait {
        if out == Format::Table {
            println!("upgrade {id} started");
            println!("{}", show::progress(&answer));
            return Ok(());
        }
        return print(out, &answer, || unreachable!("not a table"));
    }
    let mut shown = String::new();
    let upgrade = loop {
        let upgrade = admin.call(Method::GET, &path(&id)?, None).await?;
        let line = format!(
            "{}: {}",
            upgrade["state"].as_str().unwrap_or(""),
            show::progress(&upgrade)
        );
        if line != shown {
            eprintln!("upgrade {id}: {line}");
            shown = line;
        }
        if !matches!(upgrade["state"].as_str(), Some("running" | "paused")) {
            break upgrade;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    show_upgrade(out, &upgrade)?;
    match upgrade["state"].as_str() {
        Some("succeeded") => Ok(()),
        state => bail!("upgrade {id} {}", state.unwrap_or("ended")),
    }
}
