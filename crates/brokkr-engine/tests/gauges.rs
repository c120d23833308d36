//! What the broker's gauges count from the store, on SQLite and on PostgreSQL: instances and
//! bindings by plan and status, and the operations in progress, with those past their deadline
//! and those due that no engine holds a lease on.

#[macro_use]
mod support;

use brokkr_engine::store::Finish;
use brokkr_engine::{InProgress, Key, OpKind, ResourceCount, Status, Store, now_ms};
use support::{Backend, Place, instance};

async fn resources_and_operations_in_progress_are_counted(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        // i-1 ready; i-2 and i-3 still provisioning (deadline in 1 h, lease for 1 min).
        for id in ["i-1", "i-2", "i-3"] {
            store.create(&instance(id)).await.unwrap();
        }
        let ready = instance("i-1");
        let stored = store.get(&Key::instance("i-1")).await.unwrap().unwrap();
        let done = Finish::success("provisioned", Status::Ready);
        assert!(
            store
                .finish(&ready.key, &stored.op.id, "test", &done, &[])
                .await
                .unwrap()
        );
        let count = |status, count| ResourceCount {
            bindings: false,
            service_id: "service".into(),
            plan_id: "plan".into(),
            status,
            count,
        };
        let mut resources = store.count_resources().await.unwrap();
        resources.sort_by_key(|c| c.status.as_str());
        assert_eq!(
            resources,
            [count(Status::Creating, 2), count(Status::Ready, 1)]
        );

        let in_progress = |overdue, unclaimed| {
            vec![InProgress {
                kind: OpKind::Provision,
                service_id: "service".into(),
                plan_id: "plan".into(),
                count: 2,
                overdue,
                unclaimed,
            }]
        };
        let now = now_ms();
        // Now: none overdue; due, but leased until a minute from now.
        assert_eq!(
            store.count_in_progress(now, now - 60_000).await.unwrap(),
            in_progress(0, 0)
        );
        // Two hours on: past the deadline, and due with the lease long gone.
        let later = now + 2 * 3_600_000;
        assert_eq!(
            store
                .count_in_progress(later, later - 60_000)
                .await
                .unwrap(),
            in_progress(2, 2)
        );
    }
    place.drop_schema().await;
}

on_both!(resources_and_operations_in_progress_are_counted);
