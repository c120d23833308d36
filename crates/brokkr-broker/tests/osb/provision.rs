//! Provisioning: the asynchronous and synchronous plans through their whole lifecycle,
//! `accepts_incomplete` required by an asynchronous plan, and bad input refused with nothing
//! stored.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::harness::*;
use crate::support::{assert_absent, instance};

store_tests!(
    async_provision_lifecycle,
    sync_plan_lifecycle,
    async_required_changes_nothing,
    bad_input_is_rejected_and_changes_nothing,
);

async fn async_provision_lifecycle(backend: Backend) {
    let b = start(backend).await;
    let path = format!("{}?accepts_incomplete=true", instance("i-1"));
    let first = b
        .send(
            b.request(Method::PUT, &path)
                .header(
                    "X-Broker-API-Originating-Identity",
                    "kubernetes eyJ1c2VybmFtZSI6ImFsaWNlIn0=",
                )
                .json(&provision_body(ASYNC_PLAN)),
        )
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    let op = first.operation();

    // In progress: same operation for an identical repeat; 404 on fetch; a poll with Retry-After.
    let again = b.put(&path, provision_body(ASYNC_PLAN)).await;
    assert_eq!(
        (again.status, again.operation()),
        (StatusCode::ACCEPTED, op.clone())
    );
    assert_eq!(b.get(&instance("i-1")).await.status, StatusCode::NOT_FOUND);
    let poll = b
        .get(&format!(
            "{}/last_operation?operation={op}",
            instance("i-1")
        ))
        .await;
    assert_eq!(poll.body["state"], "in progress");
    assert!(poll.headers.contains_key("retry-after"));
    assert!(
        poll.body["description"]
            .as_str()
            .unwrap()
            .contains("settle")
    );
    let mut other = provision_body(ASYNC_PLAN);
    other["parameters"]["credentials"]["host"] = json!("other.example.com");
    assert_eq!(
        b.put(&path, other.clone()).await.status,
        StatusCode::CONFLICT
    );
    // A synchronous request cannot wait for an asynchronous operation.
    let r = b.put(&instance("i-1"), provision_body(ASYNC_PLAN)).await;
    assert_eq!(
        (r.status, r.error()),
        (StatusCode::UNPROCESSABLE_ENTITY, "AsyncRequired")
    );

    // An unknown operation id in a poll is not an error.
    let done = b
        .wait_done(&format!(
            "{}/last_operation?operation=unknown-op",
            instance("i-1")
        ))
        .await;
    assert_eq!(done.status, StatusCode::OK);
    assert_eq!(done.body["state"], "succeeded");
    assert!(done.body.get("instance_usable").is_none());

    // Done: 200 for an identical repeat, 409 for a different one; the instance can be fetched.
    assert_eq!(
        b.put(&path, provision_body(ASYNC_PLAN)).await.status,
        StatusCode::OK
    );
    let mut only_context = provision_body(ASYNC_PLAN);
    only_context["context"]["namespace"] = json!("team-b");
    assert_eq!(b.put(&path, only_context).await.status, StatusCode::OK);
    assert_eq!(b.put(&path, other).await.status, StatusCode::CONFLICT);
    let fetched = b.get(&instance("i-1")).await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.body["plan_id"], ASYNC_PLAN);
    assert_eq!(fetched.body["parameters"]["credentials"], credentials());
    assert_eq!(fetched.body["maintenance_info"]["version"], "1.0.0");
}

async fn sync_plan_lifecycle(backend: Backend) {
    let b = start(backend).await;
    let r = b.put(&instance("s-1"), provision_body(SYNC_PLAN)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert!(r.body.get("operation").is_none());
    assert_eq!(
        b.put(&instance("s-1"), provision_body(SYNC_PLAN))
            .await
            .status,
        StatusCode::OK
    );
    // accepts_incomplete=true may still be answered synchronously.
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", instance("s-2")),
            provision_body(SYNC_PLAN),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);

    let bind = format!("{}/service_bindings/b-1", instance("s-1"));
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN,
                      "parameters": {"credentials": {"username": "reader"}}});
    let r = b.put(&bind, body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let mut expected = credentials();
    expected["username"] = json!("reader");
    expected["provider"] = json!("brokkr");
    assert_eq!(r.body["credentials"], expected);
    assert_eq!(b.put(&bind, body).await.status, StatusCode::OK);

    let q = deprovision_query(SYNC_PLAN);
    let r = b.delete(&format!("{bind}?{q}")).await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::OK, json!({})));
    assert_eq!(
        b.delete(&format!("{bind}?{q}")).await.status,
        StatusCode::GONE
    );
    let r = b.delete(&format!("{}?{q}", instance("s-1"))).await;
    assert_eq!((r.status, r.body.clone()), (StatusCode::OK, json!({})));
    assert_eq!(
        b.delete(&format!("{}?{q}", instance("s-1"))).await.status,
        StatusCode::GONE
    );
    assert_eq!(b.get(&instance("s-1")).await.status, StatusCode::NOT_FOUND);
}

async fn async_required_changes_nothing(backend: Backend) {
    let b = start(backend).await;
    for path in [
        instance("a-1"),
        format!("{}?accepts_incomplete=false", instance("a-1")),
    ] {
        let r = b.put(&path, provision_body(ASYNC_PLAN)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(r.error(), "AsyncRequired");
    }
    assert_absent(&b, "a-1").await;

    b.provisioned("a-2").await;
    let q = deprovision_query(ASYNC_PLAN);
    let r = b.delete(&format!("{}?{q}", instance("a-2"))).await;
    assert_eq!(r.error(), "AsyncRequired");
    let r = b
        .patch(
            &instance("a-2"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "parameters": {"credentials": {"type": "mysql"}}}),
        )
        .await;
    assert_eq!(r.error(), "AsyncRequired");
    let bind = format!("{}/service_bindings/b", instance("a-2"));
    let r = b
        .put(&bind, json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN}))
        .await;
    assert_eq!(r.error(), "AsyncRequired");
    assert_eq!(
        b.get(&format!("{bind}/last_operation")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        b.get(&instance("a-2")).await.body["parameters"]["credentials"],
        credentials()
    );
}

async fn bad_input_is_rejected_and_changes_nothing(backend: Backend) {
    let b = start_with(
        backend,
        &quickstart(|s| format!("broker:\n  max_body_bytes: 4096\n{s}")),
    )
    .await;
    let path = format!("{}?accepts_incomplete=true", instance("x-1"));
    let raw = |body: &'static str, ct: &'static str| {
        b.request(Method::PUT, &path)
            .header("Content-Type", ct)
            .body(body)
    };
    let cases: Vec<(reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (raw("{\"service_id\": ", "application/json"), StatusCode::BAD_REQUEST, "not valid JSON"),
        (raw("[]", "application/json"), StatusCode::BAD_REQUEST, "JSON object"),
        (raw("{}", "text/plain"), StatusCode::BAD_REQUEST, "Content-Type"),
        (raw("{\"plan_id\": \"p\"}", "application/json"), StatusCode::BAD_REQUEST, "`service_id` is required"),
        (
            b.request(Method::PUT, &path).header("Content-Type", "application/json").body(format!(
                "{{\"service_id\": \"{SERVICE}\", \"plan_id\": \"{ASYNC_PLAN}\", \"parameters\": {{\"pad\": \"{}\"}}}}",
                "x".repeat(8 * 1024)
            )),
            StatusCode::PAYLOAD_TOO_LARGE,
            "exceeds the limit of 4096 bytes",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"organization_guid": "org", "space_guid": "space", "service_id": "nope", "plan_id": ASYNC_PLAN})),
            StatusCode::BAD_REQUEST,
            "service_id \"nope\" is not in the catalog",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": "nope"})),
            StatusCode::BAD_REQUEST,
            "plan_id \"nope\" is not a plan",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN,
                "parameters": {"credentials": {"host": "h"}, "extra": 1}})),
            StatusCode::BAD_REQUEST,
            "invalid parameters",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN,
                "parameters": {"credentials": {"type": "pg", "port": 70000, "password": "hunter2"}}})),
            StatusCode::BAD_REQUEST,
            "`port` must be an integer from 1 to 65535",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"service_id": SERVICE, "plan_id": ASYNC_PLAN})),
            StatusCode::BAD_REQUEST,
            "organization_guid and space_guid are required (OSB 2.17)",
        ),
        (
            b.request(Method::PUT, &path).json(&json!({"organization_guid": "org",
                "service_id": SERVICE, "plan_id": ASYNC_PLAN, "context": {"platform": "kubernetes"}})),
            StatusCode::BAD_REQUEST,
            "space_guid is required",
        ),
        (
            b.request(Method::PUT, &format!("{path}&accepts_incomplete=maybe")).json(&provision_body(ASYNC_PLAN)),
            StatusCode::BAD_REQUEST,
            "accepts_incomplete",
        ),
    ];
    for (rb, status, message) in cases {
        let r = b.send(rb).await;
        assert_eq!(r.status, status, "{message}: {:?}", r.body);
        assert!(r.description().contains(message), "{message}: {:?}", r.body);
        assert!(!r.description().contains("hunter2"));
    }
    assert_absent(&b, "x-1").await;

    for id in ["a%20b", "a%2Fb", "%C3%A9t%C3%A9", &"x".repeat(256)] {
        let r = b
            .put(
                &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
                provision_body(ASYNC_PLAN),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{id}");
        assert!(
            r.description().contains("instance_id must be"),
            "{:?}",
            r.body
        );
    }
    assert_eq!(b.get("/v2/nope").await.status, StatusCode::NOT_FOUND);
    // Errors raised before a handler runs still carry an OSB body.
    let r = b.get("/v2/service_instances/%FF").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.description().contains("UTF-8"), "{:?}", r.body);
    let r = b.send(b.request(Method::POST, "/v2/catalog")).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.description(), "Method Not Allowed");

    // A platform that sends only `context`, on a broker told to accept it.
    let lenient = start_with(
        backend,
        &quickstart(|s| format!("broker:\n  accept_provision_without_guids: true\n{s}")),
    )
    .await;
    let r = lenient
        .put(
            &format!("{}?accepts_incomplete=true", instance("ctx-only")),
            json!({"service_id": SERVICE, "plan_id": ASYNC_PLAN,
                   "context": {"platform": "kubernetes", "namespace": "team-a"},
                   "parameters": {"credentials": {"type": "redis", "host": "h"}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
}
