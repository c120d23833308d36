//! A typed async OSB client: what a platform sends to a broker, and the broker's answers.
//!
//! ```no_run
//! # async fn example() -> Result<(), brokkr_osb::client::Error> {
//! use brokkr_osb::client::{Client, Poll, WaitOptions};
//! use brokkr_osb::messages::ProvisionRequest;
//!
//! let client = Client::builder("https://broker.example.com")
//!     .basic_auth("platform", "secret")
//!     .build()?;
//! let catalog = client.catalog().await?.body;
//! let request = ProvisionRequest {
//!     service_id: catalog.services[0].id.clone(),
//!     plan_id: catalog.services[0].plans[0].id.clone(),
//!     // Required by OSB 2.17 (deprecated in favour of `context`).
//!     organization_guid: Some("my-org".into()),
//!     space_guid: Some("my-space".into()),
//!     ..ProvisionRequest::default()
//! };
//! let answer = client.provision("i-1", &request, true).await?;
//! if answer.is_async() {
//!     let poll = Poll::instance("i-1").operation(answer.body.operation.clone());
//!     let last = client.wait(&poll, &WaitOptions::default(), |_| {}).await?;
//!     println!("{:?}", last.state);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every call returns a [`Response`] with the HTTP status (`200` vs `201` vs `202` matters to a
//! platform), the parsed body and `Retry-After`; statuses an endpoint does not succeed with become
//! [`Error::Broker`], with the broker's `error` code and `description`. Each request carries
//! `X-Broker-API-Version: 2.17`, a fresh `X-Broker-API-Request-Identity` (unless one is set with
//! [`Client::with_request_identity`]) and, when set, `X-Broker-API-Originating-Identity`.
//!
//! TLS uses rustls with ring: with the system's roots, or only the roots of a given CA bundle.
//! Building a client installs ring as rustls' process-wide default provider if none is installed.
//!
//! What a broker sends is bounded: every answer's body is read as a stream and the read stops
//! at the [`BodyLimits`] of its kind (a catalog, another answer, an error answer), so a broker
//! can never make the client hold more than that; an honest `Content-Length` above the limit
//! fails before anything is read. Texts for people are cut at [`MAX_TEXT`] characters, and an
//! `operation` or `dashboard_url` a platform could not keep or send back is refused as an
//! answer that is not valid OSB (see `answer.rs`: [`MAX_OPERATION`], [`MAX_DASHBOARD_URL`]). Set [`ClientBuilder::timeout`] to bound the time as well (it
//! covers the body: a broker trickling bytes is cut off at it). With
//! [`ClientBuilder::connect_only_to`] the client connects only to addresses a filter accepts:
//! it resolves the broker's host itself, checks every address, and connects to the checked ones.

mod address;
mod answer;
mod error;
mod wait;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER};
pub use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use address::AddressFilter;
pub use answer::{MAX_DASHBOARD_URL, MAX_OPERATION, MAX_TEXT, clipped};
pub use error::{BrokerError, Error};
pub use wait::{Poll, WaitOptions};

use answer::Answer;

use crate::catalog::Catalog;
use crate::headers::{self, OriginatingIdentity};
use crate::messages::{
    AsyncResponse, BindRequest, BindResponse, BindingResource, InstanceOperationResponse,
    InstanceResource, LastOperation, ProvisionRequest, UpdateRequest,
};

/// How a client proves who it is.
#[derive(Clone)]
pub enum Auth {
    /// HTTP basic authentication.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
    /// A bearer token.
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Basic { username, .. } => write!(f, "Basic({username}, ********)"),
            Self::Bearer(_) => f.write_str("Bearer(********)"),
        }
    }
}

/// Installs ring as rustls's process-wide crypto provider unless one is installed already.
///
/// reqwest's rustls needs a provider, and brokkr uses ring everywhere. Building a [`Client`]
/// calls this; a program (or test) that builds other reqwest clients calls it first, since a
/// reqwest client built with no provider in place panics.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another thread's install is fine: one provider is in place.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The most bytes the client reads of each kind of answer's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// `GET /v2/catalog` (default 8 MiB).
    pub catalog: u64,
    /// Every other successful answer: operations, bindings with their credentials, fetched
    /// instances and bindings, `last_operation` (default 1 MiB).
    pub answer: u64,
    /// An error answer (only its `error` and `description` are used; default 64 KiB). A longer
    /// one is read as an error of its status with neither.
    pub error: u64,
}

impl BodyLimits {
    /// The default catalog limit: 8 MiB.
    pub const DEFAULT_CATALOG: u64 = 8 << 20;
    /// The default limit of other successful answers: 1 MiB.
    pub const DEFAULT_ANSWER: u64 = 1 << 20;
    /// The default limit of error answers: 64 KiB.
    pub const DEFAULT_ERROR: u64 = 64 << 10;
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            catalog: Self::DEFAULT_CATALOG,
            answer: Self::DEFAULT_ANSWER,
            error: Self::DEFAULT_ERROR,
        }
    }
}

/// Which kind of answer a call expects, for its [`BodyLimits`].
#[derive(Debug, Clone, Copy)]
enum Kind {
    Catalog,
    Answer,
}

/// Builds a [`Client`].
#[derive(Debug)]
#[must_use]
pub struct ClientBuilder {
    url: String,
    limits: BodyLimits,
    address_filter: Option<AddressFilter>,
    auth: Option<Auth>,
    ca_bundle: Option<Vec<u8>>,
    insecure_skip_tls_verify: bool,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    max_idle_per_host: Option<usize>,
    originating_identity: Option<OriginatingIdentity>,
}

impl ClientBuilder {
    /// HTTP basic authentication.
    pub fn basic_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some(Auth::Basic {
            username: username.into(),
            password: password.into(),
        });
        self
    }

    /// A bearer token.
    pub fn bearer_auth(mut self, token: impl Into<String>) -> Self {
        self.auth = Some(Auth::Bearer(token.into()));
        self
    }

    /// Authentication, or none.
    pub fn auth(mut self, auth: Option<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// Trusts only the certificates of this PEM bundle instead of the system's roots.
    pub fn ca_bundle(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_bundle = Some(pem.into());
        self
    }

    /// Accepts any server certificate. Only for tests and brokers you reach over a trusted network.
    pub fn insecure_skip_tls_verify(mut self, skip: bool) -> Self {
        self.insecure_skip_tls_verify = skip;
        self
    }

    /// Time limit of a whole request, answer included (default: none).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Time limit of connecting (default: none).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How many idle connections to keep to the broker (default: reqwest's).
    pub fn max_idle_connections(mut self, n: usize) -> Self {
        self.max_idle_per_host = Some(n);
        self
    }

    /// The most bytes read of each kind of answer (default: [`BodyLimits::default`]).
    pub fn body_limits(mut self, limits: BodyLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Connects only to addresses `filter` accepts (it sees each address with the URL's port).
    /// The client resolves the broker's host name itself and refuses it when any of its
    /// addresses is refused; a connection goes only to an address that was checked, so a name
    /// that resolves differently the next time (DNS rebinding) gains nothing. With a filter,
    /// redirects are not followed and no proxy is used (either would connect elsewhere).
    pub fn connect_only_to(mut self, filter: AddressFilter) -> Self {
        self.address_filter = Some(filter);
        self
    }

    /// The platform user behind every request (see also [`Client::with_originating_identity`]).
    pub fn originating_identity(mut self, identity: OriginatingIdentity) -> Self {
        self.originating_identity = Some(identity);
        self
    }

    /// Builds the client.
    pub fn build(self) -> Result<Client, Error> {
        let base = reqwest::Url::parse(self.url.trim_end_matches('/')).map_err(|e| {
            Error::Config(format!("the broker URL {:?} is not valid: {e}", self.url))
        })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(Error::Config(format!(
                "the broker URL {:?} must start with http:// or https://",
                self.url
            )));
        }
        install_crypto_provider();
        let mut http = reqwest::Client::builder();
        let mut checked_literal = None;
        if let Some(filter) = &self.address_filter {
            let port = base.port_or_known_default().unwrap_or(80);
            // An IP address in the URL is never resolved: check it here.
            let literal = base.host_str().and_then(|host| {
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .ok()
            });
            if let Some(ip) = literal
                && !filter.accepts(SocketAddr::new(ip, port))
            {
                return Err(Error::AddressRefused {
                    url: base.to_string(),
                    address: SocketAddr::new(ip, port),
                });
            }
            // And at every call: a filter may refuse more later.
            checked_literal = literal.map(|ip| (filter.clone(), SocketAddr::new(ip, port)));
            http = http
                .dns_resolver(address::CheckedResolver::new(filter.clone(), port))
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy();
        }
        if let Some(pem) = &self.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::Config(format!("the CA bundle is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(Error::Config("the CA bundle holds no certificate".into()));
            }
            http = http.tls_certs_only(certs);
        }
        if self.insecure_skip_tls_verify {
            http = http.tls_danger_accept_invalid_certs(true);
        }
        if let Some(t) = self.timeout {
            http = http.timeout(t);
        }
        if let Some(t) = self.connect_timeout {
            http = http.connect_timeout(t);
        }
        if let Some(n) = self.max_idle_per_host {
            http = http.pool_max_idle_per_host(n);
        }
        let http = http
            .build()
            .map_err(|e| Error::Config(format!("cannot set up the HTTP client: {e}")))?;
        let authorization = self
            .auth
            .as_ref()
            .map(|auth| {
                let value = match auth {
                    Auth::Basic { username, password } => {
                        use base64::Engine as _;
                        let pair = format!("{username}:{password}");
                        format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(pair)
                        )
                    }
                    Auth::Bearer(token) => format!("Bearer {token}"),
                };
                let mut value = HeaderValue::try_from(value).map_err(|_| {
                    Error::Config("the credentials contain invalid characters".into())
                })?;
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                authorization,
                limits: self.limits,
                checked_literal,
            }),
            originating_identity: self
                .originating_identity
                .map(|id| header_value(&id.to_header()))
                .transpose()?,
            request_identity: None,
        })
    }
}

fn header_value(text: &str) -> Result<HeaderValue, Error> {
    HeaderValue::try_from(text)
        .map_err(|_| Error::Config(format!("{text:?} is not a valid header value")))
}

/// A client of one broker. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
    originating_identity: Option<HeaderValue>,
    request_identity: Option<HeaderValue>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    base: reqwest::Url,
    authorization: Option<HeaderValue>,
    limits: BodyLimits,
    /// The URL's IP address, never resolved, with the filter it is checked with at every call.
    checked_literal: Option<(AddressFilter, SocketAddr)>,
}

/// A successful answer: its status, its parsed body and the headers a platform acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Response<T> {
    /// The HTTP status, e.g. 201 (created) vs 200 (already there) vs 202 (accepted, poll).
    pub status: StatusCode,
    /// The parsed body.
    pub body: T,
    /// `Retry-After`: how long to wait before polling.
    pub retry_after: Option<Duration>,
    /// `X-Broker-API-Request-Identity` as the broker echoed it.
    pub request_identity: Option<String>,
}

impl<T> Response<T> {
    /// Whether the broker accepted the request as an asynchronous operation (202) to poll.
    pub fn is_async(&self) -> bool {
        self.status == StatusCode::ACCEPTED
    }

    /// Whether the broker said the resource is gone (410), which ends a delete.
    pub fn is_gone(&self) -> bool {
        self.status == StatusCode::GONE
    }
}

/// Which service offering and plan a request is about: the `service_id` and `plan_id` query
/// parameters of deprovision, unbind, fetch and last_operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlanRef {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
}

impl PlanRef {
    /// `service_id` and `plan_id`.
    pub fn new(service_id: impl Into<String>, plan_id: impl Into<String>) -> Self {
        Self {
            service_id: service_id.into(),
            plan_id: plan_id.into(),
        }
    }
}

impl Client {
    /// A builder for a client of the broker at `url` (e.g. `https://broker.example.com`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            limits: BodyLimits::default(),
            address_filter: None,
            auth: None,
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            timeout: None,
            connect_timeout: None,
            max_idle_per_host: None,
            originating_identity: None,
        }
    }

    /// This client, sending `identity` as the platform user behind its requests.
    pub fn with_originating_identity(&self, identity: &OriginatingIdentity) -> Result<Self, Error> {
        Ok(Self {
            originating_identity: Some(header_value(&identity.to_header())?),
            ..self.clone()
        })
    }

    /// This client, sending `id` as the request identity instead of a fresh one per request.
    pub fn with_request_identity(&self, id: &str) -> Result<Self, Error> {
        Ok(Self {
            request_identity: Some(header_value(id)?),
            ..self.clone()
        })
    }

    /// The broker's base URL.
    pub fn url(&self) -> &str {
        self.inner.base.as_str()
    }

    /// `GET /v2/catalog`.
    pub async fn catalog(&self) -> Result<Response<Catalog>, Error> {
        self.call(
            Method::GET,
            "/v2/catalog",
            &[],
            None::<&()>,
            &[StatusCode::OK],
            Kind::Catalog,
        )
        .await
    }

    /// `PUT /v2/service_instances/:instance_id`: 201 created, 200 already there, 202 accepted.
    pub async fn provision(
        &self,
        instance_id: &str,
        request: &ProvisionRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<InstanceOperationResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::CREATED, StatusCode::ACCEPTED];
        let query = incomplete(accepts_incomplete);
        self.call(
            Method::PUT,
            &instance_path(instance_id),
            &query,
            Some(request),
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `PATCH /v2/service_instances/:instance_id`: 200 done, 202 accepted.
    pub async fn update(
        &self,
        instance_id: &str,
        request: &UpdateRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<InstanceOperationResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED];
        let query = incomplete(accepts_incomplete);
        self.call(
            Method::PATCH,
            &instance_path(instance_id),
            &query,
            Some(request),
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `DELETE /v2/service_instances/:instance_id`: 200 deleted, 202 accepted, 410 gone (which
    /// a platform takes as deleted).
    pub async fn deprovision(
        &self,
        instance_id: &str,
        plan: &PlanRef,
        accepts_incomplete: bool,
    ) -> Result<Response<AsyncResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::GONE];
        let query = with_plan(incomplete(accepts_incomplete), Some(plan));
        self.call(
            Method::DELETE,
            &instance_path(instance_id),
            &query,
            None::<&()>,
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `PUT …/service_bindings/:binding_id`: 201 created, 200 already there, 202 accepted.
    pub async fn bind(
        &self,
        instance_id: &str,
        binding_id: &str,
        request: &BindRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<BindResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::CREATED, StatusCode::ACCEPTED];
        let path = binding_path(instance_id, binding_id);
        let query = incomplete(accepts_incomplete);
        self.call(Method::PUT, &path, &query, Some(request), &ok, Kind::Answer)
            .await
    }

    /// `DELETE …/service_bindings/:binding_id`: 200 deleted, 202 accepted, 410 gone.
    pub async fn unbind(
        &self,
        instance_id: &str,
        binding_id: &str,
        plan: &PlanRef,
        accepts_incomplete: bool,
    ) -> Result<Response<AsyncResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::GONE];
        let path = binding_path(instance_id, binding_id);
        let query = with_plan(incomplete(accepts_incomplete), Some(plan));
        self.call(
            Method::DELETE,
            &path,
            &query,
            None::<&()>,
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `GET /v2/service_instances/:instance_id` (brokers with `instances_retrievable`).
    pub async fn instance(
        &self,
        instance_id: &str,
        plan: Option<&PlanRef>,
    ) -> Result<Response<InstanceResource>, Error> {
        let query = with_plan(Vec::new(), plan);
        let path = instance_path(instance_id);
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }

    /// `GET …/service_bindings/:binding_id` (brokers with `bindings_retrievable`).
    pub async fn binding(
        &self,
        instance_id: &str,
        binding_id: &str,
        plan: Option<&PlanRef>,
    ) -> Result<Response<BindingResource>, Error> {
        let query = with_plan(Vec::new(), plan);
        let path = binding_path(instance_id, binding_id);
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }

    /// `GET …/last_operation` of an instance or a binding, once. A 410 Gone (the resource was
    /// deleted) is an [`Error::Broker`] with that status; [`Client::wait`] takes it as the end of
    /// a delete.
    pub async fn last_operation(&self, poll: &Poll) -> Result<Response<LastOperation>, Error> {
        let mut query = with_plan(Vec::new(), poll.plan.as_ref());
        if let Some(op) = &poll.operation {
            query.push(("operation", op.clone()));
        }
        let path = format!("{}/last_operation", poll.resource.path());
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }

    /// A request to `path_and_query` with the client's authentication and OSB headers, for what
    /// the typed calls do not cover (e.g. testing a broker with deliberately wrong bodies).
    pub fn request(&self, method: Method, path_and_query: &str) -> reqwest::RequestBuilder {
        let url = format!(
            "{}{path_and_query}",
            self.inner.base.as_str().trim_end_matches('/')
        );
        self.inner.http.request(method, url).headers(self.headers())
    }

    /// The headers every request carries.
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            headers::API_VERSION,
            HeaderValue::from_static(LATEST_VERSION),
        );
        if let Some(auth) = &self.inner.authorization {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        if let Some(id) = &self.originating_identity {
            headers.insert(headers::ORIGINATING_IDENTITY, id.clone());
        }
        let request_id = self.request_identity.clone().unwrap_or_else(|| {
            HeaderValue::try_from(uuid::Uuid::new_v4().to_string()).expect("a UUID is a header")
        });
        headers.insert(headers::REQUEST_IDENTITY, request_id);
        headers
    }

    async fn call<B: Serialize + ?Sized, T: DeserializeOwned + Answer>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
        ok: &[StatusCode],
        kind: Kind,
    ) -> Result<Response<T>, Error> {
        let mut url = self.inner.base.clone();
        url.set_path(&format!(
            "{}{path}",
            self.inner.base.path().trim_end_matches('/')
        ));
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let shown = format!("{}{}", self.inner.base.as_str().trim_end_matches('/'), path);
        if let Some((filter, address)) = &self.inner.checked_literal
            && !filter.accepts(*address)
        {
            return Err(Error::AddressRefused {
                url: shown,
                address: *address,
            });
        }
        let mut request = self.inner.http.request(method, url).headers(self.headers());
        if let Some(body) = body {
            request = request.json(body);
        }
        let transport = |source| error::transport(shown.clone(), source);
        let answer = request.send().await.map_err(transport)?;
        let status = answer.status();
        let retry_after = answer
            .headers()
            .get(RETRY_AFTER)
            .and_then(parse_retry_after);
        let request_identity = answer
            .headers()
            .get(headers::REQUEST_IDENTITY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if !ok.contains(&status) {
            // An error answer too long to read is still an error of its status.
            let bytes = read_at_most(answer, self.inner.limits.error)
                .await
                .map_err(transport)?
                .unwrap_or_default();
            return Err(BrokerError::new(status, &bytes, retry_after).into());
        }
        let (limit, what) = match kind {
            Kind::Catalog => (self.inner.limits.catalog, "a catalog"),
            Kind::Answer => (self.inner.limits.answer, "an answer"),
        };
        let declared = answer.content_length();
        let Some(bytes) = read_at_most(answer, limit).await.map_err(transport)? else {
            // Read as a body that is not a valid OSB answer, so that a platform treats it as
            // one (orphan mitigation after a 201 or 202).
            return Err(Error::InvalidResponse {
                status,
                message: format!(
                    "the body is larger than the {limit} bytes this client reads of {what} from \
                     the broker at {shown}{}",
                    declared
                        .filter(|&n| n > limit)
                        .map(|n| format!(" (Content-Length: {n})"))
                        .unwrap_or_default()
                ),
            });
        };
        // A 410 on delete and some brokers' synchronous answers carry no body: read it as `{}`.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        // serde names an unexpected variant (`unknown variant `…``) as it was sent: cut.
        let mut body: T = serde_json::from_slice(bytes).map_err(|e| Error::InvalidResponse {
            status,
            message: clipped(&error::without_values(&e.to_string()), MAX_TEXT).into_owned(),
        })?;
        body.check()
            .map_err(|message| Error::InvalidResponse { status, message })?;
        Ok(Response {
            status,
            body,
            retry_after,
            request_identity,
        })
    }
}

/// The body of `answer` if it has at most `limit` bytes, else `None`, having read at most
/// `limit` bytes of it: a `Content-Length` above the limit ends it before anything is read, and
/// the read stops as soon as the body passes the limit (the connection is then closed).
async fn read_at_most(
    mut answer: reqwest::Response,
    limit: u64,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if answer.content_length().is_some_and(|n| n > limit) {
        return Ok(None);
    }
    let expected = answer.content_length().unwrap_or(0).min(limit);
    let mut body = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while let Some(chunk) = answer.chunk().await? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// The `X-Broker-API-Version` this client speaks.
const LATEST_VERSION: &str = "2.17";

fn instance_path(instance_id: &str) -> String {
    format!("/v2/service_instances/{}", segment(instance_id))
}

fn binding_path(instance_id: &str, binding_id: &str) -> String {
    format!(
        "{}/service_bindings/{}",
        instance_path(instance_id),
        segment(binding_id)
    )
}

/// `id` as one path segment: characters that would end or change the segment are escaped.
fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn incomplete(accepts_incomplete: bool) -> Vec<(&'static str, String)> {
    if accepts_incomplete {
        vec![("accepts_incomplete", "true".to_owned())]
    } else {
        Vec::new()
    }
}

fn with_plan(
    mut query: Vec<(&'static str, String)>,
    plan: Option<&PlanRef>,
) -> Vec<(&'static str, String)> {
    if let Some(plan) = plan {
        query.push(("service_id", plan.service_id.clone()));
        query.push(("plan_id", plan.plan_id.clone()));
    }
    query
}

/// `Retry-After` as seconds or as an HTTP date.
fn parse_retry_after(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(segment("i-1_a.b~"), "i-1_a.b~");
        assert_eq!(segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date() {
        let header = |s: &str| HeaderValue::try_from(s).unwrap();
        assert_eq!(
            parse_retry_after(&header("7")),
            Some(Duration::from_secs(7))
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(90));
        let d = parse_retry_after(&header(&later)).unwrap();
        assert!(
            d > Duration::from_secs(85) && d <= Duration::from_secs(90),
            "{d:?}"
        );
        assert_eq!(parse_retry_after(&header("soon")), None);
    }

    /// A broker on loopback that answers every request with `head` (status line and headers)
    /// and then `chunks` chunks of `chunk` bytes each, `pause` apart, until the client hangs up;
    /// returns its URL and the count of body bytes it managed to write.
    async fn raw_broker(
        head: &'static str,
        chunk: usize,
        chunks: usize,
        pause: Duration,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let counted = sent.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let data = vec![b' '; chunk];
                    for _ in 0..chunks {
                        if socket.write_all(&data).await.is_err() {
                            return;
                        }
                        counted.fetch_add(chunk, Ordering::SeqCst);
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                });
            }
        });
        (url, sent)
    }

    const MIB: usize = 1 << 20;

    #[tokio::test]
    async fn a_catalog_longer_than_the_limit_is_cut_off_while_it_streams() {
        // 120 MiB without a Content-Length: the body ends when the broker hangs up.
        let (url, sent) = raw_broker(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
            64 << 10,
            120 * 16,
            Duration::ZERO,
        )
        .await;
        let client = Client::builder(&url)
            .body_limits(BodyLimits {
                catalog: MIB as u64,
                ..BodyLimits::default()
            })
            .build()
            .unwrap();
        let e = client.catalog().await.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, Error::InvalidResponse { status, .. } if status == StatusCode::OK),
            "{e:?}"
        );
        assert!(
            text.contains("larger than the 1048576 bytes") && text.contains(&url),
            "{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let written = sent.load(std::sync::atomic::Ordering::SeqCst);
        // The client stopped reading at the limit: the broker could not write much more than
        // what the sockets' buffers hold.
        assert!(written < 32 * MIB, "the broker wrote {written} bytes");
    }

    #[tokio::test]
    async fn an_honest_content_length_over_the_limit_fails_before_the_body_is_read() {
        let (url, sent) = raw_broker(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 125829120\r\n\r\n",
            64 << 10,
            120 * 16,
            Duration::from_millis(10),
        )
        .await;
        let client = Client::builder(&url).build().unwrap();
        let e = client.catalog().await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("larger than the 8388608 bytes")
                && text.contains("Content-Length: 125829120"),
            "{text}"
        );
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst) < 4 * MIB);
    }

    #[tokio::test]
    async fn other_answers_have_their_own_smaller_limit() {
        let (url, _) = raw_broker(
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
            64 << 10,
            64,
            Duration::ZERO,
        )
        .await;
        let client = Client::builder(&url).build().unwrap();
        let request = crate::messages::ProvisionRequest::default();
        let e = client.provision("i-1", &request, true).await.unwrap_err();
        // A 201 with an unreadable body, as orphan mitigation wants to know it.
        assert!(
            matches!(&e, Error::InvalidResponse { status, message } if *status == StatusCode::CREATED
                && message.contains("larger than the 1048576 bytes")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_error_answer_too_long_to_read_keeps_its_status() {
        let (url, _) = raw_broker(
            "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n",
            64 << 10,
            64,
            Duration::ZERO,
        )
        .await;
        let client = Client::builder(&url).build().unwrap();
        let e = client.catalog().await.unwrap_err();
        assert!(
            matches!(&e, Error::Broker(b) if b.status == StatusCode::SERVICE_UNAVAILABLE
                && b.description.is_none()),
            "{e:?}"
        );
        assert!(e.is_transient());
    }

    #[tokio::test]
    async fn a_broker_that_trickles_its_answer_is_cut_off_at_the_timeout() {
        // One byte every 100 ms: no read ever waits long, the whole answer would take hours.
        let (url, _) = raw_broker(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
            1,
            100_000,
            Duration::from_millis(100),
        )
        .await;
        let client = Client::builder(&url)
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let e = client.catalog().await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(&e, Error::Transport { source, .. } if source.is_timeout()),
            "{e:?}"
        );
        assert!(e.to_string().contains("did not answer in time"), "{e}");
    }

    /// A broker on loopback answering a provision with `provision` (202) and every poll with
    /// `poll` (200); returns its URL and the query of every poll.
    async fn scripted_broker(
        provision: serde_json::Value,
        poll: serde_json::Value,
    ) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::extract::RawQuery;
        let polls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = polls.clone();
        let app = axum::Router::new()
            .route(
                "/v2/service_instances/{id}",
                axum::routing::put(
                    move || async move { (StatusCode::ACCEPTED, axum::Json(provision)) },
                ),
            )
            .route(
                "/v2/service_instances/{id}/last_operation",
                axum::routing::get(move |RawQuery(query): RawQuery| async move {
                    seen.lock().unwrap().push(query.unwrap_or_default());
                    axum::Json(poll)
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, polls)
    }

    #[tokio::test]
    async fn a_million_character_description_comes_out_cut_and_a_huge_operation_is_refused() {
        let (url, polls) = scripted_broker(
            serde_json::json!({"operation": "o".repeat(500_000),
                "dashboard_url": format!("https://dash.example.com/{}", "d".repeat(500_000))}),
            serde_json::json!({"state": "failed", "description": "x".repeat(1_000_000)}),
        )
        .await;
        let client = Client::builder(&url).build().unwrap();
        let request = crate::messages::ProvisionRequest::default();
        let e = client.provision("i-1", &request, true).await.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidResponse { status, message } if *status == StatusCode::ACCEPTED
                && message.contains("operation is 500000 bytes")),
            "{e:?}"
        );
        assert!(e.to_string().len() < 300, "{e}");

        let last = client
            .last_operation(&Poll::instance("i-1"))
            .await
            .unwrap()
            .body;
        let description = last.description.unwrap();
        assert_eq!(description.chars().count(), MAX_TEXT + 1);
        assert!(description.ends_with('…'));
        assert_eq!(polls.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_bodys_unexpected_value_is_cut_in_the_error() {
        let (url, _) = scripted_broker(
            serde_json::json!({}),
            serde_json::json!({"state": "s".repeat(1_000_000)}),
        )
        .await;
        let client = Client::builder(&url).build().unwrap();
        let e = client
            .last_operation(&Poll::instance("i-1"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
        assert!(
            e.to_string().chars().count() < 1200,
            "{}",
            e.to_string().len()
        );
    }

    fn no_loopback() -> AddressFilter {
        AddressFilter::new(|a| !a.ip().to_canonical().is_loopback())
    }

    #[tokio::test]
    async fn a_refused_address_is_never_connected_to() {
        let (url, sent) = raw_broker(
            "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n",
            14,
            1,
            Duration::ZERO,
        )
        .await;
        // An IP address in the URL: refused when the client is built.
        let e = Client::builder(&url)
            .connect_only_to(no_loopback())
            .build()
            .unwrap_err();
        assert!(matches!(e, Error::AddressRefused { .. }), "{e:?}");
        // A name that resolves to a refused address: refused before connecting.
        let port = url.rsplit(':').next().unwrap();
        let named = Client::builder(format!("http://localhost:{port}"))
            .connect_only_to(no_loopback())
            .build()
            .unwrap();
        let e = named.catalog().await.unwrap_err();
        assert!(
            matches!(&e, Error::AddressRefused { address, .. } if address.ip().is_loopback()),
            "{e:?}"
        );
        assert!(e.to_string().contains("may not connect"), "{e}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The same name through a filter that accepts it: connected.
        let accepted = Client::builder(format!("http://localhost:{port}"))
            .connect_only_to(AddressFilter::new(|_| true))
            .build()
            .unwrap();
        let e = accepted.catalog().await.unwrap_err();
        assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn an_address_in_the_url_is_checked_again_at_every_call() {
        let (url, sent) = raw_broker(
            "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n",
            14,
            2,
            Duration::ZERO,
        )
        .await;
        let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let now_refused = refused.clone();
        let client = Client::builder(&url)
            .connect_only_to(AddressFilter::new(move |_| {
                !now_refused.load(std::sync::atomic::Ordering::SeqCst)
            }))
            .build()
            .unwrap();
        let e = client.catalog().await.unwrap_err();
        assert!(matches!(e, Error::InvalidResponse { .. }), "{e:?}");
        let before = sent.load(std::sync::atomic::Ordering::SeqCst);
        refused.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = client.catalog().await.unwrap_err();
        assert!(matches!(e, Error::AddressRefused { .. }), "{e:?}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), before);
    }
}
