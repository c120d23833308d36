//! A tenant's namespaced ServiceBrokers on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test tenancy_brokers_e2e -- --ignored
//! --test-threads=1`). The tests act as the tenant: a user impersonated by kubectl, bound to the
//! built-in `edit` ClusterRole in its namespace, to which deploy/base/tenant-rbac.yaml adds
//! brokkr's kinds. What they check: a broker pointed at the API server tells the tenant
//! only that it could not be used; the cloud metadata address is refused by the URL policy, and
//! so is the address the API server advertises (its EndpointSlices, or on 1.20 its Endpoints, of
//! the Service `default/kubernetes`, as the cluster has them); a loopback broker is refused by a controller with the
//! default policy, also written as an IPv4-compatible, NAT64 or 6to4 IPv6 address; a closed port
//! and a server that is not a broker look the same to the tenant, in words and in time; a
//! 120 MiB catalog and a catalog of too many plans are refused without the controller falling
//! over; a real broker lists its catalog into the tenant's namespace, readable by the tenant;
//! a hostile broker's 1,000,000-character description and 500,000-character `operation` and
//! `dashboard_url` leave the tenant's ServiceInstances small, failed or mitigated; brokers
//! beyond the namespace's bounds of brokers and plans are refused while the earlier ones keep
//! working; and 22 brokers of 1,000 plans of 8 KB in one namespace keep the controller within
//! `deploy/`'s memory limit while another tenant's instances are Ready within 2 s.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use brokkr_test_support::{JSON_OK, RawServer, raw_server};
use serde_json::{Value, json};
use support::cluster::*;
use support::*;

/// A namespace whose editor (Kubernetes' `edit` role, to which deploy/base aggregates brokkr's
/// kinds) the tests act as.
async fn tenant_namespace() -> Namespace {
    let namespace = Namespace::new();
    Tenant::edit(namespace.as_str()).await;
    namespace
}

/// kubectl as the editor of `ns`.
fn as_tenant(ns: &str, args: &[&str], stdin: &str) -> Result<String, String> {
    Tenant::of(ns).try_kubectl(args, Some(stdin))
}

/// The tenant writes a ServiceBroker `name` at `url` (with `extra` spec lines).
fn tenant_broker(ns: &str, name: &str, url: &str, extra: &str) {
    as_tenant(
        ns,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBroker
metadata: {{name: {name}, namespace: {ns}}}
spec:
  url: {url}
  relistBehavior: Manual
{extra}"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The broker's Ready condition once it has `reason`, read as the tenant.
async fn tenant_sees(ns: &str, name: &str, reason: &str) -> (Value, String) {
    eventually(
        &format!("ServiceBroker {name}: Ready {reason}"),
        async || {
            let out = as_tenant(ns, &["get", "servicebroker", name, "-o", "json"], "").ok()?;
            let broker: Value = serde_json::from_str(&out).ok()?;
            let ready = broker["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready" && c["reason"] == reason)?
                .clone();
            Some((ready, broker["status"].to_string()))
        },
    )
    .await
}

const SI: &str = "serviceinstances.services.brokkr.dev";

/// What a namespaced broker's status says of any failure to use it.
const UNUSABLE: &str = "the broker could not be used (the controller's log has the details)";
/// How long after an attempt a namespaced broker's failure is written, at the soonest (the
/// connect timeout).
const FAILURE_FLOOR: Duration = Duration::from_secs(10);

/// A controller with the default URL policy (the harness's allows loopback), its log in `log`.
/// Starting (and stopping) the harness's applies brokkr's CRDs; run these tests one at a time.
fn default_policy_controller(log: &tempfile::NamedTempFile) -> Process {
    drop(Controller::start());
    Process(
        Command::new(BIN)
            .args(["controller", "--no-leader-election"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .env("KUBECONFIG", kubeconfig())
            .env_remove("BROKKR_BROKER_URL_ALLOW")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start brokkr controller"),
    )
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_broker_pointed_at_the_api_server_or_the_metadata_address_learns_nothing() {
    // The test harness's controller allows loopback, where some API servers run.
    let _controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let server = kubectl(
        &[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ],
        "",
    );

    // A cluster whose API server listens on an address it advertises (not loopback, which the
    // harness allows): refused before any connection, with TLS verification or without.
    let host = reqwest::Url::parse(&server).unwrap();
    let host = host.host_str().unwrap_or_default();
    if !(host == "localhost" || host.starts_with("127.") || host == "[::1]") {
        for (name, tls) in [
            ("apiserver", "  insecureSkipTLSVerify: true\n"),
            ("apiserver-tls", ""),
        ] {
            tenant_broker(ns, name, &server, tls);
            let (ready, _) = tenant_sees(ns, name, "ErrorBrokerURLNotAllowed").await;
            assert!(
                ready["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("the broker's URL is not allowed"),
                "{ready}"
            );
        }
    } else {
        api_server_on_loopback_learns_nothing(ns, &server).await;
    }

    // The cloud metadata address: refused before any connection.
    tenant_broker(ns, "metadata", "http://169.254.169.254/latest", "");
    let (ready, _) = tenant_sees(ns, "metadata", "ErrorBrokerURLNotAllowed").await;
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .starts_with("the broker's URL is not allowed"),
        "{ready}"
    );
}

/// A tenant's broker at an API server on loopback (which the harness allows) reaches it, and
/// learns nothing from its answer or its handshake.
async fn api_server_on_loopback_learns_nothing(ns: &str, server: &str) {
    // Without TLS verification the API server answers: 401/403 with its own words.
    tenant_broker(ns, "apiserver", server, "  insecureSkipTLSVerify: true\n");
    let (ready, status) = tenant_sees(ns, "apiserver", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], UNUSABLE, "{ready}");
    for leak in [
        "403",
        "401",
        "Forbidden",
        "Unauthorized",
        "anonymous",
        "/v2/catalog",
        server,
    ] {
        assert!(
            !status.contains(leak),
            "{leak:?} in the tenant's status: {status}"
        );
    }
    // With TLS verification, the handshake fails: the same words, nothing more.
    tenant_broker(ns, "apiserver-tls", server, "");
    let (ready, status) = tenant_sees(ns, "apiserver-tls", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], UNUSABLE, "{ready}");
    assert!(!status.contains("certificate"), "{status}");
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_controller_with_the_default_policy_refuses_a_tenant_broker_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let log = tempfile::NamedTempFile::new().unwrap();
    let _controller = default_policy_controller(&log);
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    tenant_broker(ns, "loopback", &broker_url, "");
    let (ready, status) = tenant_sees(ns, "loopback", "ErrorBrokerURLNotAllowed").await;
    assert!(!status.contains("127.0.0.1:"), "{status}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("policy for namespaced brokers"),
        "{ready}"
    );
    // The admin's log says which broker and which address.
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        text.contains("loopback") && text.contains("may not connect"),
        "{text}"
    );
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_broker_with_a_huge_or_crowded_catalog_is_refused_and_a_real_one_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let _controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();

    // 120 MiB of catalog, without a Content-Length.
    let RawServer {
        url: huge, sent, ..
    } = raw_server(JSON_OK, vec![b' '; 1 << 20], 120, Duration::ZERO).await;
    tenant_broker(ns, "huge", &huge, "");
    let (ready, _) = tenant_sees(ns, "huge", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], UNUSABLE);
    let written = sent.load(Ordering::SeqCst);
    assert!(written < 40 << 20, "the broker wrote {written} bytes");

    // 1,001 plans.
    let crowded = catalog_of("crowded", 1001, 0).await;
    tenant_broker(ns, "crowded", &crowded, "");
    let (ready, _) = tenant_sees(ns, "crowded", "ErrorCatalogTooLarge").await;
    assert!(
        ready["message"].as_str().unwrap().contains("1001 plans"),
        "{ready}"
    );
    let plans = as_tenant(ns, &["get", "serviceplans", "-o", "name"], "").unwrap();
    assert!(plans.trim().is_empty(), "{plans}");

    // A real broker, with credentials the tenant keeps in its namespace.
    as_tenant(
        ns,
        &[
            "create",
            "secret",
            "generic",
            "broker-auth",
            "--from-literal=username=platform",
            "--from-literal=password=s3cret",
        ],
        "",
    )
    .unwrap();
    tenant_broker(
        ns,
        "real",
        &broker_url,
        "  authInfo: {basic: {secretRef: {name: broker-auth}}}\n",
    );
    tenant_sees(ns, "real", "FetchedCatalog").await;
    let plans = as_tenant(ns, &["get", "serviceplans", "-o", "name"], "").unwrap();
    assert!(!plans.trim().is_empty(), "the tenant sees its plans");
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_broker_at_loopback_embedded_in_an_ipv6_address_is_refused() {
    // Counts one byte a request.
    let RawServer { url, sent, .. } = raw_server(
        "HTTP/1.1 404 Not Found\r\ncontent-length: 1\r\n\r\n",
        b" ".to_vec(),
        1,
        Duration::ZERO,
    )
    .await;
    let port = url.rsplit(':').next().unwrap().to_owned();
    // The default policy: an allow list of 127.0.0.0/8 would re-allow them, as it does
    // 127.0.0.1.
    let log = tempfile::NamedTempFile::new().unwrap();
    let _controller = default_policy_controller(&log);
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let forms = [
        ("compatible", format!("http://[::127.0.0.1]:{port}")),
        ("nat64", format!("http://[64:ff9b::7f00:1]:{port}")),
        ("nat64-local", format!("http://[64:ff9b:1::7f00:1]:{port}")),
        ("sixtofour", format!("http://[2002:7f00:1::]:{port}")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}")),
    ];
    for (name, url) in &forms {
        tenant_broker(ns, name, url, "");
    }
    for (name, _) in &forms {
        let (ready, status) = tenant_sees(ns, name, "ErrorBrokerURLNotAllowed").await;
        assert!(
            ready["message"]
                .as_str()
                .unwrap()
                .contains("policy for namespaced brokers"),
            "{name}: {ready}"
        );
        assert!(!status.contains(&port), "{name}: {status}");
    }
    assert_eq!(sent.load(Ordering::SeqCst), 0);
}

/// Whether the API server serves EndpointSlices at `discovery.k8s.io/v1` (1.21 and later).
fn endpoint_slices_v1_served() -> bool {
    try_kubectl(&["api-versions"], None)
        .is_ok_and(|out| out.lines().any(|l| l == "discovery.k8s.io/v1"))
}

/// The addresses the API server advertises, as the cluster has them (read as its admin): its
/// EndpointSlices of the Service `default/kubernetes` where `discovery.k8s.io/v1` is served,
/// else its Endpoints `default/kubernetes` — where the controller reads them.
fn advertised_addresses() -> Vec<String> {
    let read = |args: &[&str]| -> Value {
        try_kubectl(args, None)
            .ok()
            .and_then(|out| serde_json::from_str(&out).ok())
            .unwrap_or_default()
    };
    let strings = |values: Vec<&Value>| -> Vec<String> {
        values
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    if endpoint_slices_v1_served() {
        let slices = read(&[
            "-n",
            "default",
            "get",
            "endpointslices.v1.discovery.k8s.io",
            "-l",
            "kubernetes.io/service-name=kubernetes",
            "-o",
            "json",
        ]);
        let items = slices["items"].as_array().cloned().unwrap_or_default();
        strings(
            items
                .iter()
                .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
                .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
                .collect(),
        )
    } else {
        let endpoints = read(&[
            "-n",
            "default",
            "get",
            "endpoints",
            "kubernetes",
            "-o",
            "json",
        ]);
        let subsets = endpoints["subsets"].as_array().cloned().unwrap_or_default();
        strings(
            subsets
                .iter()
                .flat_map(|s| s["addresses"].as_array().into_iter().flatten())
                .map(|a| &a["ip"])
                .collect(),
        )
    }
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_broker_at_an_address_the_api_server_advertises_is_refused() {
    // The address the cluster really advertises, as its endpoint reconciler keeps it (a test
    // that wrote its own would race that reconciler). How the controller follows the addresses
    // as they change is tested against the fake API server, which the test owns
    // (crates/brokkr-controller/tests/api_server_addresses.rs).
    let advertised = advertised_addresses();
    // The harness's controller allows loopback (its brokers run there): an advertised loopback
    // address says nothing of the policy.
    let Some(address) = advertised.iter().find(|a| {
        a.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| !ip.to_canonical().is_loopback())
    }) else {
        eprintln!(
            "skipped: the API server advertises no address but loopback ({advertised:?}: an \
             API server without its endpoint reconciler, or on loopback alone)"
        );
        return;
    };
    let controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let host = if address.contains(':') {
        format!("[{address}]")
    } else {
        address.clone()
    };
    tenant_broker(ns, "advertised", &format!("https://{host}:443"), "");
    let (ready, status) = tenant_sees(ns, "advertised", "ErrorBrokerURLNotAllowed").await;
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("policy for namespaced brokers"),
        "{ready}"
    );
    assert!(!status.contains(address.as_str()), "{status}");
    // The controller read them where this server serves them: EndpointSlices where
    // discovery.k8s.io/v1 is served (never the Endpoints, deprecated from 1.33), else Endpoints.
    let from = if endpoint_slices_v1_served() {
        "EndpointSlices"
    } else {
        "Endpoints"
    };
    let log = controller.log();
    assert!(
        log.lines()
            .any(|l| l.contains("the addresses the API server advertises")
                && l.contains(&format!("from={from}"))
                && l.contains(address.as_str())),
        "{log}"
    );
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_closed_port_and_a_server_that_is_not_a_broker_look_the_same_to_a_tenant() {
    // Both on loopback, which the harness's controller allows: the policy lets the
    // connections through, and what is tested is what the status tells of them.
    let body = br#"{"error":"NotFound","description":"no such path on redis"}"#;
    let (open, answered) = json_server("404 Not Found", body.to_vec()).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let _controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let mut seen = Vec::new();
    for (name, url) in [("open", &open), ("closed", &closed)] {
        let started = std::time::Instant::now();
        tenant_broker(ns, name, url, "");
        let (ready, status) = tenant_sees(ns, name, "ErrorFetchingCatalog").await;
        let took = started.elapsed();
        assert!(
            took >= FAILURE_FLOOR,
            "{name}: the status came after {took:?}"
        );
        for leak in ["404", "NotFound", "redis", "refused", url.as_str()] {
            assert!(!status.contains(leak), "{name}: {leak:?} in {status}");
        }
        seen.push((ready["reason"].clone(), ready["message"].clone()));
    }
    assert!(
        answered.load(Ordering::SeqCst) >= 1,
        "the open port was asked"
    );
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].1, UNUSABLE);
}

/// A broker on loopback with one service (`hostile`, plan `p`). Provisions of the instance
/// `described` are accepted and fail with a description of 1,000,000 characters; any other
/// provision is accepted with an `operation` and a `dashboard_url` of 500,000 characters each.
/// Deprovisions succeed. Returns its URL and the count of polls.
async fn hostile_broker() -> (String, Arc<AtomicUsize>) {
    use axum::Json;
    use axum::extract::Path;
    use axum::http::StatusCode;
    use axum::routing::{get, put};
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = polls.clone();
    let catalog = json!({"services": [{"id": "hostile-svc", "name": "hostile", "description": "",
        "bindable": false, "plans": [{"id": "hostile-plan", "name": "p", "description": ""}]}]});
    let app = axum::Router::new()
        .route("/v2/catalog", get(move || async move { Json(catalog) }))
        .route(
            "/v2/service_instances/{id}",
            put(|Path(id): Path<String>| async move {
                let body = if id == "described" {
                    json!({"operation": "op"})
                } else {
                    json!({"operation": "o".repeat(500_000),
                        "dashboard_url": format!("https://dash.example.com/{}", "d".repeat(500_000))})
                };
                (StatusCode::ACCEPTED, Json(body))
            })
            .delete(|| async { Json(json!({})) }),
        )
        .route(
            "/v2/service_instances/{id}/last_operation",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Json(json!({"state": "failed", "description": "x".repeat(1_000_000)})) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, polls)
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_hostile_brokers_huge_texts_leave_the_tenants_instances_small() {
    let (url, polls) = hostile_broker().await;
    let _controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    tenant_broker(ns, "hostile", &url, "");
    tenant_sees(ns, "hostile", "FetchedCatalog").await;
    let instance = |name: &str| {
        as_tenant(
            ns,
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: {name}, namespace: {ns}}}
spec:
  serviceClassExternalName: hostile
  servicePlanExternalName: p
  externalID: {name}
"
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    };
    // The instance as the tenant reads it, and its size.
    let read = |name: &str| {
        let out = as_tenant(ns, &["get", "serviceinstance", name, "-o", "json"], "").unwrap();
        (serde_json::from_str::<Value>(&out).unwrap(), out.len())
    };

    // A provision that fails with a description of 1,000,000 characters: the orphan is
    // mitigated and the instance stays failed, the description cut at 1,024 characters.
    instance("described");
    let failed = condition(
        ns,
        "serviceinstance",
        "described",
        "Failed",
        "ProvisionCallFailed",
    )
    .await;
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.starts_with("Provision failed: xxx"),
        "{}",
        &message[..80]
    );
    assert!(
        message.ends_with("x…"),
        "{}",
        &message[message.len() - 80..]
    );
    assert_eq!(message.chars().count(), "Provision failed: ".len() + 1025);
    condition(
        ns,
        "serviceinstance",
        "described",
        "Ready",
        "OrphanMitigationSuccessful",
    )
    .await;
    let (described, size) = read("described");
    assert!(size < 16 << 10, "an instance of {size} bytes");
    assert!(polls.load(Ordering::SeqCst) >= 1);

    // A 202 with an operation and a dashboard URL of 500,000 characters: not a valid answer,
    // the orphan is mitigated, nothing of it is kept, and it is never polled.
    let polled = polls.load(Ordering::SeqCst);
    instance("huge");
    let ready = condition(
        ns,
        "serviceinstance",
        "huge",
        "Ready",
        "OrphanMitigationSuccessful",
    )
    .await;
    let (huge, size) = read("huge");
    assert!(size < 16 << 10, "an instance of {size} bytes");
    assert!(
        huge["status"].get("dashboardURL").is_none(),
        "{}",
        huge["status"]
    );
    assert!(
        huge["status"].get("lastOperation").is_none(),
        "{}",
        huge["status"]
    );
    assert_eq!(
        polls.load(Ordering::SeqCst),
        polled,
        "the operation is never polled"
    );
    let events = as_tenant(
        ns,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=huge",
            "-o",
            "json",
        ],
        "",
    )
    .unwrap();
    // Refused as an answer that is not valid OSB, and mitigated as one; a namespaced broker's
    // tenant is told no more than that the broker could not be used (the log says why).
    assert!(
        events.contains("StartingInstanceOrphanMitigation") && events.contains(UNUSABLE),
        "{ready} {events}"
    );
    assert!(described["status"].get("dashboardURL").is_none());

    // Both go when deleted: the broker deprovisions.
    as_tenant(
        ns,
        &[
            "delete",
            "serviceinstance",
            "described",
            "huge",
            "--wait=true",
            "--timeout=60s",
        ],
        "",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenants_brokers_beyond_its_namespaces_bounds_are_refused_and_the_earlier_keep_working() {
    // The harness's controller has the default bounds: this one keeps 2 brokers and 3 plans
    // of a namespace. Starting (and stopping) the harness's applies brokkr's CRDs.
    drop(Controller::start());
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let log = tempfile::NamedTempFile::new().unwrap();
    let _controller = Process(
        Command::new(BIN)
            .args(["controller", "--no-leader-election"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--broker-url-allow", "127.0.0.0/8"])
            .args(["--max-brokers-per-namespace", "2"])
            .args(["--max-catalog-plans-per-namespace", "3"])
            .env("KUBECONFIG", kubeconfig())
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start brokkr controller"),
    );
    let (first, second, third) = (
        catalog_of("first", 2, 0).await,
        catalog_of("second", 2, 0).await,
        catalog_of("third", 1, 0).await,
    );
    tenant_broker(ns, "first", &first, "");
    tenant_sees(ns, "first", "FetchedCatalog").await;
    // Created one second apart, so that their order (by creation time) is the one written.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    tenant_broker(ns, "second", &second, "");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    tenant_broker(ns, "third", &third, "");

    // The second fits the bound of brokers but not of plans (2 + 2 > 3): nothing of it written.
    let (ready, _) = tenant_sees(ns, "second", "ErrorNamespaceCatalogLimit").await;
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("4 ServicePlans") && message.contains("--max-catalog-plans-per-namespace"),
        "{ready}"
    );
    // The third is beyond the bound of brokers: its catalog is not even fetched.
    let (ready, _) = tenant_sees(ns, "third", "ErrorTooManyBrokers").await;
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("first 2") && message.contains("number 3"),
        "{ready}"
    );
    let plans = as_tenant(ns, &["get", "serviceplans", "-o", "name"], "").unwrap();
    let mut plans: Vec<&str> = plans.lines().collect();
    plans.sort_unstable();
    assert_eq!(
        plans,
        [
            "serviceplan.services.brokkr.dev/first-plan-0",
            "serviceplan.services.brokkr.dev/first-plan-1"
        ]
    );
    // The first keeps working: a relist (the tenant asks for one) still lists it.
    as_tenant(
        ns,
        &[
            "patch",
            "servicebroker",
            "first",
            "--type=merge",
            "-p",
            r#"{"spec":{"relistRequests":1}}"#,
        ],
        "",
    )
    .unwrap();
    eventually("the first broker relisted", async || {
        let out = as_tenant(ns, &["get", "servicebroker", "first", "-o", "json"], "").ok()?;
        let broker: Value = serde_json::from_str(&out).ok()?;
        let status = &broker["status"];
        (status["reconciledGeneration"] == broker["metadata"]["generation"]
            && status["lastConditionState"] == "Ready")
            .then_some(())
    })
    .await;

    // The tenant deletes the second: the third is now second of two, and its one plan fits
    // (2 + 1); it is listed at its next look (within 30 s).
    as_tenant(
        ns,
        &["delete", "servicebroker", "second", "--wait=false"],
        "",
    )
    .unwrap();
    tenant_sees(ns, "third", "FetchedCatalog").await;
    let plans = as_tenant(ns, &["get", "serviceplans", "-o", "name"], "").unwrap();
    assert_eq!(plans.lines().count(), 3, "{plans}");
}

/// A server on loopback whose catalog has one service `<id>-svc` with `plans` plans, each with
/// `bytes` of catalog metadata.
async fn catalog_of(id: &str, plans: usize, bytes: usize) -> String {
    let blob = "x".repeat(bytes);
    let plans: Vec<Value> = (0..plans)
        .map(|i| {
            json!({"id": format!("{id}-plan-{i}"), "name": format!("p{i}"), "description": "",
                "metadata": {"blob": blob}})
        })
        .collect();
    let catalog = json!({"services": [{"id": format!("{id}-svc"), "name": id, "description": "",
        "bindable": true, "plans": plans}]})
    .to_string();
    json_server("200 OK", catalog.into_bytes()).await.0
}

/// A server on loopback answering every request with `status` and the JSON `body`; its URL and
/// the count of body bytes written.
async fn json_server(status: &str, body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let RawServer { url, sent, .. } = raw_server(head, body, 1, Duration::ZERO).await;
    (url, sent)
}

/// A broker on loopback with one plan (`quick`/`q`) that provisions and deprovisions at once.
async fn quick_broker() -> String {
    use axum::Json;
    use axum::http::StatusCode;
    use axum::routing::{get, put};
    let catalog = json!({"services": [{"id": "quick-svc", "name": "quick", "description": "",
        "bindable": false, "plans": [{"id": "quick-plan", "name": "q", "description": ""}]}]});
    let app = axum::Router::new()
        .route("/v2/catalog", get(move || async move { Json(catalog) }))
        .route(
            "/v2/service_instances/{id}",
            put(|| async { (StatusCode::CREATED, Json(json!({}))) })
                .delete(|| async { Json(json!({})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The memory limit `deploy/base/controller.yaml` gives the controller.
const DEPLOY_LIMIT_MIB: u64 = 256;

/// One tenant's 22 ServiceBrokers, each a catalog of 1,000 plans of 8 KB (8.2 MB, under every
/// limit of one broker), with the controller's default bounds: the namespace keeps 2,000 plans
/// (two brokers' worth), the three next brokers are refused by the bound of plans and the
/// seventeen after them by the bound of brokers; the controller's peak resident memory stays
/// within `deploy/`'s limit; and another tenant's new instances are each Ready within 2 s while
/// it all happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenants_22_brokers_of_1000_plans_keep_the_controller_within_its_limit() {
    let controller = Controller::start();
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let other = tenant_namespace().await;
    let quick = quick_broker().await;
    tenant_broker(other.as_str(), "quick", &quick, "");
    tenant_sees(other.as_str(), "quick", "FetchedCatalog").await;

    let mut urls = Vec::new();
    for n in 0..22 {
        urls.push(catalog_of(&format!("heavy-{n:02}"), 1000, 8 * 1024).await);
    }
    for (n, url) in urls.iter().enumerate() {
        tenant_broker(ns, &format!("heavy-{n:02}"), url, "");
    }

    // Another tenant's instances, one every 2 s, until every heavy broker has been told.
    let started = Instant::now();
    let mut waits = Vec::new();
    let reasons = loop {
        let name = format!("other-{}", waits.len());
        as_tenant(
            other.as_str(),
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: {name}, namespace: {}}}
spec: {{serviceClassExternalName: quick, servicePlanExternalName: q}}
",
                other.as_str()
            ),
        )
        .unwrap();
        let asked = Instant::now();
        condition(
            other.as_str(),
            SI,
            &name,
            "Ready",
            "ProvisionedSuccessfully",
        )
        .await;
        waits.push(asked.elapsed());
        let brokers = kubectl(&["-n", ns, "get", "servicebrokers", "-o", "json"], "");
        let brokers: Value = serde_json::from_str(&brokers).unwrap();
        let reasons: Vec<String> = brokers["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| {
                let ready = b["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Ready")?;
                Some(ready["reason"].as_str()?.to_owned())
            })
            .collect();
        if reasons.len() == 22 {
            break reasons;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not every broker told after 600 s: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let peak = peak_mib(controller.pid());
    let count = |reason: &str| reasons.iter().filter(|r| *r == reason).count();
    eprintln!(
        "22 brokers told in {:?}; controller peak {peak} MiB; other tenant's instances Ready in {waits:?}",
        started.elapsed()
    );
    assert_eq!(count("FetchedCatalog"), 2, "{reasons:?}");
    assert_eq!(count("ErrorNamespaceCatalogLimit"), 3, "{reasons:?}");
    assert_eq!(count("ErrorTooManyBrokers"), 17, "{reasons:?}");
    let plans = kubectl(&["-n", ns, "get", "serviceplans", "-o", "name"], "");
    assert_eq!(plans.lines().count(), 2000);
    assert!(
        peak < DEPLOY_LIMIT_MIB,
        "the controller peaked at {peak} MiB"
    );
    let slowest = waits.iter().max().unwrap();
    assert!(
        *slowest <= Duration::from_secs(2),
        "another tenant's instance waited {slowest:?}: {waits:?}"
    );
}

/// The peak resident memory (`VmHWM`) of the process `pid`, in MiB.
fn peak_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024
}
