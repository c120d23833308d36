//! The admin API `brokkr upgrade` talks to: where it is, its credentials, and a request's
//! answer or a failure worded for people.

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;
use reqwest::Method;
use serde_json::Value;

/// Which broker's admin API, and how to reach it.
#[derive(Args)]
pub(super) struct AdminArgs {
    /// The broker's base URL.
    #[arg(long, env = "BROKKR_ADMIN_URL", global = true)]
    url: Option<String>,
    /// The admin API's user name.
    #[arg(long, env = "BROKKR_ADMIN_USERNAME", global = true)]
    username: Option<String>,
    /// The admin API's password; prefer the environment variable over the flag.
    #[arg(
        long,
        env = "BROKKR_ADMIN_PASSWORD",
        hide_env_values = true,
        global = true
    )]
    password: Option<String>,
    /// Time limit of each request.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration, global = true)]
    timeout: Duration,
}

/// A client of one broker's admin API.
pub(super) struct Admin {
    http: reqwest::Client,
    url: String,
    username: String,
    password: String,
}

impl Admin {
    pub(super) fn connect(args: &AdminArgs) -> Result<Self> {
        let url = (args.url.as_deref())
            .context("which broker? Give --url or set BROKKR_ADMIN_URL")?
            .trim_end_matches('/')
            .to_owned();
        let (Some(username), Some(password)) = (&args.username, &args.password) else {
            bail!(
                "the admin API needs credentials: set BROKKR_ADMIN_USERNAME and \
                 BROKKR_ADMIN_PASSWORD (or --username and --password)"
            );
        };
        brokkr_osb::client::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(args.timeout).build()?;
        Ok(Self {
            http,
            url,
            username: username.clone(),
            password: password.clone(),
        })
    }

    /// `method` on `path` with an optional JSON `body`: the JSON answer of a 2xx, else an error
    /// that says what the broker answered.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.url);
        let mut request = (self.http.request(method.clone(), &url))
            .basic_auth(&self.username, Some(&self.password));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = (request.send().await)
            .map_err(|e| anyhow!("cannot reach the broker at {}: {e}", self.url))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let reason = (value.get("description").and_then(Value::as_str))
            .map_or_else(|| text.trim().to_owned(), str::to_owned);
        match status.as_u16() {
            401 => bail!("the broker refused the admin credentials ({status})"),
            _ => bail!("{method} {path}: {status}: {reason}"),
        }
    }
}
