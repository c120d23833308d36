//! The `brokkr_settings` rows the engine keeps for itself (the rows of the schema's version are
//! `schema`'s): a setting written once, by whichever process comes first, and read back; a
//! setting read without writing; a setting deleted.

use sqlx::Row;

use super::connect::SqlStore;
use crate::store::error::StoreError;

impl SqlStore {
    pub(super) async fn init_setting(&self, name: &str, value: &str) -> Result<String, StoreError> {
        sqlx::query(
            "INSERT INTO brokkr_settings (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM brokkr_settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("value")?)
    }

    pub(super) async fn setting(&self, name: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM brokkr_settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| row.try_get("value")).transpose()?)
    }

    pub(super) async fn delete_setting(&self, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM brokkr_settings WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
