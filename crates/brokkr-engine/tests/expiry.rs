//! Finding the bindings whose credentials expired, on SQLite and on PostgreSQL, with their
//! outputs encrypted: only ready bindings of the plans asked about, past their `expires_at`,
//! with no operation running, the longest expired first, at most the limit; and bindings stored
//! before the store indexed `expires_at` are found once it is migrated.

#[macro_use]
mod support;

use brokkr_engine::crypto::Keyring;
use brokkr_engine::store::{Finish, NewStatus, SqlStore};
use brokkr_engine::{Attrs, Key, OpKind, OpPlan, Operation, Outputs, Resource, Status, Store};
use support::{Backend, Place, instance};

const OWNER: &str = "test";

async fn open(place: &Place) -> SqlStore {
    let ring = Keyring::from_base64([Keyring::generate_key().as_str()]).unwrap();
    let store = SqlStore::connect(&place.url, Some(ring)).await.unwrap();
    store.migrate().await.unwrap();
    store
}

fn operation(kind: OpKind) -> Operation {
    Operation::new(kind, OpPlan::default(), None, 3_600_000, OWNER, 60_000)
}

/// Binding `b` of instance `i` on `plan`, bound, its credentials expiring at `expires_at`.
async fn bound(store: &SqlStore, plan: &str, b: &str, expires_at: Option<i64>) -> Key {
    let key = Key::binding("i", b);
    let op = operation(OpKind::Bind);
    let binding = Resource::new(key.clone(), "service", plan, Attrs::default(), op.clone());
    store.create(&binding).await.unwrap();
    let outputs = Outputs {
        expires_at,
        ..Outputs::default()
    };
    let finish = Finish {
        outputs: Some(outputs),
        ..Finish::success("bound", Status::Ready)
    };
    assert!(
        store
            .finish(&key, &op.id, OWNER, &finish, &[])
            .await
            .unwrap()
    );
    key
}

/// Starts an unbind of `key`; returns its operation.
async fn unbind(store: &SqlStore, key: &Key) -> Operation {
    let current = store.get(key).await.unwrap().unwrap();
    let op = operation(OpKind::Unbind);
    let status = NewStatus::HaltCreation;
    assert!(
        store
            .start(key, &current.op.id, &op, status)
            .await
            .unwrap()
            .is_some()
    );
    op
}

fn plans(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|p| (*p).to_owned()).collect()
}

async fn expired_bindings_by_plan_and_time(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = open(&place).await;
        store.create(&instance("i")).await.unwrap();
        let now = brokkr_engine::now_ms();
        let late = bound(&store, "p1", "late", Some(now - 1_000)).await;
        let later = bound(&store, "p1", "later", Some(now - 5_000)).await;
        bound(&store, "p1", "valid", Some(now + 60_000)).await;
        bound(&store, "p1", "forever", None).await;
        let other = bound(&store, "p2", "other", Some(now - 1_000)).await;
        let unbinding = bound(&store, "p1", "unbinding", Some(now - 1_000)).await;
        let unbound = bound(&store, "p1", "unbound", Some(now - 1_000)).await;
        let op = unbind(&store, &unbound).await;
        let done = Finish::success("unbound", Status::Deleted);
        assert!(
            store
                .finish(&unbound, &op.id, OWNER, &done, &[])
                .await
                .unwrap()
        );
        unbind(&store, &unbinding).await;

        let found = store
            .expired_bindings(&plans(&["p1"]), now, 10)
            .await
            .unwrap();
        assert_eq!(
            found,
            [later.clone(), late.clone()],
            "longest expired first"
        );
        let found = store
            .expired_bindings(&plans(&["p1"]), now, 1)
            .await
            .unwrap();
        assert_eq!(found.first(), Some(&later), "at most the limit");
        assert_eq!(found.len(), 1);
        let found = store
            .expired_bindings(&plans(&["p1", "p2"]), now, 10)
            .await
            .unwrap();
        assert_eq!(found.len(), 3);
        assert!(found.contains(&other));
        let found = store
            .expired_bindings(&plans(&["p2"]), now - 2_000, 10)
            .await
            .unwrap();
        assert!(found.is_empty(), "not yet expired then: {found:?}");
        assert!(
            store
                .expired_bindings(&[], now, 10)
                .await
                .unwrap()
                .is_empty()
        );

        // Bound again after its unbind: the new binding's credentials are not expired.
        let again = Resource::new(
            unbound.clone(),
            "service",
            "p1",
            Attrs::default(),
            operation(OpKind::Bind),
        );
        store.create(&again).await.unwrap();
        let found = store
            .expired_bindings(&plans(&["p1"]), now, 10)
            .await
            .unwrap();
        assert_eq!(found, [later, late]);
    }
    place.drop_schema().await;
}

async fn bindings_stored_before_the_index_are_found_after_migrating(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = open(&place).await;
        store.create(&instance("i")).await.unwrap();
        let now = brokkr_engine::now_ms();
        let key = bound(&store, "p1", "old", Some(now - 1_000)).await;
        // As a store of the earlier schema left it: outputs (encrypted), no column filled.
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&place.url).await.unwrap();
        for sql in [
            "UPDATE brokkr_resources SET expires_at = NULL",
            "DELETE FROM brokkr_settings WHERE name = 'store.expires_at_indexed'",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
        let p1 = plans(&["p1"]);
        assert!(
            store
                .expired_bindings(&p1, now, 10)
                .await
                .unwrap()
                .is_empty()
        );
        store.migrate().await.unwrap();
        assert_eq!(store.expired_bindings(&p1, now, 10).await.unwrap(), [key]);
    }
    place.drop_schema().await;
}

on_both!(
    expired_bindings_by_plan_and_time,
    bindings_stored_before_the_index_are_found_after_migrating,
);
