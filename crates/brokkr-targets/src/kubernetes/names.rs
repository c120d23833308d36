//! The labels, annotations and names brokkr gives Kubernetes objects.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::target::Scope;

/// The field manager of every server-side apply.
pub const MANAGER: &str = "brokkr";
/// Marks every object brokkr manages.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The instance an object belongs to (label: possibly hashed; annotation: the full id).
pub const INSTANCE: &str = "brokkr.dev/instance-id";
/// The binding an object belongs to (label: possibly hashed; annotation: the full id).
pub const BINDING: &str = "brokkr.dev/binding-id";
/// The service offering id.
pub const SERVICE: &str = "brokkr.dev/service";
/// The plan id.
pub const PLAN: &str = "brokkr.dev/plan";
/// The blueprint step that applied the object.
pub const STEP: &str = "brokkr.dev/step";
/// On claims of a StatefulSet's volume claim templates: the StatefulSet.
pub const CLAIM_OF: &str = "brokkr.dev/claim-of";
/// On a rendered StatefulSet or PersistentVolumeClaim: `delete` or `retain`.
pub const PVC_POLICY: &str = "brokkr.dev/pvc-policy";
/// On a per-instance namespace: one annotation per step with objects in it.
pub(super) const STEP_ANNOTATION: &str = "steps.brokkr.dev/";

/// The labels of every object brokkr applies for `scope`.
pub(super) fn labels(scope: &Scope<'_>) -> Map<String, Value> {
    let mut labels = Map::new();
    labels.insert(MANAGED_BY.into(), json!(MANAGER));
    labels.insert(INSTANCE.into(), json!(label_value(scope.instance_id)));
    labels.insert(SERVICE.into(), json!(label_value(scope.service_id)));
    labels.insert(PLAN.into(), json!(label_value(scope.plan_id)));
    labels.insert(STEP.into(), json!(label_value(scope.step)));
    if let Some(b) = scope.binding_id {
        labels.insert(BINDING.into(), json!(label_value(b)));
    }
    labels
}

/// The full ids, whatever their length.
pub(super) fn annotations(scope: &Scope<'_>) -> Map<String, Value> {
    let mut annotations = Map::new();
    annotations.insert(INSTANCE.into(), json!(scope.instance_id));
    if let Some(b) = scope.binding_id {
        annotations.insert(BINDING.into(), json!(b));
    }
    annotations
}

/// Sets every entry of `entries` in the object at `slot` (made an object if it is not one).
pub(super) fn merge_into(slot: &mut Value, entries: Map<String, Value>) {
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    if let Value::Object(map) = slot {
        map.extend(entries);
    }
}

/// `text` when it is a valid label value, else `sha-` and 40 hex digits of its SHA-256.
pub fn label_value(text: &str) -> String {
    let valid = text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && text
            .chars()
            .next()
            .is_none_or(|c| c.is_ascii_alphanumeric())
        && text
            .chars()
            .last()
            .is_none_or(|c| c.is_ascii_alphanumeric());
    if valid {
        text.to_owned()
    } else {
        format!("sha-{}", &hex(text)[..40])
    }
}

/// The namespace of an instance under the `per-instance` policy: `brokkr-<id>` when the id
/// makes a DNS label, else `brokkr-` and a hash.
pub fn instance_namespace(instance_id: &str) -> String {
    let lower = instance_id.to_ascii_lowercase();
    let label = format!("brokkr-{lower}");
    let dns = label.len() <= 63
        && lower
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !lower.ends_with('-')
        && lower == instance_id;
    if dns {
        label
    } else {
        format!("brokkr-{}", &hex(instance_id)[..40])
    }
}

pub(super) fn step_annotation(step: &str) -> String {
    format!("{STEP_ANNOTATION}{}", &hex(step)[..16])
}

fn hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_hashed_only_when_invalid() {
        let uuid = "3f2a9c4e-0b1d-4e5f-8a7b-6c5d4e3f2a10";
        assert_eq!(label_value(uuid), uuid);
        let long = "x".repeat(64);
        let hashed = label_value(&long);
        assert!(hashed.starts_with("sha-") && hashed.len() == 44, "{hashed}");
        assert_ne!(label_value("a b"), "a b");
        assert_ne!(label_value("-a"), "-a");
    }

    #[test]
    fn instance_namespaces_are_dns_labels() {
        assert_eq!(instance_namespace("abc-123"), "brokkr-abc-123");
        let odd = instance_namespace("Weird_ID");
        assert!(odd.starts_with("brokkr-") && odd.len() <= 63, "{odd}");
        assert!(instance_namespace(&"a".repeat(60)).len() <= 63);
    }

    #[test]
    fn secret_names_must_be_dns_subdomains() {
        assert!(is_dns_subdomain("orders-binding.v1"));
        assert!(!is_dns_subdomain("Orders"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(""));
    }
}
