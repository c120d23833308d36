//! Which objects a LIST or a WATCH wants: kind, namespace, label and field selectors.

use serde_json::{Map, Value};

use crate::store::{Key, KindDef};

/// The objects a request selects.
#[derive(Debug, Clone)]
pub(crate) struct Selection {
    pub(crate) group: String,
    pub(crate) plural: String,
    /// Empty for every namespace (or a cluster-scoped kind).
    pub(crate) namespace: String,
    pub(crate) labels: String,
    pub(crate) fields: String,
}

impl Selection {
    /// The selection of a collection request with `query` (its label and field selectors).
    pub(crate) fn new(def: &KindDef, namespace: &str, query: &[(String, String)]) -> Self {
        let param = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        Self {
            group: def.group.clone(),
            plural: def.plural.clone(),
            namespace: namespace.to_owned(),
            labels: param("labelSelector"),
            fields: param("fieldSelector"),
        }
    }

    /// Whether the object stored at `key` is selected.
    pub(crate) fn matches(&self, key: &Key, object: &Value) -> bool {
        key.0 == self.group
            && key.1 == self.plural
            && (self.namespace.is_empty() || key.2 == self.namespace)
            && labels_match(&self.labels, &object["metadata"]["labels"])
            && fields_match(&self.fields, object)
    }
}

/// Whether `labels` match a selector of `k=v`, `k==v`, `k!=v`, `k` and `!k` terms.
fn labels_match(selector: &str, labels: &Value) -> bool {
    let empty = Map::new();
    let labels = labels.as_object().unwrap_or(&empty);
    terms(selector).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels.get(k).and_then(Value::as_str) != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels.get(k).and_then(Value::as_str) == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            !labels.contains_key(k)
        } else {
            labels.contains_key(term)
        }
    })
}

/// Whether `object` matches a field selector of `path=v`, `path==v` and `path!=v` terms, each
/// path a dotted field (`metadata.name`, `status.phase`); an absent field is the empty string.
fn fields_match(selector: &str, object: &Value) -> bool {
    let field = |path: &str| {
        let found = path.split('.').try_fold(object, |v, part| v.get(part));
        match found {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    };
    terms(selector).all(|term| {
        if let Some((path, v)) = term.split_once("!=") {
            field(path) != v
        } else if let Some((path, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            field(path) == v
        } else {
            false
        }
    })
}

fn terms(selector: &str) -> impl Iterator<Item = &str> {
    selector.split(',').map(str::trim).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_and_field_selectors() {
        let labels = json!({"app": "pg", "tier": "db"});
        assert!(labels_match("app=pg,tier==db,!gone,app", &labels));
        assert!(!labels_match("app!=pg", &labels));
        assert!(!labels_match("missing", &labels));
        let object = json!({"metadata": {"name": "a", "namespace": "ns"}, "status": {"n": 1}});
        assert!(fields_match(
            "metadata.name=a,metadata.namespace==ns",
            &object
        ));
        assert!(fields_match("status.n=1,spec.x=", &object));
        assert!(!fields_match("metadata.name!=a", &object));
        assert!(!fields_match("metadata.name", &object));
    }
}
