//! brokkr's configuration: what the broker offers and what each plan does.
//!
//! A configuration is one YAML file or a directory of them. It declares the broker's own settings
//! ([`config::BrokerConfig`]), the OSB catalog, and one [`config::Blueprint`] per plan: the ordered
//! steps of each operation on an instance and on its bindings, and the template that becomes a
//! binding's credentials. [`load`] reads and validates a configuration into a [`Config`] — a
//! read-only index the broker and the engine share — and reports every problem with the file and the
//! field it concerns.
//!
//! This crate does no I/O beyond reading configuration files: [`template`] renders typed template
//! trees, [`evaluate`] checks rendered credentials against the servicebinding.io well-known
//! entries (the rules of [`brokkr_servicebinding`]), and [`schema`] validates parameters against
//! a plan's JSON Schemas.

pub mod check;
pub mod config;
pub mod evaluate;
pub mod functions;
pub mod load;
pub mod schema;
pub mod span;
pub mod template;

pub use config::{
    Blueprint, BrokerConfig, NamespacePolicy, Phase, PvcPolicy, RegistryEntry, Step, TargetConfig,
    TargetKind,
};
pub use load::{Config, ConfigError, PlanEntry};

/// The built-in quickstart configuration served by `brokkr serve` when no `--config` is given.
pub const QUICKSTART: &str = include_str!("../../../catalogs/quickstart/quickstart.yaml");
