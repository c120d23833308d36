//! brokkr's configuration: what the broker offers and what each plan does.
//!
//! A configuration is one YAML file or a directory of them. It declares the broker's own settings
//! ([`config::BrokerConfig`]), the OSB catalog, and one [`config::Blueprint`] per plan: the ordered
//! steps of each operation on an instance and on its bindings, and the template that becomes a
//! binding's credentials. [`load`] reads a configuration; its validation checks everything that
//! can be known before a request and reports every problem as a [`ConfigError`] ([`error`]) with
//! the file, the field and the line it concerns; a valid one becomes a [`Config`] ([`index`]) — a
//! read-only index the broker and the engine share.
//!
//! This crate does no I/O beyond reading configuration files: [`template`] renders typed template
//! trees, [`evaluate`] checks rendered credentials against the servicebinding.io well-known
//! entries (the rules of [`brokkr_servicebinding`]), and [`schema`] validates parameters against
//! a plan's JSON Schemas. [`fingerprint`] gives the canonical form of what a plan's blueprint
//! makes, so that a change under an unchanged maintenance version can be found and explained.

pub mod check;
pub mod config;
pub mod error;
pub mod evaluate;
pub mod fingerprint;
pub mod functions;
pub mod index;
pub mod load;
pub mod names;
mod parse;
pub mod schema;
pub mod span;
pub mod template;
mod validate;

pub use config::{
    Blueprint, BrokerConfig, NamespacePolicy, Phase, PvcPolicy, RegistryEntry, Step, TargetConfig,
    TargetKind,
};
pub use error::{ConfigError, ConfigErrors};
pub use fingerprint::Fingerprint;
pub use index::{Config, PlanEntry};
pub use names::NamesKey;

/// The built-in quickstart configuration, served by `brokkr serve` (with [`LOCAL`]) when no
/// `--config` is given.
pub const QUICKSTART: &str = include_str!("../../../catalogs/quickstart/quickstart.yaml");

/// The built-in local catalog (a database server per instance, run by brokkr on its machine),
/// served by `brokkr serve` with the quickstart when no `--config` is given.
pub const LOCAL: &str = include_str!("../../../catalogs/local/local.yaml");
