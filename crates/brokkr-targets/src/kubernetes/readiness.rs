//! When a live Kubernetes object is usable.
//!
//! Built-in rules ([`builtin`]), by kind:
//!
//! | kind | ready when |
//! |---|---|
//! | Deployment | the controller saw the latest spec; updated and available replicas = `spec.replicas` |
//! | StatefulSet | the controller saw the latest spec; ready replicas = `spec.replicas`; the current revision is the update revision |
//! | Job | condition `Complete` is `True` (a `Failed` condition fails the step) |
//! | PersistentVolumeClaim | `status.phase` is `Bound` |
//! | anything else | its status, when it names an `observedGeneration`, describes the latest spec; its `Ready` condition, else its `Available` condition, is `True`; objects without either are ready |
//!
//! A step's `readiness` entries ([`Check`]) add a condition (`condition: {type, status}`) or a
//! field (`jsonpath: "{.status.phase}"`, `equals: Running`) that must hold.

use jsonpath_rust::JsonPath;
use serde_json::Value;

use crate::target::Readiness;

/// Applies the built-in rule for `kind` to a live object. An error says the object failed for
/// good (a Job's `Failed` condition).
pub fn builtin(kind: &str, live: &Value) -> Result<Readiness, String> {
    let name = live["metadata"]["name"].as_str().unwrap_or_default();
    let status = &live["status"];
    let wanted = live["spec"]["replicas"].as_i64().unwrap_or(1);
    let count = |field: &str| status[field].as_i64().unwrap_or(0);
    let observed = status["observedGeneration"].as_i64().unwrap_or(0)
        >= live["metadata"]["generation"].as_i64().unwrap_or(0);
    let waiting = |detail: String| {
        Ok(Readiness::Waiting(format!(
            "waiting for {kind} {name} {detail}"
        )))
    };
    match kind {
        "Deployment" => {
            let available = count("availableReplicas");
            if !observed || count("updatedReplicas") < wanted || available < wanted {
                return waiting(format!("to be available ({available}/{wanted})"));
            }
        }
        "StatefulSet" => {
            let ready = count("readyReplicas");
            if !observed || ready < wanted {
                return waiting(format!("to be ready ({ready}/{wanted})"));
            }
            let current = status["currentRevision"].as_str();
            let update = status["updateRevision"].as_str();
            if update.is_some() && current != update {
                return waiting("to finish its rolling update".into());
            }
        }
        "Job" => {
            if let Some(failed) = condition(live, "Failed").filter(|c| c["status"] == "True") {
                let why = failed["message"].as_str().or(failed["reason"].as_str());
                return Err(format!(
                    "Job {name} failed: {}",
                    why.unwrap_or("no reason given")
                ));
            }
            if !condition_is(live, "Complete", "True") {
                return waiting("to complete".into());
            }
        }
        "PersistentVolumeClaim" => {
            let phase = status["phase"].as_str().unwrap_or("Pending");
            if phase != "Bound" {
                return waiting(format!("to be bound ({phase})"));
            }
        }
        _ => {
            // A status that says which generation it describes is stale until it reaches the
            // object's: an update's new spec is not ready on the strength of the old one's.
            if status.get("observedGeneration").is_some() && !observed {
                let generation = live["metadata"]["generation"].as_i64().unwrap_or(0);
                return waiting(format!("to observe generation {generation}"));
            }
            for t in ["Ready", "Available"] {
                if let Some(c) = condition(live, t) {
                    if c["status"] != "True" {
                        let why = c["message"].as_str().or(c["reason"].as_str());
                        let why = why.map(|w| format!(": {w}")).unwrap_or_default();
                        return waiting(format!("to be {}{why}", t.to_lowercase()));
                    }
                    break;
                }
            }
        }
    }
    Ok(Readiness::Ready)
}

/// Whether objects of `kind` are ready as soon as they exist: core kinds without a status
/// their readiness depends on.
pub fn without_status(kind: &str) -> bool {
    matches!(
        kind,
        "Secret"
            | "ConfigMap"
            | "Service"
            | "ServiceAccount"
            | "Role"
            | "RoleBinding"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "NetworkPolicy"
    )
}

/// The condition of `type` in `status.conditions`.
fn condition<'a>(live: &'a Value, kind: &str) -> Option<&'a Value> {
    live["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_is(live: &Value, kind: &str, status: &str) -> bool {
    condition(live, kind).is_some_and(|c| c["status"] == status)
}

/// A readiness check a step declares.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// `condition: {type, status}` (status defaults to `True`).
    Condition {
        /// The condition type.
        kind: String,
        /// The status it must have.
        status: String,
    },
    /// `jsonpath: "{.status.phase}"` and `equals: VALUE`: the first match equals the value
    /// (compared as text when the value is a string).
    Field {
        /// The JSONPath, with or without kubectl's braces.
        path: String,
        /// The expected value.
        equals: Value,
    },
}

impl Check {
    /// Reads a rendered `readiness` entry (apiVersion, kind and name are read by the target).
    pub fn parse(check: &Value) -> Result<Self, String> {
        match (&check["condition"], check.get("jsonpath")) {
            (Value::Object(c), None) => {
                let kind = c
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or("a readiness condition needs `type` (and `status`, default True)")?;
                let status = match c.get("status") {
                    None => "True".to_owned(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Bool(b)) => if *b { "True" } else { "False" }.to_owned(),
                    Some(other) => return Err(format!("condition status {other} is not text")),
                };
                Ok(Self::Condition {
                    kind: kind.to_owned(),
                    status,
                })
            }
            (Value::Null, Some(Value::String(path))) => {
                let equals = check
                    .get("equals")
                    .cloned()
                    .ok_or("a `jsonpath` readiness check needs `equals`")?;
                let path = json_path(path);
                serde_json::Value::Null
                    .query(&path)
                    .map_err(|e| format!("jsonpath {path:?}: {e}"))?;
                Ok(Self::Field { path, equals })
            }
            _ => Err(
                "a readiness check has either `condition: {type, status}` or \
                      `jsonpath` and `equals`"
                    .into(),
            ),
        }
    }

    /// Evaluates the check on the live object `what` (`"StatefulSet pg"`).
    pub fn evaluate(&self, what: &str, live: &Value) -> Readiness {
        match self {
            Self::Condition { kind, status } => {
                let found = condition(live, kind);
                match found.map(|c| &c["status"]) {
                    Some(Value::String(s)) if s == status => Readiness::Ready,
                    Some(other) => Readiness::Waiting(format!(
                        "waiting for {what} to have condition {kind}={status} (now {})",
                        other.as_str().unwrap_or("unknown")
                    )),
                    None => Readiness::Waiting(format!(
                        "waiting for {what} to have condition {kind}={status}"
                    )),
                }
            }
            Self::Field { path, equals } => {
                let found = live
                    .query(path)
                    .ok()
                    .and_then(|v| v.first().copied().cloned());
                let matches = match (&found, equals) {
                    (Some(Value::String(a)), Value::String(b)) => a == b,
                    (Some(a), Value::String(b)) => *b == format!("{a}"),
                    (Some(a), b) => a == b,
                    (None, _) => false,
                };
                if matches {
                    return Readiness::Ready;
                }
                let now = found.map_or("nothing".to_owned(), |v| v.to_string());
                let wanted = equals
                    .as_str()
                    .map_or_else(|| equals.to_string(), str::to_owned);
                Readiness::Waiting(format!(
                    "waiting for {what} {path} to be {wanted} (now {now})"
                ))
            }
        }
    }
}

/// kubectl's `{.status.phase}` as the JSONPath `$.status.phase`.
fn json_path(path: &str) -> String {
    let inner = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim();
    if inner.starts_with('$') {
        inner.to_owned()
    } else if inner.starts_with('.') || inner.starts_with('[') {
        format!("${inner}")
    } else {
        format!("$.{inner}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn waiting(r: Result<Readiness, String>) -> String {
        match r {
            Ok(Readiness::Waiting(w)) => w,
            other => panic!("expected waiting, got {other:?}"),
        }
    }

    #[test]
    fn statefulsets_wait_for_ready_replicas_and_revision() {
        let mut sts = json!({
            "metadata": {"name": "pg-3f2a", "generation": 2},
            "spec": {"replicas": 3},
            "status": {"observedGeneration": 2, "readyReplicas": 2},
        });
        assert_eq!(
            waiting(builtin("StatefulSet", &sts)),
            "waiting for StatefulSet pg-3f2a to be ready (2/3)"
        );
        sts["status"]["readyReplicas"] = json!(3);
        sts["status"]["currentRevision"] = json!("a");
        sts["status"]["updateRevision"] = json!("b");
        assert!(waiting(builtin("StatefulSet", &sts)).contains("rolling update"));
        sts["status"]["currentRevision"] = json!("b");
        assert_eq!(builtin("StatefulSet", &sts), Ok(Readiness::Ready));
        sts["metadata"]["generation"] = json!(3);
        assert!(waiting(builtin("StatefulSet", &sts)).contains("(3/3)"));
    }

    #[test]
    fn deployments_jobs_and_claims() {
        let dep = json!({"metadata": {"name": "d"}, "spec": {"replicas": 2},
            "status": {"updatedReplicas": 2, "availableReplicas": 1}});
        assert!(waiting(builtin("Deployment", &dep)).contains("(1/2)"));
        let job = json!({"metadata": {"name": "j"}, "status": {"conditions": [
            {"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}});
        assert_eq!(
            builtin("Job", &job),
            Err("Job j failed: BackoffLimitExceeded".into())
        );
        let done = json!({"metadata": {"name": "j"}, "status": {"conditions": [
            {"type": "Complete", "status": "True"}]}});
        assert_eq!(builtin("Job", &done), Ok(Readiness::Ready));
        let pvc = json!({"metadata": {"name": "c"}, "status": {"phase": "Pending"}});
        assert!(waiting(builtin("PersistentVolumeClaim", &pvc)).contains("(Pending)"));
    }

    #[test]
    fn other_kinds_use_their_ready_condition() {
        let db = json!({"metadata": {"name": "pg"}, "status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "Provisioning"}]}});
        assert_eq!(
            waiting(builtin("Postgres", &db)),
            "waiting for Postgres pg to be ready: Provisioning"
        );
        let plain = json!({"metadata": {"name": "s"}, "data": {}});
        assert_eq!(builtin("Secret", &plain), Ok(Readiness::Ready));

        // After an update, a Ready status of the previous generation is not enough.
        let updated = json!({"metadata": {"name": "pg", "generation": 3}, "status": {
            "observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            waiting(builtin("Postgres", &updated)),
            "waiting for Postgres pg to observe generation 3"
        );
        let mut seen = updated.clone();
        seen["status"]["observedGeneration"] = json!(3);
        assert_eq!(builtin("Postgres", &seen), Ok(Readiness::Ready));
    }

    #[test]
    fn declared_checks() {
        let live = json!({"status": {"phase": "Running", "replicas": 3,
            "conditions": [{"type": "AcceptingConnection", "status": "True"}]}});
        let phase =
            Check::parse(&json!({"jsonpath": "{.status.phase}", "equals": "Running"})).unwrap();
        assert_eq!(phase.evaluate("X x", &live), Readiness::Ready);
        let replicas = Check::parse(&json!({"jsonpath": ".status.replicas", "equals": 4})).unwrap();
        assert_eq!(
            replicas.evaluate("X x", &live),
            Readiness::Waiting("waiting for X x $.status.replicas to be 4 (now 3)".into())
        );
        let cond = Check::parse(&json!({"condition": {"type": "AcceptingConnection"}})).unwrap();
        assert_eq!(cond.evaluate("X x", &live), Readiness::Ready);
        let missing =
            Check::parse(&json!({"condition": {"type": "Ready", "status": "True"}})).unwrap();
        assert!(matches!(
            missing.evaluate("X x", &live),
            Readiness::Waiting(_)
        ));
        assert!(Check::parse(&json!({"jsonpath": "{.a}"})).is_err());
        assert!(Check::parse(&json!({})).is_err());
    }
}
