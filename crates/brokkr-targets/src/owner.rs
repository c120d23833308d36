//! Who an object on a shared server was created for. The shared-server targets record it on the
//! server itself, when or before they create the object, and go on only with objects recorded
//! for the instance (or binding) at hand: brokkr never takes over what it did not create.
//!
//! The record may be read by the server's other users (PostgreSQL shows every role's comment to
//! anyone who can log in), so it names its instance and binding only by marks: keyed hashes
//! under the broker's names key ([`NamesKey::mark`]), which tell nothing about the ids without
//! the key. A record is JSON, `{"of":"db_…","v":2,"instance":"<mark>","binding":"<mark>"}`.
//! Records written before marks (`{"of":…,"instance":"<id>","binding":"<id>"}`, without `v`)
//! are still recognised, so instances created then keep working; brokkr writes none of them
//! any more.

use brokkr_blueprint::NamesKey;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::target::{Scope, TargetError};

/// The version of records that carry marks.
const MARKED: u32 = 2;

/// The instance, or the binding of it, a call is for, and the instance's database or key prefix
/// the object belongs to: what a found [`Record`] must say for the object to be this owner's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    of: String,
    instance: String,
    binding: Option<String>,
    instance_mark: String,
    binding_mark: Option<String>,
}

/// An owner record as found on a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The instance's database or key prefix.
    of: String,
    /// [`MARKED`], or absent in the records of instances created before marks.
    #[serde(default, skip_serializing_if = "is_zero")]
    v: u32,
    /// The instance's mark (its id, in an old record).
    instance: String,
    /// The binding's mark (its id, in an old record), for a binding's object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    binding: Option<String>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Owner {
    /// The instance of `scope`, owning `of`.
    pub fn instance(of: &str, scope: &Scope<'_>) -> Self {
        Self {
            of: of.into(),
            instance: scope.instance_id.into(),
            binding: None,
            instance_mark: instance_mark(scope.names_key, scope.instance_id),
            binding_mark: None,
        }
    }

    /// The binding of `scope` (none for an instance's scope), on its instance's `of`.
    pub fn binding(of: &str, scope: &Scope<'_>) -> Self {
        let binding_mark = scope.binding_id.map(|b| {
            scope
                .names_key
                .mark("owner", &json!([scope.instance_id, b]))
        });
        Self {
            binding: scope.binding_id.map(str::to_owned),
            binding_mark,
            ..Self::instance(of, scope)
        }
    }

    /// The record brokkr writes for this owner.
    pub fn to_json(&self) -> String {
        let record = Record {
            of: self.of.clone(),
            v: MARKED,
            instance: self.instance_mark.clone(),
            binding: self.binding_mark.clone(),
        };
        serde_json::to_string(&record).expect("records serialize")
    }

    /// Whether `record` (JSON, as found on the server) is this owner's, in either form.
    pub fn owns(&self, record: Option<&str>) -> bool {
        record
            .and_then(Record::parse)
            .is_some_and(|r| r.is_of(self))
    }

    /// The error for an object `what` (`database db_x`) that exists without this owner's record.
    pub fn refusal(&self, target: &str, what: &str) -> TargetError {
        let whom = match &self.binding {
            Some(b) => format!("binding {b:?} of instance {:?}", self.instance),
            None => format!("instance {:?}", self.instance),
        };
        TargetError::Invalid(format!(
            "target {target}: {what} exists and was not created by brokkr for {whom}; brokkr \
             does not take it over"
        ))
    }
}

impl Record {
    /// The record in `json`; `None` for anything else.
    pub fn parse(json: &str) -> Option<Self> {
        serde_json::from_str(json).ok()
    }

    /// Whether this is `owner`'s record.
    fn is_of(&self, owner: &Owner) -> bool {
        self.of == owner.of
            && match self.v {
                MARKED => {
                    self.instance == owner.instance_mark && self.binding == owner.binding_mark
                }
                0 => self.instance == owner.instance && self.binding == owner.binding,
                _ => false,
            }
    }

    /// Whether this is the record of a binding on what `instance` owns.
    pub fn is_binding_of(&self, instance: &Owner) -> bool {
        self.binding.is_some()
            && self.of == instance.of
            && match self.v {
                MARKED => self.instance == instance.instance_mark,
                0 => self.instance == instance.instance,
                _ => false,
            }
    }
}

/// The mark of instance `id` in owner records.
fn instance_mark(key: &NamesKey, id: &str) -> String {
    key.mark("owner", &json!([id]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope<'a>(key: &'a NamesKey, binding: Option<&'a str>) -> Scope<'a> {
        static CONTEXT: serde_json::Value = serde_json::Value::Null;
        Scope {
            instance_id: "inst-1",
            binding_id: binding,
            service_id: "s",
            plan_id: "p",
            step: "step",
            context: &CONTEXT,
            names_key: key,
        }
    }

    #[test]
    fn records_carry_marks_not_ids() {
        let key = NamesKey::generate();
        let instance = Owner::instance("db_x", &scope(&key, None));
        let binding = Owner::binding("db_x", &scope(&key, Some("bind-1")));
        for owner in [&instance, &binding] {
            let json = owner.to_json();
            assert!(
                !json.contains("inst-1") && !json.contains("bind-1"),
                "{json}"
            );
            assert!(json.starts_with(r#"{"of":"db_x","v":2,"#), "{json}");
            assert!(owner.owns(Some(&json)));
        }
        assert!(!instance.owns(Some(&binding.to_json())));
        assert!(!binding.owns(Some(&instance.to_json())));
        let found = Record::parse(&binding.to_json()).unwrap();
        assert!(found.is_binding_of(&instance));
        // Another key (another broker) makes other marks.
        let other = NamesKey::generate();
        assert!(!Owner::instance("db_x", &scope(&other, None)).owns(Some(&instance.to_json())));
        assert!(!instance.owns(None) && !instance.owns(Some("not json")));
    }

    #[test]
    fn records_from_before_marks_are_recognised() {
        let key = NamesKey::generate();
        let instance = Owner::instance("db_x", &scope(&key, None));
        let binding = Owner::binding("db_x", &scope(&key, Some("bind-1")));
        let old_instance = r#"{"of":"db_x","instance":"inst-1"}"#;
        let old_binding = r#"{"of":"db_x","instance":"inst-1","binding":"bind-1"}"#;
        assert!(instance.owns(Some(old_instance)));
        assert!(binding.owns(Some(old_binding)));
        assert!(!binding.owns(Some(old_instance)));
        assert!(!instance.owns(Some(r#"{"of":"db_x","instance":"inst-2"}"#)));
        assert!(Record::parse(old_binding).unwrap().is_binding_of(&instance));
        // An instance whose id is another's mark does not own that one's record.
        let mark = instance_mark(&key, "inst-1");
        let posing = Scope {
            instance_id: &mark,
            ..scope(&key, None)
        };
        assert!(!Owner::instance("db_x", &posing).owns(Some(&instance.to_json())));
        let unknown = format!(r#"{{"of":"db_x","v":3,"instance":"{mark}"}}"#);
        assert!(!instance.owns(Some(&unknown)));
    }
}
