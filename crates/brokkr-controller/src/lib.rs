//! Kubernetes controllers for brokkr, the platform side of OSB: brokers and their catalogs,
//! service instances and bindings as custom resources (group `services.brokkr.dev`, with the
//! Service Catalog's v1beta1 field names), reconciled by calling any OSB broker with
//! [`brokkr_osb::client`]. This crate never depends on brokkr's broker side.
//!
//! - [`resources`]: the custom resource types and their CustomResourceDefinitions.

pub mod resources;
