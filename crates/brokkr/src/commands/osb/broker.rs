//! The broker `brokkr osb` talks to: a client and the broker's catalog, fetched on first use;
//! the services and plans a request names; the instance or binding it is about; waiting for an
//! operation to end with a progress line; and a client error worded for people.

use anyhow::{Context as _, Result, anyhow, bail};
use brokkr_osb::client::{Client, Error, Poll, StatusCode, WaitOptions};
use brokkr_osb::{Catalog, LastOperation, Plan, Service};

use super::args::{BrokerArgs, PlanArgs};
use super::output::Progress;

/// A client and, fetched on first use, the broker's catalog.
pub(super) struct Broker {
    pub(super) client: Client,
    catalog: tokio::sync::OnceCell<Catalog>,
}

impl Broker {
    pub(super) fn connect(args: &BrokerArgs) -> Result<Self> {
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

    pub(super) async fn catalog(&self) -> Result<&Catalog> {
        self.catalog
            .get_or_try_init(|| async {
                let answer = self.client.catalog().await.map_err(explain)?;
                Ok(answer.body)
            })
            .await
    }

    /// The service and plan named (by name or id) in `args`.
    pub(super) async fn resolve(&self, service: &str, plan: &str) -> Result<(&Service, &Plan)> {
        let catalog = self.catalog().await?;
        let service = find_service(catalog, service)?;
        let plan = find_plan(service, plan)?;
        Ok((service, plan))
    }

    /// The service and plan of an existing instance: from the flags, else from the broker's
    /// fetch of the instance when it offers one.
    pub(super) async fn plan_of(
        &self,
        instance_id: &str,
        args: &PlanArgs,
    ) -> Result<(&Service, &Plan)> {
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

/// A client error as a message for people: a broker's answer as the client words it, an
/// unreachable broker with the reason the system gave.
pub(super) fn explain(e: Error) -> anyhow::Error {
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

/// An instance, or a binding of one.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) instance_id: &'a str,
    pub(super) binding_id: Option<&'a str>,
}

impl<'a> Target<'a> {
    pub(super) fn instance(instance_id: &'a str) -> Self {
        Self {
            instance_id,
            binding_id: None,
        }
    }

    pub(super) fn binding(instance_id: &'a str, binding_id: &'a str) -> Self {
        Self {
            instance_id,
            binding_id: Some(binding_id),
        }
    }

    pub(super) fn poll(&self) -> Poll {
        match self.binding_id {
            Some(b) => Poll::binding(self.instance_id, b),
            None => Poll::instance(self.instance_id),
        }
    }

    pub(super) fn describe(&self) -> String {
        match self.binding_id {
            Some(b) => format!("binding {b:?} of instance {:?}", self.instance_id),
            None => format!("instance {:?}", self.instance_id),
        }
    }
}

/// Polls to the end of an operation, with a progress line (a spinner on a terminal).
pub(super) async fn wait_showing_progress(
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
