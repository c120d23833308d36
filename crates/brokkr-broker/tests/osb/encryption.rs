//! Secrets at rest: instance parameters and binding credentials are sealed in the store and
//! come back in the clear.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::*;
use crate::support::instance;

store_tests!(secrets_are_encrypted_at_rest);

async fn secrets_are_encrypted_at_rest(backend: Backend) {
    let b = start(backend).await;
    let mut body = provision_body(SYNC_PLAN);
    body["parameters"]["credentials"]["password"] = json!("instance-secret-7f3a");
    assert_eq!(
        b.put(&instance("e-1"), body).await.status,
        StatusCode::CREATED
    );
    let bind = format!("{}/service_bindings/e-b", instance("e-1"));
    let r = b
        .put(
            &bind,
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN,
                           "parameters": {"credentials": {"password": "binding-secret-9c1d"}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.body["credentials"]["password"], "binding-secret-9c1d");
    let raw = String::from_utf8_lossy(&b.store_contents().await).into_owned();
    assert!(raw.contains("enc:v1:"), "the store holds sealed values");
    for secret in ["instance-secret-7f3a", "binding-secret-9c1d"] {
        assert!(!raw.contains(secret), "{secret} is stored in plaintext");
    }
    assert_eq!(
        b.get(&bind).await.body["credentials"]["password"],
        "binding-secret-9c1d"
    );
}
