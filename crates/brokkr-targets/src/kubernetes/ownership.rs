//! Objects brokkr owns: an object is brokkr's for an instance or binding when its annotations
//! say so, and brokkr never takes over or deletes anyone else's. Deleting one of its own answers
//! the object while finalizers or dependents hold it, from the API server's answer alone.

use kube::api::{DeleteParams, DynamicObject, Preconditions};
use tracing::warn;

use super::cluster::{Kubernetes, Located};
use super::names::{BINDING, INSTANCE};
use crate::target::{Scope, TargetError};

impl Kubernetes {
    /// Whether `name` exists and was created by brokkr for `scope` (its instance and binding
    /// annotations say so); an object of someone else's is an error, so it is never taken over.
    pub(super) async fn check_owner(
        &self,
        at: &Located,
        name: &str,
        scope: &Scope<'_>,
    ) -> Result<Option<DynamicObject>, TargetError> {
        let Some(live) = self.get(at, name).await? else {
            return Ok(None);
        };
        let annotations = live.metadata.annotations.clone().unwrap_or_default();
        let ours = annotations.get(INSTANCE).map(String::as_str) == Some(scope.instance_id)
            && annotations.get(BINDING).map(String::as_str) == scope.binding_id;
        if !ours {
            return Err(self.invalid(format!(
                "{} exists and was not created by brokkr for this {}; brokkr does not take it over",
                at.what,
                if scope.binding_id.is_some() {
                    "binding"
                } else {
                    "instance"
                }
            )));
        }
        Ok(Some(live))
    }

    /// Deletes `name` when it is `scope`'s; answers the object while it is still going (`None`
    /// once it is gone). An object that is not brokkr's for `scope` is left alone (and counts as
    /// gone). One already being deleted is not asked again. `foreground` waits for its
    /// dependents (a StatefulSet's Pods) before it goes.
    pub(super) async fn delete_own(
        &self,
        at: &Located,
        name: &str,
        scope: &Scope<'_>,
        foreground: bool,
    ) -> Result<Option<DynamicObject>, TargetError> {
        match self.check_owner(at, name, scope).await {
            Ok(None) => Ok(None),
            Ok(Some(live)) if live.metadata.deletion_timestamp.is_some() => Ok(Some(live)),
            Ok(Some(live)) => {
                self.delete_and_check(at, name, live.metadata.uid, foreground)
                    .await
            }
            Err(TargetError::Invalid(why)) => {
                warn!(target = %self.name, "{why}: left in place");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes `name` (only the object of that `uid`, when given: a precondition) and answers,
    /// from the API server's answer alone, the object while it waits for finalizers or, with
    /// `foreground`, for its dependents; `None` when it went at once.
    pub(super) async fn delete_and_check(
        &self,
        at: &Located,
        name: &str,
        uid: Option<String>,
        foreground: bool,
    ) -> Result<Option<DynamicObject>, TargetError> {
        let propagation = if foreground {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..propagation
        };
        match at.api.delete(name, &params).await {
            // Left: the object, still there; Right: the status of its deletion.
            Ok(answer) => Ok(answer.left()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            // Another object of that name replaced it meanwhile: this one is gone.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(self.error(&format!("deleting {}", at.what), e)),
        }
    }
}
