//! `brokkr bench`: a load driver that speaks OSB to any broker and reports throughput and latency
//! percentiles, as text or JSON.
//!
//! Scenarios: `catalog` (GET /v2/catalog), `poll` (last_operation on instances provisioned
//! beforehand, one per client) and `lifecycle` (provision → poll until succeeded → bind → poll →
//! unbind → poll → deprovision → poll until gone, each client in a loop). Requests go only to the
//! given URL; runs are bounded by `--duration` or `--count`.

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
    #[arg(long, default_value = "10s", value_parser = crate::serve::humantime_duration)]
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
        let started = Instant::now();
        let response = rb.send().await;
        let elapsed = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        sample.latencies_us.push(elapsed);
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                sample.errors += 1;
                return Err(e.into());
            }
        };
        let status = response.status();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        if status.is_server_error() || status == StatusCode::UNAUTHORIZED {
            sample.errors += 1;
        }
        Ok((status, body))
    }

    /// Polls a last_operation path until the operation ends; `Ok(true)` if it succeeded (or the
    /// resource is gone after a delete).
    async fn wait(&self, sample: &mut Sample, path: &str, deadline: Instant) -> Result<bool> {
        loop {
            let (status, body) = self.send(sample, Method::GET, path, None).await?;
            if status == StatusCode::GONE {
                return Ok(true);
            }
            match body["state"].as_str() {
                Some("succeeded") => return Ok(true),
                Some("failed") => return Ok(false),
                _ if Instant::now() > deadline => bail!("{path} did not finish in time"),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    async fn lifecycle(&self, sample: &mut Sample, id: &str, params: &Value) -> Result<()> {
        let a = &self.args;
        let deadline = Instant::now() + Duration::from_secs(120);
        let instance = format!("/v2/service_instances/{id}");
        let q = format!(
            "accepts_incomplete=true&service_id={}&plan_id={}",
            a.service_id, a.plan_id
        );
        let body = json!({"service_id": a.service_id, "plan_id": a.plan_id, "parameters": params});
        self.send(
            sample,
            Method::PUT,
            &format!("{instance}?accepts_incomplete=true"),
            Some(&body),
        )
        .await?;
        self.wait(sample, &format!("{instance}/last_operation"), deadline)
            .await?;
        let binding = format!("{instance}/service_bindings/{id}-b");
        let bind = json!({"service_id": a.service_id, "plan_id": a.plan_id});
        self.send(
            sample,
            Method::PUT,
            &format!("{binding}?accepts_incomplete=true"),
            Some(&bind),
        )
        .await?;
        self.wait(sample, &format!("{binding}/last_operation"), deadline)
            .await?;
        self.send(sample, Method::DELETE, &format!("{binding}?{q}"), None)
            .await?;
        self.wait(sample, &format!("{binding}/last_operation"), deadline)
            .await?;
        self.send(sample, Method::DELETE, &format!("{instance}?{q}"), None)
            .await?;
        self.wait(sample, &format!("{instance}/last_operation"), deadline)
            .await?;
        sample.lifecycles += 1;
        Ok(())
    }
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

    // The poll scenario needs instances to poll: one per client.
    if args.scenario == Scenario::Poll {
        let client = Client {
            http: http.clone(),
            args: args.clone(),
        };
        let mut setup = Sample::default();
        for c in 0..args.concurrency {
            let id = format!("bench-{run_id}-{c}");
            let body = json!({"service_id": args.service_id, "plan_id": args.plan_id, "parameters": params});
            client
                .send(
                    &mut setup,
                    Method::PUT,
                    &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
                    Some(&body),
                )
                .await
                .context("provisioning the instances to poll")?;
        }
    }

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
                        .send(&mut sample, Method::GET, "/v2/catalog", None)
                        .await
                        .map(drop),
                    Scenario::Poll => {
                        let path =
                            format!("/v2/service_instances/bench-{run_id}-{c}/last_operation");
                        client
                            .send(&mut sample, Method::GET, &path, None)
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
