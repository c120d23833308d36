//! The error of every reconcile, and what a status may say of it: a namespaced broker's tenant
//! learns nothing of what the other end did (`said`); the controller's log has it all
//! (`detail`).

use brokkr_osb::client::Error as OsbError;

/// Why a broker or an instance could not be reconciled. Messages name Secrets, never their
/// values.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The broker could not be reached, or answered with an error.
    #[error(transparent)]
    Osb(#[from] brokkr_osb::client::Error),
    /// The broker's authentication Secret is missing or incomplete.
    #[error("{0}")]
    Credentials(String),
    /// The broker's catalog cannot be written as resources.
    #[error("{0}")]
    Catalog(String),
    /// The broker's catalog lists more services or plans than the controller keeps.
    #[error("{0}")]
    CatalogTooLarge(String),
    /// The broker's namespace has more ServiceBrokers than the controller serves of one.
    #[error("{0}")]
    TooManyBrokers(String),
    /// The catalog would take its namespace over the classes or plans kept of one namespace.
    #[error("{0}")]
    NamespaceCatalogLimit(String),
}

impl Error {
    /// The condition reason for this error, as the Service Catalog names them.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Kube(_) => "ErrorSyncingCatalog",
            Self::Osb(OsbError::AddressRefused { .. }) => "ErrorBrokerURLNotAllowed",
            Self::Osb(_) => "ErrorFetchingCatalog",
            Self::Credentials(_) => "ErrorGettingAuthCredentials",
            Self::Catalog(_) => "ErrorListingCatalog",
            Self::CatalogTooLarge(_) => "ErrorCatalogTooLarge",
            Self::TooManyBrokers(_) => "ErrorTooManyBrokers",
            Self::NamespaceCatalogLimit(_) => "ErrorNamespaceCatalogLimit",
        }
    }

    /// The message for the status of a namespaced broker: of what the other end did, nothing
    /// — not even whether it answered — since a tenant may point the URL anywhere
    /// ([`said`]).
    pub(crate) fn tenant_message(&self) -> String {
        match self {
            Self::Osb(e) => said(e, true),
            other => other.to_string(),
        }
    }
}

/// What the status of a namespaced broker (or of its instances and bindings) says of any
/// failed call, whatever failed: a refused connection, a timeout, a TLS failure, any answer
/// that is not what OSB says or an OSB error. Which of these it was would tell a tenant what
/// listens where inside the cluster.
pub const UNUSABLE: &str = "the broker could not be used (the controller's log has the details)";

/// What a status says of the failed call `e` to a broker: for a namespaced one, [`UNUSABLE`],
/// unless the URL policy refused its address or the tenant's own configuration is wrong (a URL
/// that does not parse, a `caBundle` that is not PEM), which is said as it is; for a
/// ClusterServiceBroker, everything.
pub(crate) fn said(e: &OsbError, namespaced: bool) -> String {
    match e {
        _ if !namespaced => e.to_string(),
        OsbError::AddressRefused { .. } => {
            "the broker's URL is not allowed: the controller's policy for namespaced brokers \
             refuses its address (loopback, link-local, the controller's own, or denied by the \
             platform admin)"
                .into()
        }
        OsbError::Config(_) => e.to_string(),
        _ => UNUSABLE.into(),
    }
}

/// `e` with its sources, for the controller's log.
pub(crate) fn detail(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use brokkr_osb::client::{BrokerError, StatusCode};

    use super::*;

    #[test]
    fn a_namespaced_brokers_failures_say_one_thing_and_a_cluster_brokers_everything() {
        let answered = OsbError::Broker(BrokerError {
            status: StatusCode::NOT_FOUND,
            error: Some("NotFound".into()),
            description: Some("no such key on 10.0.0.12:6379".into()),
            instance_usable: None,
            update_repeatable: None,
            retry_after: None,
        });
        let not_osb = OsbError::InvalidResponse {
            status: StatusCode::OK,
            message: "expected a map at line 1".into(),
        };
        for e in [&answered, &not_osb] {
            assert_eq!(said(e, true), UNUSABLE);
        }
        assert!(said(&answered, false).contains("10.0.0.12:6379"));
        assert_eq!(
            Error::Osb(answered).tenant_message(),
            Error::Osb(not_osb).tenant_message()
        );

        // What the policy refused, and what the tenant wrote, are said (without the address).
        let refused = OsbError::AddressRefused {
            url: "http://[::127.0.0.1]:8080/".into(),
            address: "[::127.0.0.1]:8080".parse().unwrap(),
        };
        let text = said(&refused, true);
        assert!(
            text.starts_with("the broker's URL is not allowed"),
            "{text}"
        );
        assert!(!text.contains("127.0.0.1"), "{text}");
        let config = OsbError::Config("the CA bundle holds no certificate".into());
        assert_eq!(said(&config, true), config.to_string());
    }
}
