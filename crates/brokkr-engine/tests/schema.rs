//! The store's schema versions, on SQLite and on PostgreSQL (`BROKKR_TEST_POSTGRES_URL`, as
//! scripts/test sets it up; each test in a schema of its own, dropped afterwards):
//! a new store gets this brokkr's version; a store from before versions were recorded is
//! brought to it with its data; a newer brokkr (simulated by adding a migration to this one's)
//! migrates an older store forward; an older brokkr keeps using a store an additive migration
//! moved on — two versions sharing one PostgreSQL store, as in a rolling update — and refuses,
//! naming both versions, one that a breaking migration moved on.

#[macro_use]
mod support;

use brokkr_engine::store::{Created, Migration, SCHEMA_VERSION, SqlStore, StoreError, migrations};
use brokkr_engine::{Key, Store};
use support::{Backend, Place, instance};

async fn create(store: &SqlStore, id: &str) {
    assert!(matches!(
        store.create(&instance(id)).await.expect("create"),
        Created::Inserted
    ));
}

async fn exists(store: &SqlStore, id: &str) -> bool {
    store
        .get(&Key::instance(id))
        .await
        .expect("get")
        .is_some_and(|r| r.attrs.space_guid.as_deref() == Some(id))
}

/// This brokkr's migrations plus one more: what a later release would run.
fn newer(breaks_older: bool) -> Vec<Migration> {
    let mut all = migrations();
    all.push(Migration {
        statements: vec![
            "CREATE TABLE IF NOT EXISTS brokkr_later (id TEXT PRIMARY KEY)",
            "ALTER TABLE brokkr_resources ADD COLUMN later_note TEXT",
        ],
        breaks_older,
    });
    all
}

#[test]
fn schema_version_counts_the_migrations() {
    assert_eq!(SCHEMA_VERSION, i64::try_from(migrations().len()).unwrap());
}

async fn new_store_gets_this_version(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        assert_eq!(store.schema_version().await.unwrap(), (0, 0));
        store.migrate().await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), (SCHEMA_VERSION, 0));
        // Migrating again changes nothing.
        store.migrate().await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), (SCHEMA_VERSION, 0));
    }
    place.drop_schema().await;
}

async fn store_from_before_versions_is_adopted(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        create(&store, "old").await;
        // What a brokkr from before schema versions left: the tables of version 1 (without
        // what later versions added), no version.
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&place.url).await.unwrap();
        for sql in [
            "DELETE FROM brokkr_settings WHERE name LIKE 'schema%'",
            "DROP INDEX brokkr_resources_expires",
            "ALTER TABLE brokkr_resources DROP COLUMN expires_at",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
        assert_eq!(store.schema_version().await.unwrap(), (0, 0));
        store.migrate().await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), (SCHEMA_VERSION, 0));
        assert!(exists(&store, "old").await);
    }
    place.drop_schema().await;
}

async fn newer_brokkr_migrates_forward_and_older_keeps_working(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let old = place.open().await;
        old.migrate().await.unwrap();
        create(&old, "before").await;
        let next = SCHEMA_VERSION + 1;
        let new = match backend {
            // One process per SQLite store: the new version replaces the old.
            Backend::Sqlite => {
                drop(old);
                place.open().await
            }
            Backend::Postgres => place.open().await,
        };
        new.migrate_with(&newer(false)).await.unwrap();
        assert_eq!(new.schema_version().await.unwrap(), (next, 0));
        assert!(exists(&new, "before").await, "data kept by the migration");
        create(&new, "by-new").await;

        // The old version on the migrated store: accepted, and both read what either wrote.
        let old = match backend {
            Backend::Sqlite => {
                drop(new);
                let old = place.open().await;
                old.migrate().await.unwrap();
                assert!(exists(&old, "by-new").await);
                create(&old, "by-old").await;
                drop(old);
                let new = place.open().await;
                new.migrate_with(&newer(false)).await.unwrap();
                assert!(exists(&new, "by-old").await);
                return place.drop_schema().await;
            }
            Backend::Postgres => place.open().await,
        };
        old.migrate().await.unwrap();
        assert_eq!(
            old.schema_version().await.unwrap(),
            (next, 0),
            "not moved back"
        );
        for (writer, reader, id) in [(&old, &new, "by-old"), (&new, &old, "by-new-2")] {
            create(writer, id).await;
            assert!(exists(reader, id).await, "{id}");
        }
        assert!(exists(&old, "by-new").await);
    }
    place.drop_schema().await;
}

async fn older_brokkr_refuses_a_store_a_breaking_migration_moved_on(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let new = place.open().await;
        new.migrate_with(&newer(true)).await.unwrap();
        let next = SCHEMA_VERSION + 1;
        assert_eq!(new.schema_version().await.unwrap(), (next, next));
        drop(new);
        let old = place.open().await;
        let err = old.migrate().await.unwrap_err();
        assert!(
            matches!(err, StoreError::SchemaTooNew { found, compatible_since, supported }
                if found == next && compatible_since == next && supported == SCHEMA_VERSION),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("schema is version {next}"))
                && text.contains(&format!("this brokkr's is version {SCHEMA_VERSION}"))
                && text.contains("Run a newer brokkr"),
            "{text}"
        );
        // The refusal changed nothing.
        assert_eq!(old.schema_version().await.unwrap(), (next, next));
    }
    place.drop_schema().await;
}

async fn replicas_migrating_together_agree(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let a = place.open().await;
        let b = place.open().await;
        let (ma, mb) = (newer(false), newer(false));
        let (ra, rb) = tokio::join!(a.migrate_with(&ma), b.migrate_with(&mb));
        ra.unwrap();
        rb.unwrap();
        assert_eq!(a.schema_version().await.unwrap(), (SCHEMA_VERSION + 1, 0));
    }
    place.drop_schema().await;
}

on_both!(
    new_store_gets_this_version,
    store_from_before_versions_is_adopted,
    newer_brokkr_migrates_forward_and_older_keeps_working,
    older_brokkr_refuses_a_store_a_breaking_migration_moved_on,
);

#[tokio::test]
async fn postgres_replicas_migrating_together_agree() {
    replicas_migrating_together_agree(Backend::Postgres).await;
}
