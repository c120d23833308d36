//! Maintenance versions: the version a plan offers (the catalog's `maintenance_info`), and what
//! a ServiceInstance's `spec.maintenance` asks of upgrades to it: a version now, or the plan's
//! newest automatically, within a weekly window.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::civil::Weekday;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The catalog's `maintenance_info` of a plan: the version its instances are upgraded to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanMaintenanceInfo {
    /// The plan's maintenance version (a semantic version).
    pub version: String,
    /// What an upgrade to this version does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A semantic version 2.0 (semver.org's expression), as OSB's `maintenance_info.version` is.
const SEMVER: &str = r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$";

/// What a ServiceInstance asks of upgrades. Without it, an instance stays at the version it
/// was provisioned with, and its `UpgradeAvailable` condition says when its plan offers another.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceMaintenance {
    /// Upgrade to this maintenance version as soon as the plan offers it (now, whatever the
    /// window). A semantic version (OSB's `maintenance_info.version`), at most 256 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 256, "pattern" = SEMVER))]
    pub version: Option<String>,
    /// Upgrade to whatever version the plan offers, by itself, within `window`.
    #[serde(default)]
    pub auto_upgrade: bool,
    /// When automatic upgrades may start (UTC); without it, at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<MaintenanceWindow>,
}

/// A weekly window, in UTC: on each of `days`, from `start` for `duration`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// The days it opens on (`Mon` … `Sun`); empty means every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<Day>,
    /// When it opens, `HH:MM` (UTC).
    #[schemars(extend("pattern" = "^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// How long it stays open, e.g. `4h` or `90m` (at most a week).
    pub duration: String,
}

/// A day of the week.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Day {
    /// Monday.
    Mon,
    /// Tuesday.
    Tue,
    /// Wednesday.
    Wed,
    /// Thursday.
    Thu,
    /// Friday.
    Fri,
    /// Saturday.
    Sat,
    /// Sunday.
    Sun,
}

impl Day {
    fn weekday(self) -> Weekday {
        match self {
            Day::Mon => Weekday::Monday,
            Day::Tue => Weekday::Tuesday,
            Day::Wed => Weekday::Wednesday,
            Day::Thu => Weekday::Thursday,
            Day::Fri => Weekday::Friday,
            Day::Sat => Weekday::Saturday,
            Day::Sun => Weekday::Sunday,
        }
    }
}

const MINUTE: i64 = 60;
const DAY: i64 = 24 * 60 * MINUTE;
const WEEK: i64 = 7 * DAY;

impl MaintenanceWindow {
    /// `None` when the window is open at `now`, else how long until it opens next; an error
    /// (for the condition) when `start` or `duration` cannot be read.
    pub fn until_open(&self, now: Timestamp) -> Result<Option<Duration>, String> {
        let start = parse_start(&self.start)?;
        let length = humantime::parse_duration(&self.duration)
            .ok()
            .and_then(|d| i64::try_from(d.as_secs()).ok())
            .filter(|d| (1..=WEEK).contains(d))
            .ok_or_else(|| {
                format!(
                    "spec.maintenance.window.duration {:?} is not a duration of at most a week, \
                     such as 4h",
                    self.duration
                )
            })?;
        let now_s = now.as_second();
        let today = now_s.div_euclid(DAY) * DAY;
        // Each opening from a week ago to a week ahead: open if one covers now, else the next.
        let mut next: Option<i64> = None;
        for offset in -7..=7 {
            let opens = today + offset * DAY + start;
            let Ok(at) = Timestamp::from_second(opens) else {
                continue;
            };
            let weekday = at.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).weekday();
            if !self.days.is_empty() && !self.days.iter().any(|d| d.weekday() == weekday) {
                continue;
            }
            if opens <= now_s && now_s < opens + length {
                return Ok(None);
            }
            if opens > now_s && next.is_none_or(|n| opens < n) {
                next = Some(opens);
            }
        }
        let wait = next.map_or(DAY, |n| n - now_s);
        Ok(Some(Duration::from_secs(wait.unsigned_abs())))
    }
}

/// Seconds after midnight of `HH:MM`.
fn parse_start(start: &str) -> Result<i64, String> {
    let bad = || format!("spec.maintenance.window.start {start:?} is not a time HH:MM (UTC)");
    let (h, m) = start.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i64 = h.parse().map_err(|_| bad())?;
    let m: i64 = m.parse().map_err(|_| bad())?;
    if (0..24).contains(&h) && (0..60).contains(&m) {
        Ok(h * 3600 + m * MINUTE)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_crd_bounds_the_version_an_instance_asks_for() {
        let crd = crate::resources::crds()
            .into_iter()
            .find(|c| c.spec.names.kind == "ServiceInstance")
            .unwrap();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let version = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["maintenance"]
            ["properties"]["version"];
        assert_eq!(version["maxLength"], 256, "{version}");
        assert_eq!(version["pattern"], SEMVER);
    }

    fn window(days: &[Day], start: &str, duration: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            duration: duration.into(),
        }
    }

    #[test]
    fn open_within_the_window_and_closed_after_it() {
        // 2026-11-28 is a Saturday.
        let w = window(&[Day::Sat], "02:00", "4h");
        assert_eq!(w.until_open(at("2026-11-28T03:00:00Z")), Ok(None));
        assert_eq!(w.until_open(at("2026-11-28T02:00:00Z")), Ok(None));
        // Closed at 06:00 sharp: the next opening is a week later, less four hours.
        assert_eq!(
            w.until_open(at("2026-11-28T06:00:00Z")),
            Ok(Some(Duration::from_secs(7 * 86_400 - 4 * 3600)))
        );
        // On the Friday before, it opens the next morning.
        assert_eq!(
            w.until_open(at("2026-11-27T23:00:00Z")),
            Ok(Some(Duration::from_secs(3 * 3600)))
        );
    }

    #[test]
    fn a_window_that_crosses_midnight_stays_open_the_next_day() {
        let w = window(&[Day::Fri], "22:00", "4h");
        assert_eq!(w.until_open(at("2026-11-28T01:30:00Z")), Ok(None));
        assert!(w.until_open(at("2026-11-28T02:30:00Z")).unwrap().is_some());
    }

    #[test]
    fn no_days_means_every_day() {
        let w = window(&[], "10:00", "30m");
        assert_eq!(w.until_open(at("2026-11-25T10:10:00Z")), Ok(None));
        assert_eq!(
            w.until_open(at("2026-11-25T11:00:00Z")),
            Ok(Some(Duration::from_secs(23 * 3600)))
        );
    }

    #[test]
    fn unreadable_windows_say_which_field() {
        let now = at("2026-11-28T03:00:00Z");
        let e = window(&[], "2:00", "1h").until_open(now).unwrap_err();
        assert!(e.contains("window.start"), "{e}");
        let e = window(&[], "24:00", "1h").until_open(now).unwrap_err();
        assert!(e.contains("window.start"), "{e}");
        let e = window(&[], "02:00", "forever").until_open(now).unwrap_err();
        assert!(e.contains("window.duration"), "{e}");
        let e = window(&[], "02:00", "8d").until_open(now).unwrap_err();
        assert!(e.contains("window.duration"), "{e}");
    }
}
