//! Broker settings on SQLite and on PostgreSQL: a setting is written once, by whoever comes
//! first, and read back as written; reading one that is not set answers nothing and writes
//! nothing; a deleted setting can be written again.

#[macro_use]
mod support;

use brokkr_engine::Store;
use support::{Backend, Place};

async fn a_setting_is_written_once_and_read_without_writing(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        let name = "plan_blueprint:[\"svc\",\"plan\",\"1.0.0\"]";
        let value = r#"{"instance":{"steps":[]},"targets":{}}"#;

        assert_eq!(store.setting(name).await.unwrap(), None);
        // Reading wrote nothing: the first write is still the one that counts.
        assert_eq!(store.init_setting(name, value).await.unwrap(), value);
        assert_eq!(store.setting(name).await.unwrap().as_deref(), Some(value));
        assert_eq!(store.init_setting(name, "other").await.unwrap(), value);
        assert_eq!(store.setting(name).await.unwrap().as_deref(), Some(value));
        assert_eq!(store.setting("plan_blueprint:other").await.unwrap(), None);

        assert!(store.delete_setting(name).await.unwrap());
        assert_eq!(store.setting(name).await.unwrap(), None);
    }
    // Another connection, as after a restart, reads what was written.
    {
        let store = place.open().await;
        store.init_setting("kept", "yes").await.unwrap();
    }
    let store = place.open().await;
    assert_eq!(store.setting("kept").await.unwrap().as_deref(), Some("yes"));
    drop(store);
    place.drop_schema().await;
}

on_both!(a_setting_is_written_once_and_read_without_writing);
