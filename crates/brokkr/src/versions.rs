//! Maintenance versions: what each plan's `maintenance_info.version` makes, remembered in the
//! store.
//!
//! For every plan with a maintenance version, the store keeps the plan's
//! [`Fingerprint`] (the canonical JSON of its blueprint) in the `brokkr_settings` row
//! `plan_blueprint:["<service id>","<plan id>","<version>"]`, written the first time a
//! configuration with that version is served and never changed. A configuration whose plan makes
//! something else under a version already recorded is refused — by `serve` at start, by a
//! reload, and by `check --store` — naming the plan, the version and the paths that differ, never
//! their values. Plans without `maintenance_info` are not compared.

use std::fmt;

use anyhow::{Context as _, Result};
use brokkr_blueprint::fingerprint::Change;
use brokkr_blueprint::{Config, Fingerprint};
use brokkr_engine::Store;

/// The start of the settings' names that hold recorded blueprints.
pub const SETTING_PREFIX: &str = "plan_blueprint:";

/// How many differing paths one refusal names before it only counts the rest.
const PATHS_SHOWN: usize = 10;

/// A plan whose blueprint is not the one recorded for its maintenance version.
pub struct Changed {
    service: String,
    plan: String,
    version: String,
    changes: Vec<Change>,
}

impl fmt::Display for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = (self.changes.iter().take(PATHS_SHOWN))
            .map(ToString::to_string)
            .collect();
        write!(
            f,
            "plan {:?} of service {:?}: the blueprint differs from the one recorded for \
             maintenance_info.version {:?} at {}",
            self.plan,
            self.service,
            self.version,
            shown.join(", ")
        )?;
        if let Some(more) = self
            .changes
            .len()
            .checked_sub(PATHS_SHOWN)
            .filter(|n| *n > 0)
        {
            write!(f, " and {more} more")?;
        }
        write!(f, "; a change to what a plan makes needs a new version")
    }
}

/// One plan with a maintenance version: where its blueprint is recorded, and its fingerprint.
struct Versioned {
    service: String,
    plan: String,
    version: String,
    setting: String,
    fingerprint: Fingerprint,
}

/// The plans of `config` that have a maintenance version, by service and plan name.
fn versioned(config: &Config) -> Vec<Versioned> {
    let mut plans: Vec<Versioned> = config
        .plans()
        .filter_map(|entry| {
            let version = entry.plan.maintenance_info.as_ref()?.version.clone();
            let key = [&entry.service.id, &entry.plan.id, &version];
            Some(Versioned {
                service: entry.service.name.clone(),
                plan: entry.plan.name.clone(),
                setting: format!("{SETTING_PREFIX}{}", serde_json::json!(key)),
                fingerprint: Fingerprint::of(&entry.blueprint, &config.targets),
                version,
            })
        })
        .collect();
    plans.sort_by(|a, b| (&a.service, &a.plan).cmp(&(&b.service, &b.plan)));
    plans
}

/// How `plan` differs from the blueprint `recorded` for its version; `None` when it does not.
fn compare(plan: &Versioned, recorded: &str) -> Result<Option<Changed>> {
    if recorded == plan.fingerprint.as_json() {
        return Ok(None);
    }
    let changes = (plan.fingerprint.changes_since(recorded)).with_context(|| {
        format!(
            "the store's record of plan {:?} of service {:?}, version {:?}, is not JSON",
            plan.plan, plan.service, plan.version
        )
    })?;
    Ok((!changes.is_empty()).then(|| Changed {
        service: plan.service.clone(),
        plan: plan.plan.clone(),
        version: plan.version.clone(),
        changes,
    }))
}

/// The plans of `config` whose blueprint differs from the one `store` recorded for their
/// version. Writes nothing.
pub async fn changed(store: &dyn Store, config: &Config) -> Result<Vec<Changed>> {
    let mut changed = Vec::new();
    for plan in versioned(config) {
        if let Some(recorded) = store.setting(&plan.setting).await? {
            changed.extend(compare(&plan, &recorded)?);
        }
    }
    Ok(changed)
}

/// Refuses `config` when a plan's blueprint differs from the one recorded for its version
/// (recording nothing then); otherwise records the blueprint of every version not recorded yet.
/// Another process may record the same version meanwhile: the record that stays is compared too.
pub async fn record(store: &dyn Store, config: &Config) -> Result<()> {
    refuse(changed(store, config).await?)?;
    let mut changed = Vec::new();
    for plan in versioned(config) {
        let recorded = (store.init_setting(&plan.setting, plan.fingerprint.as_json())).await?;
        changed.extend(compare(&plan, &recorded)?);
    }
    refuse(changed)
}

/// An error naming every plan of `changed`, one `error:` line each; `Ok` when there is none.
fn refuse(changed: Vec<Changed>) -> Result<()> {
    if changed.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = changed.iter().map(|c| format!("error: {c}")).collect();
    anyhow::bail!("{}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use brokkr_blueprint::fingerprint::{Change, ChangeKind};

    use super::Changed;

    fn changed(paths: usize) -> Changed {
        Changed {
            service: "db".into(),
            plan: "small".into(),
            version: "1.0.0".into(),
            changes: (0..paths)
                .map(|i| Change {
                    path: format!("instance.steps[{i}]"),
                    kind: ChangeKind::Added,
                })
                .collect(),
        }
    }

    #[test]
    fn a_refusal_names_the_plan_the_version_and_at_most_ten_paths() {
        let one = changed(1).to_string();
        assert_eq!(
            one,
            "plan \"small\" of service \"db\": the blueprint differs from the one recorded for \
             maintenance_info.version \"1.0.0\" at instance.steps[0] (added); a change to what a \
             plan makes needs a new version"
        );
        let many = changed(12).to_string();
        assert!(
            many.contains("instance.steps[9] (added) and 2 more;"),
            "{many}"
        );
        assert!(!many.contains("instance.steps[10]"), "{many}");
        assert!(!changed(10).to_string().contains("more"));
    }
}
