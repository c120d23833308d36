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
use brokkr_osb::OperationState;
use brokkr_osb::client::{Client, Error, Method, PlanRef, Poll};
use brokkr_osb::messages::{BindRequest, ProvisionRequest};
use clap::{Args, ValueEnum};
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
    /// Broker base URL. Given more than once (replicas of one broker), the requests go to each
    /// in turn, as through a load balancer: one operation's requests and polls reach different
    /// replicas.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: Vec<String>,
    /// With several --url: each client sends all its requests to one of them (the clients spread
    /// over the URLs), as through a load balancer with session affinity, instead of each request
    /// to the next URL.
    #[arg(long)]
    affinity: bool,
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

impl Sample {
    /// Awaits one request and records its latency (the whole answer read), and an error if it
    /// failed.
    async fn timed<T, E>(&mut self, request: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let started = Instant::now();
        let result = request.await;
        let elapsed = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.latencies_us.push(elapsed);
        if result.is_err() {
            self.errors += 1;
        }
        result
    }
}

/// `GET /v2/catalog` read to its end but not parsed: the broker's work is measured, not the
/// driver's (a typed catalog costs the driver more than the broker spends serving it).
async fn catalog_unparsed(osb: &Client) -> Result<()> {
    let response = osb
        .request(Method::GET, "/v2/catalog")
        .send()
        .await?
        .error_for_status()?;
    response.bytes().await?;
    Ok(())
}

struct Driver {
    /// A client per broker URL.
    osbs: Arc<[Client]>,
    /// Requests made (or, with `--affinity`, the client's number): which URL the next one goes
    /// to.
    turn: usize,
    args: Arc<BenchArgs>,
}

impl Driver {
    /// The client for the next request.
    fn osb(&mut self) -> Client {
        if !self.args.affinity {
            self.turn += 1;
        }
        self.osbs[self.turn % self.osbs.len()].clone()
    }

    /// Polls last_operation until the operation ends; an error if it failed. With a deleting
    /// poll, 410 Gone ends it. Every poll is measured, so this loop is the driver's own rather
    /// than [`Client::wait`].
    async fn wait(&mut self, sample: &mut Sample, poll: &Poll, deadline: Instant) -> Result<()> {
        loop {
            let last = match sample.timed(self.osb().last_operation(poll)).await {
                Ok(answer) => answer.body,
                Err(e) if poll.is_deleting() && gone(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            match last.state {
                OperationState::Succeeded => return Ok(()),
                OperationState::Failed => bail!(
                    "{poll:?}: the operation failed: {}",
                    last.description.unwrap_or_default()
                ),
                OperationState::InProgress if Instant::now() > deadline => {
                    bail!("{poll:?} did not finish in time")
                }
                OperationState::InProgress => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// One instance's life, as a platform drives it: provision, bind (and, when the bind was
    /// asynchronous, fetch the binding's credentials), unbind, deprovision.
    async fn lifecycle(&mut self, sample: &mut Sample, id: &str, params: &Value) -> Result<()> {
        let a = self.args.clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        let plan = PlanRef::new(&a.service_id, &a.plan_id);
        let request = provision_request(&a, params);
        let provisioned = sample
            .timed(self.osb().provision(id, &request, true))
            .await?;
        if provisioned.is_async() {
            let poll = Poll::instance(id).operation(provisioned.body.operation);
            self.wait(sample, &poll, deadline).await?;
        }
        let binding = format!("{id}-b");
        let request = BindRequest {
            service_id: a.service_id.clone(),
            plan_id: a.plan_id.clone(),
            ..BindRequest::default()
        };
        let bound = sample
            .timed(self.osb().bind(id, &binding, &request, true))
            .await?;
        if bound.is_async() {
            let poll = Poll::binding(id, &binding)
                .operation(bound.body.operation)
                .plan(plan.clone());
            self.wait(sample, &poll, deadline).await?;
            sample.timed(self.osb().binding(id, &binding, None)).await?;
        }
        let unbound = sample
            .timed(self.osb().unbind(id, &binding, &plan, true))
            .await?;
        if unbound.is_async() {
            let poll = Poll::binding(id, &binding)
                .operation(unbound.body.operation)
                .plan(plan.clone())
                .deleting();
            self.wait(sample, &poll, deadline).await?;
        }
        let deprovisioned = sample
            .timed(self.osb().deprovision(id, &plan, true))
            .await?;
        if deprovisioned.is_async() {
            let poll = Poll::instance(id)
                .operation(deprovisioned.body.operation)
                .deleting();
            self.wait(sample, &poll, deadline).await?;
        }
        sample.lifecycles += 1;
        Ok(())
    }
}

fn gone(e: &Error) -> bool {
    e.status() == Some(reqwest::StatusCode::GONE)
}

/// A provision request. `organization_guid` and `space_guid` are deprecated in OSB 2.17 but
/// still required fields, and some brokers (openbrokerapi) reject a provision without them.
fn provision_request(args: &BenchArgs, params: &Value) -> ProvisionRequest {
    ProvisionRequest {
        service_id: args.service_id.clone(),
        plan_id: args.plan_id.clone(),
        organization_guid: Some("brokkr-bench".into()),
        space_guid: Some("brokkr-bench".into()),
        context: json!({"platform": "kubernetes", "namespace": "brokkr-bench"})
            .as_object()
            .cloned(),
        parameters: params.as_object().cloned(),
        ..ProvisionRequest::default()
    }
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
    let mut osbs = Vec::new();
    for url in &args.url {
        let mut osb = Client::builder(url).max_idle_connections(args.concurrency);
        if let Some(user) = &args.username {
            osb = osb.basic_auth(user, args.password.clone().unwrap_or_default());
        }
        osbs.push(osb.build()?);
    }
    let osbs: Arc<[Client]> = osbs.into();
    let osb = &osbs[0];
    let run_id = uuid::Uuid::new_v4().simple().to_string();

    // The poll scenario needs instances to poll: one per client, polled with its operation.
    let mut polls = Vec::new();
    if args.scenario == Scenario::Poll && args.poll_seeded.is_none() {
        let request = provision_request(&args, &params);
        for c in 0..args.concurrency {
            let instance = format!("bench-{run_id}-{c}");
            let answer = osb
                .provision(&instance, &request, true)
                .await
                .context("provisioning the instances to poll")?;
            polls.push(Poll::instance(instance).operation(answer.body.operation));
        }
    }
    let polls = Arc::new(polls);

    let issued = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + args.duration;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..args.concurrency {
        let mut client = Driver {
            osbs: osbs.clone(),
            turn: c,
            args: args.clone(),
        };
        let issued = issued.clone();
        let params = params.clone();
        let run_id = run_id.clone();
        let polls = polls.clone();
        tasks.spawn(async move {
            let mut sample = Sample::default();
            let count = client.args.count;
            let more = |issued: &AtomicU64| match count {
                Some(n) => issued.fetch_add(1, Ordering::Relaxed) < n,
                None => Instant::now() < until,
            };
            let mut i = 0u64;
            while more(&issued) {
                let result = match client.args.scenario {
                    Scenario::Catalog => sample.timed(catalog_unparsed(&client.osb())).await,
                    Scenario::Poll => {
                        let poll = match client.args.poll_seeded {
                            Some(n) => Poll::instance(format!(
                                "seed-{:07}",
                                splitmix64(c as u64 * 1_000_003 + i) % n.max(1)
                            )),
                            None => polls[c].clone(),
                        };
                        sample
                            .timed(client.osb().last_operation(&poll))
                            .await
                            .map(drop)
                            .map_err(anyhow::Error::from)
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
