//! What a broker can cost the controller, and what a tenant's broker can learn through it, run
//! against the fake API server and real local HTTP servers: a 120 MiB catalog is cut off at the
//! catalog limit while the server is still writing, a broker trickling its answer hits the
//! time limit, a catalog with more plans than the controller keeps is refused with nothing
//! written; a namespaced ServiceBroker's status never carries what the other end answered (its
//! status, error text or address) nor whether it answered at all (a closed port and a server
//! that is not a broker fail in the same words, neither sooner than the failure floor), and its
//! URL must pass the URL policy before any connection: loopback (also embedded in IPv6), a name
//! resolving to loopback and the metadata address 169.254.169.254 are refused by default,
//! loopback is used when the allow list says so.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use brokkr_controller::Context;
use brokkr_controller::resources;
use brokkr_fake_kube::FakeCluster;
use brokkr_test_support::{JSON_OK, RawServer, raw_server};
use serde_json::{Value, json};

const API: &str = "services.brokkr.dev/v1alpha1";
const MIB: usize = 1 << 20;

/// The fake API server with brokkr's kinds, the namespace `team-a`, and the controllers with
/// `change` applied to their context; stopped when dropped.
struct Cluster {
    fake: FakeCluster,
    controllers: tokio::task::JoinHandle<()>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controllers.abort();
    }
}

impl Cluster {
    async fn start(change: impl FnOnce(&mut Context)) -> Self {
        let fake = FakeCluster::start().await;
        for crd in resources::crds() {
            fake.add_crd(&crd);
        }
        fake.create(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
        );
        let mut ctx = Context::new(fake.client());
        change(&mut ctx);
        let controllers = tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()));
        Self { fake, controllers }
    }

    /// A ServiceBroker `name` in `team-a` at `url`.
    fn tenant_broker(&self, name: &str, url: &str) {
        self.fake
            .create(json!({"apiVersion": API, "kind": "ServiceBroker",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"url": url, "relistBehavior": "Manual"}}));
    }

    /// A ClusterServiceBroker `name` at `url`.
    fn cluster_broker(&self, name: &str, url: &str) {
        self.fake
            .create(json!({"apiVersion": API, "kind": "ClusterServiceBroker",
            "metadata": {"name": name}, "spec": {"url": url, "relistBehavior": "Manual"}}));
    }

    /// Waits up to 20 s for the Ready condition of a broker (`ns` none: a ClusterServiceBroker)
    /// to be set, and returns it.
    async fn ready(&self, ns: Option<&str>, name: &str) -> Value {
        let kind = if ns.is_some() {
            "ServiceBroker"
        } else {
            "ClusterServiceBroker"
        };
        for _ in 0..400 {
            if let Some(broker) = self.fake.get(API, kind, ns, name)
                && let Some(ready) = broker["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            {
                return ready.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for the Ready condition of {kind} {name}");
    }
}

/// A server whose `/v2/catalog` answers `status` with `body`; returns its URL.
async fn json_server(status: StatusCode, body: Value) -> String {
    let app = axum::Router::new().route(
        "/v2/catalog",
        get(move || {
            let body = body.clone();
            async move { (status, axum::Json(body)) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn allow_loopback(ctx: &mut Context) {
    ctx.brokers.namespaced_urls.allow("127.0.0.0/8").unwrap();
}

fn message(condition: &Value) -> &str {
    condition["message"].as_str().unwrap_or_default()
}

const NOT_OSB: &str = brokkr_controller::error::UNUSABLE;

#[tokio::test]
async fn a_120_mib_catalog_is_cut_off_at_the_limit_while_the_broker_still_writes() {
    let RawServer { url, sent, .. } =
        raw_server(JSON_OK, vec![b' '; 64 << 10], 120 * 16, Duration::ZERO).await;
    let cluster = Cluster::start(allow_loopback).await;
    cluster.cluster_broker("huge", &url);
    let ready = cluster.ready(None, "huge").await;
    assert_eq!(ready["reason"], "ErrorFetchingCatalog");
    // A platform admin's broker: the admin sees the size and the URL.
    assert!(
        message(&ready).contains("larger than the 8388608 bytes this client reads of a catalog")
            && message(&ready).contains(&url),
        "{ready}"
    );
    let written = sent.load(Ordering::SeqCst);
    assert!(
        written < 40 * MIB,
        "the broker could write {written} bytes: the controller read on past the limit"
    );

    // A tenant's broker: no size, no address.
    cluster.tenant_broker("huge", &url);
    let ready = cluster.ready(Some("team-a"), "huge").await;
    assert_eq!(ready["reason"], "ErrorFetchingCatalog");
    assert_eq!(message(&ready), NOT_OSB);
}

#[tokio::test]
async fn a_broker_trickling_its_catalog_is_cut_off_at_the_time_limit() {
    let RawServer { url, .. } =
        raw_server(JSON_OK, vec![b' '; 1], 1_000_000, Duration::from_millis(50)).await;
    let cluster = Cluster::start(|ctx| {
        allow_loopback(ctx);
        ctx.brokers.timeout = Duration::from_secs(2);
        ctx.brokers.failure_floor = Duration::from_secs(1);
    })
    .await;
    let started = std::time::Instant::now();
    cluster.tenant_broker("slow", &url);
    let ready = cluster.ready(Some("team-a"), "slow").await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(ready["reason"], "ErrorFetchingCatalog");
    assert_eq!(message(&ready), NOT_OSB);
    cluster.cluster_broker("slow", &url);
    let ready = cluster.ready(None, "slow").await;
    assert!(
        message(&ready).contains("did not answer in time"),
        "{ready}"
    );
}

#[tokio::test]
async fn a_catalog_with_more_plans_than_the_controller_keeps_is_refused_with_nothing_written() {
    let plans: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("plan-{i}"), "name": format!("p{i}"), "description": ""}))
        .collect();
    let url = json_server(
        StatusCode::OK,
        json!({"services": [{"id": "svc", "name": "db", "description": "", "bindable": true,
            "plans": plans}]}),
    )
    .await;
    let cluster = Cluster::start(allow_loopback).await;
    cluster.tenant_broker("many", &url);
    let ready = cluster.ready(Some("team-a"), "many").await;
    assert_eq!(ready["reason"], "ErrorCatalogTooLarge");
    assert_eq!(
        message(&ready),
        "the catalog lists 1 services and 1001 plans; this controller keeps at most 200 \
         services and 1000 plans of one broker, so nothing of it was written"
    );
    assert!(cluster.fake.list(API, "ServicePlan").is_empty());
    assert!(cluster.fake.list(API, "ServiceClass").is_empty());

    // The limits are the controller's to set: here, 2 services.
    let services: Vec<Value> = (0..3)
        .map(|i| json!({"id": format!("svc-{i}"), "name": format!("s{i}"), "description": "",
            "bindable": true, "plans": [{"id": format!("plan-{i}"), "name": "p", "description": ""}]}))
        .collect();
    let url = json_server(StatusCode::OK, json!({"services": services})).await;
    let cluster = Cluster::start(|ctx| {
        allow_loopback(ctx);
        ctx.brokers.max_services = 2;
    })
    .await;
    cluster.tenant_broker("three", &url);
    let ready = cluster.ready(Some("team-a"), "three").await;
    assert_eq!(ready["reason"], "ErrorCatalogTooLarge", "{ready}");
    assert!(
        message(&ready).starts_with(
            "the catalog lists 3 services and 3 plans; this controller keeps at most 2 services"
        ),
        "{ready}"
    );
    assert!(cluster.fake.list(API, "ServiceClass").is_empty());
}

#[tokio::test]
async fn a_tenants_broker_status_never_echoes_what_the_other_end_answered() {
    let url = json_server(
        StatusCode::UNAUTHORIZED,
        json!({"error": "InternalAuthFailure",
               "description": "etcd member 10.0.0.12:2379 refused the client certificate"}),
    )
    .await;
    let cluster = Cluster::start(allow_loopback).await;
    cluster.tenant_broker("probe", &url);
    let ready = cluster.ready(Some("team-a"), "probe").await;
    assert_eq!(ready["reason"], "ErrorFetchingCatalog");
    assert_eq!(message(&ready), NOT_OSB);
    let status = cluster
        .fake
        .get(API, "ServiceBroker", Some("team-a"), "probe")
        .unwrap()["status"]
        .to_string();
    for leak in [
        "etcd",
        "10.0.0.12",
        "401",
        "Unauthorized",
        "InternalAuthFailure",
        &url,
    ] {
        assert!(!status.contains(leak), "{leak:?} in {status}");
    }

    // Nothing listens: the same words, without the address or the system's reason.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    cluster.tenant_broker("gone", &closed);
    let ready = cluster.ready(Some("team-a"), "gone").await;
    assert_eq!(ready["reason"], "ErrorFetchingCatalog");
    assert_eq!(message(&ready), NOT_OSB);

    // A platform admin's broker keeps the broker's words.
    cluster.cluster_broker("probe", &url);
    let ready = cluster.ready(None, "probe").await;
    assert!(
        message(&ready).contains("refused the client certificate"),
        "{ready}"
    );
}

#[tokio::test]
async fn a_namespaced_broker_on_loopback_is_refused_by_default_before_any_connection() {
    let RawServer { url, requests, .. } = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n",
        vec![b' '; 15],
        1,
        Duration::ZERO,
    )
    .await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    // Eight brokers in one namespace: more than a namespace may have by default.
    let cluster = Cluster::start(|ctx| ctx.brokers.namespaces.max_brokers = 8).await;
    let refused = "the broker's URL is not allowed: the controller's policy for namespaced \
                   brokers refuses its address (loopback, link-local, the controller's own, or \
                   denied by the platform admin)";
    let targets = [
        ("loopback", url.clone()),
        ("named", format!("http://localhost:{port}")),
        ("metadata", "http://169.254.169.254/latest".to_owned()),
        ("ipv6", format!("http://[::1]:{port}")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}")),
        ("compatible", format!("http://[::127.0.0.1]:{port}")),
        ("nat64", format!("http://[64:ff9b::7f00:1]:{port}")),
        ("sixtofour", format!("http://[2002:7f00:1::]:{port}")),
    ];
    for (name, target) in &targets {
        cluster.tenant_broker(name, target);
    }
    for (name, _) in &targets {
        let ready = cluster.ready(Some("team-a"), name).await;
        assert_eq!(
            ready["reason"], "ErrorBrokerURLNotAllowed",
            "{name}: {ready}"
        );
        assert_eq!(message(&ready), refused, "{name}");
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        0,
        "a request reached the server"
    );

    // A ClusterServiceBroker is a platform admin's: not subject to the policy.
    cluster.cluster_broker("admins", &url);
    let ready = cluster.ready(None, "admins").await;
    assert_eq!(ready["reason"], "ErrorFetchingCatalog", "{ready}");
    assert!(
        requests.load(Ordering::SeqCst) >= 1,
        "the admin's broker was called"
    );
}

#[tokio::test]
async fn the_allow_list_lets_a_namespaced_broker_use_loopback() {
    let url = json_server(
        StatusCode::OK,
        json!({"services": [{"id": "svc", "name": "db", "description": "", "bindable": true,
            "plans": [{"id": "small", "name": "small", "description": ""}]}]}),
    )
    .await;
    let cluster = Cluster::start(|ctx| {
        ctx.brokers.namespaced_urls.allow("127.0.0.1").unwrap();
    })
    .await;
    cluster.tenant_broker("own", &url);
    let ready = cluster.ready(Some("team-a"), "own").await;
    assert_eq!(ready["reason"], "FetchedCatalog", "{ready}");
    assert!(
        cluster
            .fake
            .get(API, "ServicePlan", Some("team-a"), "small")
            .is_some()
    );
}

#[tokio::test]
async fn a_tenants_broker_fails_in_the_same_words_and_no_sooner_whatever_is_at_its_url() {
    let not_osb = json_server(
        StatusCode::NOT_FOUND,
        json!({"description": "no such page"}),
    )
    .await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let floor = Duration::from_secs(2);
    let cluster = Cluster::start(|ctx| {
        allow_loopback(ctx);
        ctx.brokers.failure_floor = floor;
    })
    .await;
    let mut seen = Vec::new();
    for (name, url) in [("open", &not_osb), ("closed", &closed)] {
        let started = std::time::Instant::now();
        cluster.tenant_broker(name, url);
        let ready = cluster.ready(Some("team-a"), name).await;
        let took = started.elapsed();
        assert!(took >= floor, "{name}: written after {took:?}");
        seen.push((ready["reason"].clone(), message(&ready).to_owned()));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].1, NOT_OSB);

    // A broker that works is not held back.
    let url = json_server(
        StatusCode::OK,
        json!({"services": [{"id": "svc", "name": "db", "description": "", "bindable": true,
            "plans": [{"id": "small", "name": "small", "description": ""}]}]}),
    )
    .await;
    let started = std::time::Instant::now();
    cluster.tenant_broker("works", &url);
    let ready = cluster.ready(Some("team-a"), "works").await;
    assert_eq!(ready["reason"], "FetchedCatalog", "{ready}");
    assert!(started.elapsed() < floor, "{:?}", started.elapsed());
}
