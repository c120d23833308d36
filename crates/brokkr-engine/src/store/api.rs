//! The [`Store`] trait, what every store does, and the values its methods take and give.

use async_trait::async_trait;

use super::error::StoreError;
use crate::model::{
    Event, Key, OpKind, Operation, Orchestration, OrchestrationState, Orphan, Outputs, Resource,
    Status, Update, UpgradeItem, VersionCount,
};

/// Result of [`Store::create`].
#[derive(Debug)]
pub enum Created {
    /// The resource was inserted (or replaced a tombstone).
    Inserted,
    /// A live resource with that key exists.
    Exists(Box<Resource>),
}

/// The status a resource takes when a new operation starts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewStatus {
    /// This status.
    Set(Status),
    /// Unchanged, except that a resource still being created is marked failed: its creation is
    /// halted by the new operation. Decided by the store at the moment of the change.
    HaltCreation,
}

/// How an operation ended and what it changes on its resource.
#[derive(Debug, Clone)]
pub struct Finish {
    /// `succeeded` or `failed`.
    pub succeeded: bool,
    /// For the user.
    pub description: String,
    /// The resource's new status.
    pub status: Status,
    /// For updates: the instance's new plan and attributes.
    pub update: Option<Update>,
    /// New outputs (a bind's credentials, a teardown's skipped steps).
    pub outputs: Option<Outputs>,
}

impl Finish {
    /// A success that leaves the resource in `status` and changes nothing else.
    pub fn success(description: &str, status: Status) -> Self {
        Self {
            succeeded: true,
            description: description.to_owned(),
            status,
            update: None,
            outputs: None,
        }
    }
}

/// The operations in progress of one kind on one plan, as the store counts them at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProgress {
    /// What they do.
    pub kind: OpKind,
    /// The service.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// How many are in progress.
    pub count: i64,
    /// Of those, how many are past their deadline: the engine fails an operation at its
    /// deadline, so one still in progress long after it is one no engine runs.
    pub overdue: i64,
    /// Of those, how many were due to run again, unclaimed by any engine, since before the
    /// moment given to [`Store::count_in_progress`].
    pub unclaimed: i64,
}

/// How many instances, or bindings, of one plan are in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCount {
    /// Bindings, not instances.
    pub bindings: bool,
    /// The service.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// Their status.
    pub status: Status,
    /// How many.
    pub count: i64,
}

/// Persistent state of instances, bindings and their operations.
#[async_trait]
pub trait Store: Send + Sync {
    /// Creates the schema, or migrates it forward to this brokkr's version, recording the version
    /// in the store; refuses ([`StoreError::SchemaTooNew`]) a store that a newer brokkr migrated
    /// past what this one can use.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Reads a resource, tombstones included.
    async fn get(&self, key: &Key) -> Result<Option<Resource>, StoreError>;

    /// Reads a resource's status and operations only — what `last_operation` answers with:
    /// its `attrs`, `outputs` and operation's update are empty, its operation's plan too, and
    /// its lease not told (no owner, until 0), so nothing is decrypted, and the store may answer
    /// from memory: a SQLite store always, a PostgreSQL store for `operation` (the one the
    /// platform asks about) when this process changed it last, moments ago.
    async fn get_status(
        &self,
        key: &Key,
        operation: Option<&str>,
    ) -> Result<Option<Resource>, StoreError>;

    /// Inserts a resource with its first operation, unless a live one with that key exists.
    async fn create(&self, resource: &Resource) -> Result<Created, StoreError>;

    /// Replaces the resource's operation with `op`, if its current operation is still
    /// `expected_op`, and records the replaced one as the previous operation (`failed` when it was
    /// still running: it is halted). Returns the resource as the start left it, or `None` when it
    /// did not start.
    async fn start(
        &self,
        key: &Key,
        expected_op: &str,
        op: &Operation,
        status: NewStatus,
    ) -> Result<Option<Resource>, StoreError>;

    /// Saves the progress of a running operation held by `owner` and renews the lease until
    /// `op.lease_until`. Returns false when the operation is no longer this owner's to run.
    async fn save_progress(
        &self,
        key: &Key,
        op: &Operation,
        owner: &str,
    ) -> Result<bool, StoreError>;

    /// Replaces the outputs (registry values and credentials) of a resource whose operation
    /// `op_id` is held by `owner`, and its dashboard URL when `dashboard_url` is given (else
    /// it is kept). Returns false when the operation is no longer this owner's.
    async fn save_outputs(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        outputs: &Outputs,
        dashboard_url: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Ends an operation held by `owner` and appends `events` to its log, together. A
    /// deprovision that ends in `Deleted` also turns the instance's bindings into tombstones.
    /// Returns false, changing nothing, when the operation is no longer this owner's.
    async fn finish(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        finish: &Finish,
        events: &[Event],
    ) -> Result<bool, StoreError>;

    /// Leases up to `limit` operations that are due (or past their deadline) and not leased by a
    /// live owner, to `owner` until `lease_until`.
    async fn claim_due(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError>;

    /// Gives up `owner`'s lease on an operation so another engine may run it.
    async fn release(&self, key: &Key, op_id: &str, owner: &str) -> Result<(), StoreError>;

    /// Drops every lease (of operations and of orphans). Only for a store that one process
    /// uses (SQLite) when it starts.
    async fn release_all(&self) -> Result<u64, StoreError>;

    /// Records that `orphan.step` of its resource was left behind, encrypting its context; when
    /// that step of that resource already is, refreshes its operation, context and last error.
    async fn record_orphan(&self, orphan: &Orphan) -> Result<(), StoreError>;

    /// Forgets the leftover `step` of the resource `key` created at `created_at`: it has been
    /// done. Returns whether there was one.
    async fn resolve_orphan(
        &self,
        key: &Key,
        created_at: i64,
        step: &str,
    ) -> Result<bool, StoreError>;

    /// Leases up to `limit` orphans due for an attempt, and not leased by a live owner, to
    /// `owner` until `lease_until`; returns them with their context.
    async fn claim_orphans(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Orphan>, StoreError>;

    /// Removes orphan `id` after `owner`'s attempt at it succeeded.
    async fn remove_orphan(&self, id: &str, owner: &str) -> Result<(), StoreError>;

    /// Records `owner`'s failed attempt at orphan `id` and releases it until `next_attempt_at`.
    async fn orphan_failed(
        &self,
        id: &str,
        owner: &str,
        error: &str,
        next_attempt_at: i64,
    ) -> Result<(), StoreError>;

    /// Orphans, of one resource or of all, oldest first, at most `limit`, without their
    /// context (nothing is decrypted).
    async fn list_orphans(&self, key: Option<&Key>, limit: i64) -> Result<Vec<Orphan>, StoreError>;

    /// How many orphans there are, by operation kind and step name.
    async fn count_orphans(&self) -> Result<Vec<(OpKind, String, i64)>, StoreError>;

    /// The operations in progress, by kind and plan, with those past their deadline at `now`
    /// and those due and unclaimed since before `unclaimed_since` (both ms). Reads the
    /// in-progress rows only, through their index.
    async fn count_in_progress(
        &self,
        now: i64,
        unclaimed_since: i64,
    ) -> Result<Vec<InProgress>, StoreError>;

    /// How many instances and bindings each plan has in each status (tombstones of deleted
    /// ones included, until they are purged).
    async fn count_resources(&self) -> Result<Vec<ResourceCount>, StoreError>;

    /// Deletes tombstones deleted before `before` (ms).
    async fn purge_deleted(&self, before: i64) -> Result<u64, StoreError>;

    /// Writes a broker setting unless it is already set; returns the value in force.
    async fn init_setting(&self, name: &str, value: &str) -> Result<String, StoreError>;

    /// A broker setting's value, if it is set; writes nothing.
    async fn setting(&self, name: &str) -> Result<Option<String>, StoreError>;

    /// Removes a broker setting; returns whether it was set.
    async fn delete_setting(&self, name: &str) -> Result<bool, StoreError>;

    /// Appends `events`, in order, to an operation's event log.
    async fn append_events(&self, op_id: &str, events: &[Event]) -> Result<(), StoreError>;

    /// An operation's event log, oldest first.
    async fn events(&self, op_id: &str) -> Result<Vec<Event>, StoreError>;

    /// The resource whose current or previous operation is `op_id`.
    async fn find_operation(&self, op_id: &str) -> Result<Option<Resource>, StoreError>;

    /// Bindings of the plans `plan_ids` whose credentials expired by `now` (ms; their outputs'
    /// `expires_at`), ready and with no operation running, the longest expired first, at most
    /// `limit`. Found through an index: the other resources are not read.
    async fn expired_bindings(
        &self,
        plan_ids: &[String],
        now: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError>;

    /// Instances (not bindings), optionally only those with `status`, newest first, at most
    /// `limit`.
    async fn list_instances(
        &self,
        status: Option<Status>,
        limit: i64,
    ) -> Result<Vec<Resource>, StoreError>;

    /// Records a new fleet upgrade and its instances.
    async fn create_orchestration(
        &self,
        orchestration: &Orchestration,
        items: &[UpgradeItem],
    ) -> Result<(), StoreError>;

    /// Fleet upgrades, newest first, at most `limit`.
    async fn list_orchestrations(&self, limit: i64) -> Result<Vec<Orchestration>, StoreError>;

    /// A fleet upgrade and its instances, in their order.
    async fn orchestration(
        &self,
        id: &str,
    ) -> Result<Option<(Orchestration, Vec<UpgradeItem>)>, StoreError>;

    /// Moves fleet upgrade `id` to `to` (with `description`; ended when `to` is final) if it is
    /// in one of the states `from`. Returns whether it did.
    async fn set_orchestration_state(
        &self,
        id: &str,
        from: &[OrchestrationState],
        to: OrchestrationState,
        description: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Leases to `owner`, until `lease_until`, the running and paused fleet upgrades (and the
    /// cancelled ones with upgrades still in progress) whose lease is free, expired or
    /// `owner`'s already; returns their ids.
    async fn claim_orchestrations(
        &self,
        owner: &str,
        lease_until: i64,
    ) -> Result<Vec<String>, StoreError>;

    /// Saves an instance's progress in fleet upgrade `id`, if `owner` holds its lease. Returns
    /// whether it did.
    async fn save_upgrade_item(
        &self,
        id: &str,
        owner: &str,
        item: &UpgradeItem,
    ) -> Result<bool, StoreError>;

    /// The ready instances of a plan, oldest first.
    async fn plan_instances(
        &self,
        service_id: &str,
        plan_id: &str,
    ) -> Result<Vec<Resource>, StoreError>;

    /// How many ready instances each plan has at each maintenance version.
    async fn count_instance_versions(&self) -> Result<Vec<VersionCount>, StoreError>;

    /// Re-encrypts every stored secret with the newest key (and encrypts plaintext left from
    /// before a key was configured), orphans' contexts included. Returns how many rows changed.
    async fn rekey(&self) -> Result<u64, StoreError>;

    /// Whether several processes may share this store (PostgreSQL) or only one (SQLite).
    fn shared(&self) -> bool;

    /// Resolves when an engine may have released operations that are due (on PostgreSQL, a
    /// release committed by any replica since the last call); never on a store only one
    /// process uses.
    async fn work_released(&self);
}
