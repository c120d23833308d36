//! Concurrent requests: 50 identical provisions make one instance, 50 conflicting ones leave one
//! winner.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::*;
use crate::support::instance;

store_tests!(
    concurrent_identical_provisions_create_one_instance,
    concurrent_conflicting_provisions_leave_one_winner,
);

async fn concurrent_identical_provisions_create_one_instance(backend: Backend) {
    // Every request must be answered while the provision runs (an identical provision of a
    // ready instance is answered 200): its step lasts long enough for 50 requests to a debug
    // build on a busy machine, rather than the harness's 300ms.
    let yaml = quickstart(|s| s.replace("delay: 300ms", "delay: 3s"));
    let b = start_with(backend, &yaml).await;
    let path = format!("{}?accepts_incomplete=true", instance("c-1"));
    let replies =
        futures::future::join_all((0..50).map(|_| b.put(&path, provision_body(ASYNC_PLAN)))).await;
    let mut ops = HashSet::new();
    for r in &replies {
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        ops.insert(r.operation());
    }
    assert_eq!(ops.len(), 1, "every answer names the same operation");
    let done = b
        .wait_done(&format!("{}/last_operation", instance("c-1")))
        .await;
    assert_eq!(done.body["state"], "succeeded");
    assert_eq!(
        b.put(&path, provision_body(ASYNC_PLAN)).await.status,
        StatusCode::OK
    );
}

async fn concurrent_conflicting_provisions_leave_one_winner(backend: Backend) {
    let b = start(backend).await;
    let path = format!("{}?accepts_incomplete=true", instance("c-2"));
    let bodies: Vec<Value> = (0..50)
        .map(|i| {
            let mut body = provision_body(ASYNC_PLAN);
            body["parameters"]["credentials"]["username"] = json!(format!("user-{i}"));
            body
        })
        .collect();
    let replies =
        futures::future::join_all(bodies.iter().map(|body| b.put(&path, body.clone()))).await;
    let winners: Vec<usize> = (0..50)
        .filter(|&i| replies[i].status == StatusCode::ACCEPTED)
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(
        replies
            .iter()
            .all(|r| matches!(r.status, StatusCode::ACCEPTED | StatusCode::CONFLICT))
    );
    b.wait_done(&format!("{}/last_operation", instance("c-2")))
        .await;
    let fetched = b.get(&instance("c-2")).await;
    assert_eq!(
        fetched.body["parameters"]["credentials"]["username"],
        format!("user-{}", winners[0])
    );
}
