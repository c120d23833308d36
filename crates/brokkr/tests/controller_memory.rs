//! The memory a tenant's broker can make `brokkr controller` use (`#[ignore]`d: a measurement,
//! run with `cargo test -p brokkr --test controller_memory -- --ignored --nocapture`). The
//! controller runs against the fake API server; a ServiceBroker points it at a server whose
//! `/v2/catalog` streams 120 MiB; the controller's peak resident memory (`VmHWM`) is read
//! before and after (after a broker with a small catalog, so that what any broker costs is
//! counted before), and may grow by less than the 120 MiB (reading it all took a debug build
//! from 62 to 330 MiB). `BROKKR_MEASURE_BIN` names another `brokkr` binary to measure (an older
//! build, for comparison; then nothing is asserted), `MEASURE_MIB` another size of catalog.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use brokkr_fake_kube::FakeCluster;
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            connection: close\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let mib = vec![b' '; 1 << 20];
                let total: usize = std::env::var("MEASURE_MIB")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(120);
                for _ in 0..total {
                    if socket.write_all(&mib).await.is_err() {
                        return;
                    }
                }
            });
        }
    });

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
