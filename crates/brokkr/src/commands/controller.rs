//! `brokkr controller`: brokkr's Kubernetes controllers against the cluster that KUBECONFIG (or
//! the in-cluster configuration) names, as kubectl finds it; one replica at a time reconciles,
//! elected on a coordination.k8s.io Lease; `/healthz`, `/readyz` and Prometheus `/metrics`.
//! What a broker may cost it (body sizes, time, catalog size), what the brokers of one
//! namespace may list together, and where a namespaced ServiceBroker may point it (the URL
//! policy) are set by flags.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use brokkr_controller::Scope;
use brokkr_controller::broker_policy::BrokerPolicy;
use brokkr_controller::broker_policy::NamespaceBounds;
use brokkr_controller::lease::LeaseLock;
use brokkr_controller::metrics::Metrics;
use brokkr_controller::resources::ClusterServiceBroker;
use brokkr_controller::url_policy::{API_SERVER_REREAD, UrlPolicy};
use brokkr_osb::client::BodyLimits;
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
    /// How long after a namespace's deletion began its ServiceInstances and ServiceBindings
    /// still waiting for their broker (one that never answers) are released without it, so
    /// that the namespace ends; what the broker may keep is logged, counted and said in an
    /// Event about the Namespace.
    #[arg(long, env = "BROKKR_NAMESPACE_DELETION_TIMEOUT", default_value = "1h", value_parser = crate::config::parse_duration)]
    namespace_deletion_timeout: Duration,
    /// The least time between two rotations of one ServiceBinding: a rotation asked for sooner
    /// (by the annotation, or by a broker's `renew_before`) waits until then; a broker that
    /// asks for more gets a Warning Event.
    #[arg(long, env = "BROKKR_MIN_ROTATION_INTERVAL", default_value = "1m", value_parser = crate::config::parse_duration)]
    min_rotation_interval: Duration,
    /// The most bytes read of a broker's catalog (`8Mi`, `512Ki` or a number of bytes).
    #[arg(long, env = "BROKKR_BROKER_MAX_CATALOG_BYTES", default_value = "8Mi", value_parser = parse_size)]
    broker_max_catalog_bytes: u64,
    /// The most bytes read of a broker's other answers (operations, bindings with their
    /// credentials, fetched instances and bindings).
    #[arg(long, env = "BROKKR_BROKER_MAX_ANSWER_BYTES", default_value = "1Mi", value_parser = parse_size)]
    broker_max_answer_bytes: u64,
    /// The most bytes read of a broker's error answer (a longer one counts as an error of its
    /// status without a description).
    #[arg(long, env = "BROKKR_BROKER_MAX_ERROR_BYTES", default_value = "64Ki", value_parser = parse_size)]
    broker_max_error_bytes: u64,
    /// The time limit of one call to a broker, its whole answer included.
    #[arg(long, env = "BROKKR_BROKER_TIMEOUT", default_value = "60s", value_parser = crate::config::parse_duration)]
    broker_timeout: Duration,
    /// The most service offerings one broker's catalog may list; a larger catalog is refused.
    #[arg(long, env = "BROKKR_MAX_CATALOG_SERVICES", default_value_t = BrokerPolicy::DEFAULT_MAX_SERVICES)]
    max_catalog_services: usize,
    /// The most plans one broker's catalog may list (over all its services).
    #[arg(long, env = "BROKKR_MAX_CATALOG_PLANS", default_value_t = BrokerPolicy::DEFAULT_MAX_PLANS)]
    max_catalog_plans: usize,
    /// How many catalogs the controller reads and writes at once (each may hold up to
    /// --broker-max-catalog-bytes in memory).
    #[arg(long, env = "BROKKR_MAX_CONCURRENT_CATALOGS", default_value = "4", value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_catalogs: u16,
    /// The most ServiceBrokers served in one namespace: those beyond (by creation time, then
    /// name) are refused before their catalog is fetched.
    #[arg(long, env = "BROKKR_MAX_BROKERS_PER_NAMESPACE", default_value_t = NamespaceBounds::DEFAULT_MAX_BROKERS)]
    max_brokers_per_namespace: usize,
    /// The most ServiceClasses the ServiceBrokers of one namespace may list together.
    #[arg(long, env = "BROKKR_MAX_CATALOG_CLASSES_PER_NAMESPACE", default_value_t = NamespaceBounds::DEFAULT_MAX_CLASSES)]
    max_catalog_classes_per_namespace: usize,
    /// The most ServicePlans the ServiceBrokers of one namespace may list together.
    #[arg(long, env = "BROKKR_MAX_CATALOG_PLANS_PER_NAMESPACE", default_value_t = NamespaceBounds::DEFAULT_MAX_PLANS)]
    max_catalog_plans_per_namespace: usize,
    /// Networks (`10.0.0.0/8`), addresses or host names namespaced ServiceBrokers may use
    /// although the default policy refuses them (loopback, link-local, the controller's own
    /// addresses); comma-separated or repeated.
    #[arg(long, env = "BROKKR_BROKER_URL_ALLOW", value_delimiter = ',')]
    broker_url_allow: Vec<String>,
    /// Networks or addresses namespaced ServiceBrokers may never use, whatever
    /// --broker-url-allow says; comma-separated or repeated.
    #[arg(long, env = "BROKKR_BROKER_URL_DENY", value_delimiter = ',')]
    broker_url_deny: Vec<String>,
    /// This pod's IP addresses, refused to namespaced brokers (in a Deployment, from the
    /// downward API's `status.podIPs`); comma-separated.
    #[arg(long, env = "POD_IPS", value_delimiter = ',')]
    pod_ips: Vec<IpAddr>,
    /// Serve only this namespace (its brokers, instances, bindings, usages and servicebinding.io
    /// bindings; ClusterServiceBrokers are left to the cluster's controller), with a Role in
    /// it; repeated or comma-separated, one set of controllers per namespace [default: every
    /// namespace].
    #[arg(
        long = "namespace",
        short = 'n',
        env = "BROKKR_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// Leave these namespaces to controllers of their own (with --namespace); comma-separated
    /// or repeated.
    #[arg(
        long = "exclude-namespace",
        env = "BROKKR_EXCLUDE_NAMESPACES",
        value_delimiter = ',',
        conflicts_with = "namespaces"
    )]
    exclude_namespaces: Vec<String>,
    /// How many objects of one kind are reconciled at once.
    #[arg(long, env = "BROKKR_CONCURRENCY", default_value_t = brokkr_controller::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// The most requests per second sent to the Kubernetes API server (watches included); more
    /// wait their turn.
    #[arg(long, env = "BROKKR_KUBE_API_QPS", default_value = "500", value_parser = clap::value_parser!(u64).range(1..))]
    kube_api_qps: u64,
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
    let api_server = config.cluster_url.host().map(str::to_owned);
    let brokers = broker_policy(&args, api_server.as_deref()).await?;
    let client = kube::client::ClientBuilder::try_from(config)
        .context("cannot build a Kubernetes client")?
        .with_layer(&tower::limit::RateLimitLayer::new(
            args.kube_api_qps,
            Duration::from_secs(1),
        ))
        .build();
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
    // The addresses the API server advertises are refused to namespaced brokers, as they are
    // now and as they change.
    let advertised = brokers
        .namespaced_urls
        .follow_api_server(client.clone(), API_SERVER_REREAD)
        .await;
    let user_info = brokkr_controller::user_info::Guard::new(client.clone());
    let context = |scope: Scope| brokkr_controller::Context {
        metrics: metrics.clone(),
        cluster_id: cluster_id.clone(),
        wait_timeout: args.wait_timeout,
        namespace_deletion_timeout: args.namespace_deletion_timeout,
        min_rotation_interval: args.min_rotation_interval,
        brokers: brokers.clone(),
        scope,
        concurrency: args.concurrency,
        user_info: user_info.clone(),
        ..brokkr_controller::Context::new(client.clone())
    };
    let scopes = if args.namespaces.is_empty() {
        vec![Scope::Cluster {
            except: args.exclude_namespaces.clone(),
        }]
    } else {
        args.namespaces
            .iter()
            .cloned()
            .map(Scope::Namespace)
            .collect()
    };
    info!(scopes = ?scopes, concurrency = args.concurrency, kube_api_qps = args.kube_api_qps, "serving");
    let runs: Vec<_> = scopes
        .into_iter()
        .map(|scope| brokkr_controller::run(context(scope), shutdown.clone()))
        .collect();
    // Whose identity is forwarded to brokers: only one the API server checked.
    let guard = tokio::spawn(user_info.watch(metrics.clone()));
    let controllers = futures::future::join_all(runs).map(move |_| {
        guard.abort();
        advertised.abort();
    });
    if args.no_leader_election {
        metrics.set_leader(true);
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
        metrics.set_leader(true);
        let held = lock.hold(controllers).await;
        metrics.set_leader(false);
        held?;
    }
    info!("controllers stopped");
    http.abort();
    Ok(())
}

/// The controller's runtime: one thread. Its reconciles wait on the API server and brokers,
/// not on a CPU; on more threads every watch event and response that wakes a task on another
/// worker costs a wake-up across threads, which made up much of its CPU
/// (docs/benchmarks.md, "Controllers at scale").
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Keeps the controller's memory in small pages; called before the runtime starts. mimalloc, the
/// allocator the broker's CPU gains from, asks Linux for transparent huge pages where it may, and
/// a 2 MiB page holding a few live objects is 2 MiB resident: with 5,000 instances and 5,000
/// bindings cached, the controller was 106 MiB resident with them and 92 MiB without
/// (docs/benchmarks.md, "Controllers at scale"). The broker keeps them. Where the kernel refuses
/// (before Linux 3.15), the controller runs as it would have, only larger.
pub fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// The bounds of broker calls and the URL policy of namespaced brokers, from the flags. The
/// policy refuses, besides its defaults, the controller's own addresses: its pod's IPs, its
/// listening socket, and the API server's addresses in its configuration (those the API server
/// advertises are added once the client is made, [`UrlPolicy::follow_api_server`]).
async fn broker_policy(args: &ControllerArgs, api_server: Option<&str>) -> Result<BrokerPolicy> {
    let mut urls = UrlPolicy::default();
    for entry in &args.broker_url_allow {
        urls.allow(entry).context("--broker-url-allow")?;
    }
    for entry in &args.broker_url_deny {
        urls.deny(entry).context("--broker-url-deny")?;
    }
    for ip in &args.pod_ips {
        urls.own_address(*ip);
    }
    urls.own_socket(args.listen);
    if let Some(host) = api_server {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        // Best effort: a name that does not resolve here is not one the controller reaches.
        if let Ok(found) = tokio::net::lookup_host((host, 0)).await {
            for address in found {
                urls.own_address(address.ip());
            }
        }
    }
    Ok(BrokerPolicy {
        body_limits: BodyLimits {
            catalog: args.broker_max_catalog_bytes,
            answer: args.broker_max_answer_bytes,
            error: args.broker_max_error_bytes,
        },
        timeout: args.broker_timeout,
        max_services: args.max_catalog_services,
        max_plans: args.max_catalog_plans,
        namespaced_urls: urls,
        catalog_permits: std::sync::Arc::new(tokio::sync::Semaphore::new(usize::from(
            args.max_concurrent_catalogs,
        ))),
        namespaces: NamespaceBounds {
            max_brokers: args.max_brokers_per_namespace,
            max_classes: args.max_catalog_classes_per_namespace,
            max_plans: args.max_catalog_plans_per_namespace,
        },
        ..BrokerPolicy::default()
    })
}

/// A size in bytes: a number, or a number with `Ki`, `Mi` or `Gi` (optionally followed by `B`).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let number = text.trim_end_matches('B');
    let (digits, unit) = match number.len().checked_sub(2).map(|at| number.split_at(at)) {
        Some((digits, "Ki")) => (digits, 1 << 10),
        Some((digits, "Mi")) => (digits, 1 << 20),
        Some((digits, "Gi")) => (digits, 1 << 30),
        _ => (number, 1),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is not a size such as 8Mi, 512Ki or 65536"))
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

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_are_bytes_or_binary_multiples() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64Ki"), Ok(65536));
        assert_eq!(parse_size("8Mi"), Ok(8 << 20));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert!(parse_size("8MB").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
    }
}
