//! `brokkr store seed`: fills a store with many ready instances, for scale benchmarks.
//!
//! Every instance goes through the [`Store`] the way a real provision does — `create` with a
//! running provision operation, then `finish` as the engine ends it — so rows carry exactly the
//! format, the encryption and the indexes of the broker's own. Instances are named
//! `seed-<n>` and use the plan given (by default the quickstart's `async` plan, with its steps).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use brokkr_engine::store::{Created, Finish};
use brokkr_engine::{Attrs, Key, OpKind, OpPlan, Operation, Resource, Status, Store};
use brokkr_osb::MaintenanceInfo;
use clap::Args;
use serde_json::json;

/// Owner of the operations the seeder creates and finishes.
const SEED_OWNER: &str = "brokkr-seed";

#[derive(Args)]
pub struct SeedArgs {
    /// Store URL: sqlite://PATH or postgres://…
    #[arg(long, env = "BROKKR_STORE", default_value = "sqlite://brokkr.db")]
    store: String,
    /// How many instances to add.
    #[arg(long)]
    count: u64,
    /// Number of the first instance (`seed-<start>`), to add to an already seeded store.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Configuration the plan comes from (default: the built-in quickstart and local catalogs).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Service offering id (default: the quickstart's).
    #[arg(long, default_value = "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10")]
    service_id: String,
    /// Plan id (default: the quickstart's async plan).
    #[arg(long, default_value = "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21")]
    plan_id: String,
    /// Concurrent writers.
    #[arg(long, default_value_t = 4)]
    concurrency: u64,
    #[command(flatten)]
    keys: crate::secrets::KeyArgs,
}

/// The instance the seeder writes as `seed-<n>`, with a running provision operation.
fn instance(n: u64, args: &SeedArgs, plan: &OpPlan, attrs: &Attrs) -> Resource {
    let op = Operation::new(
        OpKind::Provision,
        plan.clone(),
        None,
        24 * 3600 * 1000,
        SEED_OWNER,
        3600 * 1000,
    );
    Resource::new(
        Key::instance(&format!("seed-{n:07}")),
        &args.service_id,
        &args.plan_id,
        attrs.clone(),
        op,
    )
}

async fn seed_one(store: &dyn Store, r: &Resource) -> Result<()> {
    match store.create(r).await? {
        Created::Inserted => {}
        Created::Exists(_) => bail!("{} already exists", r.key),
    }
    let finish = Finish::success("provisioned", Status::Ready);
    if !store
        .finish(&r.key, &r.op.id, SEED_OWNER, &finish, &[])
        .await?
    {
        bail!("{}: its provision could not be finished", r.key);
    }
    Ok(())
}

/// Adds `args.count` ready instances to the store.
pub async fn run(args: SeedArgs) -> Result<()> {
    let config = &crate::config::load_config(args.config.as_deref())?;
    let entry = config
        .plan(&args.service_id, &args.plan_id)
        .with_context(|| format!("no plan {} of service {}", args.plan_id, args.service_id))?;
    let plan = OpPlan::configured(Some(entry), OpKind::Provision)?;
    let parameters =
        json!({"credentials": {"type": "postgresql", "host": "db.example.com", "port": 5432}});
    let attrs = Attrs {
        parameters: parameters.as_object().cloned(),
        // Instances keep the version only.
        maintenance_info: (entry.plan.maintenance_info.clone()).map(|m| MaintenanceInfo {
            description: None,
            ..m
        }),
        ..Attrs::default()
    };
    let keyring = crate::secrets::keyring(&args.keys, &args.store, true)?;
    let store = brokkr_engine::connect(&args.store, keyring)
        .await
        .with_context(|| {
            format!(
                "cannot open the store {}",
                brokkr_engine::redact_url(&args.store)
            )
        })?;
    let args = Arc::new(args);
    let (plan, attrs) = (Arc::new(plan), Arc::new(attrs));
    let next = Arc::new(AtomicU64::new(args.start));
    let end = args.start.saturating_add(args.count);
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (store, args, plan, attrs, next) = (
            store.clone(),
            args.clone(),
            plan.clone(),
            attrs.clone(),
            next.clone(),
        );
        writers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= end {
                    return Ok::<_, anyhow::Error>(());
                }
                seed_one(store.as_ref(), &instance(n, &args, &plan, &attrs)).await?;
                let done = n + 1 - args.start;
                if done % 100_000 == 0 {
                    eprintln!(
                        "{done} instances in {:.0}s",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        });
    }
    while let Some(result) = writers.join_next().await {
        result??;
    }
    println!("seeded {} instances", args.count);
    Ok(())
}
