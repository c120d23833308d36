//! The columns of `brokkr_resources`: their names, in the order every statement selects them,
//! those that hold secrets, the statements that read one row (whole or its status), and a key
//! as the row's two key columns.

use std::sync::LazyLock;

use crate::model::Key;

/// Columns that may hold secrets (parameters, context, credentials), sealed with the keyring.
pub(super) const SEALED_COLUMNS: [&str; 3] = ["attrs", "outputs", "op_request"];

pub(super) const COLUMNS: &str = "instance_id, binding_id, service_id, plan_id, attrs, status, outputs, \
    dashboard_url, created_at, deleted_at, op_id, op_kind, op_state, op_description, op_request, \
    op_plan, op_step, op_step_started_at, op_next_run_at, op_deadline_at, lease_owner, \
    lease_until, op_started_at, op_finished_at, prev_op_id, prev_op_state, prev_op_description";

/// The names [`COLUMNS`] lists, in its order: a row it selects is read by position.
pub(super) const COLUMN_NAMES: [&str; 27] = [
    "instance_id",
    "binding_id",
    "service_id",
    "plan_id",
    "attrs",
    "status",
    "outputs",
    "dashboard_url",
    "created_at",
    "deleted_at",
    "op_id",
    "op_kind",
    "op_state",
    "op_description",
    "op_request",
    "op_plan",
    "op_step",
    "op_step_started_at",
    "op_next_run_at",
    "op_deadline_at",
    "lease_owner",
    "lease_until",
    "op_started_at",
    "op_finished_at",
    "prev_op_id",
    "prev_op_state",
    "prev_op_description",
];

/// The statement that reads `columns` of the row whose key is `$1` and `$2`.
fn select(columns: &str) -> String {
    format!("SELECT {columns} FROM brokkr_resources WHERE instance_id = $1 AND binding_id = $2")
}

/// The statement that reads a whole row.
pub(super) static SELECT_ROW: LazyLock<String> = LazyLock::new(|| select(COLUMNS));

/// [`COLUMNS`] with those `get_status` does not read (sealed or parsed JSON) as NULL: a status
/// row decodes as a row of `COLUMNS`, and nothing sealed is read.
pub(super) static STATUS_COLUMNS: LazyLock<String> = LazyLock::new(|| {
    let columns: Vec<&str> = COLUMN_NAMES
        .iter()
        .map(|c| match *c {
            "attrs" | "outputs" | "op_request" | "op_plan" => "NULL",
            c => c,
        })
        .collect();
    columns.join(", ")
});

/// The statement that reads a status row (see [`STATUS_COLUMNS`]).
pub(super) static SELECT_STATUS: LazyLock<String> = LazyLock::new(|| select(&STATUS_COLUMNS));

/// Where column `name` stands in [`COLUMNS`].
pub(super) fn column_at(name: &str) -> Option<usize> {
    COLUMN_NAMES.iter().position(|c| *c == name)
}

/// Binds a key as the two columns of the primary key.
pub(super) fn binding_col(key: &Key) -> &str {
    key.binding_id.as_deref().unwrap_or("")
}

/// The keys of `rows`, each selected with its `instance_id` and `binding_id` columns.
pub(super) fn row_keys(rows: &[sqlx::any::AnyRow]) -> Result<Vec<Key>, sqlx::Error> {
    use sqlx::Row as _;
    (rows.iter())
        .map(|row| {
            Ok(row_key(
                row.try_get("instance_id")?,
                row.try_get("binding_id")?,
            ))
        })
        .collect()
}

/// The key of a row's `instance_id` and `binding_id` columns: [`binding_col`] undone.
pub(super) fn row_key(instance_id: String, binding_id: String) -> Key {
    Key {
        instance_id,
        binding_id: (!binding_id.is_empty()).then_some(binding_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_names_are_the_selected_columns_in_order() {
        let selected: Vec<&str> = COLUMNS.split(',').map(str::trim).collect();
        assert_eq!(selected, COLUMN_NAMES);
    }
}
