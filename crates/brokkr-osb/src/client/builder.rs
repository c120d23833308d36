//! Building a [`Client`]: how it authenticates, which certificates it trusts, its time limits,
//! the addresses it may connect to, and how much of an answer it reads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;

use super::address::{self, AddressFilter};
use super::error::Error;
use super::exchange::{BodyLimits, Client, Inner, header_value};
use crate::headers::OriginatingIdentity;

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
