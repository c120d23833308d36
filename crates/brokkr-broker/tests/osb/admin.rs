//! The admin API: operations and their events, behind the operator's own credentials.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::harness::*;
use crate::support::instance;

store_tests!(admin_api_shows_operations_and_their_events);

async fn admin_api_shows_operations_and_their_events(backend: Backend) {
    let b = start(backend).await;
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", instance("adm-1")),
            provision_body(ASYNC_PLAN),
        )
        .await;
    let op = r.operation();
    b.wait_done(&format!("{}/last_operation", instance("adm-1")))
        .await;
    b.put(&instance("adm-2"), provision_body(SYNC_PLAN)).await;

    let admin = |path: &str| {
        b.client
            .get(format!("{}{path}", b.base))
            .basic_auth(ADMIN, Some(ADMIN_PASSWORD))
    };
    let platform = b.request(Method::GET, &format!("/admin/v1/operations/{op}"));
    assert_eq!(
        b.send(platform).await.status,
        StatusCode::UNAUTHORIZED,
        "platform credentials"
    );

    let r = b.send(admin(&format!("/admin/v1/operations/{op}"))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["operation"]["state"], "succeeded");
    assert_eq!(r.body["operation"]["steps"], json!(["settle"]));
    assert_eq!(r.body["resource"]["instance_id"], "adm-1");
    let kinds: Vec<&str> = r.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["step_started", "step_finished", "succeeded"]);
    assert!(
        !r.body.to_string().contains("pw-1"),
        "no credentials in the admin API"
    );
    assert_eq!(
        b.send(admin("/admin/v1/operations/nope")).await.status,
        StatusCode::NOT_FOUND
    );

    let r = b.send(admin("/admin/v1/instances?state=ready")).await;
    let ids: Vec<&str> = r.body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["adm-2", "adm-1"], "newest first");
    let r = b.send(admin("/admin/v1/instances?state=failed")).await;
    assert_eq!(r.body["instances"], json!([]));
    for bad in ["state=bogus", "limit=0", "limit=x"] {
        let r = b.send(admin(&format!("/admin/v1/instances?{bad}"))).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // Prometheus metrics: routes by pattern (no ids), operations by kind, state, and the
    // catalog's names of their service and plan.
    let metrics = b
        .client
        .get(format!("{}/metrics", b.base))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.unwrap();
    for expected in [
        "brokkr_operations_total{kind=\"provision\",state=\"succeeded\",service=\"user-provided\",plan=\"async\"} 1",
        "brokkr_operations_total{kind=\"provision\",state=\"succeeded\",service=\"user-provided\",plan=\"sync\"} 1",
        "route=\"/v2/service_instances/{instance_id}\"",
        "brokkr_step_duration_seconds_count{kind=\"provision\",step=\"settle\"} 1",
        "brokkr_operations_running 0",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
    assert!(!text.contains("adm-1"), "no ids in metric labels");
}
