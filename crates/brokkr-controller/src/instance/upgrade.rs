//! Upgrades to a plan's maintenance version. The version an instance runs is the one its last
//! provision or update sent (`status.externalProperties.maintenanceInfoVersion`); when its plan
//! offers another, the `UpgradeAvailable` condition says so, and an upgrade — an OSB update
//! that carries the plan's `maintenance_info` — is due at once when `spec.maintenance.version`
//! names the offered version, or, with `spec.maintenance.autoUpgrade`, when the window is open.

use std::time::Duration;

use brokkr_osb::client::{MAX_TEXT, clipped};

use k8s_openapi::jiff::Timestamp;

use crate::runner::Action;

use super::state::{condition_is, reason, write_status};
use crate::conditions;
use crate::context::Context;
use crate::error::Error;
use crate::resources::{
    CommonServicePlanSpec, ConditionStatus, ServiceInstance, ServiceInstanceStatus,
};

/// The condition that says the plan offers a version the instance does not run.
pub(super) const CONDITION: &str = "UpgradeAvailable";

/// Whether an upgrade should start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Due {
    /// Nothing to upgrade to, or nobody asked for it.
    No,
    /// Upgrade to this version now.
    Now(String),
    /// An automatic upgrade waits for its window, which opens in this long.
    Later(Duration),
}

/// The maintenance version the instance runs, as its last provision or update sent it.
pub(super) fn running(status: &ServiceInstanceStatus) -> Option<&str> {
    (status.external_properties.as_ref()).and_then(|p| p.maintenance_info_version.as_deref())
}

/// Sets or removes the `UpgradeAvailable` condition of `status` from what `plan` offers, and
/// says whether an upgrade is due at `now`. A refused update or upgrade stands until the spec
/// changes: none is due after one.
pub(super) fn mark(
    instance: &ServiceInstance,
    status: &mut ServiceInstanceStatus,
    plan: &CommonServicePlanSpec,
    now: Timestamp,
) -> Due {
    let Some(offered) = &plan.maintenance_info else {
        status.conditions.retain(|c| c.type_ != CONDITION);
        return Due::No;
    };
    let runs = running(status);
    if runs == Some(offered.version.as_str()) {
        status.conditions.retain(|c| c.type_ != CONDITION);
        return Due::No;
    }
    let mut message = match runs {
        Some(runs) => format!(
            "The plan offers version {} (the instance runs {runs})",
            offered.version
        ),
        None => format!(
            "The plan offers version {} (the version the instance runs was not recorded)",
            offered.version
        ),
    };
    // The broker's text, cut as its other texts are.
    if let Some(description) = offered.description.as_deref().filter(|d| !d.is_empty()) {
        message.push_str(": ");
        message.push_str(&clipped(description, MAX_TEXT));
    }
    let maintenance = instance.spec.maintenance.clone().unwrap_or_default();
    let refused = status.last_condition_state == reason::UPDATE_FAILED
        || condition_is(status, "Failed").is_some();
    let due = match &maintenance.version {
        Some(asked) if *asked == offered.version => {
            message.push_str(". spec.maintenance.version asks for it");
            Due::Now(offered.version.clone())
        }
        Some(asked) if Some(asked.as_str()) != runs => {
            message.push_str(&format!(
                ". spec.maintenance.version {:?} is not a version the plan offers",
                clipped(asked, MAX_TEXT)
            ));
            Due::No
        }
        _ if maintenance.auto_upgrade => match &maintenance.window {
            None => {
                message.push_str(". spec.maintenance.autoUpgrade upgrades it");
                Due::Now(offered.version.clone())
            }
            Some(window) => match window.until_open(now) {
                Ok(None) => {
                    message.push_str(". spec.maintenance.autoUpgrade upgrades it in this window");
                    Due::Now(offered.version.clone())
                }
                Ok(Some(wait)) => {
                    message.push_str(
                        ". spec.maintenance.autoUpgrade upgrades it when the window opens",
                    );
                    Due::Later(wait)
                }
                Err(invalid) => {
                    message.push_str(&format!(". No automatic upgrade: {invalid}"));
                    Due::No
                }
            },
        },
        _ => {
            message.push_str(&format!(
                ". Set spec.maintenance.version to {:?} to upgrade",
                offered.version
            ));
            Due::No
        }
    };
    let due = match due {
        Due::Now(_) if refused => {
            message.push_str(", once the spec changes (the last update was refused)");
            Due::No
        }
        due => due,
    };
    conditions::set(
        &mut status.conditions,
        CONDITION,
        ConditionStatus::True,
        "UpgradeAvailable",
        message,
    );
    due
}

/// What a settled instance (nothing in flight, its spec's generation done, or refused) does
/// about upgrades, from the caches alone: `None` when an upgrade is due and the reconcile must
/// go on, else the action to return, after writing the `UpgradeAvailable` condition if it
/// changed.
pub(super) async fn settled(
    instance: &ServiceInstance,
    status: &ServiceInstanceStatus,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    let Some(plan) = crate::resolve::plan_of(instance, ctx) else {
        // The plan is gone from the catalog: nothing to offer.
        return Ok(Some(Action::await_change()));
    };
    let mut marked = status.clone();
    let action = match mark(instance, &mut marked, &plan, Timestamp::now()) {
        Due::Now(_) => return Ok(None),
        Due::No => Action::await_change(),
        Due::Later(wait) => Action::requeue(wait),
    };
    if marked.conditions != status.conditions {
        write_status(instance, ctx, &marked).await?;
    }
    Ok(Some(action))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{
        InstanceMaintenance, MaintenanceWindow, PlanMaintenanceInfo, ServiceInstancePropertiesState,
    };

    fn plan(version: Option<&str>) -> CommonServicePlanSpec {
        CommonServicePlanSpec {
            maintenance_info: version.map(|v| PlanMaintenanceInfo {
                version: v.into(),
                description: Some("max_connections 30".into()),
            }),
            ..Default::default()
        }
    }

    fn runs(version: &str) -> ServiceInstanceStatus {
        ServiceInstanceStatus {
            external_properties: Some(ServiceInstancePropertiesState {
                maintenance_info_version: Some(version.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn asking(maintenance: Option<InstanceMaintenance>) -> ServiceInstance {
        let mut i = ServiceInstance::new("db", Default::default());
        i.spec.maintenance = maintenance;
        i
    }

    fn condition(status: &ServiceInstanceStatus) -> Option<String> {
        (status.conditions.iter())
            .find(|c| c.type_ == CONDITION)
            .map(|c| c.message.clone())
    }

    const SATURDAY_3AM: &str = "2026-11-28T03:00:00Z";

    #[test]
    fn a_brokers_long_description_is_cut_like_its_other_texts() {
        let mut long = plan(Some("1.1.0"));
        let description = "x".repeat(3109);
        long.maintenance_info.as_mut().unwrap().description = Some(description);
        let mut status = runs("1.0.0");
        let now = SATURDAY_3AM.parse().unwrap();
        mark(&asking(None), &mut status, &long, now);
        let message = condition(&status).unwrap();
        assert!(
            message.contains(&format!("{}…", "x".repeat(MAX_TEXT))),
            "{message}"
        );
        assert!(!message.contains(&"x".repeat(MAX_TEXT + 1)));
    }

    #[test]
    fn an_instance_at_the_offered_version_has_no_condition() {
        let mut status = runs("1.0.0");
        status.conditions.push(crate::resources::Condition {
            type_: CONDITION.into(),
            ..Default::default()
        });
        let now = SATURDAY_3AM.parse().unwrap();
        assert_eq!(
            mark(&asking(None), &mut status, &plan(Some("1.0.0")), now),
            Due::No
        );
        assert_eq!(condition(&status), None);
        let mut status = runs("1.0.0");
        assert_eq!(mark(&asking(None), &mut status, &plan(None), now), Due::No);
        assert_eq!(condition(&status), None);
    }

    #[test]
    fn a_newer_version_is_offered_and_waits_to_be_asked_for() {
        let mut status = runs("1.0.0");
        let now = SATURDAY_3AM.parse().unwrap();
        assert_eq!(
            mark(&asking(None), &mut status, &plan(Some("1.1.0")), now),
            Due::No
        );
        let said = condition(&status).unwrap();
        assert!(
            said.contains("offers version 1.1.0 (the instance runs 1.0.0): max_connections 30"),
            "{said}"
        );
        assert!(
            said.contains("spec.maintenance.version to \"1.1.0\""),
            "{said}"
        );
    }

    #[test]
    fn asking_for_the_offered_version_upgrades_now_and_another_does_not() {
        let now = SATURDAY_3AM.parse().unwrap();
        let asked = |v: &str| {
            asking(Some(InstanceMaintenance {
                version: Some(v.into()),
                ..Default::default()
            }))
        };
        let mut status = runs("1.0.0");
        assert_eq!(
            mark(&asked("1.1.0"), &mut status, &plan(Some("1.1.0")), now),
            Due::Now("1.1.0".into())
        );
        let mut status = runs("1.0.0");
        assert_eq!(
            mark(&asked("2.0.0"), &mut status, &plan(Some("1.1.0")), now),
            Due::No
        );
        assert!(
            condition(&status)
                .unwrap()
                .contains("\"2.0.0\" is not a version the plan offers")
        );
        // A refused update is not sent again until the spec changes.
        let mut status = runs("1.0.0");
        status.last_condition_state = reason::UPDATE_FAILED.into();
        assert_eq!(
            mark(&asked("1.1.0"), &mut status, &plan(Some("1.1.0")), now),
            Due::No
        );
    }

    #[test]
    fn automatic_upgrades_wait_for_their_window() {
        let auto = |window: Option<MaintenanceWindow>| {
            asking(Some(InstanceMaintenance {
                auto_upgrade: true,
                window,
                ..Default::default()
            }))
        };
        let now: Timestamp = SATURDAY_3AM.parse().unwrap();
        let mut status = runs("1.0.0");
        assert_eq!(
            mark(&auto(None), &mut status, &plan(Some("1.1.0")), now),
            Due::Now("1.1.0".into())
        );
        let sunday = MaintenanceWindow {
            days: vec![crate::resources::Day::Sun],
            start: "02:00".into(),
            duration: "2h".into(),
        };
        let mut status = runs("1.0.0");
        assert_eq!(
            mark(&auto(Some(sunday)), &mut status, &plan(Some("1.1.0")), now),
            Due::Later(Duration::from_secs(23 * 3600))
        );
        let broken = MaintenanceWindow {
            start: "2am".into(),
            ..Default::default()
        };
        let mut status = runs("1.0.0");
        assert_eq!(
            mark(&auto(Some(broken)), &mut status, &plan(Some("1.1.0")), now),
            Due::No
        );
        assert!(condition(&status).unwrap().contains("window.start"));
    }
}
