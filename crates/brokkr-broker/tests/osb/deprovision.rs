//! Deprovisioning: its status rows, and a deprovision that halts a provision still running.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::*;
use crate::support::instance;

store_tests!(deprovision_rules, deprovision_halts_a_running_provision);

async fn deprovision_rules(backend: Backend) {
    let b = start(backend).await;
    b.provisioned("d-1").await;
    let base = format!("{}?accepts_incomplete=true", instance("d-1"));
    for q in ["", "&service_id=x", &format!("&plan_id={ASYNC_PLAN}")] {
        let r = b.delete(&format!("{base}{q}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{q}: {:?}", r.body);
    }
    let r = b
        .delete(&format!("{base}&service_id={SERVICE}&plan_id={SYNC_PLAN}"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let path = format!("{base}&{}", deprovision_query(ASYNC_PLAN));
    let r = b.delete(&path).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let op = r.operation();
    assert_eq!(b.delete(&path).await.operation(), op);
    let bind = format!(
        "{}/service_bindings/late?accepts_incomplete=true",
        instance("d-1")
    );
    let r = b
        .put(&bind, json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN}))
        .await;
    assert_eq!(r.error(), "ConcurrencyError");
    let done = b
        .wait_done(&format!(
            "{}/last_operation?operation={op}",
            instance("d-1")
        ))
        .await;
    assert_eq!(
        done.body["state"], "succeeded",
        "kept answering after deprovision"
    );
    assert_eq!(b.delete(&path).await.status, StatusCode::GONE);
    assert_eq!(b.get(&instance("d-1")).await.status, StatusCode::NOT_FOUND);
    let r = b
        .delete(&format!(
            "{}?accepts_incomplete=true&{}",
            instance("never"),
            deprovision_query(ASYNC_PLAN)
        ))
        .await;
    assert_eq!(r.status, StatusCode::GONE);
    // The id can be provisioned again.
    b.provisioned("d-1").await;
}

async fn deprovision_halts_a_running_provision(backend: Backend) {
    let b = start(backend).await;
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", instance("h-1")),
            provision_body(ASYNC_PLAN),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let provision_op = r.operation();
    let r = b
        .delete(&format!(
            "{}?accepts_incomplete=true&{}",
            instance("h-1"),
            deprovision_query(ASYNC_PLAN)
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    // The halted provision's poll says it failed.
    let r = b
        .get(&format!(
            "{}/last_operation?operation={provision_op}",
            instance("h-1")
        ))
        .await;
    assert_eq!(r.body["state"], "failed");
    assert_eq!(r.body["description"], "halted by a deprovision");
    let done = b
        .wait_done(&format!("{}/last_operation", instance("h-1")))
        .await;
    assert_eq!(done.body["state"], "succeeded");
    assert_eq!(done.body["description"], "deprovisioned");
    assert_eq!(b.get(&instance("h-1")).await.status, StatusCode::NOT_FOUND);
}
