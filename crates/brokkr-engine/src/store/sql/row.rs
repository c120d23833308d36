//! A resource as a row of `brokkr_resources` (its columns are in `columns`): the secret-bearing
//! ones sealed with the keyring, and decoding a row (from sqlx or rusqlite) into a [`Resource`].

use brokkr_osb::OperationState;

use super::columns::{SEALED_COLUMNS, binding_col, row_key};
use super::connect::SqlStore;
use super::statement::Columns;
use crate::crypto::is_sealed;
use crate::model::{Key, OpKind, OpPlan, Operation, PreviousOperation, Resource, Status};
use crate::store::error::StoreError;

/// Associated data of a sealed column: its row and its name.
pub(super) fn seal_context(key: &Key, column: &str) -> String {
    format!("{}\0{}\0{column}", key.instance_id, binding_col(key))
}

/// The `op_kind` column of a counting query's row from `table`.
pub(super) fn count_kind(row: &sqlx::any::AnyRow, table: &str) -> Result<OpKind, StoreError> {
    use sqlx::Row as _;
    let kind: String = row.try_get("op_kind")?;
    OpKind::parse(&kind).ok_or_else(|| StoreError::Corrupt {
        key: table.into(),
        message: format!("op_kind {kind:?}"),
    })
}

impl SqlStore {
    /// The text stored for a secret-bearing JSON column of `key`.
    pub(super) fn seal(&self, key: &Key, column: &str, value: &impl serde::Serialize) -> String {
        let json = serde_json::to_string(value).expect("stored values serialize");
        match &self.keyring {
            Some(ring) => ring.seal(&json, &seal_context(key, column)),
            None => json,
        }
    }

    /// The JSON text of a stored secret-bearing column. Plaintext is accepted, so that a store
    /// written without a key keeps working after one is configured (until `rekey`).
    pub(super) fn open(
        &self,
        key: &Key,
        column: &str,
        stored: String,
    ) -> Result<String, StoreError> {
        self.open_sealed(key, column, stored, &seal_context(key, column))
    }

    /// The plaintext of `stored`, sealed (or not) with the associated data `aad`.
    pub(super) fn open_sealed(
        &self,
        key: &Key,
        column: &str,
        stored: String,
        aad: &str,
    ) -> Result<String, StoreError> {
        if !is_sealed(&stored) {
            return Ok(stored);
        }
        let corrupt = |message: String| StoreError::Corrupt {
            key: key.to_string(),
            message,
        };
        let ring = self.keyring.as_ref().ok_or_else(|| {
            corrupt(format!(
                "{column} is encrypted but no encryption key is configured"
            ))
        })?;
        ring.open(&stored, aad)
            .map_err(|e| corrupt(format!("{column}: {e}")))
    }

    /// A resource from its row; with `status_only`, without the columns that need decrypting or
    /// parsing (attributes, outputs, the operation's request and plan) nor its lease, which
    /// changes outside the writer's view (claims).
    pub(super) fn decode(
        &self,
        row: &impl Columns,
        status_only: bool,
    ) -> Result<Resource, StoreError> {
        let key = row_key(row.column("instance_id")?, row.column("binding_id")?);
        let corrupt = |message: String| StoreError::Corrupt {
            key: key.to_string(),
            message,
        };
        // The columns that need parsing, decrypted first where sealed; left empty for
        // `status_only`.
        let text = |col: &str| -> Result<Option<String>, StoreError> {
            if status_only {
                return Ok(None);
            }
            let text: String = row.column(col)?;
            match SEALED_COLUMNS.contains(&col) {
                true => self.open(&key, col, text).map(Some),
                false => Ok(Some(text)),
            }
        };
        fn parse<T: serde::de::DeserializeOwned + Default>(
            col: &str,
            text: Option<String>,
        ) -> Result<T, String> {
            match text {
                None => Ok(T::default()),
                Some(text) => serde_json::from_str(&text).map_err(|e| format!("{col}: {e}")),
            }
        }
        let status: String = row.column("status")?;
        let kind: String = row.column("op_kind")?;
        let state: String = row.column("op_state")?;
        let plan: OpPlan = parse("op_plan", text("op_plan")?).map_err(corrupt)?;
        // Operations other than updates store `null` (`{}` before updates were typed).
        let update = match text("op_request")? {
            Some(text) if text != "{}" => parse("op_request", Some(text)).map_err(corrupt)?,
            _ => None,
        };
        let op = Operation {
            id: row.column("op_id")?,
            kind: OpKind::parse(&kind).ok_or_else(|| corrupt(format!("op_kind {kind:?}")))?,
            state: OperationState::parse(&state)
                .ok_or_else(|| corrupt(format!("op_state {state:?}")))?,
            description: row.column("op_description")?,
            update,
            plan,
            step: usize::try_from(row.column::<i64>("op_step")?).unwrap_or(usize::MAX),
            step_started_at: row.column("op_step_started_at")?,
            next_run_at: row.column("op_next_run_at")?,
            deadline_at: row.column("op_deadline_at")?,
            lease_owner: match status_only {
                true => None,
                false => row.column("lease_owner")?,
            },
            lease_until: match status_only {
                true => 0,
                false => row.column("lease_until")?,
            },
            started_at: row.column("op_started_at")?,
            finished_at: row.column("op_finished_at")?,
        };
        let prev_id: Option<String> = row.column("prev_op_id")?;
        let prev_state: Option<String> = row.column("prev_op_state")?;
        let previous = match (prev_id, prev_state) {
            (Some(id), Some(state)) => Some(PreviousOperation {
                id,
                state: OperationState::parse(&state)
                    .ok_or_else(|| corrupt(format!("prev_op_state {state:?}")))?,
                description: row.column("prev_op_description")?,
            }),
            _ => None,
        };
        Ok(Resource {
            previous,
            service_id: row.column("service_id")?,
            plan_id: row.column("plan_id")?,
            attrs: parse("attrs", text("attrs")?).map_err(corrupt)?,
            status: Status::parse(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?,
            outputs: parse("outputs", text("outputs")?).map_err(corrupt)?,
            dashboard_url: row.column("dashboard_url")?,
            op,
            created_at: row.column("created_at")?,
            deleted_at: row.column("deleted_at")?,
            key,
        })
    }
}
