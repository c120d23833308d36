//! Whose identity the controllers forward to brokers (`X-Broker-API-Originating-Identity`).
//!
//! `spec.userInfo` of a ServiceInstance or ServiceBinding says who changed it, but a tenant can
//! write anything there. It is forwarded only while the API server checks it: while the
//! ValidatingAdmissionPolicy [`POLICY`] (shipped in `deploy/base`, Kubernetes 1.30+) and its
//! binding of the same name are installed and deny. That policy admits a `userInfo` only when
//! it is the requester's own (its username, its uid, a subset of its groups, no extra), or when
//! the spec is unchanged. Without the guard — an older API server, or an install without it —
//! no originating identity is sent at all, rather than one nobody checked.
//!
//! [`Guard::watch`] looks for the policy at start and then every minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use brokkr_osb::client::Client as OsbClient;
use brokkr_osb::headers::OriginatingIdentity;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::resources::UserInfo;

/// The name of the ValidatingAdmissionPolicy, and of its binding, that checks `spec.userInfo`.
pub const POLICY: &str = "brokkr-user-info";
/// How often the guard is looked for again.
const RECHECK: Duration = Duration::from_secs(60);

/// Whether the API server checks `spec.userInfo`; shared by every reconcile.
#[derive(Clone, Debug, Default)]
pub struct Guard(Arc<AtomicBool>);

impl Guard {
    /// A guard that is (or is not) in force, whatever the cluster says: for tests and for
    /// controllers told not to look.
    pub fn fixed(in_force: bool) -> Self {
        Self(Arc::new(AtomicBool::new(in_force)))
    }

    /// Whether `spec.userInfo` may be forwarded.
    pub fn in_force(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `user`, when it may be forwarded; else nothing.
    pub fn forwarded<'a>(&self, user: Option<&'a UserInfo>) -> Option<&'a UserInfo> {
        user.filter(|_| self.in_force())
    }

    /// `osb` sending `user` as the originating identity, where it may be forwarded.
    pub fn client(
        &self,
        osb: OsbClient,
        user: Option<&UserInfo>,
    ) -> Result<OsbClient, brokkr_osb::client::Error> {
        match self.forwarded(user) {
            Some(user) => osb.with_originating_identity(&OriginatingIdentity::new(
                "kubernetes",
                serde_json::json!(user),
            )),
            None => Ok(osb),
        }
    }

    /// Looks for the policy now and every minute after, until the task is dropped.
    pub async fn watch(self, client: Client) {
        loop {
            let found = installed(&client).await;
            if found != self.in_force() {
                if found {
                    tracing::info!(
                        policy = POLICY,
                        "spec.userInfo is checked by the API server: it is forwarded to brokers as the originating identity"
                    );
                } else {
                    tracing::warn!(
                        policy = POLICY,
                        "the ValidatingAdmissionPolicy that checks spec.userInfo is not installed: no originating identity is forwarded to brokers"
                    );
                }
            }
            self.0.store(found, Ordering::Relaxed);
            tokio::time::sleep(RECHECK).await;
        }
    }
}

/// Whether the policy and a binding of it that denies are installed.
async fn installed(client: &Client) -> bool {
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
    let (Ok(Some(_)), Ok(Some(binding))) = (
        policies.get_opt(POLICY).await,
        bindings.get_opt(POLICY).await,
    ) else {
        return false;
    };
    denies(&binding.data)
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
}
