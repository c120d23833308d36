//! Workloads watched: the usage and servicebinding.io controllers react to a workload that
//! appears, is renamed or relabelled, instead of polling for it.
//!
//! Workload kinds are open-ended (any UsageKind, any kind a servicebinding.io binding names), so
//! a watch starts the first time a controller meets a kind ([`Workloads::watch`]) and runs
//! until the controllers stop. Only metadata is watched (`PartialObjectMetadata`): names,
//! labels and the annotations projections record are what decides which usages and bindings a
//! change concerns, and a cluster's many Deployments then cost little memory. Every change is
//! published to the controllers that [`Workloads::changes`] subscribed, which map it to the
//! objects to reconcile; a subscriber that falls behind is told so and reconciles everything it
//! may have missed, and so does every subscriber when a watch lists its kind (at its start, or
//! after it lost its place) instead of hearing of each workload listed.
//!
//! `edit` is how both controllers change a workload: a JSON patch guarded by the version it
//! was computed from, made anew when another writer came in between.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::api::{Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::metrics::Metrics;
use crate::projector;
use crate::scope::Scope;

/// How many workload changes a slow subscriber may be behind before it is told it missed some.
const BUFFER: usize = 4096;

/// A workload that changed (or went).
#[derive(Debug)]
pub struct WorkloadChange {
    /// Its kind.
    pub resource: ApiResource,
    /// Its metadata, as watched (namespace, name, labels, annotations).
    pub metadata: ObjectMeta,
}

/// What a subscriber gets: a workload's change, or word that it missed some.
pub type Seen = crate::changes::Seen<Arc<WorkloadChange>>;

/// The workload kinds watched, and the changes seen.
pub struct Workloads {
    watched: Mutex<HashMap<(String, String, String), tokio::task::JoinHandle<()>>>,
    changes: crate::changes::Broadcast<WorkloadChange>,
    /// The kinds discovered so far (a kind once served stays served for the controller's
    /// purposes; a request to a kind removed since fails like one to a missing workload).
    discovered: Mutex<HashMap<GroupVersionKind, ApiResource>>,
}

impl Default for Workloads {
    fn default() -> Self {
        Self {
            watched: Mutex::new(HashMap::new()),
            changes: broadcast::channel(BUFFER).0,
            discovered: Mutex::new(HashMap::new()),
        }
    }
}

impl Drop for Workloads {
    fn drop(&mut self) {
        for (_, task) in self.watched.lock().expect("lock").drain() {
            task.abort();
        }
    }
}

impl Workloads {
    /// The API resource of `gvk`, if the cluster serves it (discovered once).
    pub async fn resource(
        &self,
        client: &Client,
        gvk: &GroupVersionKind,
    ) -> Result<Option<ApiResource>, kube::Error> {
        if let Some(found) = self.discovered.lock().expect("lock").get(gvk) {
            return Ok(Some(found.clone()));
        }
        match kube::discovery::pinned_kind(client, gvk).await {
            Ok((resource, _)) => {
                let mut discovered = self.discovered.lock().expect("lock");
                discovered.insert(gvk.clone(), resource.clone());
                Ok(Some(resource))
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Starts watching the workloads of `resource` in `scope`, unless they are watched already.
    pub fn watch(&self, client: &Client, scope: &Scope, resource: &ApiResource) {
        let key = (
            resource.group.clone(),
            resource.version.clone(),
            resource.plural.clone(),
        );
        let mut watched = self.watched.lock().expect("lock");
        if watched.contains_key(&key) {
            return;
        }
        type Metadata = PartialObjectMeta<DynamicObject>;
        let api = match scope {
            Scope::Namespace(ns) => Api::<Metadata>::namespaced_with(client.clone(), ns, resource),
            Scope::Cluster { .. } => Api::<Metadata>::all_with(client.clone(), resource),
        };
        let (sender, resource) = (self.changes.clone(), resource.clone());
        let task = watcher(api, scope.watch_config())
            .default_backoff()
            .for_each(move |event| {
                match event {
                    Ok(event) => {
                        crate::changes::broadcast(&sender, event, |object, _| WorkloadChange {
                            resource: resource.clone(),
                            metadata: object.metadata,
                        })
                    }
                    Err(e) => tracing::debug!(error = %e, kind = %resource.kind, "workload watch"),
                }
                futures::future::ready(())
            });
        watched.insert(key, tokio::spawn(task));
    }

    /// The changes seen from now on.
    pub fn changes(&self) -> impl futures::Stream<Item = Seen> + Send + 'static {
        crate::changes::follow(&self.changes)
    }
}

/// Why editing a workload, or a reconcile that edits them, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A workload could not be edited.
    #[error(transparent)]
    Projector(#[from] projector::Error),
}

impl Error {
    /// Whether the API server refused a write because the object changed after it was read:
    /// 409 Conflict, or 422 Invalid because a JSON patch's `test` failed (as a finalizer's or a
    /// workload's guarded patch does). An ordinary conflict: the watch brings the newer version.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(e)) => {
                e.code == 409 || (e.code == 422 && e.message.contains("test failed"))
            }
            _ => false,
        }
    }
}

impl From<projector::PathError> for Error {
    fn from(e: projector::PathError) -> Self {
        Error::Projector(e.into())
    }
}

/// How many times one workload edit is sent, each after reading the workload again, while
/// other writers keep changing it between the read and the patch.
const EDIT_ATTEMPTS: usize = 5;

/// Who edits a workload: the controller named in the log and in the conflicts metric.
#[derive(Clone, Copy)]
pub(crate) struct Editor<'a> {
    pub metrics: &'a Metrics,
    /// The controller's name, as in `brokkr_controller_reconciles_total`.
    pub controller: &'a str,
}

/// Applies `change` to `workload` (given the object as read and its JSON to edit) and sends
/// exactly the difference, if there is one, as a JSON patch that first tests the
/// `resourceVersion` it was computed from, so that an edit made meanwhile is never lost.
///
/// A patch refused because the workload changed after it was read — 409 Conflict, or 422
/// Invalid because its test of the version failed (how the API server answers a failed JSON
/// patch `test`) — is an ordinary conflict, as when a Deployment's own controller writes its
/// status while brokkr edits its pod template: the workload is read again and the edit made
/// anew at once, logged at debug and counted in `brokkr_controller_conflicts_total`,
/// up to [`EDIT_ATTEMPTS`] sends. A 422 with the version unchanged is a refusal of the edit
/// itself, returned as it is. Returns what `change` returned for the version patched, or
/// `None` when the workload went meanwhile.
pub(crate) async fn edit<T>(
    api: &Api<DynamicObject>,
    workload: DynamicObject,
    editor: Editor<'_>,
    mut change: impl FnMut(&DynamicObject, &mut Value) -> Result<T, projector::Error>,
) -> Result<Option<T>, Error> {
    let mut object = workload;
    let mut attempt = 1;
    loop {
        let before = serde_json::to_value(&object).expect("a JSON object");
        let mut after = before.clone();
        let changed = change(&object, &mut after)?;
        let refused = match send(api, &object, &before, &after).await {
            Ok(()) => return Ok(Some(changed)),
            Err(kube::Error::Api(e)) if attempt < EDIT_ATTEMPTS && [409, 422].contains(&e.code) => {
                e
            }
            Err(e) => return Err(e.into()),
        };
        let Some(current) = api.get_opt(&object.name_any()).await? else {
            return Ok(None);
        };
        let read = object.metadata.resource_version.as_deref();
        if refused.code == 422 && current.metadata.resource_version.as_deref() == read {
            return Err(kube::Error::Api(refused).into());
        }
        editor.metrics.conflict(editor.controller);
        tracing::debug!(
            controller = editor.controller,
            namespace = %object.namespace().unwrap_or_default(),
            workload = %object.name_any(),
            read = read.unwrap_or_default(),
            now = current.metadata.resource_version.as_deref().unwrap_or_default(),
            status = refused.code,
            "the workload changed after it was read: editing it again"
        );
        object = current;
        attempt += 1;
    }
}

/// Sends the difference between `before` and `after`, if any, as a JSON patch that first tests
/// the `resourceVersion` of `object`.
async fn send(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    before: &Value,
    after: &Value,
) -> Result<(), kube::Error> {
    let diff = json_patch::diff(before, after);
    if diff.0.is_empty() {
        return Ok(());
    }
    let mut operations = serde_json::to_value(&diff).expect("a JSON patch");
    if let Value::Array(ops) = &mut operations {
        ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/resourceVersion",
                   "value": object.metadata.resource_version}),
        );
    }
    let patch: json_patch::Patch = serde_json::from_value(operations).expect("a JSON patch");
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await?;
    Ok(())
}
