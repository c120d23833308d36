//! `brokkr osb`: the OSB API from the command line, for any broker — what a platform does,
//! one request (and, with `--wait`, its polling) at a time.

mod change;
mod output;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use brokkr_osb::client::{Client, Error, PlanRef, Poll, StatusCode, WaitOptions};
use brokkr_osb::{Catalog, LastOperation, OperationState, Plan, Service};
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use change::{bind, deprovision, provision, unbind, update};
use output::{Format, Progress, Table, print};

#[derive(Args)]
pub struct OsbArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: OsbCommand,
}

/// Which broker, and how to reach it.
#[derive(Args)]
struct BrokerArgs {
    /// The broker's base URL.
    #[arg(long, env = "BROKKR_OSB_URL", global = true)]
    url: Option<String>,
    /// Basic auth user name.
    #[arg(long, env = "BROKKR_OSB_USERNAME", global = true)]
    username: Option<String>,
    /// Basic auth password; prefer the environment variable over the flag.
    #[arg(
        long,
        env = "BROKKR_OSB_PASSWORD",
        hide_env_values = true,
        global = true
    )]
    password: Option<String>,
    /// Bearer token, instead of a user name and password.
    #[arg(long, env = "BROKKR_OSB_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Trust only the certificates of this PEM bundle instead of the system's roots.
    #[arg(long, env = "BROKKR_OSB_CA_BUNDLE", global = true)]
    ca_bundle: Option<PathBuf>,
    /// Accept any TLS certificate (tests only).
    #[arg(long, global = true)]
    insecure_skip_tls_verify: bool,
    /// Time limit of each request.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration, global = true)]
    timeout: Duration,
}

#[derive(Subcommand)]
enum OsbCommand {
    /// List the broker's services and plans.
    Catalog,
    /// Create an instance (an id is generated and printed when none is given).
    Provision {
        /// Instance id.
        instance_id: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
        /// The platform's context: JSON, or @FILE [default: {"platform":"brokkr-cli"}].
        #[arg(long)]
        context: Option<String>,
    },
    /// Change an instance's plan or parameters.
    Update {
        /// Instance id.
        instance_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Delete an instance.
    Deprovision {
        /// Instance id.
        instance_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: WaitArgs,
    },
    /// Create a binding (an id is generated and printed when none is given).
    Bind {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: Option<String>,
        /// Rotate this binding: the new one gets new credentials and, unless --params is
        /// given, this one's parameters; both work until this one is unbound. Only for plans
        /// the catalog declares binding_rotatable.
        #[arg(long, value_name = "BINDING_ID")]
        predecessor: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Delete a binding.
    Unbind {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: WaitArgs,
    },
    /// Show an instance (brokers with instances_retrievable).
    Instance {
        /// Instance id.
        instance_id: String,
    },
    /// Show a binding; `-o json` or `-o yaml` prints its credentials.
    Binding {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: String,
    },
    /// Show the state of an instance's (or, with a binding id, a binding's) last operation.
    LastOperation {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: Option<String>,
        /// The operation the broker returned.
        #[arg(long)]
        operation: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        /// Poll until the operation ends.
        #[arg(long)]
        wait: bool,
    },
}

/// The service offering and plan a request is about.
#[derive(Args)]
struct PlanArgs {
    /// Service offering, by name or id.
    #[arg(long)]
    service: Option<String>,
    /// Plan, by name or id.
    #[arg(long)]
    plan: Option<String>,
}

/// What the requests that create or change something share: parameters, and waiting.
#[derive(Args)]
struct RequestArgs {
    /// Parameters: JSON, or @FILE.
    #[arg(long)]
    params: Option<String>,
    #[command(flatten)]
    wait: WaitArgs,
}

/// Whether and how long to wait for the operation a request starts.
#[derive(Args)]
struct WaitArgs {
    /// Wait until the operation ends; exit 1 if it failed.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long [default: the plan's maximum_polling_duration].
    #[arg(long, value_parser = crate::config::parse_duration)]
    wait_timeout: Option<Duration>,
}

/// Runs one `brokkr osb` command.
pub async fn run(args: OsbArgs) -> Result<()> {
    let broker = Broker::connect(&args.broker)?;
    let out = args.output;
    match args.command {
        OsbCommand::Catalog => catalog(&broker, out).await,
        OsbCommand::Provision {
            instance_id,
            plan,
            request,
            context,
        } => {
            let id = instance_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let context = match context {
                Some(text) => crate::config::parameters(Some(&text))
                    .context("--context")?
                    .as_object()
                    .cloned(),
                None => json!({"platform": "brokkr-cli"}).as_object().cloned(),
            };
            provision(&broker, &id, &plan, &request, context, out).await
        }
        OsbCommand::Update {
            instance_id,
            plan,
            request,
        } => update(&broker, &instance_id, &plan, &request, out).await,
        OsbCommand::Deprovision {
            instance_id,
            plan,
            request,
        } => deprovision(&broker, &instance_id, &plan, &request, out).await,
        OsbCommand::Bind {
            instance_id,
            binding_id,
            predecessor,
            plan,
            request,
        } => {
            let id = binding_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let binding = Target::binding(&instance_id, &id);
            let predecessor = predecessor.as_deref();
            bind(&broker, binding, predecessor, &plan, &request, out).await
        }
        OsbCommand::Unbind {
            instance_id,
            binding_id,
            plan,
            request,
        } => unbind(&broker, &instance_id, &binding_id, &plan, &request, out).await,
        OsbCommand::Instance { instance_id } => instance(&broker, &instance_id, out).await,
        OsbCommand::Binding {
            instance_id,
            binding_id,
        } => binding(&broker, &instance_id, &binding_id, out).await,
        OsbCommand::LastOperation {
            instance_id,
            binding_id,
            operation,
            plan,
            wait,
        } => {
            let target = Target {
                instance_id: &instance_id,
                binding_id: binding_id.as_deref(),
            };
            last_operation(&broker, target, operation, &plan, wait, out).await
        }
    }
}

/// A client and, fetched on first use, the broker's catalog.
struct Broker {
    client: Client,
    catalog: tokio::sync::OnceCell<Catalog>,
}

impl Broker {
    fn connect(args: &BrokerArgs) -> Result<Self> {
        let url = args
            .url
            .as_deref()
            .context("which broker? Give --url or set BROKKR_OSB_URL")?;
        let mut builder = Client::builder(url)
            .timeout(args.timeout)
            .insecure_skip_tls_verify(args.insecure_skip_tls_verify);
        builder = match (&args.token, &args.username, &args.password) {
            (Some(_), Some(_), _) => bail!("give either --token or --username, not both"),
            (Some(token), None, _) => builder.bearer_auth(token),
            (None, Some(user), Some(password)) => builder.basic_auth(user, password),
            (None, Some(_), None) => {
                bail!("--username needs a password: set BROKKR_OSB_PASSWORD (or --password)")
            }
            (None, None, _) => builder,
        };
        if let Some(path) = &args.ca_bundle {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
            builder = builder.ca_bundle(pem);
        }
        Ok(Self {
            client: builder.build()?,
            catalog: tokio::sync::OnceCell::new(),
        })
    }

    async fn catalog(&self) -> Result<&Catalog> {
        self.catalog
            .get_or_try_init(|| async {
                let answer = self.client.catalog().await.map_err(explain)?;
                Ok(answer.body)
            })
            .await
    }

    /// The service and plan named (by name or id) in `args`.
    async fn resolve(&self, service: &str, plan: &str) -> Result<(&Service, &Plan)> {
        let catalog = self.catalog().await?;
        let service = find_service(catalog, service)?;
        let plan = find_plan(service, plan)?;
        Ok((service, plan))
    }

    /// The service and plan of an existing instance: from the flags, else from the broker's
    /// fetch of the instance when it offers one.
    async fn plan_of(&self, instance_id: &str, args: &PlanArgs) -> Result<(&Service, &Plan)> {
        if let (Some(service), Some(plan)) = (&args.service, &args.plan) {
            return self.resolve(service, plan).await;
        }
        let fetched = self.client.instance(instance_id, None).await.map_err(|e| {
            if e.status() == Some(StatusCode::UNPROCESSABLE_ENTITY) {
                return explain(e);
            }
            anyhow!(
                "give --service and --plan: the broker did not tell instance {instance_id:?}'s \
                 plan ({})",
                explain(e)
            )
        })?;
        let catalog = self.catalog().await?;
        let service = match &args.service {
            Some(s) => find_service(catalog, s)?,
            None => find_service(catalog, &fetched.body.service_id)?,
        };
        let plan = find_plan(
            service,
            args.plan.as_deref().unwrap_or(&fetched.body.plan_id),
        )?;
        Ok((service, plan))
    }
}

fn find_service<'a>(catalog: &'a Catalog, key: &str) -> Result<&'a Service> {
    catalog
        .services
        .iter()
        .find(|s| s.id == key)
        .or_else(|| catalog.services.iter().find(|s| s.name == key))
        .with_context(|| {
            let names: Vec<&str> = catalog.services.iter().map(|s| s.name.as_str()).collect();
            format!(
                "the broker offers no service {key:?} (services: {})",
                names.join(", ")
            )
        })
}

fn find_plan<'a>(service: &'a Service, key: &str) -> Result<&'a Plan> {
    service
        .plans
        .iter()
        .find(|p| p.id == key)
        .or_else(|| service.plans.iter().find(|p| p.name == key))
        .with_context(|| {
            let names: Vec<&str> = service.plans.iter().map(|p| p.name.as_str()).collect();
            format!(
                "service {:?} has no plan {key:?} (plans: {})",
                service.name,
                names.join(", ")
            )
        })
}

fn required<'a>(value: &'a Option<String>, flag: &str) -> Result<&'a str> {
    value
        .as_deref()
        .with_context(|| format!("{flag} is required (by name or id)"))
}

/// A client error as a message for people: a broker's answer as the client words it, an
/// unreachable broker with the reason the system gave.
fn explain(e: Error) -> anyhow::Error {
    match e {
        Error::Transport { .. } => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            anyhow!(text)
        }
        other => anyhow!(other),
    }
}

fn parameters(args: &RequestArgs) -> Result<Option<Map<String, Value>>> {
    match &args.params {
        None => Ok(None),
        Some(text) => Ok(crate::config::parameters(Some(text))?.as_object().cloned()),
    }
}

async fn catalog(broker: &Broker, out: Format) -> Result<()> {
    let catalog = broker.catalog().await?;
    print(out, &serde_json::to_value(catalog)?, || {
        let mut table = Table::new(vec![
            "SERVICE",
            "PLAN",
            "SERVICE ID",
            "PLAN ID",
            "BINDABLE",
            "DESCRIPTION",
        ]);
        for service in &catalog.services {
            for plan in &service.plans {
                table.row(vec![
                    service.name.clone(),
                    plan.name.clone(),
                    service.id.clone(),
                    plan.id.clone(),
                    plan.is_bindable(service).to_string(),
                    plan.description.clone(),
                ]);
            }
        }
        table
    })
}

/// An instance, or a binding of one.
#[derive(Clone, Copy)]
struct Target<'a> {
    instance_id: &'a str,
    binding_id: Option<&'a str>,
}

impl<'a> Target<'a> {
    fn instance(instance_id: &'a str) -> Self {
        Self {
            instance_id,
            binding_id: None,
        }
    }

    fn binding(instance_id: &'a str, binding_id: &'a str) -> Self {
        Self {
            instance_id,
            binding_id: Some(binding_id),
        }
    }

    fn poll(&self) -> Poll {
        match self.binding_id {
            Some(b) => Poll::binding(self.instance_id, b),
            None => Poll::instance(self.instance_id),
        }
    }

    fn describe(&self) -> String {
        match self.binding_id {
            Some(b) => format!("binding {b:?} of instance {:?}", self.instance_id),
            None => format!("instance {:?}", self.instance_id),
        }
    }
}

async fn instance(broker: &Broker, instance_id: &str, out: Format) -> Result<()> {
    let answer = match broker.client.instance(instance_id, None).await {
        Ok(answer) => answer,
        Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
            return not_fetched(broker, instance_id, e, out).await;
        }
        Err(e) => return Err(explain(e)),
    };
    let body = answer.body;
    let catalog = broker.catalog().await.ok();
    let names = catalog.and_then(|c| c.plan(&body.service_id, &body.plan_id));
    print(out, &serde_json::to_value(&body)?, || {
        let mut table = Table::new(vec!["INSTANCE", "SERVICE", "PLAN", "DASHBOARD"]);
        let (service, plan) = match names {
            Some((s, p)) => (s.name.clone(), p.name.clone()),
            None => (body.service_id.clone(), body.plan_id.clone()),
        };
        table.row(vec![
            instance_id.to_owned(),
            service,
            plan,
            body.dashboard_url.clone().unwrap_or_default(),
        ]);
        table
    })?;
    // A broker that says the instance is not usable (brokkr: a server it runs is down) tells
    // why in its last operation's description.
    if body.instance_usable == Some(false) {
        let poll = Poll::instance(instance_id);
        let why = (broker.client.last_operation(&poll).await.ok())
            .and_then(|answer| answer.body.description)
            .map(|description| format!(" (last operation: {description})"));
        eprintln!(
            "instance {instance_id:?} is not usable now{}",
            why.unwrap_or_default()
        );
    }
    Ok(())
}

/// An instance the broker does not show: OSB answers its fetch with 404 while its provision
/// runs, once that failed, and once it is deprovisioned. Its last operation, when the broker
/// still tells it, says which: its state and description are printed, and the command fails
/// (exit 1), as there is no instance to show. A broker that knows nothing of it gets the 404.
async fn not_fetched(broker: &Broker, instance_id: &str, e: Error, out: Format) -> Result<()> {
    let Ok(answer) = broker
        .client
        .last_operation(&Poll::instance(instance_id))
        .await
    else {
        return Err(explain(e));
    };
    let last = answer.body;
    print(out, &serde_json::to_value(&last)?, || {
        let mut table = Table::new(vec!["INSTANCE", "LAST OPERATION", "DESCRIPTION"]);
        table.row(vec![
            instance_id.to_owned(),
            last.state.as_str().to_owned(),
            last.description.clone().unwrap_or_default(),
        ]);
        table
    })?;
    let what = match last.state {
        OperationState::InProgress => "is still in progress",
        OperationState::Succeeded => "succeeded",
        OperationState::Failed => "failed",
    };
    bail!("the broker shows no instance {instance_id:?}: its last operation {what}")
}

async fn binding(broker: &Broker, instance_id: &str, binding_id: &str, out: Format) -> Result<()> {
    let answer = broker
        .client
        .binding(instance_id, binding_id, None)
        .await
        .map_err(explain)?;
    let body = answer.body;
    print(out, &serde_json::to_value(&body)?, || {
        let mut table = Table::new(vec![
            "INSTANCE",
            "BINDING",
            "EXPIRES AT",
            "RENEW BEFORE",
            "CREDENTIALS",
        ]);
        let keys: Vec<&str> = body
            .credentials
            .iter()
            .flat_map(|c| c.keys())
            .map(String::as_str)
            .collect();
        // Binding metadata (OSB `expires_at`, `renew_before`): `-` when the broker gives none.
        let metadata = |key: &str| {
            let value = body.metadata.as_ref().and_then(|m| m.get(key));
            match value {
                Some(Value::String(at)) => at.clone(),
                Some(other) => other.to_string(),
                None => "-".to_owned(),
            }
        };
        table.row(vec![
            instance_id.to_owned(),
            binding_id.to_owned(),
            metadata("expires_at"),
            metadata("renew_before"),
            format!("{} (shown with -o json)", keys.join(", ")),
        ]);
        table
    })
}

async fn last_operation(
    broker: &Broker,
    target: Target<'_>,
    operation: Option<String>,
    plan_args: &PlanArgs,
    wait_to_end: bool,
    out: Format,
) -> Result<()> {
    let mut poll = target.poll().operation(operation.clone());
    let mut options = WaitOptions::default();
    if let (Some(service), Some(plan)) = (&plan_args.service, &plan_args.plan) {
        let (service, plan) = broker.resolve(service, plan).await?;
        poll = poll.plan(PlanRef::new(&service.id, &plan.id));
        options = options.for_plan(plan);
    }
    let last = if wait_to_end {
        let label = format!("operation of {}", target.describe());
        wait_showing_progress(broker, &poll, &options, label).await?
    } else {
        broker
            .client
            .last_operation(&poll)
            .await
            .map_err(explain)?
            .body
    };
    print(out, &serde_json::to_value(&last)?, || {
        let mut table = Table::new(vec!["STATE", "DESCRIPTION"]);
        table.row(vec![
            last.state.as_str().to_owned(),
            last.description.clone().unwrap_or_default(),
        ]);
        table
    })?;
    if wait_to_end && last.state == OperationState::Failed {
        bail!("the operation of {} failed", target.describe());
    }
    Ok(())
}

/// Polls to the end of an operation, with a progress line (a spinner on a terminal).
async fn wait_showing_progress(
    broker: &Broker,
    poll: &Poll,
    options: &WaitOptions,
    label: String,
) -> Result<LastOperation> {
    let progress = Progress::start(label);
    let result = broker
        .client
        .wait(poll, options, |last| progress.update(last))
        .await;
    progress.finish();
    result.map_err(explain)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::OsbArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OsbArgs,
    }

    #[test]
    fn only_requests_that_carry_parameters_take_them() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["osb"], args].concat()).map(drop);
        for ok in [
            &["provision", "i1", "--params", "{}", "--wait"][..],
            &["update", "i1", "--params", "{}"],
            &["bind", "i1", "b1", "--params", "{}"],
            &["bind", "i1", "b2", "--predecessor", "b1", "--wait"],
            &["deprovision", "i1", "--wait", "--wait-timeout", "1m"],
            &["unbind", "i1", "b1", "--wait"],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for refused in [
            &["deprovision", "i1", "--params", "{}"][..],
            &["unbind", "i1", "b1", "--params", "{}"],
        ] {
            let e = parse(refused).unwrap_err().to_string();
            assert!(e.contains("--params"), "{refused:?}: {e}");
        }
    }
}
