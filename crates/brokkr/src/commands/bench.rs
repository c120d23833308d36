//! `brokkr bench`: a load driver that speaks OSB to any broker and reports throughput and latency
//! percentiles, as text or JSON.
//!
//! Scenarios: `catalog` (GET /v2/catalog), `poll` (last_operation on instances provisioned
//! beforehand, one per client) and `lifecycle` (provision → poll until succeeded → bind → poll →
//! fetch the binding → unbind → poll → deprovision → poll until gone, each client in a loop).
//! It behaves as the OSB spec asks of a platform, so that it can drive any broker: it polls only
//! after a 202, passes the `operation` the broker returned to last_operation, fetches a binding's
//! credentials only after an asynchronous bind, and takes 410 Gone as the end of a delete.
//! Requests go only to the given URL; runs are bounded by `--duration` or `--count`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Scenario {
    Catalog,
    Poll,
    Lifecycle,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Scenario::Catalog)]
    scenario: Scenario,
    /// Broker base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Basic auth user name.
    #[arg(long, env = "BROKKR_BROKER_USERNAME")]
    username: Option<String>,
    /// Basic auth password.
    #[arg(long, env = "BROKKR_BROKER_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// How long to run (ignored with --count).
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    duration: Duration,
    /// Stop after this many requests (catalog, poll) or lifecycles.
    #[arg(long)]
    count: Option<u64>,
    /// Service offering id (default: the quickstart's).
    #[arg(long, default_value = "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10")]
    service_id: String,
    /// Plan id (default: the quickstart's async plan).
    #[arg(long, default_value = "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21")]
    plan_id: String,
    /// With the poll scenario: poll the N instances `seed-0000000`… that `brokkr store seed
    /// --count N` wrote, a random one each request, instead of provisioning one per client.
    #[arg(long, value_name = "N")]
    poll_seeded: Option<u64>,
    /// Provision parameters (JSON).
    #[arg(
        long,
        default_value = r#"{"credentials":{"type":"postgresql","host":"db.example.com","port":5432}}"#
    )]
    params: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    output: Output,
}

/// One client's measurements.
#[derive(Default)]
struct Sample {
    latencies_us: Vec<u64>,
    errors: u64,
    lifecycles: u64,
}

struct Client {
    http: reqwest::Client,
    args: Arc<BenchArgs>,
}

impl Client {
    async fn send(
        &self,
        sample: &mut Sample,
        method: Method,
        path: &str,
        body: Option<&Value>,
        parse: bool,
    ) -> Result<(StatusCode, Value)> {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.args.url))
            .header("X-Broker-API-Version", "2.17");
        if let Some(user) = &self.args.username {
            rb = rb.basic_auth(user, self.args.password.as_ref());
        }
        if let Some(body) = body {
            rb = rb.json(body);
        }
        // Latency includes reading the whole body.
        let started = Instant::now();
        let response = match rb.send().await {
            Ok(r) => {
                let status = r.status();
                r.bytes().await.map(|b| (status, b))
            }
            Err(e) => Err(e),
        };
        let elapsed = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        sample.latencies_us.push(elapsed);
        let (status, bytes) = match response {
            Ok(r) => r,
            Err(e) => {
                sample.errors += 1;
                return Err(e.into());
            }
        };
        // Only what the driver reads is parsed, so that the driver's own work stays small.
        let body = if parse {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        if status.is_server_error() || status == StatusCode::UNAUTHORIZED {
            sample.errors += 1;
        }
        Ok((status, body))
    }

    /// Sends a request that starts an operation and, when the broker answers 202, polls
    /// `poll_path` (with the `operation` it returned, as the OSB spec asks of platforms) until the
    /// operation ends. `done` lists the statuses that end the request without polling.
    async fn operate(
        &self,
        sample: &mut Sample,
        (method, path, body): (Method, &str, Option<&Value>),
        poll_path: &str,
        done: &[StatusCode],
        deadline: Instant,
    ) -> Result<bool> {
        let (status, response) = self.send(sample, method.clone(), path, body, true).await?;
        if status == StatusCode::ACCEPTED {
            let poll = match response["operation"].as_str() {
                Some(op) => format!("{poll_path}{}operation={op}", query_sep(poll_path)),
                None => poll_path.to_owned(),
            };
            self.wait(sample, &poll, deadline).await
        } else if done.contains(&status) {
            Ok(false)
        } else {
            bail!("{method} {path}: unexpected status {status}")
        }
    }

    /// Polls a last_operation path until the operation ends; an error if it failed. A 410 Gone
    /// ends the poll of a delete.
    async fn wait(&self, sample: &mut Sample, path: &str, deadline: Instant) -> Result<bool> {
        loop {
            let (status, body) = self.send(sample, Method::GET, path, None, true).await?;
            if status == StatusCode::GONE {
                return Ok(true);
            }
            if status != StatusCode::OK {
                bail!("GET {path}: unexpected status {status}");
            }
            match body["state"].as_str() {
                Some("succeeded") => return Ok(true),
                Some("failed") => bail!("{path}: the operation failed: {}", body["description"]),
                _ if Instant::now() > deadline => bail!("{path} did not finish in time"),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// One instance's life, as a platform drives it: provision, bind (and, when the bind was
    /// asynchronous, fetch the binding's credentials), unbind, deprovision.
    async fn lifecycle(&self, sample: &mut Sample, id: &str, params: &Value) -> Result<()> {
        let a = &self.args;
        let deadline = Instant::now() + Duration::from_secs(120);
        let ids = format!("service_id={}&plan_id={}", a.service_id, a.plan_id);
        let instance = format!("/v2/service_instances/{id}");
        let created = [StatusCode::OK, StatusCode::CREATED];
        let deleted = [StatusCode::OK, StatusCode::GONE];
        let body = provision_body(a, params);
        let put = format!("{instance}?accepts_incomplete=true");
        let last = format!("{instance}/last_operation");
        self.operate(
            sample,
            (Method::PUT, &put, Some(&body)),
            &last,
            &created,
            deadline,
        )
        .await?;
        let binding = format!("{instance}/service_bindings/{id}-b");
        let bind = json!({"service_id": a.service_id, "plan_id": a.plan_id});
        let put = format!("{binding}?accepts_incomplete=true");
        let binding_last = format!("{binding}/last_operation?{ids}");
        let polled = self
            .operate(
                sample,
                (Method::PUT, &put, Some(&bind)),
                &binding_last,
                &created,
                deadline,
            )
            .await?;
        if polled {
            let (status, _) = self
                .send(sample, Method::GET, &binding, None, false)
                .await?;
            if status != StatusCode::OK {
                bail!("GET {binding}: unexpected status {status}");
            }
        }
        let delete = format!("{binding}?accepts_incomplete=true&{ids}");
        self.operate(
            sample,
            (Method::DELETE, &delete, None),
            &binding_last,
            &deleted,
            deadline,
        )
        .await?;
        let delete = format!("{instance}?accepts_incomplete=true&{ids}");
        self.operate(
            sample,
            (Method::DELETE, &delete, None),
            &last,
            &deleted,
            deadline,
        )
        .await?;
        sample.lifecycles += 1;
        Ok(())
    }
}

/// A provision request body. `organization_guid` and `space_guid` are deprecated in OSB 2.17 but
/// still required fields, and some brokers (openbrokerapi) reject a provision without them.
fn provision_body(args: &BenchArgs, params: &Value) -> Value {
    json!({
        "service_id": args.service_id,
        "plan_id": args.plan_id,
        "organization_guid": "brokkr-bench",
        "space_guid": "brokkr-bench",
        "context": {"platform": "kubernetes", "namespace": "brokkr-bench"},
        "parameters": params,
    })
}

/// What joins a query parameter to `path`.
fn query_sep(path: &str) -> char {
    if path.contains('?') { '&' } else { '?' }
}

/// A well-spread hash of `x` (SplitMix64's finalizer), to pick seeded instances at random.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Runs the benchmark and prints its result.
pub async fn run(args: BenchArgs) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let params: Value = serde_json::from_str(&args.params).context("--params must be JSON")?;
    let args = Arc::new(args);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();

    // The poll scenario needs instances to poll: one per client, polled with its operation.
    let mut poll_paths = Vec::new();
    if args.scenario == Scenario::Poll && args.poll_seeded.is_none() {
        let client = Client {
            http: http.clone(),
            args: args.clone(),
        };
        let mut setup = Sample::default();
        for c in 0..args.concurrency {
            let instance = format!("/v2/service_instances/bench-{run_id}-{c}");
            let body = provision_body(&args, &params);
            let (status, response) = client
                .send(
                    &mut setup,
                    Method::PUT,
                    &format!("{instance}?accepts_incomplete=true"),
                    Some(&body),
                    true,
                )
                .await
                .context("provisioning the instances to poll")?;
            if !status.is_success() {
                bail!("provisioning the instances to poll: status {status}");
            }
            poll_paths.push(match response["operation"].as_str() {
                Some(op) => format!("{instance}/last_operation?operation={op}"),
                None => format!("{instance}/last_operation"),
            });
        }
    }
    let poll_paths = Arc::new(poll_paths);

    let issued = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + args.duration;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..args.concurrency {
        let client = Client {
            http: http.clone(),
            args: args.clone(),
        };
        let issued = issued.clone();
        let params = params.clone();
        let run_id = run_id.clone();
        let poll_paths = poll_paths.clone();
        tasks.spawn(async move {
            let mut sample = Sample::default();
            let more = |issued: &AtomicU64| match client.args.count {
                Some(n) => issued.fetch_add(1, Ordering::Relaxed) < n,
                None => Instant::now() < until,
            };
            let mut i = 0u64;
            while more(&issued) {
                let result = match client.args.scenario {
                    Scenario::Catalog => client
                        .send(&mut sample, Method::GET, "/v2/catalog", None, false)
                        .await
                        .map(drop),
                    Scenario::Poll => {
                        let path = match client.args.poll_seeded {
                            Some(n) => format!(
                                "/v2/service_instances/seed-{:07}/last_operation",
                                splitmix64(c as u64 * 1_000_003 + i) % n.max(1)
                            ),
                            None => poll_paths[c].clone(),
                        };
                        client
                            .send(&mut sample, Method::GET, &path, None, false)
                            .await
                            .map(drop)
                    }
                    Scenario::Lifecycle => {
                        let id = format!("bench-{run_id}-{c}-{i}");
                        client.lifecycle(&mut sample, &id, &params).await
                    }
                };
                if result.is_err() && client.args.scenario == Scenario::Lifecycle {
                    sample.errors += 1;
                }
                i += 1;
            }
            sample
        });
    }
    let mut all = Sample::default();
    while let Some(sample) = tasks.join_next().await {
        let sample = sample?;
        all.latencies_us.extend(sample.latencies_us);
        all.errors += sample.errors;
        all.lifecycles += sample.lifecycles;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.latencies_us.sort_unstable();
    let requests = all.latencies_us.len();
    let report = json!({
        "scenario": format!("{:?}", args.scenario).to_lowercase(),
        "concurrency": args.concurrency,
        "seconds": elapsed,
        "requests": requests,
        "requests_per_second": requests as f64 / elapsed,
        "lifecycles": all.lifecycles,
        "lifecycles_per_second": all.lifecycles as f64 / elapsed,
        "errors": all.errors,
        "latency_ms": {
            "p50": percentile(&all.latencies_us, 50.0),
            "p90": percentile(&all.latencies_us, 90.0),
            "p99": percentile(&all.latencies_us, 99.0),
        },
    });
    match args.output {
        Output::Json => println!("{report}"),
        Output::Text => {
            println!(
                "{} × {} clients for {elapsed:.1}s: {requests} requests ({:.0}/s), {} errors",
                report["scenario"].as_str().unwrap_or(""),
                args.concurrency,
                report["requests_per_second"].as_f64().unwrap_or(0.0),
                all.errors
            );
            if args.scenario == Scenario::Lifecycle {
                println!(
                    "lifecycles: {} ({:.1}/s)",
                    all.lifecycles,
                    report["lifecycles_per_second"].as_f64().unwrap_or(0.0)
                );
            }
            let l = &report["latency_ms"];
            println!(
                "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}",
                l["p50"], l["p90"], l["p99"]
            );
        }
    }
    if requests == 0 {
        bail!("no request was made");
    }
    Ok(())
}
