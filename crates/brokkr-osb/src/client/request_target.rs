//! What each call is about, as its request target says it: the path of an instance or a binding
//! (each id escaped as one path segment), the plan (`service_id`, `plan_id`) and
//! `accepts_incomplete` query parameters, and the operation a `last_operation` polls.

use serde::Serialize;

/// Which service offering and plan a request is about: the `service_id` and `plan_id` query
/// parameters of deprovision, unbind, fetch and last_operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlanRef {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
}

impl PlanRef {
    /// `service_id` and `plan_id`.
    pub fn new(service_id: impl Into<String>, plan_id: impl Into<String>) -> Self {
        Self {
            service_id: service_id.into(),
            plan_id: plan_id.into(),
        }
    }
}

/// Whose operation to poll, and with what: the `operation` the broker returned, the plan, and
/// whether the operation deletes (so that 410 Gone means it succeeded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub(super) resource: Resource,
    pub(super) operation: Option<String>,
    pub(super) plan: Option<PlanRef>,
    pub(super) deleting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resource {
    Instance(String),
    Binding(String, String),
}

impl Resource {
    pub(super) fn path(&self) -> String {
        match self {
            Self::Instance(id) => instance_path(id),
            Self::Binding(instance, binding) => binding_path(instance, binding),
        }
    }
}

impl Poll {
    /// The operation of an instance.
    pub fn instance(instance_id: impl Into<String>) -> Self {
        Self::of(Resource::Instance(instance_id.into()))
    }

    /// The operation of a binding.
    pub fn binding(instance_id: impl Into<String>, binding_id: impl Into<String>) -> Self {
        Self::of(Resource::Binding(instance_id.into(), binding_id.into()))
    }

    fn of(resource: Resource) -> Self {
        Self {
            resource,
            operation: None,
            plan: None,
            deleting: false,
        }
    }

    /// The `operation` the broker returned with its 202 (pass it on, as the specification asks).
    #[must_use]
    pub fn operation(mut self, operation: Option<String>) -> Self {
        self.operation = operation;
        self
    }

    /// The service offering and plan, sent as `service_id` and `plan_id`.
    #[must_use]
    pub fn plan(mut self, plan: PlanRef) -> Self {
        self.plan = Some(plan);
        self
    }

    /// The operation deletes the resource: a 410 Gone while polling means it succeeded.
    #[must_use]
    pub fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// Whether the operation deletes the resource.
    pub fn is_deleting(&self) -> bool {
        self.deleting
    }
}

pub(super) fn instance_path(instance_id: &str) -> String {
    format!("/v2/service_instances/{}", segment(instance_id))
}

pub(super) fn binding_path(instance_id: &str, binding_id: &str) -> String {
    format!(
        "{}/service_bindings/{}",
        instance_path(instance_id),
        segment(binding_id)
    )
}

/// `id` as one path segment: characters that would end or change the segment are escaped.
fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn incomplete(accepts_incomplete: bool) -> Vec<(&'static str, String)> {
    if accepts_incomplete {
        vec![("accepts_incomplete", "true".to_owned())]
    } else {
        Vec::new()
    }
}

pub(super) fn with_plan(
    mut query: Vec<(&'static str, String)>,
    plan: Option<&PlanRef>,
) -> Vec<(&'static str, String)> {
    if let Some(plan) = plan {
        query.push(("service_id", plan.service_id.clone()));
        query.push(("plan_id", plan.plan_id.clone()));
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(segment("i-1_a.b~"), "i-1_a.b~");
        assert_eq!(segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
    }
}
