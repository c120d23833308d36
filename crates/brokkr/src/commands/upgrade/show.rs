//! How `brokkr upgrade` shows fleet upgrades: a progress bar, the instances of one upgrade as a
//! table, and a list of upgrades.

use serde_json::Value;

use crate::commands::osb::output::Table;

/// Width of the progress bar, in characters.
const BAR: usize = 20;

fn count(upgrade: &Value, what: &str) -> u64 {
    upgrade["counts"][what].as_u64().unwrap_or(0)
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `[#####...............] 25/100 succeeded, 1 failed`.
pub(super) fn progress(upgrade: &Value) -> String {
    let total = count(upgrade, "total");
    let succeeded = count(upgrade, "succeeded");
    let failed = count(upgrade, "failed");
    let filled = match total {
        0 => BAR,
        _ => usize::try_from((succeeded + failed) * BAR as u64 / total).unwrap_or(BAR),
    };
    let mut line = format!(
        "[{}{}] {succeeded}/{total} succeeded",
        "#".repeat(filled),
        ".".repeat(BAR - filled)
    );
    if failed > 0 {
        line.push_str(&format!(", {failed} failed"));
    }
    let running = count(upgrade, "in_progress");
    if running > 0 {
        line.push_str(&format!(", {running} in progress"));
    }
    line
}

/// The head of one upgrade: what it moves where, its state and progress.
pub(super) fn header(upgrade: &Value) -> String {
    let name = |name: &str, id: &str| match &upgrade[name] {
        Value::String(s) => s.clone(),
        _ => text(&upgrade[id]),
    };
    let mut head = format!(
        "upgrade {}: {}/{} to {}: {}\n{}",
        text(&upgrade["id"]),
        name("service", "service_id"),
        name("plan", "plan_id"),
        text(&upgrade["target_version"]),
        text(&upgrade["state"]),
        progress(upgrade)
    );
    if let Some(description) = upgrade["description"].as_str() {
        head.push_str(&format!("\n{description}"));
    }
    head
}

/// One upgrade with its instances.
pub(super) fn upgrade(upgrade: &Value) -> String {
    let mut table = Table::new(vec![
        "INSTANCE",
        "CANARY",
        "FROM",
        "STATE",
        "OPERATION",
        "DESCRIPTION",
    ]);
    for i in upgrade["instances"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&i["instance_id"]),
            if i["canary"] == true { "yes" } else { "" }.to_owned(),
            text(&i["from_version"]),
            text(&i["state"]),
            text(&i["operation"]),
            text(&i["description"]),
        ]);
    }
    format!("{}\n\n{}", header(upgrade), table.render())
}

/// A list of upgrades.
pub(super) fn list(upgrades: &Value) -> Table {
    let mut table = Table::new(vec![
        "ID", "SERVICE", "PLAN", "VERSION", "STATE", "PROGRESS",
    ]);
    for u in upgrades["upgrades"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&u["id"]),
            text(&u["service"]),
            text(&u["plan"]),
            text(&u["target_version"]),
            text(&u["state"]),
            progress(u),
        ]);
    }
    table
}

/// What a dry run would upgrade.
pub(super) fn dry_run(answer: &Value) -> Table {
    let mut table = Table::new(vec!["INSTANCE", "FROM", "TO"]);
    for i in answer["instances"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&i["instance_id"]),
            text(&i["from_version"]),
            text(&i["to_version"]),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_progress_bar_counts_what_ended() {
        let u = json!({"counts": {"total": 50, "succeeded": 24, "failed": 1, "in_progress": 5}});
        assert_eq!(
            progress(&u),
            "[##########..........] 24/50 succeeded, 1 failed, 5 in progress"
        );
        let empty = json!({"counts": {"total": 0, "succeeded": 0, "failed": 0}});
        assert_eq!(progress(&empty), "[####################] 0/0 succeeded");
    }
}
