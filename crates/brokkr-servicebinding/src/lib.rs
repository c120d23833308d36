//! The provider side of the [Service Binding Specification for Kubernetes](https://servicebinding.io).
//!
//! A binding's credentials are a flat map of scalar entries. The specification reserves `type`
//! and `provider`, and gives rules to a few well-known entries ([`WELL_KNOWN_ENTRIES`]); every
//! entry name becomes a file name when a Secret is projected into a workload. This crate holds
//! those rules and the shape of a binding Secret, so that every part of brokkr that produces or
//! publishes credentials — the configuration checks, the broker's binds, the Kubernetes target
//! and the controllers — applies the same contract:
//!
//! - [`credentials`]: [`finalize`] and [`validate`] check a credentials map against the
//!   well-known entry rules, with messages that name an entry, never its value;
//! - [`secret`]: [`BindingSecret`] turns checked credentials into a Secret's type
//!   (`servicebinding.io/<type>`) and its entries.
//!
//! It depends on no other brokkr crate and on no Kubernetes client: callers build the Secret
//! object with the client they already have.

pub mod credentials;
pub mod secret;

pub use credentials::{CredentialsError, DEFAULT_PROVIDER, WELL_KNOWN_ENTRIES, finalize, validate};
pub use secret::{BindingSecret, SECRET_TYPE_PREFIX};
