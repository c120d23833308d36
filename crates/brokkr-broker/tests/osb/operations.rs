//! An operation's time limits: a deadline that fails it (and the orphan mitigation the platform
//! follows with), and the retention after which a deprovisioned instance is forgotten.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::*;
use crate::support::instance;

store_tests!(
    deadline_failure_and_orphan_mitigation,
    tombstones_are_forgotten_after_retention,
);

async fn deadline_failure_and_orphan_mitigation(backend: Backend) {
    // The async plan's 300ms step cannot finish within a 100ms deadline.
    let yaml = quickstart(|s| s.replacen("plan: async\n", "plan: async\n    deadline: 100ms\n", 1));
    let b = start_with(backend, &yaml).await;
    let path = format!("{}?accepts_incomplete=true", instance("o-1"));
    assert_eq!(
        b.put(&path, provision_body(ASYNC_PLAN)).await.status,
        StatusCode::ACCEPTED
    );
    let done = b
        .wait_done(&format!("{}/last_operation", instance("o-1")))
        .await;
    assert_eq!(done.body["state"], "failed");
    assert_eq!(
        done.body["description"],
        "provision timed out in step 'settle'"
    );
    assert!(
        done.body.get("instance_usable").is_none(),
        "only for updates and deprovisions"
    );
    assert_eq!(b.get(&instance("o-1")).await.status, StatusCode::NOT_FOUND);
    let bind = format!(
        "{}/service_bindings/b?accepts_incomplete=true",
        instance("o-1")
    );
    let r = b
        .put(&bind, json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN}))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Orphan mitigation: the platform deletes what failed; that deprovision also times out but
    // reports it, and a retried provision starts a new operation.
    let retry = b.put(&path, provision_body(ASYNC_PLAN)).await;
    assert_eq!(retry.status, StatusCode::ACCEPTED);
    let r = b
        .delete(&format!("{path}&{}", deprovision_query(ASYNC_PLAN)))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_ne!(r.operation(), retry.operation());
    let done = b
        .wait_done(&format!("{}/last_operation", instance("o-1")))
        .await;
    assert_eq!(done.body["state"], "failed");
    assert_eq!(
        done.body["instance_usable"], false,
        "its provision never succeeded"
    );
    assert!(
        done.body["description"]
            .as_str()
            .unwrap()
            .starts_with("deprovision timed out")
    );
}

async fn tombstones_are_forgotten_after_retention(backend: Backend) {
    let yaml = quickstart(|s| format!("broker:\n  retention: 100ms\n{s}"));
    let b = start_with(backend, &yaml).await;
    let r = b.put(&instance("r-1"), provision_body(SYNC_PLAN)).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = b
        .delete(&format!(
            "{}?{}",
            instance("r-1"),
            deprovision_query(SYNC_PLAN)
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let poll = format!("{}/last_operation", instance("r-1"));
    assert_eq!(b.get(&poll).await.body["state"], "succeeded");
    for _ in 0..100 {
        if b.get(&poll).await.status == StatusCode::NOT_FOUND {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the deprovisioned instance was never forgotten");
}
