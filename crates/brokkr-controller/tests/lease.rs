//! Leader election against the fake API server: one holder at a time, takeover after expiry,
//! release for an immediate handover, and work running only while the lease is held.

use std::time::Duration;

use brokkr_controller::lease::LeaseLock;
use brokkr_fake_kube::FakeCluster;
use serde_json::Value;

async fn cluster() -> FakeCluster {
    let fake = FakeCluster::start().await;
    fake.add_kind("coordination.k8s.io", "v1", "Lease", "leases", true);
    fake
}

fn lease(fake: &FakeCluster) -> Value {
    fake.get(
        "coordination.k8s.io/v1",
        "Lease",
        Some("default"),
        "brokkr-controller",
    )
    .expect("the lease")
}

const DURATION: Duration = Duration::from_secs(1);

#[tokio::test]
async fn one_replica_holds_the_lease_until_it_expires_or_is_released() {
    let fake = cluster().await;
    let a = LeaseLock::new(
        fake.client(),
        "default",
        "brokkr-controller",
        "replica-a",
        DURATION,
    );
    let b = LeaseLock::new(
        fake.client(),
        "default",
        "brokkr-controller",
        "replica-b",
        DURATION,
    );

    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
    let held = lease(&fake);
    assert_eq!(held["spec"]["holderIdentity"], "replica-a");
    assert_eq!(held["spec"]["leaseDurationSeconds"], 1);
    assert_eq!(held["spec"]["leaseTransitions"], 0);

    // A renewal more than a lease duration old lets the other replica take over.
    tokio::time::sleep(DURATION + Duration::from_millis(200)).await;
    assert!(b.try_acquire_or_renew().await.unwrap());
    assert!(!a.try_acquire_or_renew().await.unwrap());
    let taken = lease(&fake);
    assert_eq!(taken["spec"]["holderIdentity"], "replica-b");
    assert_eq!(taken["spec"]["leaseTransitions"], 1);

    // Releasing hands over at once; a replica that does not hold it cannot release it.
    a.release().await.unwrap();
    assert_eq!(lease(&fake)["spec"]["holderIdentity"], "replica-b");
    b.release().await.unwrap();
    assert!(lease(&fake)["spec"].get("holderIdentity").is_none());
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert_eq!(lease(&fake)["spec"]["leaseTransitions"], 2);
}

#[tokio::test]
async fn work_waits_for_the_lease_and_releases_it_when_done() {
    let fake = cluster().await;
    let a = LeaseLock::new(
        fake.client(),
        "default",
        "brokkr-controller",
        "replica-a",
        Duration::from_secs(30),
    );
    let b = LeaseLock::new(
        fake.client(),
        "default",
        "brokkr-controller",
        "replica-b",
        DURATION,
    );
    assert!(a.try_acquire_or_renew().await.unwrap());

    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let follower = tokio::spawn(async move {
        b.acquire().await;
        b.hold(async move {
            started_tx.send(()).unwrap();
            42
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        started.try_recv().is_err(),
        "work ran while another replica held the lease"
    );

    a.release().await.unwrap();
    let output = tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("took over")
        .unwrap();
    assert_eq!(output.unwrap(), 42);
    assert!(started.try_recv().is_ok());
    assert!(
        lease(&fake)["spec"].get("holderIdentity").is_none(),
        "released after the work"
    );
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops() {
    let fake = cluster().await;
    let a = LeaseLock::new(
        fake.client(),
        "default",
        "brokkr-controller",
        "replica-a",
        Duration::from_secs(3),
    );
    let leading = tokio::spawn(async move {
        a.acquire().await;
        a.hold(futures::future::pending::<()>()).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Someone else writes themselves in (an operator, or a replica that saw the lease expire).
    let mut lease = lease(&fake);
    lease["spec"]["holderIdentity"] = "intruder".into();
    fake.create(lease);
    let result = tokio::time::timeout(Duration::from_secs(5), leading)
        .await
        .expect("the leader stops")
        .unwrap();
    assert!(result.is_err());
}
