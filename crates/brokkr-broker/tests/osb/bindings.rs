//! Bindings: every status row of bind, fetch and unbind, and registry values feeding a
//! binding's credentials.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::*;
use crate::support::instance;

store_tests!(binding_rules, registry_values_feed_credentials);

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
