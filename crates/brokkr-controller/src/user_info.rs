//! Whose identity the controllers forward to brokers (`X-Broker-API-Originating-Identity`).
//!
//! `spec.userInfo` of a ServiceInstance or ServiceBinding says who changed its spec, but a tenant
//! can write anything there. The ValidatingAdmissionPolicy [`POLICY`] (shipped in `deploy/base`,
//! Kubernetes 1.30+) and its binding of the same name admit a `userInfo` only when it is the
//! requester's own (its username, its uid, a subset of its groups, no extra), or when the spec
//! does not change: so while it is in force, the `userInfo` of an object's spec is that of the
//! last person who changed the spec, or absent.
//!
//! Two rules follow, and this module keeps both:
//!
//! - **Only an identity the API server checked goes.** The policy only checks writes made while
//!   it is installed. An object's identity is forwarded only if the object was created after the
//!   policy and its binding were last created or changed (their `creationTimestamp` and
//!   `managedFields` times, in whole seconds), and only on a look at them that started after the
//!   reconcile did — so that every write of the object happened while they were there, and a
//!   policy removed a moment ago is not taken for one still in force. Looks are shared: every
//!   reconcile waiting for one takes the next, whoever asked.
//! - **An identity goes only with the call its change caused.** The callers ask for it only for
//!   a call that the spec's own change caused: a provision or an update of a new generation, and
//!   a bind. A deletion, a rotation, a parameters Secret's change, a poll, an orphan mitigation —
//!   all caused by someone the controller cannot name — carry none.
//!
//! Without the policy (an older API server, or an install that left it out) no originating
//! identity is sent at all. [`Guard::watch`] looks for the policy at start and every minute,
//! for the log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brokkr_osb::client::Client as OsbClient;
use brokkr_osb::headers::OriginatingIdentity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::resources::UserInfo;

/// The name of the ValidatingAdmissionPolicy, and of its binding, that checks `spec.userInfo`.
pub const POLICY: &str = "brokkr-user-info";
/// How often [`Guard::watch`] looks for the policy, for the log.
const RECHECK: Duration = Duration::from_secs(60);

/// Whether the API server checks `spec.userInfo`, as last looked up; shared by every reconcile.
#[derive(Clone, Default)]
pub struct Guard(Arc<Inner>);

#[derive(Default)]
struct Inner {
    /// Where the policy is looked up; none: it never is, and no identity is forwarded.
    client: Option<Client>,
    /// The last look's answer.
    state: Mutex<Looked>,
    /// Held by the one look under way.
    looking: tokio::sync::Mutex<()>,
}

/// What a look found.
#[derive(Clone, Copy, Default)]
struct Looked {
    /// When the look started.
    at: Option<Instant>,
    /// Since when the policy has been in force unchanged, in whole seconds as the API server
    /// dated it; none when it is not in force.
    since: Option<i64>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("looks", &self.0.client.is_some())
            .finish()
    }
}

impl Guard {
    /// A guard that looks the policy up through `client`.
    pub fn new(client: Client) -> Self {
        Self(Arc::new(Inner {
            client: Some(client),
            ..Inner::default()
        }))
    }

    /// `user`, the `spec.userInfo` of the object `meta` describes, when the API server checked
    /// it; else nothing. Ask only for a call that the object's spec caused (module docs).
    pub async fn checked<'a>(
        &self,
        meta: &ObjectMeta,
        user: Option<&'a UserInfo>,
    ) -> Option<&'a UserInfo> {
        let user = user?;
        let created = meta.creation_timestamp.as_ref()?.0;
        let since = self.look_after(Instant::now()).await?;
        admitted_since(created, since).then_some(user)
    }

    /// `osb` sending `user` as the originating identity, if any.
    pub fn client(
        osb: &OsbClient,
        user: Option<&UserInfo>,
    ) -> Result<OsbClient, brokkr_osb::client::Error> {
        match user {
            Some(user) => osb
                .clone()
                .with_originating_identity(&OriginatingIdentity::new(
                    "kubernetes",
                    serde_json::json!(user),
                )),
            None => Ok(osb.clone()),
        }
    }

    /// What a look that started no earlier than `asked` found: the time since which the
    /// policy has been in force, if it is. Reconciles that ask while a look is under way take
    /// the next one.
    async fn look_after(&self, asked: Instant) -> Option<i64> {
        let recent = |state: &Mutex<Looked>| {
            let looked = *state.lock().unwrap_or_else(|p| p.into_inner());
            looked
                .at
                .is_some_and(|at| at >= asked)
                .then_some(looked.since)
        };
        if let Some(since) = recent(&self.0.state) {
            return since;
        }
        let client = self.0.client.as_ref()?;
        let _turn = self.0.looking.lock().await;
        if let Some(since) = recent(&self.0.state) {
            return since;
        }
        let at = Instant::now();
        let since = in_force_since(client).await;
        *self.0.state.lock().unwrap_or_else(|p| p.into_inner()) = Looked {
            at: Some(at),
            since,
        };
        since
    }

    /// Looks for the policy now and every minute after, logging when it comes or goes, until
    /// the task is dropped.
    pub async fn watch(self) {
        let mut was = None;
        loop {
            let found = self.look_after(Instant::now()).await.is_some();
            if was != Some(found) {
                if found {
                    tracing::info!(
                        policy = POLICY,
                        "spec.userInfo is checked by the API server: it is forwarded to brokers as the originating identity, for objects created after the policy"
                    );
                } else {
                    tracing::warn!(
                        policy = POLICY,
                        "the ValidatingAdmissionPolicy that checks spec.userInfo is not installed: no originating identity is forwarded to brokers"
                    );
                }
            }
            was = Some(found);
            tokio::time::sleep(RECHECK).await;
        }
    }
}

/// Whether an object created at `created` was written only while a policy in force since
/// `since` (whole seconds) was there: a creation in the same second may have come first.
fn admitted_since(created: Timestamp, since: i64) -> bool {
    created.as_second() > since
}

/// Since when the policy and a binding of it that denies have been installed unchanged: the
/// latest of their creation and change times, in whole seconds; none when either is missing
/// (or cannot be read) or the binding does not deny.
async fn in_force_since(client: &Client) -> Option<i64> {
    let kind = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            kind,
        ))
    };
    let policies: Api<DynamicObject> =
        Api::all_with(client.clone(), &kind("ValidatingAdmissionPolicy"));
    let bindings: Api<DynamicObject> =
        Api::all_with(client.clone(), &kind("ValidatingAdmissionPolicyBinding"));
    let (policy, binding) = futures::join!(policies.get_opt(POLICY), bindings.get_opt(POLICY));
    let (Ok(Some(policy)), Ok(Some(binding))) = (policy, binding) else {
        return None;
    };
    if !denies(&binding.data) {
        return None;
    }
    Some(last_changed(&policy.metadata)?.max(last_changed(&binding.metadata)?))
}

/// The latest of an object's creation and of the times its managers last changed it.
fn last_changed(meta: &ObjectMeta) -> Option<i64> {
    let created = meta.creation_timestamp.as_ref()?.0.as_second();
    Some(
        meta.managed_fields
            .iter()
            .flatten()
            .filter_map(|entry| entry.time.as_ref())
            .map(|time| time.0.as_second())
            .fold(created, i64::max),
    )
}

/// Whether a ValidatingAdmissionPolicyBinding's body binds [`POLICY`] with the `Deny` action.
fn denies(binding: &Value) -> bool {
    let spec = &binding["spec"];
    spec["policyName"] == POLICY
        && spec["validationActions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "Deny"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use serde_json::json;

    #[test]
    fn only_a_denying_binding_of_the_policy_counts() {
        let binding = |name: &str, actions: Value| json!({"spec": {"policyName": name, "validationActions": actions}});
        assert!(denies(&binding(POLICY, json!(["Deny"]))));
        assert!(denies(&binding(POLICY, json!(["Audit", "Deny"]))));
        assert!(!denies(&binding(POLICY, json!(["Warn", "Audit"]))));
        assert!(!denies(&binding("another", json!(["Deny"]))));
        assert!(!denies(&json!({})));
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn only_objects_created_after_the_policy_was_last_changed_are_trusted() {
        let since = at("2026-01-01T10:00:00Z").as_second();
        assert!(admitted_since(at("2026-01-01T10:00:01Z"), since));
        // Within the same second the object may have come first.
        assert!(!admitted_since(at("2026-01-01T10:00:00Z"), since));
        assert!(!admitted_since(at("2026-01-01T09:59:59Z"), since));
    }

    #[test]
    fn a_policy_changed_after_its_creation_counts_from_its_change() {
        let mut meta = ObjectMeta {
            creation_timestamp: Some(Time(at("2026-01-01T10:00:00Z"))),
            ..ObjectMeta::default()
        };
        assert_eq!(
            last_changed(&meta),
            Some(at("2026-01-01T10:00:00Z").as_second())
        );
        meta.managed_fields = Some(vec![
            ManagedFieldsEntry {
                time: Some(Time(at("2026-01-02T10:00:00Z"))),
                ..ManagedFieldsEntry::default()
            },
            ManagedFieldsEntry::default(),
        ]);
        assert_eq!(
            last_changed(&meta),
            Some(at("2026-01-02T10:00:00Z").as_second())
        );
        assert_eq!(last_changed(&ObjectMeta::default()), None);
    }
}
