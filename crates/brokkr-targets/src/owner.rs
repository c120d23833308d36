//! Who an object on a shared server was created for. The shared-server targets record it on the
//! server itself, when or before they create the object, and go on only with objects recorded
//! for the instance (or binding) at hand: brokkr never takes over what it did not create.

use serde::{Deserialize, Serialize};

use crate::{Scope, TargetError};

/// The instance, or the binding of it, an object was created for, and the instance's database
/// or key prefix it belongs to. Kept on the server as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    /// The instance's database or key prefix.
    pub of: String,
    /// The instance id.
    pub instance: String,
    /// The binding id, for a binding's object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

impl Owner {
    /// The instance of `scope`, owning `of`.
    pub fn instance(of: &str, scope: &Scope<'_>) -> Self {
        Self {
            of: of.into(),
            instance: scope.instance_id.into(),
            binding: None,
        }
    }

    /// The binding of `scope` (none for an instance's scope), on its instance's `of`.
    pub fn binding(of: &str, scope: &Scope<'_>) -> Self {
        Self {
            binding: scope.binding_id.map(str::to_owned),
            ..Self::instance(of, scope)
        }
    }

    /// The record as written by [`Owner::to_json`]; `None` for anything else.
    pub fn parse(json: &str) -> Option<Self> {
        serde_json::from_str(json).ok()
    }

    /// The record.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("owners serialize")
    }

    /// Whether this is the record of a binding on what `instance` owns.
    pub fn is_binding_of(&self, instance: &Self) -> bool {
        self.binding.is_some() && self.of == instance.of && self.instance == instance.instance
    }

    /// The error for an object `what` (`database db_x`) that exists without this record.
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
