//! `brokkr serve`: configuration, store, engine and HTTP server, with graceful shutdown.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use base64::Engine as _;
use brokkr_blueprint::Config;
use brokkr_broker::{Auth, Broker, auth};
use brokkr_engine::{Engine, EngineOptions, Store, redact_url};
use brokkr_targets::Targets;
use clap::{Args, ValueEnum};
use rand::RngExt as _;
use tracing::{info, warn};

/// Default listen address.
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default store.
const DEFAULT_STORE: &str = "sqlite://brokkr.db";
/// User name of the generated basic credentials.
const GENERATED_USERNAME: &str = "brokkr";
/// Store setting holding the digest of the generated password.
pub const GENERATED_PASSWORD_SETTING: &str = "broker.generated_password_sha256";

#[derive(Args)]
pub struct ServeArgs {
    /// Configuration file or directory (default: the built-in quickstart and local catalogs).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Address to listen on [default: broker.listen, else 127.0.0.1:8080].
    #[arg(long, env = "BROKKR_LISTEN")]
    listen: Option<SocketAddr>,
    /// Store URL: sqlite://PATH or postgres://… [default: store, else sqlite://brokkr.db].
    #[arg(long, env = "BROKKR_STORE")]
    store: Option<String>,
    /// Basic auth user name (the password comes from --password or BROKKR_BROKER_PASSWORD).
    #[arg(long, env = "BROKKR_BROKER_USERNAME", hide_env_values = true)]
    username: Option<String>,
    /// Basic auth password; prefer the environment variable over the flag.
    #[arg(long, env = "BROKKR_BROKER_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// Log format.
    #[arg(long, env = "BROKKR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Admin API user name; with BROKKR_ADMIN_PASSWORD it turns the admin API on.
    #[arg(long, env = "BROKKR_ADMIN_USERNAME", hide_env_values = true)]
    admin_username: Option<String>,
    /// Admin API password; prefer the environment variable over the flag.
    #[arg(long, env = "BROKKR_ADMIN_PASSWORD", hide_env_values = true)]
    admin_password: Option<String>,
    #[command(flatten)]
    keys: crate::secrets::KeyArgs,
    /// How often the engine looks for due operations (e.g. 1s, 200ms).
    #[arg(long, env = "BROKKR_POLL_INTERVAL", default_value = "1s", value_parser = crate::config::parse_duration)]
    poll_interval: std::time::Duration,
    /// How long a claim on an operation lasts without renewal; with several replicas on
    /// PostgreSQL, how soon a dead replica's operations are taken over.
    #[arg(long, env = "BROKKR_LEASE", default_value = "30s", value_parser = crate::config::parse_duration)]
    lease: std::time::Duration,
    /// How often the broker looks for bindings whose credentials expired, of plans with
    /// `rotation.revoke_expired`, and unbinds them.
    #[arg(long, env = "BROKKR_EXPIRY_SWEEP_INTERVAL", default_value = "10s", value_parser = crate::config::parse_duration)]
    expiry_sweep_interval: std::time::Duration,
    /// Most HTTP connections open at once; beyond, new ones wait in the listen backlog
    /// [default: broker.max_connections, else 1024].
    #[arg(long, env = "BROKKR_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// How long a client may take to send a request's headers
    /// [default: broker.header_read_timeout, else 10s].
    #[arg(long, env = "BROKKR_HEADER_READ_TIMEOUT", value_parser = crate::config::parse_duration)]
    header_read_timeout: Option<std::time::Duration>,
    /// How long a connection may stay open without traffic, unless a request whose body has
    /// arrived is being answered [default: broker.idle_timeout, else 120s].
    #[arg(long, env = "BROKKR_IDLE_TIMEOUT", value_parser = crate::config::parse_duration)]
    idle_timeout: Option<std::time::Duration>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Runs the broker until SIGTERM or Ctrl-C, then drains requests and stops the engine.
pub async fn run(args: ServeArgs, kinds: crate::step_kinds::StepKinds) -> Result<()> {
    init_logging(args.log_format);
    anyhow::ensure!(
        !args.expiry_sweep_interval.is_zero(),
        "--expiry-sweep-interval must be longer than zero"
    );
    let config = crate::config::load_config(args.config.as_deref())?;
    let mut available = kinds.names();
    available.extend(
        brokkr_engine::BUILT_IN_STEP_KINDS
            .iter()
            .map(|k| (*k).to_owned()),
    );
    check_step_kinds(&config, &available)?;
    let listen = match (args.listen, &config.broker.listen) {
        (Some(a), _) => a,
        (None, Some(a)) => a.parse().context("broker.listen")?,
        (None, None) => DEFAULT_LISTEN.parse().expect("valid default"),
    };
    let store_url = args
        .store
        .clone()
        .or_else(|| config.store.clone())
        .unwrap_or_else(|| DEFAULT_STORE.to_owned());
    let keyring = crate::secrets::keyring(&args.keys, &store_url, true)?;
    let store = brokkr_engine::connect(&store_url, keyring)
        .await
        .with_context(|| format!("cannot open the store {}", redact_url(&store_url)))?;
    let auth = platform_auth(&args, &config, store.as_ref()).await?;
    let admin_auth = admin_auth(&args, &config)?;

    let mut options = EngineOptions {
        poll_interval: args.poll_interval,
        lease: args.lease,
        ..EngineOptions::default()
    };
    if let Some(retention) = config.broker.retention {
        options.retention = retention;
    }
    let targets = Targets::from_config(&config.targets, &local_root(&store_url))
        .context("cannot set up the targets")?;
    crate::versions::record(store.as_ref(), &config).await?;
    let engine = Engine::with_targets(store, options, targets);
    for (name, kind) in kinds.0 {
        engine.register(&name, kind);
    }
    // The broker names the plans in the engine's metrics, so it comes before the engine resumes
    // any operation that could end under a plan's ids.
    let broker = Arc::new(Broker::new(
        Arc::new(config),
        engine.clone(),
        auth,
        admin_auth,
    ));
    engine.start().await.context("cannot start the engine")?;

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The owner id names this replica in the store's leases (`lease_owner`).
    info!(address = %listener.local_addr()?, store = %redact_url(&store_url), owner = %engine.owner(), "brokkr is serving the OSB API");
    let limits = server_limits(&args, &broker.config().broker);
    let check = Box::new(move |c: &Config| check_step_kinds(c, &available));
    crate::reload::spawn(args.config.clone(), broker.clone(), check)?;
    let expiry = brokkr_broker::expiry::spawn(broker.clone(), args.expiry_sweep_interval);
    let upgrades = brokkr_broker::upgrade::spawn(broker.clone());
    brokkr_broker::server::serve(listener, broker, limits, shutdown_signal()).await;
    expiry.abort();
    upgrades.abort();
    info!("requests drained; stopping the engine (unfinished operations resume on next start)");
    engine.shutdown().await;
    Ok(())
}

pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log collected from a pipe or a file (a
    // container's, a service manager's) gets plain text.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The connection limits: flags and environment first, then `broker.*`, then the defaults.
fn server_limits(
    args: &ServeArgs,
    config: &brokkr_blueprint::config::BrokerConfig,
) -> brokkr_broker::server::ServerLimits {
    let defaults = brokkr_broker::server::ServerLimits::default();
    brokkr_broker::server::ServerLimits {
        max_connections: (args.max_connections.or(config.max_connections))
            .unwrap_or(defaults.max_connections),
        header_read_timeout: (args.header_read_timeout.or(config.header_read_timeout))
            .unwrap_or(defaults.header_read_timeout),
        idle_timeout: (args.idle_timeout.or(config.idle_timeout)).unwrap_or(defaults.idle_timeout),
    }
}

/// Refuses a configuration whose steps `run` a step kind this binary does not include.
fn check_step_kinds(config: &Config, available: &[String]) -> Result<()> {
    for entry in config.plans() {
        let binding = entry.blueprint.binding.as_ref().map(|b| b.steps.as_slice());
        let steps = entry
            .blueprint
            .instance
            .steps
            .iter()
            .chain(binding.unwrap_or_default());
        for step in steps {
            let missing = |n: &&str| !available.iter().any(|a| a == n);
            if let Some(name) = step.run.as_deref().filter(missing) {
                anyhow::bail!(
                    "plan {:?} of service {:?}: step {:?} runs {name:?}, which this brokkr \
                     binary does not include",
                    entry.plan.name,
                    entry.service.name,
                    step.name
                );
            }
        }
    }
    Ok(())
}

/// Where a `local` target without `root` keeps its servers: beside a SQLite store
/// (`brokkr.db` → `brokkr.db.d/`), else `brokkr.db.d/` in the working directory.
pub(crate) fn local_root(store_url: &str) -> std::path::PathBuf {
    let file = store_url
        .strip_prefix("sqlite://")
        .map(|rest| rest.split('?').next().unwrap_or(rest))
        .filter(|path| !path.is_empty() && !path.starts_with(':'));
    std::path::PathBuf::from(format!("{}.d", file.unwrap_or("brokkr.db")))
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    info!("shutdown requested");
}

/// Credentials from a user name/password pair (flags or environment first, then `config`) and
/// the config's bearer tokens; `None` when nothing is configured.
fn configured_auth(
    username: Option<&String>,
    password: Option<&String>,
    config: &brokkr_blueprint::config::AuthConfig,
    what: &str,
) -> Result<Option<Auth>> {
    let mut auth = Auth::default();
    let mut any = false;
    match (
        username.or(config.username.as_ref()),
        password.or(config.password.as_ref()),
    ) {
        (Some(u), Some(p)) => {
            auth = auth.basic(u, p);
            any = true;
        }
        (None, None) => {}
        _ => anyhow::bail!("{what} basic auth needs both a user name and a password"),
    }
    for token in &config.bearer_tokens {
        auth = auth.bearer(token);
        any = true;
    }
    Ok(any.then_some(auth))
}

/// Admin API credentials from BROKKR_ADMIN_USERNAME/BROKKR_ADMIN_PASSWORD or `broker.admin_auth`.
fn admin_auth(args: &ServeArgs, config: &Config) -> Result<Option<Auth>> {
    let none = brokkr_blueprint::config::AuthConfig::default();
    let configured = config.broker.admin_auth.as_ref().unwrap_or(&none);
    configured_auth(
        args.admin_username.as_ref(),
        args.admin_password.as_ref(),
        configured,
        "admin",
    )
}

/// Platform credentials from the environment/flags, then the configuration; with none, a password
/// generated on first start, kept in the store as a digest, and printed once.
async fn platform_auth(args: &ServeArgs, config: &Config, store: &dyn Store) -> Result<Auth> {
    let configured = &config.broker.auth;
    if let Some(auth) = configured_auth(
        args.username.as_ref(),
        args.password.as_ref(),
        configured,
        "platform",
    )? {
        return Ok(auth);
    }
    let password: String = {
        let mut rng = rand::rng();
        let bytes: [u8; 24] = rng.random();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    };
    let digest = hex(&auth::digest(&password));
    let stored = store
        .init_setting(GENERATED_PASSWORD_SETTING, &digest)
        .await?;
    if stored == digest {
        println!(
            "No platform credentials are configured, so brokkr generated them.\n  \
             username: {GENERATED_USERNAME}\n  password: {password}\n\
             This password is shown only once; the store keeps only its digest.\n\
             Set BROKKR_BROKER_USERNAME and BROKKR_BROKER_PASSWORD to choose your own."
        );
    } else {
        warn!(
            "using the platform password generated on first start (user {GENERATED_USERNAME}); \
             set BROKKR_BROKER_USERNAME/BROKKR_BROKER_PASSWORD to replace it"
        );
    }
    let digest = unhex(&stored).context("the stored generated password digest is corrupt")?;
    Ok(Auth::default().basic_digest(GENERATED_USERNAME, digest))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_through_hex() {
        let d = auth::digest("x");
        assert_eq!(unhex(&hex(&d)), Some(d));
        assert_eq!(unhex("zz"), None);
    }
}
