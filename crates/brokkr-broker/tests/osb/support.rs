//! Helpers the OSB tests share.

use reqwest::StatusCode;

use crate::harness::TestBroker;

/// The path of instance `id`.
pub(crate) fn instance(id: &str) -> String {
    format!("/v2/service_instances/{id}")
}

/// Asserts that instance `id` was never stored (its last operation is not found).
pub(crate) async fn assert_absent(b: &TestBroker, id: &str) {
    let r = b.get(&format!("{}/last_operation", instance(id))).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "{id} must not exist: {:?}",
        r.body
    );
}
