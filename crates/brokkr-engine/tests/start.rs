//! Starting an operation on an existing resource, on SQLite and on PostgreSQL: the store answers
//! with the resource as the start left it — the row a read from another connection returns, so
//! that the engine runs the operation from it without reading it back — and a start from an
//! operation that is no longer the current one answers nothing and changes nothing.

#[macro_use]
mod support;

use brokkr_engine::store::{Created, Finish};
use brokkr_engine::{Key, NewStatus, OpKind, OpPlan, Operation, Status, Store};
use serde_json::json;
use support::{Backend, Place, instance};

/// A deprovision with no steps, held by `test`.
fn a_deprovision() -> Operation {
    let plan = OpPlan::default();
    Operation::new(OpKind::Deprovision, plan, None, 60_000, "test", 60_000)
}

async fn a_start_answers_with_the_resource_as_stored(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        let mut created = instance("i-1");
        created.outputs.registry.insert("port".into(), json!(5432));
        let key = Key::instance("i-1");
        assert!(matches!(
            store.create(&created).await.unwrap(),
            Created::Inserted
        ));
        let ready = Finish::success("provisioned", Status::Ready);
        let (op, owner) = (&created.op.id, "test");
        assert!(store.finish(&key, op, owner, &ready, &[]).await.unwrap());

        let deprovision = a_deprovision();
        let deleting = NewStatus::Set(Status::Deleted);
        let started = store
            .start(&key, &created.op.id, &deprovision, deleting)
            .await
            .unwrap()
            .expect("started");
        assert_eq!(started.op.id, deprovision.id);
        assert_eq!(started.outputs.registry["port"], 5432);
        let previous = started.previous.as_ref().map(|p| p.id.as_str());
        assert_eq!(previous, Some(op.as_str()));

        // From the replaced operation: nothing.
        let stale = store
            .start(&key, &created.op.id, &a_deprovision(), deleting)
            .await;
        assert!(stale.unwrap().is_none());
        drop(store);
        // Read by another store on the database: nothing of the first one's memory.
        let stored = place.open().await.get(&key).await.unwrap().unwrap();
        assert_eq!(started, stored);
    }
    place.drop_schema().await;
}

on_both!(a_start_answers_with_the_resource_as_stored);
