//! Why a workload is not ready, in the node's words: a StatefulSet or Deployment waiting for
//! its replicas says what holds its Pods back (an image that is not there, a container that
//! crashes, a probe that does not pass, a Pod no node takes), so that a provision that times
//! out tells the user what to fix.
//!
//! The Pods are found by the workload's `spec.selector.matchLabels` in its namespace. Reading
//! them needs `list` on `pods`; without it (or on any error) the wait is described as before.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::cluster::{Kubernetes, Located};

/// Kinds whose readiness is their Pods'.
const POD_OWNERS: [&str; 2] = ["StatefulSet", "Deployment"];
/// At most this many Pods are read for one description.
const PODS_READ: u32 = 20;
/// A node's message is cut to this many characters.
const MESSAGE_LIMIT: usize = 300;

impl Kubernetes {
    /// What keeps the Pods of `live` (a workload of `kind`) from being ready, if it can tell.
    pub(super) async fn pod_trouble(
        &self,
        at: &Located,
        kind: &str,
        live: &Value,
    ) -> Option<String> {
        if !POD_OWNERS.contains(&kind) {
            return None;
        }
        let namespace = at.namespace.as_deref()?;
        let labels = live["spec"]["selector"]["matchLabels"].as_object()?;
        let selector = labels
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(",");
        if selector.is_empty() {
            return None;
        }
        let client = self.client().await.ok()?.clone();
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let params = ListParams::default().labels(&selector).limit(PODS_READ);
        let mut list = pods.list(&params).await.ok()?.items;
        list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        list.iter().find_map(trouble)
    }
}

/// What is wrong with one Pod, if anything is yet.
pub(super) fn trouble(pod: &Pod) -> Option<String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let condition = |kind: &str| status.conditions.iter().flatten().find(|c| c.type_ == kind);
    if let Some(c) = condition("PodScheduled").filter(|c| c.status == "False") {
        let why = c
            .message
            .as_deref()
            .or(c.reason.as_deref())
            .unwrap_or("no reason given");
        return Some(format!("Pod {name} cannot be scheduled: {}", cut(why)));
    }
    if status.phase.as_deref() == Some("Failed") {
        let why = status.message.as_deref().or(status.reason.as_deref());
        return Some(format!(
            "Pod {name} failed: {}",
            cut(why.unwrap_or("no reason given"))
        ));
    }
    let containers = status.init_container_statuses.iter().flatten();
    let containers = containers.chain(status.container_statuses.iter().flatten());
    for c in containers.clone() {
        if let Some(said) = waiting(c).or_else(|| exited(c)) {
            return Some(format!("Pod {name}: container {}: {said}", c.name));
        }
    }
    let running_unready = containers
        .filter(|c| !c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>();
    if !running_unready.is_empty() {
        return Some(format!(
            "Pod {name}: container {} running but not ready (its readiness probe has not passed)",
            running_unready.join(", ")
        ));
    }
    None
}

/// A container that waits for a reason other than being started: the reason, the node's
/// message, and how its last run ended.
fn waiting(c: &ContainerStatus) -> Option<String> {
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref().unwrap_or("Waiting");
    if matches!(reason, "ContainerCreating" | "PodInitializing") {
        return None;
    }
    let mut said = reason.to_owned();
    if let Some(message) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
        said.push_str(&format!(": {}", cut(message)));
    }
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    if let Some(t) = last {
        said.push_str(&format!(" (last run exited with code {}", t.exit_code));
        if let Some(why) = t.reason.as_deref() {
            said.push_str(&format!(", {why}"));
        }
        said.push_str(&format!(", restarted {} times)", c.restart_count));
    }
    Some(said)
}

/// A container that ended and is not restarted yet: how.
fn exited(c: &ContainerStatus) -> Option<String> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    let mut said = format!("exited with code {}", t.exit_code);
    if let Some(why) = t.reason.as_deref() {
        said.push_str(&format!(" ({why})"));
    }
    if c.restart_count > 0 {
        said.push_str(&format!(", restarted {} times", c.restart_count));
    }
    Some(said)
}

fn cut(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MESSAGE_LIMIT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "pg-0"}, "status": status})).unwrap()
    }

    #[test]
    fn a_pod_says_what_keeps_it_from_running() {
        let never = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "postgresql", "ready": false, "restartCount": 0, "image": "postgres:99",
            "imageID": "", "state": {"waiting": {"reason": "ErrImageNeverPull",
            "message": "Container image \"postgres:99\" is not present with pull policy of Never"}}}]}));
        assert_eq!(
            trouble(&never).unwrap(),
            "Pod pg-0: container postgresql: ErrImageNeverPull: Container image \"postgres:99\" \
             is not present with pull policy of Never"
        );
        let crashing = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "postgresql", "ready": false, "restartCount": 3, "image": "postgres:17",
            "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff",
            "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(
            trouble(&crashing).unwrap(),
            "Pod pg-0: container postgresql: CrashLoopBackOff: back-off 40s restarting failed \
             container (last run exited with code 1, Error, restarted 3 times)"
        );
        let exited = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "postgresql", "ready": false, "restartCount": 2, "image": "postgres:17",
            "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(
            trouble(&exited).unwrap(),
            "Pod pg-0: container postgresql: exited with code 1 (Error), restarted 2 times"
        );
        let unready = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "postgresql", "ready": false, "restartCount": 0, "image": "postgres:17",
            "imageID": "", "state": {"running": {}}}]}));
        assert_eq!(
            trouble(&unready).unwrap(),
            "Pod pg-0: container postgresql running but not ready (its readiness probe has not passed)"
        );
        let unscheduled = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 Insufficient memory."}]}),
        );
        assert_eq!(
            trouble(&unscheduled).unwrap(),
            "Pod pg-0 cannot be scheduled: 0/1 nodes are available: 1 Insufficient memory."
        );
    }

    #[test]
    fn a_pod_on_its_way_is_no_trouble() {
        let creating = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "postgresql", "ready": false, "restartCount": 0, "image": "postgres:17",
            "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(trouble(&creating), None);
        let ready = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "postgresql", "ready": true, "restartCount": 0, "image": "postgres:17",
            "imageID": "", "state": {"running": {}}}]}));
        assert_eq!(trouble(&ready), None);
        let long = "x".repeat(1000);
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ErrImagePull", "message": long}}}]}));
        let said = trouble(&pulling).unwrap();
        assert!(said.chars().count() < 400, "{said}");
    }
}
