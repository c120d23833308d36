//! The broker's names key (behind `opaque_name` and the owner records on shared servers) is the
//! store's: the same after a restart, after the encryption keys are rotated, and for every
//! replica on one PostgreSQL store (`BROKKR_TEST_POSTGRES_URL`, as scripts/test sets it), even
//! when they start together.

mod support;

use std::sync::Arc;

use brokkr_engine::crypto::Keyring;
use brokkr_engine::{Engine, EngineOptions, NAMES_KEY_SETTING, Store, connect};
use serde_json::json;
use support::{Backend, Place};

/// The name `opaque_name('db_', 'instance-1')` gives on `engine`.
async fn name_on(engine: &Engine) -> String {
    let key = engine.names_key().await.unwrap();
    key.name("db_", &json!("instance-1"), 63).unwrap()
}

async fn store(url: &str, keyring: Option<Keyring>) -> Arc<dyn Store> {
    let store = connect(url, keyring).await.unwrap();
    store.migrate().await.unwrap();
    store
}

fn keyring() -> Keyring {
    Keyring::from_base64([Keyring::generate_key().as_str()]).unwrap()
}

#[tokio::test]
async fn the_names_key_outlives_a_restart_and_a_key_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/brokkr.db", dir.path().display());
    let first = Engine::new(store(&url, Some(keyring())).await, EngineOptions::default());
    first.start().await.unwrap();
    let name = name_on(&first).await;
    first.shutdown().await;
    drop(first);

    // Restarted with other encryption keys: the same names.
    let again = Engine::new(store(&url, Some(keyring())).await, EngineOptions::default());
    again.start().await.unwrap();
    assert_eq!(name_on(&again).await, name);
    again.shutdown().await;

    // Another store has another key.
    let other_dir = tempfile::tempdir().unwrap();
    let other_url = format!("sqlite://{}/brokkr.db", other_dir.path().display());
    let other = Engine::new(store(&other_url, None).await, EngineOptions::default());
    assert_ne!(name_on(&other).await, name);
}

#[tokio::test]
async fn replicas_on_one_postgres_store_share_the_names_key() {
    let place = Place::new(Backend::Postgres).await;
    let url = place.url.clone();

    let a = store(&url, Some(keyring())).await;
    let b = store(&url, Some(keyring())).await;
    let (a, b) = (
        Engine::new(a, EngineOptions::default()),
        Engine::new(b, EngineOptions::default()),
    );
    // Both ask at once, before either has made the key.
    let (name_a, name_b) = tokio::join!(name_on(&a), name_on(&b));
    assert_eq!(name_a, name_b);
    let stored = a
        .store()
        .init_setting(NAMES_KEY_SETTING, "x")
        .await
        .unwrap();
    assert_ne!(stored, "x", "the key in force is kept");

    drop((a, b));
    place.drop_schema().await;
}
