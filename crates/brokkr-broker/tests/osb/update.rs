//! Updates: the rules of `maintenance_info` and of a plan or parameters change.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::*;
use crate::support::{assert_absent, instance};

store_tests!(maintenance_info_rules, update_rules);

async fn maintenance_info_rules(backend: Backend) {
    let b = start(backend).await;
    let path = format!("{}?accepts_incomplete=true", instance("m-1"));
    let mut body = provision_body(ASYNC_PLAN);
    body["maintenance_info"] = json!({"version": "0.9.0"});
    let r = b.put(&path, body.clone()).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::UNPROCESSABLE_ENTITY, "MaintenanceInfoConflict")
    );
    assert_absent(&b, "m-1").await;
    body["maintenance_info"] = json!({"description": "no version counts as absent"});
    assert_eq!(
        b.put(&path, body.clone()).await.status,
        StatusCode::ACCEPTED
    );
    b.wait_done(&format!("{}/last_operation", instance("m-1")))
        .await;
    let r = b
        .patch(
            &path,
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "maintenance_info": {"version": "2.0.0"}}),
        )
        .await;
    assert_eq!(r.error(), "MaintenanceInfoConflict");
    let r = b
        .patch(
            &path,
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "maintenance_info": {"version": "1.0.0"}}),
        )
        .await;
    // Provisioned without a version, the instance was built at the plan's: nothing to do.
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        b.get(&instance("m-1")).await.body["maintenance_info"]["version"],
        "1.0.0"
    );
}

async fn update_rules(backend: Backend) {
    let b = start(backend).await;
    b.provisioned("u-1").await;
    let path = format!("{}?accepts_incomplete=true", instance("u-1"));
    let poll = format!("{}/last_operation", instance("u-1"));

    let change = json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN,
                        "previous_values": {"plan_id": ASYNC_PLAN}});
    // The new plan (sync) has no update steps: the plan change completes within the request.
    let r = b.patch(&path, change.clone()).await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::OK, json!({})));
    assert_eq!(b.get(&instance("u-1")).await.body["plan_id"], SYNC_PLAN);
    assert_eq!(
        b.patch(&path, change).await.status,
        StatusCode::OK,
        "a no-op update"
    );

    let back = json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN,
                      "parameters": {"credentials": {"type": "mysql", "host": "m.example.com"}}});
    let r = b.patch(&path, back.clone()).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let op = r.operation();
    assert_eq!(
        b.patch(&path, back.clone()).await.operation(),
        op,
        "identical repeat"
    );
    let other = json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "parameters": {"credentials": {"type": "redis"}}});
    let r = b.patch(&path, other).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::UNPROCESSABLE_ENTITY, "ConcurrencyError")
    );
    let r = b.get(&instance("u-1")).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::UNPROCESSABLE_ENTITY, "ConcurrencyError")
    );
    let r = b
        .delete(&format!("{path}&{}", deprovision_query(SYNC_PLAN)))
        .await;
    assert_eq!(r.error(), "ConcurrencyError");
    assert_eq!(b.wait_done(&poll).await.body["state"], "succeeded");
    let fetched = b.get(&instance("u-1")).await.body;
    assert_eq!(fetched["plan_id"], ASYNC_PLAN);
    assert_eq!(fetched["parameters"]["credentials"]["type"], "mysql");

    for (body, status, message) in [
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "other"}),
            StatusCode::BAD_REQUEST,
            "belongs to service",
        ),
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": "nope"}),
            StatusCode::BAD_REQUEST,
            "not a plan",
        ),
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "parameters": {"credentials": {"port": "x"}}}),
            StatusCode::BAD_REQUEST,
            "invalid parameters",
        ),
    ] {
        let r = b.patch(&path, body).await;
        assert_eq!(r.status, status, "{:?}", r.body);
        assert!(r.description().contains(message), "{:?}", r.body);
    }
    let r = b
        .patch(
            &format!("{}?accepts_incomplete=true", instance("nope")),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        b.get(&instance("u-1")).await.body["parameters"]["credentials"]["type"],
        "mysql"
    );

    // plan_updateable: false refuses plan changes, still allows parameter changes.
    let fixed = start_with(
        backend,
        &quickstart(|s| s.replace("plan_updateable: true", "plan_updateable: false")),
    )
    .await;
    fixed.put(&instance("f-1"), provision_body(SYNC_PLAN)).await;
    let r = fixed
        .patch(
            &instance("f-1"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.description().contains("plan_updateable"));
    let r = fixed
        .patch(
            &instance("f-1"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "parameters": {"credentials": {"type": "x"}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
}
