//! The memory a tenant's broker can make `brokkr controller` use (`#[ignore]`d: a measurement,
//! run with `cargo test -p brokkr --test controller_memory -- --ignored --nocapture`). The
//! controller runs against the fake API server; a ServiceBroker points it at a server whose
//! `/v2/catalog` streams 120 MiB; the controller's peak resident memory (`VmHWM`) is read
//! before and after (after a broker with a small catalog, so that what any broker costs is
//! counted before), and may grow by less than the 120 MiB (reading it all took a debug build
//! from 62 to 330 MiB). `BROKKR_MEASURE_BIN` names another `brokkr` binary to measure (an older
//! build, for comparison; then nothing is asserted), `MEASURE_MIB` another size of catalog.
//!
//! `a_namespace_of_22_brokers_of_1000_plans_stays_within_the_deploy_limit`: one tenant creates 22
//! ServiceBrokers, each a catalog of 1,000 plans of 8 KB (8.2 MB); the controller's peak memory
//! is read after they were listed, after a restart (the caches list everything anew) and after
//! they were deleted, and must stay under deploy/'s 256 Mi; the namespace's bounds must refuse
//! the brokers beyond them; and another tenant's instances, one every 2 s throughout, must each be
//! Ready within 2 s. Asserted of a build with the namespace bounds (`BROKKR_MEASURE_BIN` may name
//! one: a binary of the shared target directory may be rebuilt meanwhile); an older build is
//! measured for comparison. `MEASURE_UNBOUNDED=1` raises the bounds so that all 22,000 plans are
//! written: what the caches keep of them.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use brokkr_fake_kube::FakeCluster;
use brokkr_test_support::{JSON_OK, raw_server};
use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A `/proc/<pid>/status` field, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim_start_matches(':').trim().split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A server whose catalog has one service with one plan, `p`.
async fn small_catalog() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = json!({"services": [{"id": "s", "name": "s", "description": "", "bindable": true,
        "plans": [{"id": "p", "name": "p", "description": ""}]}]})
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn a_120_mib_catalog_leaves_the_controllers_memory_where_it_was() {
    let total: usize = std::env::var("MEASURE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let url = raw_server(JSON_OK, vec![b' '; 1 << 20], total, Duration::ZERO)
        .await
        .url;

    let dir = tempfile::tempdir().unwrap();
    let fake = FakeCluster::start().await;
    for crd in brokkr_controller::resources::crds() {
        fake.add_crd(&crd);
    }
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    let bin = std::env::var("BROKKR_MEASURE_BIN").unwrap_or_else(|_| BIN.to_owned());
    let controller = Process(
        Command::new(&bin)
            .args(["controller", "--no-leader-election"])
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            // An environment variable, which an older build ignores.
            .env("BROKKR_BROKER_URL_ALLOW", "127.0.0.0/8")
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start brokkr controller"),
    );
    let pid = controller.0.id();
    // First a broker with a small catalog, so that what the controller does for any broker (a
    // client, its TLS roots, the first writes) is counted before.
    let small = small_catalog().await;
    fake.create(
        json!({"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceBroker",
        "metadata": {"name": "small", "namespace": "team-a"},
        "spec": {"url": small, "relistBehavior": "Manual"}}),
    );
    eventually("the small catalog listed", async || {
        fake.get(
            "services.brokkr.dev/v1alpha1",
            "ServicePlan",
            Some("team-a"),
            "p",
        )
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = status_kib(pid, "VmHWM");

    fake.create(
        json!({"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceBroker",
        "metadata": {"name": "huge", "namespace": "team-a"},
        "spec": {"url": url, "relistBehavior": "Manual"}}),
    );
    eventually("the broker's status", async || {
        let broker = fake.get(
            "services.brokkr.dev/v1alpha1",
            "ServiceBroker",
            Some("team-a"),
            "huge",
        )?;
        broker["status"]["conditions"].as_array()?.first().cloned()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after, rss) = (status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS"));
    println!(
        "{bin}: VmHWM {} MiB before the catalog, {} MiB after (VmRSS {} MiB)",
        before / 1024,
        after / 1024,
        rss / 1024
    );
    if std::env::var_os("BROKKR_MEASURE_BIN").is_none() {
        assert!(
            after < before + 120 * 1024,
            "the controller's peak memory grew from {before} KiB to {after} KiB"
        );
    }
}

/// A broker server for many brokers: `/<prefix>/v2/catalog` answers a catalog whose ids start
/// with `<prefix>` — for a prefix `big-…`, one service of 1,000 plans of about 8,150 bytes each
/// (their schemas, as large catalogs' are; 8.2 MB, under the 8 MiB a catalog may be), else
/// one plan; provisions succeed at once (201), anything else answers `{}`.
async fn tenant_brokers() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_string();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while request.len() < head_end + length {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let mut words = head.split(' ');
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let prefix = path.trim_start_matches('/').split('/').next().unwrap_or("");
                let (status, body) = if path.ends_with("/v2/catalog") {
                    ("200 OK", catalog(prefix))
                } else if method == "PUT" {
                    ("201 Created", "{}".to_owned())
                } else {
                    ("200 OK", "{}".to_owned())
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                if socket.write_all(answer.as_bytes()).await.is_ok() {
                    let _ = socket.write_all(body.as_bytes()).await;
                }
            });
        }
    });
    url
}

/// The catalog of [`tenant_brokers`]'s broker `prefix`.
fn catalog(prefix: &str) -> String {
    let (plans, filler) = if prefix.starts_with("big-") {
        (1000, "x".repeat(7_950))
    } else {
        (1, String::new())
    };
    let plans: Vec<_> = (0..plans)
        .map(|i| {
            json!({"id": format!("{prefix}-plan-{i}"), "name": format!("plan-{i}"),
                "description": "a plan", "free": true,
                "schemas": {"service_instance": {"create": {"parameters": {
                    "type": "object", "description": filler}}}}})
        })
        .collect();
    let body = json!({"services": [{"id": format!("{prefix}-svc"), "name": "svc",
        "description": "a service", "bindable": true, "plans": plans}]})
    .to_string();
    assert!(body.len() < 8 << 20, "{} bytes", body.len());
    body
}

/// The reason of the ServiceBroker's Ready condition, once it has one.
fn ready_reason(fake: &FakeCluster, ns: &str, name: &str) -> Option<String> {
    let broker = fake.get(API, "ServiceBroker", Some(ns), name)?;
    broker["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["reason"].as_str())
        .map(str::to_owned)
}

const API: &str = "services.brokkr.dev/v1alpha1";

/// `brokkr controller` (`bin`) against `kubeconfig`, with the environment `env`.
fn measured_controller(bin: &str, kubeconfig: &std::path::Path, env: &[(&str, &str)]) -> Process {
    let mut command = Command::new(bin);
    command
        .args(["controller", "--no-leader-election"])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("BROKKR_BROKER_URL_ALLOW", "127.0.0.0/8")
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // MEASURE_LOG: a file for the controller's log (appended to across the restart).
    if let Some(path) = std::env::var_os("MEASURE_LOG") {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("MEASURE_LOG");
        command.stderr(log);
    }
    for (k, v) in env {
        command.env(k, v);
    }
    Process(command.spawn().expect("start brokkr controller"))
}

/// Polls `check` every 100 ms for up to `limit`.
async fn within<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Another tenant (`team-b`) provisions an instance every 2 seconds while `team-a`'s brokers are
/// listed, relisted and deleted; how long each took to become Ready, in ms.
fn other_tenant(
    fake: std::sync::Arc<FakeCluster>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u128>> {
    tokio::spawn(async move {
        let mut took = Vec::new();
        for n in 0.. {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            let name = format!("other-{n}");
            fake.create(json!({"apiVersion": API, "kind": "ServiceInstance",
                "metadata": {"name": name, "namespace": "team-b"},
                "spec": {"serviceClassExternalName": "svc", "servicePlanExternalName": "plan-0"}}));
            let started = std::time::Instant::now();
            within(
                &format!("instance {name} Ready"),
                Duration::from_secs(300),
                || {
                    let instance = fake.get(API, "ServiceInstance", Some("team-b"), &name)?;
                    instance["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        .then_some(())
                },
            )
            .await;
            took.push(started.elapsed().as_millis());
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        took
    })
}

/// The memory limit of deploy/base's controller.
const DEPLOY_LIMIT_MIB: u64 = 256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn a_namespace_of_22_brokers_of_1000_plans_stays_within_the_deploy_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let server = tenant_brokers().await;
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCluster::start().await);
    for crd in brokkr_controller::resources::crds() {
        fake.add_crd(&crd);
    }
    for ns in ["team-a", "team-b"] {
        fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    let bin = std::env::var("BROKKR_MEASURE_BIN").unwrap_or_else(|_| BIN.to_owned());
    // What is asserted holds for a build with the namespace bounds (an older one is measured
    // for comparison).
    let help = Command::new(&bin)
        .args(["controller", "--help"])
        .output()
        .expect("brokkr controller --help");
    let bounded = String::from_utf8_lossy(&help.stdout).contains("--max-brokers-per-namespace");
    // MEASURE_UNBOUNDED: bounds so high every broker is listed, to measure what the caches
    // keep of 22,000 plans (environment variables, which an older build ignores).
    let unbounded = std::env::var_os("MEASURE_UNBOUNDED").is_some();
    let env: &[(&str, &str)] = if unbounded {
        &[
            ("BROKKR_MAX_BROKERS_PER_NAMESPACE", "100"),
            ("BROKKR_MAX_CATALOG_PLANS_PER_NAMESPACE", "100000"),
        ]
    } else {
        &[]
    };
    let checked = bounded && !unbounded;
    let mut controller = measured_controller(&bin, &kubeconfig, env);
    let pid = controller.0.id();

    // The other tenant's broker and a first instance: what any broker costs, counted before.
    fake.create(json!({"apiVersion": API, "kind": "ServiceBroker",
        "metadata": {"name": "small", "namespace": "team-b"},
        "spec": {"url": format!("{server}/small"), "relistBehavior": "Manual"}}));
    within("team-b's broker", Duration::from_secs(60), || {
        (ready_reason(&fake, "team-b", "small")? == "FetchedCatalog").then_some(())
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let tenant = other_tenant(fake.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = status_kib(pid, "VmHWM");

    // 22 brokers in team-a, created one second apart.
    let names: Vec<String> = (0..22).map(|i| format!("big-{i:02}")).collect();
    let listing = std::time::Instant::now();
    for (i, name) in names.iter().enumerate() {
        fake.create(json!({"apiVersion": API, "kind": "ServiceBroker",
            "metadata": {"name": name, "namespace": "team-a",
                         "creationTimestamp": format!("2024-01-01T00:00:{i:02}Z")},
            "spec": {"url": format!("{server}/{name}"), "relistBehavior": "Manual"}}));
    }
    let reasons = within("every broker's Ready", Duration::from_secs(900), || {
        names
            .iter()
            .map(|n| ready_reason(&fake, "team-a", n))
            .collect::<Option<Vec<_>>>()
            .filter(|r| !unbounded || r.iter().all(|r| r == "FetchedCatalog"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let plans = fake
        .list(API, "ServicePlan")
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "team-a")
        .count();
    let (listed, listed_rss) = (status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS"));
    println!(
        "{bin}: 22 brokers listed in {:?}: {reasons:?}; {plans} plans in team-a",
        listing.elapsed()
    );

    // A restart: the caches list everything anew.
    drop(controller);
    controller = measured_controller(&bin, &kubeconfig, env);
    let pid = controller.0.id();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (restarted, restarted_rss) = (status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS"));
    // From here the peak of the deletion alone (`5` resets VmHWM to the current VmRSS).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();

    // Deleting the brokers: the controller releases their classes and plans, which the garbage
    // collector (here: the test) deletes once their broker is gone.
    let brokers: kube::Api<brokkr_controller::resources::ServiceBroker> =
        kube::Api::namespaced(fake.client(), "team-a");
    for name in &names {
        brokers.delete(name, &Default::default()).await.unwrap();
    }
    within("the brokers gone", Duration::from_secs(900), || {
        names
            .iter()
            .all(|n| fake.get(API, "ServiceBroker", Some("team-a"), n).is_none())
            .then_some(())
    })
    .await;
    let client = fake.client();
    for kind in ["ServiceClass", "ServicePlan"] {
        let resource = kube::api::ApiResource {
            group: "services.brokkr.dev".into(),
            version: "v1alpha1".into(),
            api_version: API.into(),
            kind: kind.into(),
            plural: match kind {
                "ServiceClass" => "serviceclasses".into(),
                _ => "serviceplans".into(),
            },
        };
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::namespaced_with(client.clone(), "team-a", &resource);
        for entry in fake.list(API, kind) {
            if entry["metadata"]["namespace"] == "team-a" {
                let name = entry["metadata"]["name"].as_str().unwrap();
                api.delete(name, &Default::default()).await.unwrap();
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (deleted, deleted_rss) = (status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS"));
    stop.store(true, Ordering::SeqCst);
    let took = tenant.await.unwrap();
    println!(
        "{bin}: VmHWM {} MiB before the brokers; {} MiB after listing them (VmRSS {} MiB); \
         after a restart {} MiB (VmRSS {} MiB); while deleting them {} MiB (VmRSS {} MiB after)",
        before / 1024,
        listed / 1024,
        listed_rss / 1024,
        restarted / 1024,
        restarted_rss / 1024,
        deleted / 1024,
        deleted_rss / 1024
    );
    println!(
        "team-b's {} instances Ready after (ms): max {}, {took:?}",
        took.len(),
        took.iter().max().unwrap_or(&0)
    );
    if checked {
        // The defaults: 5 brokers and 2,000 plans a namespace. The first two fill it, the next
        // three find no room, the rest are beyond the bound of brokers.
        let expected: Vec<&str> = (0..22)
            .map(|i| match i {
                0 | 1 => "FetchedCatalog",
                2..=4 => "ErrorNamespaceCatalogLimit",
                _ => "ErrorTooManyBrokers",
            })
            .collect();
        assert_eq!(reasons, expected);
        assert_eq!(plans, 2000);
        for (what, kib) in [
            ("listing", listed),
            ("restart", restarted),
            ("deletion", deleted),
        ] {
            assert!(
                kib < DEPLOY_LIMIT_MIB * 1024,
                "{what}: the controller's peak memory was {kib} KiB"
            );
        }
        let slowest = took.iter().max().copied().unwrap_or_default();
        assert!(
            slowest < 2000,
            "another tenant's instance waited {slowest} ms"
        );
    }
}
