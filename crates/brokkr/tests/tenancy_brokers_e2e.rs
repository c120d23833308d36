//! A tenant's namespaced ServiceBrokers on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test tenancy_brokers_e2e -- --ignored
//! --test-threads=1`). The tests act as the tenant: a user impersonated by kubectl, bound to the
//! built-in `edit` ClusterRole in its namespace, to which deploy/base/tenant-rbac.yaml adds
//! brokkr's kinds. What they check: a broker pointed at the API server tells the tenant
//! only that it is not an OSB broker; the cloud metadata address is refused by the URL policy;
//! a loopback broker is refused by a controller with the default policy; a 120 MiB catalog and a
//! catalog of too many plans are refused without the controller falling over; a real broker
//! lists its catalog into the tenant's namespace, readable by the tenant; and brokers beyond
//! the namespace's bounds of brokers and plans are refused while the earlier ones keep working.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::cluster::*;
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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

/// A server on loopback answering every request with `head` and then `body` repeated `times`
/// times; returns its URL and the count of body bytes it wrote.
async fn raw_server(head: String, body: Vec<u8>, times: usize) -> (String, Arc<AtomicUsize>) {
    let sent = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let counted = sent.clone();
    let (head, body) = (Arc::new(head), Arc::new(body));
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (counted, head, body) = (counted.clone(), head.clone(), body.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..times {
                    if socket.write_all(&body).await.is_err() {
                        return;
                    }
                    counted.fetch_add(body.len(), Ordering::SeqCst);
                }
            });
        }
    });
    (url, sent)
}

const UNREACHABLE: &str = "the broker is unreachable (the controller's log has the details)";
const NOT_OSB: &str = "the broker's answer is not an OSB catalog the controller accepts (the controller's log has the details)";

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_tenant_broker_pointed_at_the_api_server_or_the_metadata_address_learns_nothing() {
    // The test harness's controller allows loopback, where this API server runs.
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

    // Without TLS verification the API server answers: 401/403 with its own words.
    tenant_broker(ns, "apiserver", &server, "  insecureSkipTLSVerify: true\n");
    let (ready, status) = tenant_sees(ns, "apiserver", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], NOT_OSB, "{ready}");
    for leak in [
        "403",
        "401",
        "Forbidden",
        "Unauthorized",
        "anonymous",
        "/v2/catalog",
        &server,
    ] {
        assert!(
            !status.contains(leak),
            "{leak:?} in the tenant's status: {status}"
        );
    }
    // With TLS verification, the handshake fails: unreachable, nothing more.
    tenant_broker(ns, "apiserver-tls", &server, "");
    let (ready, status) = tenant_sees(ns, "apiserver-tls", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], UNREACHABLE, "{ready}");
    assert!(!status.contains("certificate"), "{status}");

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

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_controller_with_the_default_policy_refuses_a_tenant_broker_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    // The harness's controller allows loopback: this one runs with the defaults. Starting
    // (and stopping) the harness's applies brokkr's CRDs; run these tests one at a time.
    drop(Controller::start());
    let namespace = tenant_namespace().await;
    let ns = namespace.as_str();
    let log = tempfile::NamedTempFile::new().unwrap();
    let _controller = Process(
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
    );
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
    let (huge, sent) = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n".into(),
        vec![b' '; 1 << 20],
        120,
    )
    .await;
    tenant_broker(ns, "huge", &huge, "");
    let (ready, _) = tenant_sees(ns, "huge", "ErrorFetchingCatalog").await;
    assert_eq!(ready["message"], NOT_OSB);
    let written = sent.load(Ordering::SeqCst);
    assert!(written < 40 << 20, "the broker wrote {written} bytes");

    // 1,001 plans.
    let plans: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("plan-{i}"), "name": format!("p{i}"), "description": ""}))
        .collect();
    let catalog = json!({"services": [{"id": "svc", "name": "db", "description": "",
        "bindable": true, "plans": plans}]})
    .to_string();
    let (crowded, _) = raw_server(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            catalog.len()
        ),
        catalog.into_bytes(),
        1,
    )
    .await;
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

/// A server on loopback whose catalog has one service `<id>-svc` with `plans` plans.
async fn catalog_of(id: &str, plans: usize) -> String {
    let plans: Vec<Value> = (0..plans)
        .map(
            |i| json!({"id": format!("{id}-plan-{i}"), "name": format!("p{i}"), "description": ""}),
        )
        .collect();
    let catalog = json!({"services": [{"id": format!("{id}-svc"), "name": id, "description": "",
        "bindable": true, "plans": plans}]})
    .to_string();
    let (url, _) = raw_server(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            catalog.len()
        ),
        catalog.into_bytes(),
        1,
    )
    .await;
    url
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
        catalog_of("first", 2).await,
        catalog_of("second", 2).await,
        catalog_of("third", 1).await,
    );
    tenant_broker(ns, "first", &first, "");
    tenant_sees(ns, "first", "FetchedCatalog").await;
    // Created one second apart, so that their order (by creation time) is the one written.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    tenant_broker(ns, "second", &second, "");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
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
