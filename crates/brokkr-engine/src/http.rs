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
//!     until: {pointer: /state, equals: ready} # call again (after Retry-After) until it holds
//!     timeout: 10s                          # per call, default 30s
//!   outputs: [record_id]
//! ```
//!
//! With `until`, an expected answer that does not hold `equals` at `pointer` is not the end:
//! the call is made again, after the answer's `Retry-After` or a backoff, within the step's
//! budget or the operation's deadline, and values are extracted from the answer that holds it.
//!
//! `with` is rendered like any template tree before the call, so registry values (including
//! secret ones) can fill the URL, headers and body. A 5xx answer, a 429, a timeout or a
//! connection failure is retried — after the answer's `Retry-After` when it gives one — within the
//! step's budget or the operation's deadline; any other unexpected status fails the step with the
//! method, URL (without its query) and status. Header values and bodies never appear in errors or
//! logs.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::step::{StepContext, StepKind, StepOutcome, async_trait};

/// The name blueprints `run`.
pub const NAME: &str = "http";

/// Largest answer read, for values to extract.
const MAX_ANSWER: usize = 1 << 20;

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
    #[serde(default)]
    until: Option<Until>,
    #[serde(default, with = "brokkr_blueprint::config::opt_duration")]
    timeout: Option<Duration>,
}

/// What an answer must hold for the step to be done: until then the call is repeated.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Until {
    /// A JSON pointer into the answer.
    pointer: String,
    /// The value expected there.
    equals: Value,
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

/// Calls external systems over HTTP, or HTTPS verified against the system's certificate
/// authorities (rustls with ring).
#[derive(Default)]
pub struct Http {
    /// Built on the first call: reading the system's certificates is start-up work a broker
    /// without `http` steps need not do.
    client: OnceLock<HttpClient>,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

impl Http {
    fn client(&self) -> &HttpClient {
        self.client.get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            // Unreadable certificates are skipped; HTTPS to a server they would have vouched
            // for then fails verification with a clear error.
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            let connector = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .build();
            Client::builder(TokioExecutor::new()).build(connector)
        })
    }
}

/// The URL without credentials or query, for messages.
fn shown(uri: &Uri) -> String {
    let port = uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "{}://{}{port}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.host().unwrap_or_default(),
        uri.path()
    )
}

/// How long a `Retry-After` header asks to wait (delta-seconds only), bounded to an hour.
fn retry_after<B>(response: &Response<B>) -> Option<Duration> {
    let value = response.headers().get(header::RETRY_AFTER)?;
    let seconds: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds.min(3600)))
}

/// The wait before trying again when the answer gives none: from 1 s, growing with the time the
/// step has been tried, up to 60 s.
fn backoff(started_at: i64) -> Duration {
    let elapsed = u64::try_from(crate::clock::now_ms() - started_at).unwrap_or(0);
    Duration::from_millis((elapsed / 2).clamp(1_000, 60_000))
}

#[async_trait]
impl StepKind for Http {
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
        let call: Call = match serde_json::from_value(ctx.with.clone()) {
            Ok(call) => call,
            Err(e) => return StepOutcome::Fail(format!("http: invalid `with`: {e}")),
        };
        let uri: Uri = match call.url.parse() {
            Ok(uri) => uri,
            Err(_) => return StepOutcome::Fail("http: `url` is not a URL".into()),
        };
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return StepOutcome::Fail("http: `url` must be an absolute http or https URL".into());
        }
        let Ok(method) = Method::from_bytes(call.method.to_uppercase().as_bytes()) else {
            return StepOutcome::Fail(format!("http: unknown method {:?}", call.method));
        };
        let target = format!("{method} {}", shown(&uri));
        let mut request = Request::builder().method(method).uri(uri).header(
            header::USER_AGENT,
            concat!("brokkr/", env!("CARGO_PKG_VERSION")),
        );
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
        let body = match &call.body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let Ok(request) = request.body(Full::new(body)) else {
            // Never show the headers: they may hold secrets.
            return StepOutcome::Fail(format!("{target}: invalid request (check the headers)"));
        };
        let timeout = call.timeout.unwrap_or(Duration::from_secs(30));
        let exchange = async {
            let response = self
                .client()
                .request(request)
                .await
                .map_err(|_| "could not connect")?;
            let (parts, body) = response.into_parts();
            let bytes = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|_| "the answer could not be read")?
                .to_bytes();
            Ok::<_, &str>(Response::from_parts(parts, bytes))
        };
        let response = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(why)) => {
                return StepOutcome::retry(backoff(ctx.started_at), format!("{target}: {why}"));
            }
            Err(_) => {
                return StepOutcome::retry(backoff(ctx.started_at), format!("{target}: timed out"));
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
            if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                let wait = retry_after(&response).unwrap_or_else(|| backoff(ctx.started_at));
                return StepOutcome::retry(wait, reason);
            }
            return StepOutcome::Fail(reason);
        }
        if call.extract.is_empty() && call.until.is_none() {
            return StepOutcome::Done;
        }
        let Ok(answer) = serde_json::from_slice::<Value>(response.body()) else {
            return StepOutcome::Fail(format!("{target}: the answer is not JSON"));
        };
        if let Some(until) = &call.until
            && answer.pointer(&until.pointer) != Some(&until.equals)
        {
            let wait = retry_after(&response).unwrap_or_else(|| backoff(ctx.started_at));
            let (pointer, equals) = (&until.pointer, &until.equals);
            return StepOutcome::retry(
                wait,
                format!("{target}: waiting until {pointer} is {equals}"),
            );
        }
        if call.extract.is_empty() {
            return StepOutcome::Done;
        }
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
