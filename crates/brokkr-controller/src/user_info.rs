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
//!   it is installed, and only those it matches. An object's identity is forwarded only if the
//!   policy and its binding check its kind in every namespace as shipped, or provably the same
//!   way ([`crate::user_info_policy`]), and the object was created after they were last created
//!   or changed (their `creationTimestamp` and `managedFields` times, in whole seconds; a spec
//!   changed since creation — `metadata.generation` above 1 — whose `managedFields` carry no
//!   time counts from when this process first saw that generation, so stripping them widens
//!   nothing), and only on a look at them that started after the reconcile did — so that every
//!   write of the object happened while they were there, and a policy removed a moment ago is
//!   not taken for one still in force. Looks are shared: every reconcile waiting for one takes
//!   the next, whoever asked.
//! - **An identity goes only with the call its change caused.** The callers ask for it only for
//!   a call that the spec's own change caused: a provision or an update of a new generation, and
//!   a bind. A deletion, a rotation, a parameters Secret's change, a poll, an orphan mitigation —
//!   all caused by someone the controller cannot name — carry none.
//!
//! Without the policy as shipped (an older API server, an install that left it out or changed
//! it) no originating identity is sent at all. An object whose `userInfo` is withheld says so
//! in its condition `OriginatingIdentity` ([`Checked::record`]), and is counted in
//! `brokkr_controller_user_info_withheld_total{kind}`; [`Guard::watch`] looks at the policy at
//! start and every minute, logs why it is not trusted when that changes, and keeps the gauge
//! `brokkr_controller_user_info_checked` (1 while it is trusted for both kinds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brokkr_osb::client::Client as OsbClient;
use brokkr_osb::headers::OriginatingIdentity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use crate::conditions;
use crate::metrics::Metrics;
use crate::resources::{Condition, ConditionStatus, UserInfo};
pub use crate::user_info_policy::POLICY;
use crate::user_info_policy::as_shipped;

/// The kinds whose `spec.userInfo` is forwarded, by their resource names.
pub const INSTANCES: &str = "serviceinstances";
/// See [`INSTANCES`].
pub const BINDINGS: &str = "servicebindings";
/// The condition that says whether an object's `spec.userInfo` went to its broker.
pub const CONDITION: &str = "OriginatingIdentity";
/// How often [`Guard::watch`] looks for the policy, for the log and the gauge of it.
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
    /// When this process first saw each (uid, generation) of the policy and its binding.
    first_seen: Mutex<HashMap<(String, i64), i64>>,
}

/// What a look found.
#[derive(Clone, Default)]
struct Looked {
    /// When the look started.
    at: Option<Instant>,
    /// For each kind ([`INSTANCES`], [`BINDINGS`]): since when the policy has been in force as
    /// shipped, in whole seconds as the API server dated it, or why it is not.
    verdicts: HashMap<&'static str, Result<i64, String>>,
}

impl Looked {
    fn verdict(&self, plural: &str) -> Result<i64, String> {
        self.verdicts.get(plural).cloned().unwrap_or_else(|| {
            Err(format!(
                "the controller does not look for the ValidatingAdmissionPolicy {POLICY}"
            ))
        })
    }
}

/// Whether an object's `spec.userInfo` goes with the call its change caused.
#[derive(Debug, Clone, PartialEq)]
pub enum Checked<'a> {
    /// The object has no `userInfo`.
    Absent,
    /// Checked by the API server: forwarded.
    Forwarded(&'a UserInfo),
    /// Not checked, or not known to be: withheld, and why, in words for the object's condition
    /// (the controller's log says more when the policy's state changes).
    Withheld {
        /// Why, in words for the object's condition.
        condition: &'static str,
    },
}

impl<'a> Checked<'a> {
    /// The identity to forward, if any.
    pub fn user(&self) -> Option<&'a UserInfo> {
        match self {
            Checked::Forwarded(user) => Some(user),
            _ => None,
        }
    }

    /// Says in `conditions` whether the object's `userInfo` went to the broker (nothing for an
    /// object without one), and counts a withheld one of `kind` in `metrics`.
    pub fn record(&self, conditions: &mut Vec<Condition>, metrics: &Metrics, kind: &str) {
        match self {
            Checked::Absent => {}
            Checked::Forwarded(_) => conditions::set(
                conditions,
                CONDITION,
                ConditionStatus::True,
                "UserInfoForwarded",
                "spec.userInfo went to the broker as the originating identity: the API server \
                 checked it",
            ),
            Checked::Withheld { condition } => {
                metrics.user_info_withheld(kind);
                conditions::set(
                    conditions,
                    CONDITION,
                    ConditionStatus::False,
                    "UserInfoNotChecked",
                    format!(
                        "spec.userInfo did not go to the broker as the originating identity: \
                         {condition}"
                    ),
                );
            }
        }
    }
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

    /// `user`, the `spec.userInfo` of the object of kind `plural` ([`INSTANCES`],
    /// [`BINDINGS`]) that `meta` describes, forwarded when the API server checked it; else why
    /// not. Ask only for a call that the object's spec caused (module docs).
    pub async fn checked<'a>(
        &self,
        plural: &str,
        meta: &ObjectMeta,
        user: Option<&'a UserInfo>,
    ) -> Checked<'a> {
        let Some(user) = user else {
            return Checked::Absent;
        };
        let not_in_force = "the API server's check of it (the ValidatingAdmissionPolicy \
                            brokkr-user-info) is not in force as brokkr ships it; the \
                            controller's log says why";
        let since = match self.look_after(Instant::now()).await.verdict(plural) {
            Ok(since) => since,
            Err(_) => {
                return Checked::Withheld {
                    condition: not_in_force,
                };
            }
        };
        match meta.creation_timestamp.as_ref() {
            Some(created) if admitted_since(created.0, since) => Checked::Forwarded(user),
            _ => Checked::Withheld {
                condition: "the object is older than the API server's check of it (the \
                            ValidatingAdmissionPolicy brokkr-user-info as it is now)",
            },
        }
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

    /// What a look that started no earlier than `asked` found. Reconciles that ask while a
    /// look is under way take the next one.
    async fn look_after(&self, asked: Instant) -> Looked {
        let recent = |state: &Mutex<Looked>| {
            let looked = state.lock().unwrap_or_else(|p| p.into_inner());
            looked
                .at
                .is_some_and(|at| at >= asked)
                .then(|| looked.clone())
        };
        if let Some(looked) = recent(&self.0.state) {
            return looked;
        }
        let Some(client) = self.0.client.as_ref() else {
            return Looked::default();
        };
        let _turn = self.0.looking.lock().await;
        if let Some(looked) = recent(&self.0.state) {
            return looked;
        }
        let at = Instant::now();
        let verdicts = {
            let found = look(client).await;
            let mut first_seen = self.0.first_seen.lock().unwrap_or_else(|p| p.into_inner());
            [INSTANCES, BINDINGS]
                .into_iter()
                .map(|plural| (plural, verdict(found.as_ref(), plural, &mut first_seen)))
                .collect()
        };
        let looked = Looked {
            at: Some(at),
            verdicts,
        };
        *self.0.state.lock().unwrap_or_else(|p| p.into_inner()) = looked.clone();
        looked
    }

    /// Looks at the policy now and every minute after, logging when whether it is trusted (and
    /// why not) changes, and keeping `metrics`' gauge of it, until the task is dropped.
    pub async fn watch(self, metrics: Metrics) {
        let mut was = None;
        loop {
            let looked = self.look_after(Instant::now()).await;
            let why: Vec<String> = [INSTANCES, BINDINGS]
                .into_iter()
                .filter_map(|plural| {
                    let why = looked.verdict(plural).err()?;
                    Some(format!("{plural}: {why}"))
                })
                .collect();
            metrics.set_user_info_checked(why.is_empty());
            if was.as_ref() != Some(&why) {
                if why.is_empty() {
                    tracing::info!(
                        policy = POLICY,
                        "spec.userInfo is checked by the API server as brokkr ships the policy: it is forwarded to brokers as the originating identity, for objects created after the policy"
                    );
                } else {
                    tracing::warn!(
                        policy = POLICY,
                        why = %why.join("; "),
                        "spec.userInfo is not checked by the API server as brokkr ships the policy: no originating identity is forwarded to brokers, and the objects whose userInfo is withheld say so (condition OriginatingIdentity)"
                    );
                }
            }
            was = Some(why);
            tokio::time::sleep(RECHECK).await;
        }
    }
}

/// Whether an object created at `created` was written only while a policy in force since
/// `since` (whole seconds) was there: a creation in the same second may have come first.
fn admitted_since(created: Timestamp, since: i64) -> bool {
    created.as_second() > since
}

/// The policy and its binding as the API server holds them; `Err` says why they are not there.
type Found = Result<(DynamicObject, DynamicObject), String>;

/// Reads the policy and its binding.
async fn look(client: &Client) -> Found {
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
    match (policy, binding) {
        (Ok(Some(policy)), Ok(Some(binding))) => Ok((policy, binding)),
        (Err(e), _) | (_, Err(e)) => Err(format!("the policy cannot be read: {e}")),
        _ => Err(format!(
            "the ValidatingAdmissionPolicy {POLICY} or its binding is not installed"
        )),
    }
}

/// Since when `found` has checked `plural` as shipped (the latest of the policy's and the
/// binding's changes), or why it does not.
fn verdict(
    found: Result<&(DynamicObject, DynamicObject), &String>,
    plural: &str,
    first_seen: &mut HashMap<(String, i64), i64>,
) -> Result<i64, String> {
    let (policy, binding) = found.map_err(Clone::clone)?;
    as_shipped(&policy.data, &binding.data, plural)?;
    let now = Timestamp::now().as_second();
    let mut since = |meta: &ObjectMeta| {
        let key = (
            meta.uid.clone().unwrap_or_default(),
            meta.generation.unwrap_or(1),
        );
        let seen = *first_seen.entry(key).or_insert(now);
        last_changed(meta, seen).ok_or_else(|| format!("{POLICY} has no creationTimestamp"))
    };
    Ok(since(&policy.metadata)?.max(since(&binding.metadata)?))
}

/// The latest of an object's creation and of the times its managers last changed it. When its
/// spec changed since its creation (`generation` above 1) and no `managedFields` entry says when
/// (they were stripped), when it is known to have been as it is: `seen`, when this process
/// first saw that generation.
fn last_changed(meta: &ObjectMeta, seen: i64) -> Option<i64> {
    let created = meta.creation_timestamp.as_ref()?.0.as_second();
    let times: Vec<i64> = (meta.managed_fields.iter().flatten())
        .filter_map(|entry| entry.time.as_ref())
        .map(|time| time.0.as_second())
        .collect();
    let changed_unknown = meta.generation.unwrap_or(1) > 1 && times.is_empty();
    let latest = times.into_iter().fold(created, i64::max);
    Some(if changed_unknown {
        latest.max(seen)
    } else {
        latest
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

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
        let seen = at("2026-03-01T00:00:00Z").as_second();
        let mut meta = ObjectMeta {
            creation_timestamp: Some(Time(at("2026-01-01T10:00:00Z"))),
            ..ObjectMeta::default()
        };
        assert_eq!(
            last_changed(&meta, seen),
            Some(at("2026-01-01T10:00:00Z").as_second())
        );
        meta.managed_fields = Some(vec![
            ManagedFieldsEntry {
                time: Some(Time(at("2026-01-02T10:00:00Z"))),
                ..ManagedFieldsEntry::default()
            },
            ManagedFieldsEntry::default(),
        ]);
        meta.generation = Some(2);
        assert_eq!(
            last_changed(&meta, seen),
            Some(at("2026-01-02T10:00:00Z").as_second())
        );
        assert_eq!(last_changed(&ObjectMeta::default(), seen), None);
    }

    #[test]
    fn a_changed_policy_whose_managed_fields_were_stripped_counts_from_when_it_was_seen() {
        let seen = at("2026-03-01T00:00:00Z").as_second();
        let mut meta = ObjectMeta {
            creation_timestamp: Some(Time(at("2026-01-01T10:00:00Z"))),
            generation: Some(3),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..ObjectMeta::default()
        };
        assert_eq!(last_changed(&meta, seen), Some(seen));
        meta.managed_fields = None;
        assert_eq!(last_changed(&meta, seen), Some(seen));
        // Never changed since its creation: its creation is when it became what it is.
        meta.generation = Some(1);
        assert_eq!(
            last_changed(&meta, seen),
            Some(at("2026-01-01T10:00:00Z").as_second())
        );
    }
}
