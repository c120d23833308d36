//! `brokkr controller`: brokkr's Kubernetes controllers against the cluster that KUBECONFIG (or
//! the in-cluster configuration) names, as kubectl finds it; one replica at a time reconciles,
//! elected on a coordination.k8s.io Lease; `/healthz`, `/readyz` and Prometheus `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use brokkr_controller::lease::LeaseLock;
use brokkr_controller::metrics::Metrics;
use brokkr_controller::resources::ClusterServiceBroker;
use clap::Args;
use futures::FutureExt as _;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::serve::{LogFormat, init_logging, shutdown_signal};

/// How often a controller waiting for brokkr's CRDs looks again.
const CRD_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Args)]
pub struct ControllerArgs {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "BROKKR_CONTROLLER_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    listen: SocketAddr,
    /// Namespace of the leader-election Lease [default: the namespace of the in-cluster
    /// configuration or of the kubeconfig's context].
    #[arg(long, env = "BROKKR_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "BROKKR_LEASE_NAME", default_value = "brokkr-controller")]
    lease_name: String,
    /// How long the Lease lasts without renewal: how soon another replica takes over from one
    /// that died.
    #[arg(long, env = "BROKKR_LEASE_DURATION", default_value = "15s", value_parser = crate::config::parse_duration)]
    lease_duration: Duration,
    /// This replica's name in the Lease [default: $POD_NAME, else $HOSTNAME, else a random one].
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long a ServiceBinding waits for its ServiceInstance to become Ready, and a
    /// ServiceInstance for its class and plan to appear in a catalog, before it fails.
    #[arg(long, env = "BROKKR_WAIT_TIMEOUT", default_value = "1h", value_parser = crate::config::parse_duration)]
    wait_timeout: Duration,
    /// Reconcile without leader election (only one replica may run).
    #[arg(long)]
    no_leader_election: bool,
    /// Log format.
    #[arg(long, env = "BROKKR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// What the health endpoints report.
struct Health {
    registry: Registry,
    /// The API server answered and serves brokkr's kinds.
    ready: AtomicBool,
}

/// Runs the controllers until SIGTERM or Ctrl-C, then lets reconciles in progress finish and
/// releases the Lease.
pub async fn run(args: ControllerArgs) -> Result<()> {
    init_logging(args.log_format);
    let mut config = kube::Config::infer()
        .await
        .context("cannot configure a Kubernetes client (KUBECONFIG, ~/.kube/config or the in-cluster configuration)")?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("brokkr-controller/", env!("CARGO_PKG_VERSION"))),
    ));
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Arc::new(Health {
        registry,
        ready: AtomicBool::new(false),
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    info!(address = %args.listen, "serving /healthz, /readyz and /metrics");
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(health.clone());
    let http = tokio::spawn(async move { axum::serve(listener, app).await });

    // Ready once the API server answers and serves brokkr's kinds.
    let shutdown = shutdown_signal().boxed().shared();
    tokio::select! {
        served = crds_served(&client) => served?,
        () = shutdown.clone() => {
            http.abort();
            return Ok(());
        }
    }
    info!("connected to the Kubernetes API server");
    health.ready.store(true, Ordering::Relaxed);

    // The OSB context's clusterid: the kube-system namespace's uid, as other platforms use.
    let cluster_id = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt("kube-system")
        .await
        .ok()
        .flatten()
        .and_then(|ns| ns.metadata.uid);
    let ctx = brokkr_controller::Context {
        metrics,
        cluster_id,
        wait_timeout: args.wait_timeout,
        ..brokkr_controller::Context::new(client.clone())
    };
    // Whose identity is forwarded to brokers: only one the API server checked.
    let guard = tokio::spawn(ctx.user_info.clone().watch(client.clone()));
    let controllers =
        brokkr_controller::run(ctx, shutdown.clone()).inspect(move |()| guard.abort());
    if args.no_leader_election {
        controllers.await;
    } else {
        let namespace = args
            .lease_namespace
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let identity = args
            .identity
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("brokkr-{}", uuid::Uuid::new_v4()));
        let lock = LeaseLock::new(
            client,
            &namespace,
            &args.lease_name,
            &identity,
            args.lease_duration,
        );
        info!(lease = %format!("{namespace}/{}", args.lease_name), %identity, "waiting for the lease");
        tokio::select! {
            () = lock.acquire() => {}
            () = shutdown.clone() => {
                http.abort();
                return Ok(());
            }
        }
        lock.hold(controllers).await?;
    }
    info!("controllers stopped");
    http.abort();
    Ok(())
}

/// Returns once the API server serves brokkr's kinds. CRDs that are not there yet (applied
/// together with the controller, say) are waited for, looking every few seconds; any other
/// answer — an unreachable server, refused credentials — is an error at once.
async fn crds_served(client: &kube::Client) -> Result<()> {
    let brokers = kube::Api::<ClusterServiceBroker>::all(client.clone());
    let mut said = false;
    loop {
        match brokers
            .list(&kube::api::ListParams::default().limit(1))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                if !said {
                    warn!("waiting for brokkr's CRDs (brokkr crds | kubectl apply -f -)");
                    said = true;
                }
                tokio::time::sleep(CRD_RECHECK).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "cannot list ClusterServiceBrokers: is the API server reachable, and may \
                     this identity list them?",
                ));
            }
        }
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Kubernetes API server has not answered yet, or does not serve brokkr's CRDs yet",
        )
    }
}

async fn metrics_text(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &health.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
