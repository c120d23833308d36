//! Micro-benchmarks of the store's hot queries on SQLite, in a store of 10,000 ready instances
//! with encryption at rest: `get` by key (what every last_operation, fetch and repeated request
//! does, decryption included), `find_operation`, and the write pair of an operation without steps
//! (`create` then `finish`). Run with `cargo bench -p brokkr-engine`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use brokkr_engine::crypto::Keyring;
use brokkr_engine::store::{Created, Finish, SqlStore};
use brokkr_engine::{Key, OpKind, OpPlan, Operation, Resource, Status, Store};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

const INSTANCES: u64 = 10_000;
const OWNER: &str = "bench";

fn instance(id: &str) -> Resource {
    let op = Operation::new(
        OpKind::Provision,
        OpPlan::default(),
        None,
        3_600_000,
        OWNER,
        60_000,
    );
    let attrs = json!({"parameters": {"credentials": {"type": "postgresql", "host": "db.example.com", "port": 5432}}});
    let attrs = serde_json::from_value(attrs).expect("attributes");
    Resource::new(
        Key::instance(id),
        "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10",
        "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21",
        attrs,
        op,
    )
}

/// Creates `r` and finishes its provision, as the engine does for a plan without steps.
async fn provision(store: &SqlStore, r: &Resource) {
    assert!(matches!(
        store.create(r).await.expect("create"),
        Created::Inserted
    ));
    let finish = Finish::success("provisioned", Status::Ready);
    assert!(
        store
            .finish(&r.key, &r.op.id, OWNER, &finish, &[])
            .await
            .expect("finish")
    );
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = rt.block_on(async {
        let keyring = Keyring::from_base64([Keyring::generate_key().as_str()]).expect("key");
        let store = SqlStore::connect(&url, Some(keyring))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        for n in 0..INSTANCES {
            provision(&store, &instance(&format!("i-{n}"))).await;
        }
        Arc::new(store)
    });
    let probe = rt
        .block_on(store.get(&Key::instance("i-4242")))
        .expect("get")
        .expect("seeded");

    let n = AtomicU64::new(0);
    c.bench_function("store/get (last_operation)", |b| {
        b.to_async(&rt).iter(|| async {
            let i = n.fetch_add(7919, Ordering::Relaxed) % INSTANCES;
            let key = Key::instance(&format!("i-{i}"));
            black_box(store.get(&key).await.expect("get").expect("exists"))
        })
    });
    c.bench_function("store/get missing", |b| {
        b.to_async(&rt).iter(|| async {
            let key = Key::instance("no-such-instance");
            black_box(store.get(&key).await.expect("get"))
        })
    });
    c.bench_function("store/find_operation", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(store.find_operation(&probe.op.id).await.expect("find")) })
    });
    let created = AtomicU64::new(0);
    c.bench_function("store/create+finish", |b| {
        b.to_async(&rt).iter(|| async {
            let i = created.fetch_add(1, Ordering::Relaxed);
            provision(&store, &instance(&format!("new-{i}"))).await;
        })
    });
}

criterion_group!(store, benches);
criterion_main!(store);
