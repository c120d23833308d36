//! A resource's life on the hot path: creating it, starting an operation on it (a compare-and-set
//! on its current operation), saving the operation's progress and outputs, and ending it.
//! Wherever outputs are written, their `expires_at` is copied to its column (see `expiry`).

use brokkr_osb::OperationState;

use super::columns::{COLUMNS, binding_col};
use super::connect::SqlStore;
use super::statement::{Arg, Statement};
use super::view::Touches;
use crate::model::{Event, Key, Operation, Outputs, Resource, Status};
use crate::store::api::{Created, Finish, NewStatus, Store};
use crate::store::error::StoreError;

/// A step number as an SQL integer.
fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqlStore {
    /// Appends an operation's columns, `op_id` to `op_started_at`, in table order.
    fn operation_args(&self, args: &mut Vec<Arg>, key: &Key, op: &Operation) {
        args.extend([
            op.id.as_str().into(),
            op.kind.as_str().into(),
            op.state.as_str().into(),
            op.description.clone().into(),
            self.seal(key, "op_request", &op.update).into(),
            serde_json::to_string(&op.plan)
                .expect("plans serialize")
                .into(),
            to_i64(op.step).into(),
            op.step_started_at.into(),
            op.next_run_at.into(),
            op.deadline_at.into(),
            op.lease_owner.clone().into(),
            op.lease_until.into(),
            op.started_at.into(),
        ]);
    }

    pub(super) async fn create(&self, r: &Resource) -> Result<Created, StoreError> {
        let sql = format!(
            "INSERT INTO brokkr_resources ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
             $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, NULL, NULL, NULL) \
             ON CONFLICT (instance_id, binding_id) DO UPDATE SET \
             service_id = excluded.service_id, plan_id = excluded.plan_id, attrs = excluded.attrs, \
             status = excluded.status, outputs = excluded.outputs, \
             dashboard_url = excluded.dashboard_url, created_at = excluded.created_at, \
             deleted_at = excluded.deleted_at, op_id = excluded.op_id, op_kind = excluded.op_kind, \
             op_state = excluded.op_state, op_description = excluded.op_description, \
             op_request = excluded.op_request, op_plan = excluded.op_plan, \
             op_step = excluded.op_step, op_step_started_at = excluded.op_step_started_at, \
             op_next_run_at = excluded.op_next_run_at, op_deadline_at = excluded.op_deadline_at, \
             lease_owner = excluded.lease_owner, lease_until = excluded.lease_until, \
             op_started_at = excluded.op_started_at, op_finished_at = excluded.op_finished_at, \
             prev_op_id = NULL, prev_op_state = NULL, prev_op_description = NULL, \
             expires_at = NULL \
             WHERE brokkr_resources.status = 'deleted'"
        );
        let op = &r.op;
        let mut args: Vec<Arg> = vec![
            r.key.instance_id.as_str().into(),
            binding_col(&r.key).into(),
            r.service_id.as_str().into(),
            r.plan_id.as_str().into(),
            self.seal(&r.key, "attrs", &r.attrs).into(),
            r.status.as_str().into(),
            self.seal(&r.key, "outputs", &r.outputs).into(),
            r.dashboard_url.clone().into(),
            r.created_at.into(),
            r.deleted_at.into(),
        ];
        self.operation_args(&mut args, &r.key, op);
        args.push(op.finished_at.into());
        for _ in 0..3 {
            let insert = Statement::new(sql.as_str(), args.clone());
            if self
                .write(insert, Vec::new(), Touches::Resource(r.key.clone()))
                .await?
            {
                return Ok(Created::Inserted);
            }
            // Lost the race to a live row: report it, unless it vanished meanwhile.
            if let Some(existing) = self.get(&r.key).await?
                && existing.status != Status::Deleted
            {
                return Ok(Created::Exists(Box::new(existing)));
            }
        }
        Err(StoreError::Corrupt {
            key: r.key.to_string(),
            message: "insert kept conflicting with a row that is not there".into(),
        })
    }

    pub(super) async fn start(
        &self,
        key: &Key,
        expected_op: &str,
        op: &Operation,
        status: NewStatus,
    ) -> Result<Option<Resource>, StoreError> {
        let sql = "UPDATE brokkr_resources SET \
             status = CASE WHEN $1 = 'halt' \
                 THEN (CASE WHEN status = 'creating' THEN 'failed' ELSE status END) ELSE $1 END, \
             prev_op_id = op_id, \
             prev_op_state = CASE WHEN op_state = 'in progress' THEN 'failed' ELSE op_state END, \
             prev_op_description = CASE WHEN op_state = 'in progress' \
                 THEN 'halted by a ' || $2 ELSE op_description END, \
             op_id = $3, op_kind = $4, op_state = $5, \
             op_description = $6, op_request = $7, op_plan = $8, op_step = $9, \
             op_step_started_at = $10, op_next_run_at = $11, op_deadline_at = $12, \
             lease_owner = $13, lease_until = $14, op_started_at = $15, op_finished_at = NULL \
             WHERE instance_id = $16 AND binding_id = $17 AND op_id = $18";
        let mut args: Vec<Arg> = vec![
            match status {
                NewStatus::Set(status) => status.as_str(),
                NewStatus::HaltCreation => "halt",
            }
            .into(),
            op.kind.as_str().into(),
        ];
        self.operation_args(&mut args, key, op);
        args.extend([
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            expected_op.into(),
        ]);
        let touches = Touches::Resource(key.clone());
        let statement = Statement::new(sql, args);
        if let Some(group) = &self.group {
            // The row as the start left it, returned by the start itself.
            return match group
                .write(statement.returning(COLUMNS), Vec::new(), touches, true)
                .await?
            {
                (false, _) => Ok(None),
                (true, Some(row)) => self.decode(&row, false).map(Some),
                (true, None) => self.get(key).await, // committed alone: read back
            };
        }
        if !self.write(statement, Vec::new(), touches).await? {
            return Ok(None);
        }
        // On a SQLite file, from the writer's view.
        self.get(key).await
    }

    pub(super) async fn save_progress(
        &self,
        key: &Key,
        op: &Operation,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE brokkr_resources SET op_description = $1, op_step = $2, \
             op_step_started_at = $3, op_next_run_at = $4, lease_until = $5 \
             WHERE instance_id = $6 AND binding_id = $7 AND op_id = $8 \
             AND op_state = 'in progress' AND lease_owner = $9";
        let args = vec![
            op.description.clone().into(),
            to_i64(op.step).into(),
            op.step_started_at.into(),
            op.next_run_at.into(),
            op.lease_until.into(),
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            op.id.as_str().into(),
            owner.into(),
        ];
        let touches = Touches::Resource(key.clone());
        self.write(Statement::new(sql, args), Vec::new(), touches)
            .await
    }

    pub(super) async fn save_outputs(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        outputs: &Outputs,
        dashboard_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE brokkr_resources SET outputs = $1, \
             dashboard_url = COALESCE($6, dashboard_url), expires_at = $7 \
             WHERE instance_id = $2 AND binding_id = $3 AND op_id = $4 \
             AND op_state = 'in progress' AND lease_owner = $5";
        let args = vec![
            self.seal(key, "outputs", outputs).into(),
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            op_id.into(),
            owner.into(),
            dashboard_url.map(str::to_owned).into(),
            outputs.expires_at.into(),
        ];
        let touches = Touches::Resource(key.clone());
        self.write(Statement::new(sql, args), Vec::new(), touches)
            .await
    }

    pub(super) async fn finish(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        f: &Finish,
        events: &[Event],
    ) -> Result<bool, StoreError> {
        let now = crate::clock::now_ms();
        let state = if f.succeeded {
            OperationState::Succeeded
        } else {
            OperationState::Failed
        };
        let deleted_at = (f.status == Status::Deleted).then_some(now);
        let end = Statement::new(
            "UPDATE brokkr_resources SET op_state = $1, op_description = $2, op_finished_at = $3, \
             lease_owner = NULL, lease_until = 0, status = $4, \
             plan_id = COALESCE($5, plan_id), attrs = COALESCE($6, attrs), \
             outputs = COALESCE($7, outputs), deleted_at = COALESCE($8, deleted_at), \
             expires_at = CASE WHEN $7 IS NULL THEN expires_at ELSE $13 END \
             WHERE instance_id = $9 AND binding_id = $10 AND op_id = $11 \
             AND op_state = 'in progress' AND lease_owner = $12",
            vec![
                state.as_str().into(),
                f.description.as_str().into(),
                now.into(),
                f.status.as_str().into(),
                f.update.as_ref().map(|u| u.plan_id.clone()).into(),
                (f.update.as_ref())
                    .map(|u| self.seal(key, "attrs", &u.attrs))
                    .into(),
                f.outputs
                    .as_ref()
                    .map(|v| self.seal(key, "outputs", v))
                    .into(),
                deleted_at.into(),
                key.instance_id.as_str().into(),
                binding_col(key).into(),
                op_id.into(),
                owner.into(),
                f.outputs.as_ref().and_then(|v| v.expires_at).into(),
            ],
        );
        // One transaction: the tombstones of the bindings and the events stand only if the
        // operation's end does.
        let mut rest = Vec::new();
        let mut touches = Touches::Resource(key.clone());
        if key.binding_id.is_none() && f.status == Status::Deleted {
            touches = Touches::InstanceAndBindings(key.clone());
            rest.push(Statement::new(
                "UPDATE brokkr_resources SET status = 'deleted', deleted_at = $1, \
                 lease_owner = NULL, lease_until = 0, op_finished_at = $1, \
                 op_state = CASE WHEN op_state = 'in progress' THEN 'failed' ELSE op_state END, \
                 op_description = CASE WHEN op_state = 'in progress' \
                     THEN 'the instance was deprovisioned' ELSE op_description END \
                 WHERE instance_id = $2 AND binding_id <> '' AND status <> 'deleted'",
                vec![now.into(), key.instance_id.as_str().into()],
            ));
        }
        rest.extend(self.event_statements(op_id, events));
        self.write(end, rest, touches).await
    }
}
