//! Connecting only to addresses a filter accepts: a DNS resolver that checks every address a
//! broker's host name resolves to, and hands reqwest only checked ones to connect to.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Which addresses a client may connect to: a predicate over the address (with the URL's port).
#[derive(Clone)]
pub struct AddressFilter(Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>);

impl AddressFilter {
    /// A filter that accepts the addresses for which `accepts` is true.
    pub fn new(accepts: impl Fn(SocketAddr) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(accepts))
    }

    /// Whether a connection to `address` is allowed.
    pub fn accepts(&self, address: SocketAddr) -> bool {
        (self.0)(address)
    }
}

impl fmt::Debug for AddressFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AddressFilter")
    }
}

/// A host name resolved to an address the filter refuses.
#[derive(Debug)]
pub(super) struct Refused(pub(super) SocketAddr);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the address {} is refused", self.0)
    }
}

impl std::error::Error for Refused {}

/// Resolves with the system's resolver, then refuses the name if any address is refused.
pub(super) struct CheckedResolver {
    filter: AddressFilter,
    port: u16,
}

impl CheckedResolver {
    /// Checks addresses with `filter`, as addresses of `port` (the URL's).
    pub(super) fn new(filter: AddressFilter, port: u16) -> Arc<Self> {
        Arc::new(Self { filter, port })
    }
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (filter, port) = (self.filter.clone(), self.port);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            if let Some(refused) = found.iter().find(|a| !filter.accepts(**a)) {
                return Err(Box::new(Refused(*refused)) as _);
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}
