//! The usage and servicebinding.io controllers stop after a shutdown even when their kinds are
//! not served (their CRDs not installed, here: registered at another version), which
//! kube-runtime's graceful shutdown alone never ends.

use std::sync::Arc;
use std::time::Duration;

use brokkr_controller::resources;
use brokkr_fake_kube::FakeCluster;
use futures::FutureExt as _;

#[tokio::test]
async fn controllers_of_kinds_not_served_still_stop() {
    let fake = FakeCluster::start().await;
    // Only brokkr's own kinds are served: the servicebinding.io ones are not installed.
    for crd in resources::crds() {
        if crd.spec.group == resources::GROUP {
            fake.add_crd(&crd);
        }
    }
    let ctx = Arc::new(brokkr_controller::Context::new(fake.client()));
    let shutdown = tokio::time::sleep(Duration::from_secs(1)).boxed().shared();
    let both = futures::future::join(
        brokkr_controller::usage::run(ctx.clone(), shutdown.clone()),
        brokkr_controller::servicebinding_io::run(ctx, shutdown),
    );
    tokio::time::timeout(Duration::from_secs(15), both)
        .await
        .expect("both controllers stop");
}
