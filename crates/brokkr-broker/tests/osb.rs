//! Black-box tests of the OSB API v2.17: every endpoint and status row, over HTTP, against both
//! store backends (SQLite and the local PostgreSQL server).

#[macro_use]
mod harness;

use std::collections::HashSet;

use harness::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

store_tests!(
    catalog_and_headers,
    async_provision_lifecycle,
    sync_plan_lifecycle,
    async_required_changes_nothing,
    bad_input_is_rejected_and_changes_nothing,
    maintenance_info_rules,
    update_rules,
    deprovision_rules,
    deprovision_halts_a_running_provision,
    binding_rules,
    concurrent_identical_provisions_create_one_instance,
    concurrent_conflicting_provisions_leave_one_winner,
    deadline_failure_and_orphan_mitigation,
    tombstones_are_forgotten_after_retention,
    secrets_are_encrypted_at_rest,
    admin_api_shows_operations_and_their_events,
    registry_values_feed_credentials,
);

fn instance(id: &str) -> String {
    format!("/v2/service_instances/{id}")
}

async fn assert_absent(b: &TestBroker, id: &str) {
    let r = b.get(&format!("{}/last_operation", instance(id))).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "{id} must not exist: {:?}",
        r.body
    );
}

async fn catalog_and_headers(backend: Backend) {
    let b = start(backend).await;
    let r = b.get("/v2/catalog").await;
    assert_eq!(r.status, StatusCode::OK);
    let services = r.body["services"].as_array().unwrap();
    assert_eq!(services[0]["id"], SERVICE);
    assert_eq!(services[0]["plan_updateable"], true);
    assert_eq!(
        services[0]["plans"][0]["maintenance_info"]["version"],
        "1.0.0"
    );
    assert!(
        services[0]["plans"][0]["schemas"]["service_instance"]["create"]["parameters"].is_object()
    );

    for version in [
        None,
        Some(""),
        Some("1.0"),
        Some("3.0"),
        Some("2.12"),
        Some("two"),
    ] {
        let mut rb = b
            .client
            .get(format!("{}/v2/catalog", b.base))
            .basic_auth("platform", Some("test-password"));
        if let Some(v) = version {
            rb = rb.header("X-Broker-API-Version", v);
        }
        let r = b.send(rb).await;
        assert_eq!(r.status, StatusCode::PRECONDITION_FAILED, "{version:?}");
        assert!(
            r.description().contains("X-Broker-API-Version"),
            "{:?}",
            r.body
        );
    }
    for version in ["2.13", "2.17", "2.18"] {
        let rb = b
            .request(Method::GET, "/v2/catalog")
            .header("X-Broker-API-Version", version);
        assert_eq!(b.send(rb).await.status, StatusCode::OK, "{version}");
    }

    let unauthenticated = b
        .client
        .get(format!("{}/v2/catalog", b.base))
        .header("X-Broker-API-Version", "2.17");
    let r = b.send(unauthenticated).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.headers.contains_key("www-authenticate"));
    let wrong = b
        .client
        .get(format!("{}/v2/catalog", b.base))
        .basic_auth("platform", Some("nope"));
    assert_eq!(b.send(wrong).await.status, StatusCode::UNAUTHORIZED);

    let rb = b
        .osb
        .with_request_identity("req-42")
        .unwrap()
        .request(Method::GET, "/v2/catalog");
    assert_eq!(
        b.send(rb).await.headers["x-broker-api-request-identity"],
        "req-42"
    );
    let rb = b
        .osb
        .with_request_identity("req-43")
        .unwrap()
        .request(Method::GET, "/v2/service_instances/nope");
    let r = b.send(rb).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.headers["x-broker-api-request-identity"], "req-43");
    assert_eq!(b.get("/healthz").await.status, StatusCode::OK);
}

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

async fn binding_rules(backend: Backend) {
    let b = start(backend).await;
    let bind = |i: &str, id: &str| format!("{}/service_bindings/{id}", instance(i));
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN, "bind_resource": {"app_guid": "app-1"}});

    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", bind("missing", "b")),
            body.clone(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", instance("i-1")),
            provision_body(ASYNC_PLAN),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", bind("i-1", "b-1")),
            body.clone(),
        )
        .await;
    assert_eq!(r.error(), "ConcurrencyError", "instance still provisioning");
    b.wait_done(&format!("{}/last_operation", instance("i-1")))
        .await;

    let path = format!("{}?accepts_incomplete=true", bind("i-1", "b-1"));
    let r = b.put(&path, body.clone()).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    assert!(
        r.body.get("credentials").is_none(),
        "202 carries no credentials"
    );
    let op = r.operation();
    assert_eq!(b.put(&path, body.clone()).await.operation(), op);
    assert_eq!(
        b.get(&bind("i-1", "b-1")).await.status,
        StatusCode::NOT_FOUND
    );
    let mut other = body.clone();
    other["parameters"] = json!({"credentials": {"username": "x"}});
    assert_eq!(
        b.put(&path, other.clone()).await.status,
        StatusCode::CONFLICT
    );
    let done = b
        .wait_done(&format!(
            "{}/last_operation?operation={op}",
            bind("i-1", "b-1")
        ))
        .await;
    assert_eq!(done.body["state"], "succeeded");
    let fetched = b.get(&bind("i-1", "b-1")).await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.body["credentials"]["type"], "postgresql");
    assert_eq!(fetched.body["credentials"]["provider"], "brokkr");
    let repeat = b.put(&path, body.clone()).await;
    assert_eq!(repeat.status, StatusCode::OK);
    assert_eq!(repeat.body["credentials"], fetched.body["credentials"]);
    assert_eq!(b.put(&path, other).await.status, StatusCode::CONFLICT);

    for (body, message) in [
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN}),
            "has service_id",
        ),
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN, "parameters": {"credentials": {"host": "bad host"}}}),
            "`host`",
        ),
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN, "parameters": {"nope": 1}}),
            "invalid parameters",
        ),
        (
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN, "predecessor_binding_id": "b-1"}),
            "cannot be rotated",
        ),
    ] {
        let r = b
            .put(
                &format!("{}?accepts_incomplete=true", bind("i-1", "b-2")),
                body,
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
        assert!(r.description().contains(message), "{message}: {:?}", r.body);
    }
    assert_eq!(
        b.get(&format!("{}/last_operation", bind("i-1", "b-2")))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let q = format!("accepts_incomplete=true&{}", deprovision_query(ASYNC_PLAN));
    let r = b.delete(&format!("{}?{q}", bind("i-1", "nope"))).await;
    assert_eq!(r.status, StatusCode::GONE);
    let r = b
        .delete(&format!("{}?accepts_incomplete=true", bind("i-1", "b-1")))
        .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "service_id and plan_id are required"
    );
    let r = b.delete(&format!("{}?{q}", bind("i-1", "b-1"))).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let op = r.operation();
    assert_eq!(
        b.delete(&format!("{}?{q}", bind("i-1", "b-1")))
            .await
            .operation(),
        op
    );
    let done = b
        .wait_done(&format!("{}/last_operation", bind("i-1", "b-1")))
        .await;
    assert_eq!(
        (done.body["state"].clone(), done.body["description"].clone()),
        (json!("succeeded"), json!("unbound"))
    );
    assert_eq!(
        b.get(&bind("i-1", "b-1")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        b.delete(&format!("{}?{q}", bind("i-1", "b-1")))
            .await
            .status,
        StatusCode::GONE
    );

    // After a plan change, platforms unbind with the instance's new plan.
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", bind("i-1", "b-4")),
            body.clone(),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    b.wait_done(&format!("{}/last_operation", bind("i-1", "b-4")))
        .await;
    let r = b
        .patch(
            &instance("i-1"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let q = format!("accepts_incomplete=true&{}", deprovision_query(SYNC_PLAN));
    let r = b.delete(&format!("{}?{q}", bind("i-1", "b-4"))).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    b.wait_done(&format!("{}/last_operation", bind("i-1", "b-4")))
        .await;

    // Deprovisioning an instance also removes bindings a platform left behind.
    let r = b
        .put(
            &format!("{}?accepts_incomplete=true", bind("i-1", "b-3")),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": SYNC_PLAN}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "the sync plan binds at once");
    b.delete(&format!("{}?{q}", instance("i-1"))).await;
    b.wait_done(&format!("{}/last_operation", instance("i-1")))
        .await;
    assert_eq!(
        b.get(&bind("i-1", "b-3")).await.status,
        StatusCode::NOT_FOUND
    );
}

async fn concurrent_identical_provisions_create_one_instance(backend: Backend) {
    let b = start(backend).await;
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

    // Prometheus metrics: routes by pattern (no ids), operations by kind and state.
    let metrics = b
        .client
        .get(format!("{}/metrics", b.base))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.unwrap();
    for expected in [
        "brokkr_operations_total{kind=\"provision\",state=\"succeeded\"} 2",
        "route=\"/v2/service_instances/{instance_id}\"",
        "brokkr_step_duration_seconds_count{kind=\"provision\",step=\"settle\"} 1",
        "brokkr_operations_running 0",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
    assert!(!text.contains("adm-1"), "no ids in metric labels");
}

const REGISTRY_CONFIG: &str = r#"
catalog:
  services:
  - name: db
    id: svc-db
    description: A database per instance, a user per binding
    bindable: true
    bindings_retrievable: true
    plans:
    - {name: small, id: plan-small, description: d}
blueprints:
- service: db
  plan: small
  instance:
    registry:
    - {name: database, value: "db-{{ instance_id }}"}
    - {name: owner_password, value: "{{ password(24) }}", secret: true}
  binding:
    registry:
    - {name: user, value: "{{ registry('database') }}-{{ binding_id }}"}
    - {name: password, value: "{{ password(16) }}", secret: true}
    credentials:
      type: postgresql
      host: db.example.com
      database: "{{ registry('database') }}"
      username: "{{ registry('user') }}"
      password: "{{ registry('password') }}"
"#;

async fn registry_values_feed_credentials(backend: Backend) {
    let b = start_with(backend, REGISTRY_CONFIG).await;
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-db", "plan_id": "plan-small"});
    assert_eq!(
        b.put("/v2/service_instances/r-1", body.clone())
            .await
            .status,
        StatusCode::CREATED
    );
    let first = b
        .put(
            "/v2/service_instances/r-1/service_bindings/b-1",
            body.clone(),
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let c = &first.body["credentials"];
    assert_eq!(c["database"], "db-r-1");
    assert_eq!(
        c["username"], "db-r-1-b-1",
        "a binding value built on an instance value"
    );
    assert_eq!(c["password"].as_str().unwrap().len(), 16);
    // Values are computed once: a repeat and a fetch return the same credentials.
    let repeat = b
        .put(
            "/v2/service_instances/r-1/service_bindings/b-1",
            body.clone(),
        )
        .await;
    assert_eq!(repeat.body["credentials"], *c);
    let fetched = b
        .get("/v2/service_instances/r-1/service_bindings/b-1")
        .await;
    assert_eq!(fetched.body["credentials"], *c);
    // Another binding gets its own user and password.
    let second = b
        .put("/v2/service_instances/r-1/service_bindings/b-2", body)
        .await;
    assert_eq!(second.body["credentials"]["username"], "db-r-1-b-2");
    assert_ne!(second.body["credentials"]["password"], c["password"]);
    let raw = String::from_utf8_lossy(&b.store_contents().await).into_owned();
    assert!(
        !raw.contains(c["password"].as_str().unwrap()),
        "generated secrets are sealed"
    );
}
