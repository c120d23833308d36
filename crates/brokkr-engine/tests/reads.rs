//! Reads of one resource, many at once, on SQLite and on PostgreSQL (where reads that arrive
//! together share one query): each gets its own resource, as committed before it was asked,
//! whatever its key holds; a key no row has answers nothing, and a key the database cannot hold
//! fails alone.

#[macro_use]
mod support;

use std::sync::Arc;

use brokkr_engine::store::{Created, Finish};
use brokkr_engine::{Key, Status, Store};
use serde_json::json;
use support::{Backend, Place, instance};

/// Instance ids, the ordinary and the hostile: quotes, backslashes, SQL, parameters, Unicode.
fn ids() -> Vec<String> {
    let hostile = [
        "it's",
        "\\",
        "\\'); DELETE FROM brokkr_resources; --",
        "'; DROP TABLE brokkr_resources; --",
        "$1 $2 $$",
        "ünïcödé 🦀",
    ];
    (0..200)
        .map(|n| format!("i-{n}"))
        .chain(hostile.map(String::from))
        .collect()
}

async fn concurrent_reads_each_get_their_own_resource(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = Arc::new(place.open().await);
        store.migrate().await.unwrap();
        for (n, id) in ids().iter().enumerate() {
            let mut created = instance(id);
            created.outputs.registry.insert("n".into(), json!(n));
            assert!(matches!(
                store.create(&created).await.unwrap(),
                Created::Inserted
            ));
            // Every other one ends: reads tell the two states apart.
            if n % 2 == 0 {
                let ready = Finish::success("provisioned", Status::Ready);
                let key = Key::instance(id);
                assert!(
                    store
                        .finish(&key, &created.op.id, "test", &ready, &[])
                        .await
                        .unwrap()
                );
            }
        }
        let mut tasks = Vec::new();
        for (n, id) in ids().into_iter().enumerate() {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = Key::instance(&id);
                let whole = store.get(&key).await.unwrap().expect("whole row");
                let status = store.get_status(&key, None).await.unwrap().expect("status");
                (n, id, whole, status)
            }));
        }
        let missing = {
            let store = store.clone();
            tokio::spawn(async move { store.get(&Key::instance("missing")).await })
        };
        let nul = {
            let store = store.clone();
            tokio::spawn(async move { store.get(&Key::instance("nul \0 inside")).await })
        };
        for task in tasks {
            let (n, id, whole, status) = task.await.unwrap();
            assert_eq!(whole.key, Key::instance(&id));
            assert_eq!(whole.outputs.registry["n"], json!(n), "{id}");
            assert_eq!(status.key, Key::instance(&id));
            let expected = if n % 2 == 0 {
                Status::Ready
            } else {
                Status::Creating
            };
            assert_eq!(whole.status, expected, "{id}");
            assert_eq!(status.status, expected, "{id}");
        }
        assert!(missing.await.unwrap().unwrap().is_none());
        assert!(!matches!(nul.await.unwrap(), Ok(Some(_))));
    }
    place.drop_schema().await;
}

on_both!(concurrent_reads_each_get_their_own_resource);
