//! The one piece of code that edits workloads: it finds the pod template, containers and
//! volumes of any kind through a [`Mapping`] (`mapping.rs`, its paths in [`path`]), and applies
//! or removes one of two edits on a workload given as JSON. No I/O: callers read the workload,
//! call this, and write it back.
//!
//! - [`inject`] / [`uninject`] (`injection.rs`): a ServiceBindingUsage's edit. Every container
//!   gets `envFrom: [{secretRef: {name}, prefix}]`; the pod template gets the annotation
//!   `usage.services.brokkr.dev/<usage>` recording the Secret, the prefix and a digest of the
//!   Secret's data ([`secret_digest`]), so a credential change rolls the pods.
//! - [`project`] / [`unproject`] (`projection.rs`): a servicebinding.io ServiceBinding's edit. A
//!   projected volume `servicebinding-<binding>` from the Secret (with `type`/`provider`
//!   overrides as downward-API items read from pod annotations, which win over the Secret's
//!   entries), mounted read-only at `$SERVICE_BINDING_ROOT/<name>` in every bound container,
//!   `SERVICE_BINDING_ROOT=/bindings` added where it is absent (and never changed where present),
//!   and the binding's `env` entries as variables from `secretKeyRef`. The annotation
//!   `projection.services.brokkr.dev/<volume>` records the Secret and the variables.
//!
//! Applying is idempotent and edits in place (an entry that is already there keeps its
//! position, so two edits on one workload never make each other's pods roll); removing takes
//! away exactly what the recorded edit added, keeps every other entry, and removes the lists
//! and maps it leaves empty, so applying then removing gives back the original workload.
//! Removing needs the mapping that applied the edit.
//!
//! What both edits stand on — reading the record annotations, and finding lists and containers
//! through the mapping — is `walk.rs`'s.

mod injection;
mod mapping;
pub mod path;
mod projection;
mod walk;

pub use injection::{
    Injection, USAGE_ANNOTATION_PREFIX, inject, injected_usages, secret_digest, uninject,
    usage_annotation,
};
pub use mapping::{ContainerMapping, ContainerPaths, Mapping};
pub use path::{Path, PathError, Segment};
pub use projection::{
    DEFAULT_SERVICE_BINDING_ROOT, PROJECTION_ANNOTATION_PREFIX, PROVIDER_ANNOTATION_PREFIX,
    Projection, ROOT_ANNOTATION, SERVICE_BINDING_ROOT, TYPE_ANNOTATION_PREFIX, VOLUME_PREFIX,
    project, projected_volumes, projection_annotation, unproject, volume_name,
};
pub use walk::Error;

#[cfg(test)]
mod tests;
