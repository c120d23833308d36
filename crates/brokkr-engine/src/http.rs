//! The built-in `http` step kind: calls an external system and keeps values from its answer.
//!
//! ```yaml
//! - name: register-dns
//!   run: http
//!   with:
//!     method: POST                          # default GET
//!     url: "https://dns.internal/v1/records"
//!     headers:
//!       Authorization: {from_env: DNS_TOKEN}  # read from the broker's environment at call time
//!       X-Instance: "{{ instance_id }}"
//!     body: {name: "{{ registry('database') }}", ttl: 300}   # sent as JSON
//!     expect: [200, 201]                    # default: any 2xx
//!     extract: {record_id: /id}             # JSON pointers into the answer
//!     timeout: 10s                          # per call, default 30s
//!   outputs: [record_id]
//! ```
//!
//! `with` is rendered like any template tree before the call, so registry values (including
//! secret ones) can fill the URL, headers and body. A 5xx answer, a 429, a timeout or a
//! connection failure is retried — after the answer's `Retry-After` when it gives one — within the
//! step's budget or the operation's deadline; any other unexpected status fails the step with the
//! method, URL (without its query) and status. Header values and bodies never appear in errors or
//! logs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::step::{StepContext, StepKind, StepOutcome, async_trait};

/// The name blueprints `run`.
pub const NAME: &str = "http";

/// The arguments of an `http` step, after rendering.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    #[serde(default = "get")]
    method: String,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, HeaderValue>,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    expect: Vec<u16>,
    #[serde(default)]
    extract: BTreeMap<String, String>,
    #[serde(default, with = "brokkr_blueprint::config::opt_duration")]
    timeout: Option<Duration>,
}

fn get() -> String {
    "GET".into()
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HeaderValue {
    Text(String),
    FromEnv { from_env: String },
}

/// Calls external systems over HTTP(S).
pub struct Http {
    client: reqwest::Client,
}

impl Default for Http {
    fn default() -> Self {
        // One crypto provider for the process (ring, as everywhere in brokkr); an error means
        // one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(concat!("brokkr/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self { client }
    }
}

/// The URL without query or credentials, for messages.
fn shown(url: &reqwest::Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port().map(|p| format!(":{p}")).unwrap_or_default()
    ) + url.path()
}

/// How long a `Retry-After` header asks to wait (delta-seconds only), bounded to an hour.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds.min(3600)))
}

/// The wait before trying again when the answer gives none: from 1 s, growing with the time the
/// step has been tried, up to 60 s.
fn backoff(started_at: i64) -> Duration {
    let elapsed = u64::try_from(crate::now_ms() - started_at).unwrap_or(0);
    Duration::from_millis((elapsed / 2).clamp(1_000, 60_000))
}

#[async_trait]
impl StepKind for Http {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let call: Call = match serde_json::from_value(ctx.with.clone()) {
            Ok(call) => call,
            Err(e) => return StepOutcome::Fail(format!("http: invalid `with`: {e}")),
        };
        let Ok(url) = reqwest::Url::parse(&call.url) else {
            return StepOutcome::Fail("http: `url` is not an absolute URL".into());
        };
        if !matches!(url.scheme(), "http" | "https") {
            return StepOutcome::Fail("http: `url` must be http or https".into());
        }
        let Ok(method) = reqwest::Method::from_bytes(call.method.to_uppercase().as_bytes()) else {
            return StepOutcome::Fail(format!("http: unknown method {:?}", call.method));
        };
        let target = format!("{method} {}", shown(&url));
        let mut request = self
            .client
            .request(method, url)
            .timeout(call.timeout.unwrap_or(Duration::from_secs(30)));
        for (name, value) in &call.headers {
            let value = match value {
                HeaderValue::Text(text) => text.clone(),
                HeaderValue::FromEnv { from_env } => match std::env::var(from_env) {
                    Ok(v) => v,
                    Err(_) => {
                        return StepOutcome::Fail(format!(
                            "http: header {name}: environment variable {from_env} is not set"
                        ));
                    }
                },
            };
            request = request.header(name.as_str(), value);
        }
        if let Some(body) = &call.body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) if e.is_builder() => {
                return StepOutcome::Fail(format!("{target}: invalid request (check the headers)"));
            }
            Err(e) => {
                let why = if e.is_timeout() {
                    "timed out"
                } else {
                    "could not connect"
                };
                return StepOutcome::retry(backoff(ctx.started_at), format!("{target}: {why}"));
            }
        };
        let status = response.status();
        let expected = if call.expect.is_empty() {
            status.is_success()
        } else {
            call.expect.contains(&status.as_u16())
        };
        if !expected {
            let reason = format!("{target} answered {status}");
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                let wait = retry_after(&response).unwrap_or_else(|| backoff(ctx.started_at));
                return StepOutcome::retry(wait, reason);
            }
            return StepOutcome::Fail(reason);
        }
        if call.extract.is_empty() {
            return StepOutcome::Done;
        }
        let answer: Value = match response.json().await {
            Ok(v) => v,
            Err(_) => return StepOutcome::Fail(format!("{target}: the answer is not JSON")),
        };
        let mut values = Map::new();
        for (name, pointer) in &call.extract {
            match answer.pointer(pointer) {
                Some(v) => {
                    values.insert(name.clone(), v.clone());
                }
                None => {
                    return StepOutcome::Fail(format!(
                        "{target}: the answer has nothing at {pointer} (for {name})"
                    ));
                }
            }
        }
        StepOutcome::Produced(values)
    }
}
