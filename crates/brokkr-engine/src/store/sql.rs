//! [`Store`] over SQL, for SQLite (one process, the default) and PostgreSQL (several replicas).
//!
//! Both databases run the same statements; the only differences are connection set-up and the
//! row locking clause used when claiming due operations. The hot path's changes are committed in
//! groups on both: on a SQLite file by one writer thread on a plain rusqlite connection
//! (`writer`), which also reads one resource in the caller's thread (`readers`); on PostgreSQL by
//! committer tasks on connections of sqlx's `Any` pool (`group`, each batch one transaction:
//! `batch`), where reads of one resource go in batches too (`batched_reads`; both keep their
//! prepared statements in a `session`). Each keeps the rows it changed lately in memory
//! (`view`): SQLite answers every read of them from there, PostgreSQL, which other replicas
//! change too, only `last_operation` for the operation asked about. On PostgreSQL, a release is
//! announced to every replica (`released`). The rest goes through sqlx. Timestamps are
//! milliseconds since the Unix epoch; JSON is stored as text.
//!
//! The [`SqlStore`] and connecting it are in `connect`. The [`Store`] implementation here calls
//! its methods, each in the file of its idea: a resource's life on the hot path (`operations`),
//! an operation's events (`events`), leases (`leases`), reading resources (`read`), the orphans
//! (`orphans`), settings (`settings`), purging and re-keying (`maintenance`), bindings whose
//! credentials expired (`expiry`); all of them change
//! rows through `write`. The tables and their migrations are in `schema`, the columns of a
//! resource's row in `columns`, how a resource is a row (sealing, decoding) in `row`, the
//! statements of the hot path in `statement`, a SQLite file's lock and connection settings in
//! `sqlite`. Fleet upgrades and the reads of instances they need are in `upgrades`.

use async_trait::async_trait;

use super::api::{Created, Finish, InProgress, NewStatus, ResourceCount, Store};
use super::error::StoreError;
use crate::model::{
    Event, Key, OpKind, Operation, Orchestration, OrchestrationState, Orphan, Outputs, Resource,
    Status, UpgradeItem, VersionCount,
};

mod batch;
mod batched_reads;
mod columns;
mod connect;
mod events;
mod expiry;
mod gauges;
mod group;
mod leases;
mod maintenance;
mod operations;
mod orphans;
mod read;
mod readers;
mod released;
mod row;
mod schema;
#[cfg(test)]
mod scratch_table;
mod session;
mod settings;
mod sqlite;
mod statement;
mod upgrades;
mod view;
mod write;
mod writer;

use connect::Dialect;
pub use connect::SqlStore;
pub use schema::{Migration, SCHEMA_VERSION, migrations};

#[async_trait]
impl Store for SqlStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_with(&migrations()).await?;
        self.index_expiry().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Option<Resource>, StoreError> {
        self.read(key, false, None).await
    }

    async fn get_status(
        &self,
        key: &Key,
        operation: Option<&str>,
    ) -> Result<Option<Resource>, StoreError> {
        self.read(key, true, operation).await
    }

    async fn create(&self, r: &Resource) -> Result<Created, StoreError> {
        SqlStore::create(self, r).await
    }

    async fn start(
        &self,
        key: &Key,
        expected_op: &str,
        op: &Operation,
        status: NewStatus,
    ) -> Result<Option<Resource>, StoreError> {
        SqlStore::start(self, key, expected_op, op, status).await
    }

    async fn save_progress(
        &self,
        key: &Key,
        op: &Operation,
        owner: &str,
    ) -> Result<bool, StoreError> {
        SqlStore::save_progress(self, key, op, owner).await
    }

    async fn save_outputs(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        outputs: &Outputs,
        dashboard_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        SqlStore::save_outputs(self, key, op_id, owner, outputs, dashboard_url).await
    }

    async fn finish(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        f: &Finish,
        events: &[Event],
    ) -> Result<bool, StoreError> {
        SqlStore::finish(self, key, op_id, owner, f, events).await
    }

    async fn claim_due(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError> {
        SqlStore::claim_due(self, owner, lease_until, limit).await
    }

    async fn release(&self, key: &Key, op_id: &str, owner: &str) -> Result<(), StoreError> {
        SqlStore::release(self, key, op_id, owner).await
    }

    async fn release_all(&self) -> Result<u64, StoreError> {
        SqlStore::release_all(self).await
    }

    async fn record_orphan(&self, orphan: &Orphan) -> Result<(), StoreError> {
        SqlStore::record_orphan(self, orphan).await
    }

    async fn resolve_orphan(
        &self,
        key: &Key,
        created_at: i64,
        step: &str,
    ) -> Result<bool, StoreError> {
        SqlStore::resolve_orphan(self, key, created_at, step).await
    }

    async fn claim_orphans(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Orphan>, StoreError> {
        SqlStore::claim_orphans(self, owner, lease_until, limit).await
    }

    async fn remove_orphan(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        SqlStore::remove_orphan(self, id, owner).await
    }

    async fn orphan_failed(
        &self,
        id: &str,
        owner: &str,
        error: &str,
        next_attempt_at: i64,
    ) -> Result<(), StoreError> {
        SqlStore::orphan_failed(self, id, owner, error, next_attempt_at).await
    }

    async fn list_orphans(&self, key: Option<&Key>, limit: i64) -> Result<Vec<Orphan>, StoreError> {
        SqlStore::list_orphans(self, key, limit).await
    }

    async fn count_orphans(&self) -> Result<Vec<(OpKind, String, i64)>, StoreError> {
        SqlStore::count_orphans(self).await
    }

    async fn purge_deleted(&self, before: i64) -> Result<u64, StoreError> {
        SqlStore::purge_deleted(self, before).await
    }

    async fn init_setting(&self, name: &str, value: &str) -> Result<String, StoreError> {
        SqlStore::init_setting(self, name, value).await
    }

    async fn setting(&self, name: &str) -> Result<Option<String>, StoreError> {
        SqlStore::setting(self, name).await
    }

    async fn delete_setting(&self, name: &str) -> Result<bool, StoreError> {
        SqlStore::delete_setting(self, name).await
    }

    async fn append_events(&self, op_id: &str, events: &[Event]) -> Result<(), StoreError> {
        SqlStore::append_events(self, op_id, events).await
    }

    async fn events(&self, op_id: &str) -> Result<Vec<Event>, StoreError> {
        SqlStore::events(self, op_id).await
    }

    async fn find_operation(&self, op_id: &str) -> Result<Option<Resource>, StoreError> {
        SqlStore::find_operation(self, op_id).await
    }

    async fn expired_bindings(
        &self,
        plan_ids: &[String],
        now: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError> {
        SqlStore::expired_bindings(self, plan_ids, now, limit).await
    }

    async fn list_instances(
        &self,
        status: Option<Status>,
        limit: i64,
    ) -> Result<Vec<Resource>, StoreError> {
        SqlStore::list_instances(self, status, limit).await
    }

    async fn create_orchestration(
        &self,
        orchestration: &Orchestration,
        items: &[UpgradeItem],
    ) -> Result<(), StoreError> {
        SqlStore::create_orchestration(self, orchestration, items).await
    }

    async fn list_orchestrations(&self, limit: i64) -> Result<Vec<Orchestration>, StoreError> {
        SqlStore::list_orchestrations(self, limit).await
    }

    async fn orchestration(
        &self,
        id: &str,
    ) -> Result<Option<(Orchestration, Vec<UpgradeItem>)>, StoreError> {
        SqlStore::orchestration(self, id).await
    }

    async fn set_orchestration_state(
        &self,
        id: &str,
        from: &[OrchestrationState],
        to: OrchestrationState,
        description: Option<&str>,
    ) -> Result<bool, StoreError> {
        SqlStore::set_orchestration_state(self, id, from, to, description).await
    }

    async fn claim_orchestrations(
        &self,
        owner: &str,
        lease_until: i64,
    ) -> Result<Vec<String>, StoreError> {
        SqlStore::claim_orchestrations(self, owner, lease_until).await
    }

    async fn save_upgrade_item(
        &self,
        id: &str,
        owner: &str,
        item: &UpgradeItem,
    ) -> Result<bool, StoreError> {
        SqlStore::save_upgrade_item(self, id, owner, item).await
    }

    async fn plan_instances(
        &self,
        service_id: &str,
        plan_id: &str,
    ) -> Result<Vec<Resource>, StoreError> {
        SqlStore::plan_instances(self, service_id, plan_id).await
    }

    async fn count_instance_versions(&self) -> Result<Vec<VersionCount>, StoreError> {
        SqlStore::count_instance_versions(self).await
    }

    async fn count_in_progress(
        &self,
        now: i64,
        unclaimed_since: i64,
    ) -> Result<Vec<InProgress>, StoreError> {
        SqlStore::count_in_progress(self, now, unclaimed_since).await
    }

    async fn count_resources(&self) -> Result<Vec<ResourceCount>, StoreError> {
        SqlStore::count_resources(self).await
    }

    async fn rekey(&self) -> Result<u64, StoreError> {
        SqlStore::rekey(self).await
    }

    fn shared(&self) -> bool {
        self.dialect == Dialect::Postgres
    }

    async fn work_released(&self) {
        match self.dialect {
            Dialect::Postgres => self.released.notified().await,
            Dialect::Sqlite => std::future::pending().await,
        }
    }
}
