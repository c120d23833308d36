//! kill -9 during 1,000 concurrent provisions, 10 times over, on one SQLite store: after the last
//! restart every operation has ended, none is lost, and no step ran twice within one process's
//! life (a step may run again only after a crash struck between its effect and its record).
//! Steps are counted with the example's `record` step kind, which logs each run with its process
//! id.

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brokkr_osb::client::{Client, Method, Poll, StatusCode};
use brokkr_osb::messages::ProvisionRequest;
use futures::StreamExt;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_brokkr-custom");
const INSTANCES: usize = 1000;
const KILLS: usize = 10;
const USER: &str = "platform";
const PASSWORD: &str = "crash-test-password";

fn config(record: &Path) -> String {
    format!(
        r#"
catalog:
  services:
  - name: crash
    id: svc-crash
    description: Steps counted across crashes
    bindable: false
    plans: [{{name: p, id: plan-crash, description: three steps}}]
blueprints:
- service: crash
  plan: p
  instance:
    steps:
    - {{name: first, run: record, with: {{file: "{file}"}}}}
    - {{name: pause, delay: 200ms}}
    - {{name: second, run: record, with: {{file: "{file}"}}}}
"#,
        file = record.display()
    )
}

/// A running broker, killed (like `kill -9`) when dropped, also when a test fails.
struct Broker(Child);

impl Broker {
    fn kill(mut self) {
        self.0.kill().expect("kill -9");
        self.0.wait().expect("reap");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, port: u16) -> Broker {
    let child = Command::new(BIN)
        .args(["serve", "--poll-interval", "50ms", "--lease", "2s"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(dir.join("brokkr.yaml"))
        .arg("--store")
        .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
        .env("BROKKR_BROKER_USERNAME", USER)
        .env("BROKKR_BROKER_PASSWORD", PASSWORD)
        .env("RUST_LOG", "warn")
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start brokkr-custom");
    Broker(child)
}

async fn wait_healthy(osb: &Client) {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if let Ok(r) = osb.request(Method::GET, "/healthz").send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("brokkr-custom did not become healthy");
}

/// Sends a provision for each id; returns the ids the broker answered (202 or 200).
async fn provision(osb: &Client, ids: &[String]) -> Vec<String> {
    let request = ProvisionRequest {
        service_id: "svc-crash".into(),
        plan_id: "plan-crash".into(),
        organization_guid: Some("org".into()),
        space_guid: Some("space".into()),
        ..ProvisionRequest::default()
    };
    futures::stream::iter(ids.iter().cloned())
        .map(|id| {
            let request = &request;
            async move {
                let status = match osb.provision(&id, request, true).await {
                    Ok(answer) => answer.status,
                    Err(e) => {
                        eprintln!("provision {id}: {e}");
                        return None;
                    }
                };
                if !matches!(status, StatusCode::ACCEPTED | StatusCode::OK) {
                    eprintln!("provision {id}: {status}");
                }
                matches!(status, StatusCode::ACCEPTED | StatusCode::OK).then_some(id)
            }
        })
        .buffer_unordered(200)
        .filter_map(|accepted| async move { accepted })
        .collect()
        .await
}

async fn state(osb: &Client, id: &str) -> Value {
    let answer = osb
        .last_operation(&Poll::instance(id))
        .await
        .expect("last_operation");
    serde_json::to_value(answer.body).expect("a JSON body")
}

/// A pseudo-random delay from 50 to 550 ms, different every cycle.
fn jitter(cycle: usize) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as usize;
    Duration::from_millis(50 + ((nanos ^ (cycle * 7919)) % 500) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_survive_repeated_kill_9_and_finished_steps_never_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record.log");
    std::fs::write(dir.path().join("brokkr.yaml"), config(&record)).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let osb = Client::builder(format!("http://127.0.0.1:{port}"))
        .basic_auth(USER, PASSWORD)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ids: Vec<String> = (0..INSTANCES).map(|i| format!("crash-{i}")).collect();
    let mut accepted: HashSet<String> = HashSet::new();

    for cycle in 0..KILLS {
        let broker = start(dir.path(), port);
        wait_healthy(&osb).await;
        let pending: Vec<String> = ids
            .iter()
            .filter(|i| !accepted.contains(*i))
            .cloned()
            .collect();
        // Kill while requests are still arriving on the first cycles, mid-steps on later ones.
        let sent = tokio::time::timeout(jitter(cycle), provision(&osb, &pending)).await;
        if let Ok(newly) = sent {
            accepted.extend(newly);
            tokio::time::sleep(jitter(cycle + 1)).await;
        }
        broker.kill();
    }

    let broker = start(dir.path(), port);
    wait_healthy(&osb).await;
    let pending: Vec<String> = ids
        .iter()
        .filter(|i| !accepted.contains(*i))
        .cloned()
        .collect();
    accepted.extend(provision(&osb, &pending).await);
    assert_eq!(accepted.len(), INSTANCES, "every provision was accepted");

    let until = Instant::now() + Duration::from_secs(180);
    let mut states: HashMap<String, String> = HashMap::new();
    loop {
        let open: Vec<&String> = ids
            .iter()
            .filter(|i| states.get(*i).is_none_or(|s| s == "in progress"))
            .collect();
        if open.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "{} operations never ended",
            open.len()
        );
        for id in open {
            let s = state(&osb, id).await;
            states.insert(id.clone(), s["state"].as_str().unwrap_or("?").to_owned());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.kill();
    let failed: Vec<_> = states.iter().filter(|(_, s)| *s != "succeeded").collect();
    assert!(
        failed.is_empty(),
        "operations that did not succeed: {failed:?}"
    );

    let log = std::fs::read_to_string(&record).unwrap();
    let mut runs: HashMap<(String, String), Vec<String>> = HashMap::new();
    for line in log.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 4, "a whole line per run: {line:?}");
        runs.entry((fields[0].to_owned(), fields[2].to_owned()))
            .or_default()
            .push(fields[3].to_owned());
    }
    let mut repeated = 0;
    for id in &ids {
        for step in ["first", "second"] {
            let pids = runs
                .get(&(id.clone(), step.to_owned()))
                .unwrap_or_else(|| panic!("step {step} of {id} never ran"));
            let distinct: HashSet<&String> = pids.iter().collect();
            assert_eq!(
                distinct.len(),
                pids.len(),
                "step {step} of {id} ran twice in one process: {pids:?}"
            );
            repeated += pids.len() - 1;
        }
    }
    println!(
        "{INSTANCES} provisions, {KILLS} kills: {} step runs, {repeated} re-runs after a crash",
        log.lines().count()
    );
}
