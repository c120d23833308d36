//! Fleet upgrades in the store, on SQLite and on PostgreSQL: an orchestration and its instances
//! read back as written; one broker at a time holds it (on PostgreSQL, until its lease runs
//! out; a SQLite store has one process, whose earlier leases are void); only the holder saves an
//! instance's progress; states move only from those a change names; and the ready instances of a
//! plan are counted by maintenance version.

#[macro_use]
mod support;

use brokkr_engine::store::Finish;
use brokkr_engine::{
    ItemState, Key, Orchestration, OrchestrationState, Status, Store, UpgradeItem, VersionCount,
};
use brokkr_osb::MaintenanceInfo;
use support::{Backend, Place, instance};

fn orchestration(id: &str) -> Orchestration {
    Orchestration {
        id: id.to_owned(),
        service_id: "svc".into(),
        plan_id: "plan".into(),
        target_version: "1.1.0".into(),
        max_parallel: 5,
        canary: 1,
        max_failures: 2,
        state: OrchestrationState::Running,
        description: None,
        created_at: 1_000,
        finished_at: None,
    }
}

fn item(instance_id: &str, position: i64) -> UpgradeItem {
    UpgradeItem {
        instance_id: instance_id.to_owned(),
        position,
        from_version: Some("1.0.0".into()),
        state: ItemState::Pending,
        op_id: None,
        description: None,
    }
}

/// Instance `id`, ready, at `version`.
async fn ready(store: &dyn Store, id: &str, version: Option<&str>) {
    let mut r = instance(id);
    r.service_id = "svc".into();
    r.plan_id = "plan".into();
    r.attrs.maintenance_info = version.map(|v| MaintenanceInfo {
        version: v.to_owned(),
        description: None,
    });
    store.create(&r).await.unwrap();
    let done = Finish::success("provisioned", Status::Ready);
    let key = Key::instance(id);
    assert!(
        store
            .finish(&key, &r.op.id, "test", &done, &[])
            .await
            .unwrap()
    );
}

async fn an_orchestration_is_held_by_one_broker_and_moves_as_told(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        let o = orchestration("u-1");
        let items = [item("i-1", 0), item("i-2", 1)];
        store.create_orchestration(&o, &items).await.unwrap();
        let (read, read_items) = store.orchestration("u-1").await.unwrap().unwrap();
        assert_eq!(read, o);
        assert_eq!(read_items, items);
        assert!(store.orchestration("u-2").await.unwrap().is_none());

        let far = brokkr_engine::now_ms() + 60_000;
        assert_eq!(store.claim_orchestrations("a", far).await.unwrap(), ["u-1"]);
        let other = store.claim_orchestrations("b", far).await.unwrap();
        match backend {
            // Held by `a` until its lease runs out.
            Backend::Postgres => assert!(other.is_empty()),
            // One process uses a SQLite store: a lease of an earlier run is void.
            Backend::Sqlite => assert_eq!(other, ["u-1"]),
        }
        let holder = match backend {
            Backend::Postgres => "a",
            Backend::Sqlite => "b",
        };
        let started = UpgradeItem {
            state: ItemState::InProgress,
            op_id: Some("op-1".into()),
            ..item("i-1", 0)
        };
        assert!(!store.save_upgrade_item("u-1", "c", &started).await.unwrap());
        assert!(
            store
                .save_upgrade_item("u-1", holder, &started)
                .await
                .unwrap()
        );
        let (_, saved) = store.orchestration("u-1").await.unwrap().unwrap();
        assert_eq!(saved[0], started);

        use OrchestrationState::{Cancelled, Paused, Running};
        assert!(
            !store
                .set_orchestration_state("u-1", &[Paused], Running, None)
                .await
                .unwrap()
        );
        assert!(
            store
                .set_orchestration_state("u-1", &[Running], Paused, None)
                .await
                .unwrap()
        );
        let cancel =
            store.set_orchestration_state("u-1", &[Running, Paused], Cancelled, Some("by hand"));
        assert!(cancel.await.unwrap());
        let (cancelled, _) = store.orchestration("u-1").await.unwrap().unwrap();
        assert_eq!(cancelled.state, Cancelled);
        assert_eq!(cancelled.description.as_deref(), Some("by hand"));
        assert!(cancelled.finished_at.is_some());
        // Cancelled with an upgrade in progress: still followed, by its holder.
        assert_eq!(
            store.claim_orchestrations(holder, far).await.unwrap(),
            ["u-1"]
        );
        let ended = UpgradeItem {
            state: ItemState::Succeeded,
            ..started
        };
        assert!(
            store
                .save_upgrade_item("u-1", holder, &ended)
                .await
                .unwrap()
        );
        assert!(
            store
                .claim_orchestrations(holder, far)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.list_orchestrations(10).await.unwrap().len(), 1);
    }
    place.drop_schema().await;
}

async fn instances_are_listed_by_plan_and_counted_by_version(backend: Backend) {
    let place = Place::new(backend).await;
    {
        let store = place.open().await;
        store.migrate().await.unwrap();
        ready(&store, "i-1", Some("1.0.0")).await;
        ready(&store, "i-2", Some("1.1.0")).await;
        ready(&store, "i-3", Some("1.0.0")).await;
        ready(&store, "i-4", None).await;
        let ids: Vec<String> = (store
            .plan_instances("svc", "plan")
            .await
            .unwrap()
            .into_iter())
        .map(|r| r.key.instance_id)
        .collect();
        assert_eq!(ids, ["i-1", "i-2", "i-3", "i-4"]);
        assert!(
            store
                .plan_instances("svc", "other")
                .await
                .unwrap()
                .is_empty()
        );
        let count = |version: Option<&str>, count| VersionCount {
            service_id: "svc".into(),
            plan_id: "plan".into(),
            version: version.map(str::to_owned),
            count,
        };
        assert_eq!(
            store.count_instance_versions().await.unwrap(),
            [
                count(None, 1),
                count(Some("1.0.0"), 2),
                count(Some("1.1.0"), 1)
            ]
        );
    }
    place.drop_schema().await;
}

on_both!(
    an_orchestration_is_held_by_one_broker_and_moves_as_told,
    instances_are_listed_by_plan_and_counted_by_version,
);
