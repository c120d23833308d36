//! Bindings: every status row of bind, fetch and unbind, registry values feeding a binding's
//! credentials, and rotation (predecessor bindings, `expires_at` and `renew_before`).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::*;
use crate::support::instance;

store_tests!(
    binding_rules,
    registry_values_feed_credentials,
    rotation_rules
);

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
            json!({"organization_guid": "org", "space_guid": "space", "service_id": SERVICE, "plan_id": ASYNC_PLAN, "predecessor_binding_id": "nope"}),
            "predecessor binding nope does not exist",
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

const ROTATION_CONFIG: &str = r#"
catalog:
  services:
  - name: db
    id: svc-db
    description: A user per binding
    bindable: true
    bindings_retrievable: true
    plans:
    - {name: rotating, id: plan-rot, description: d}
    - {name: brief, id: plan-brief, description: d}
    - {name: fixed, id: plan-fixed, description: d}
blueprints:
- service: db
  plan: rotating
  binding: &binding
    rotation: {lifetime: 30d, renew_before: 7d}
    registry:
    - {name: user, value: "u-{{ binding_id }}"}
    - {name: password, value: "{{ password(16) }}", secret: true}
    credentials:
      type: postgresql
      host: db.example.com
      username: "{{ registry('user') }}"
      password: "{{ registry('password') }}"
      access: "{{ param('/access', 'read-write') }}"
- service: db
  plan: brief
  binding:
    rotation: {lifetime: 1s}
    credentials: {type: postgresql, username: "u-{{ binding_id }}"}
- service: db
  plan: fixed
  binding:
    credentials: {type: postgresql, username: "u-{{ binding_id }}"}
"#;

/// `text` as milliseconds since the epoch, if it has the form OSB gives binding metadata.
fn osb_time(text: &Value) -> i64 {
    let text = text.as_str().expect("a timestamp string");
    let at = |i: usize| text.as_bytes()[i];
    assert!(
        text.len() == 22 && at(4) == b'-' && at(10) == b'T' && at(19) == b'.' && at(21) == b'Z',
        "yyyy-mm-ddThh:mm:ss.sZ: {text}"
    );
    let n = |r: std::ops::Range<usize>| text[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days since the epoch of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..21) * 100
}

fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(now.unwrap().as_millis()).unwrap()
}

async fn rotation_rules(backend: Backend) {
    const DAY: i64 = 86_400_000;
    let b = start_with(backend, ROTATION_CONFIG).await;
    let catalog = b.get("/v2/catalog").await;
    let plans = &catalog.body["services"][0]["plans"];
    assert_eq!(
        plans[0]["binding_rotatable"], true,
        "a plan with a rotation"
    );
    assert_eq!(plans[1]["binding_rotatable"], true);
    assert!(plans[2].get("binding_rotatable").is_none(), "{plans}");

    let body = |plan: &str, extra: Value| {
        let mut body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-db", "plan_id": plan});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (id, plan) in [
        ("i-1", "plan-rot"),
        ("i-2", "plan-rot"),
        ("i-3", "plan-brief"),
        ("i-4", "plan-fixed"),
    ] {
        let r = b.put(&instance(id), body(plan, json!({}))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    }
    let bind = |i: &str, id: &str| format!("{}/service_bindings/{id}", instance(i));

    let before = now_ms();
    let first = b
        .put(
            &bind("i-1", "b-1"),
            body("plan-rot", json!({"parameters": {"access": "read-only"}})),
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let expires_at = osb_time(&first.body["metadata"]["expires_at"]);
    let renew_before = osb_time(&first.body["metadata"]["renew_before"]);
    assert!(
        (before - 1000..=now_ms()).contains(&(expires_at - 30 * DAY)),
        "expires 30 days after the bind: {:?}",
        first.body["metadata"]
    );
    assert_eq!(expires_at - renew_before, 7 * DAY, "renew 7 days before");
    let fetched = b.get(&bind("i-1", "b-1")).await;
    assert_eq!(
        fetched.body["metadata"], first.body["metadata"],
        "fetch answers the same"
    );

    // The successor: new credentials, the predecessor's parameters, its own expiry.
    let rotate = body("plan-rot", json!({"predecessor_binding_id": "b-1"}));
    let second = b.put(&bind("i-1", "b-2"), rotate.clone()).await;
    assert_eq!(second.status, StatusCode::CREATED, "{:?}", second.body);
    let (old, new) = (&first.body["credentials"], &second.body["credentials"]);
    assert_eq!(new["username"], "u-b-2");
    assert_ne!(new["password"], old["password"]);
    assert_eq!(new["access"], "read-only", "the predecessor's parameters");
    assert!(osb_time(&second.body["metadata"]["expires_at"]) >= expires_at);
    assert_eq!(
        b.get(&bind("i-1", "b-2")).await.body["parameters"],
        json!({"access": "read-only"})
    );
    assert_eq!(
        b.get(&bind("i-1", "b-1")).await.status,
        StatusCode::OK,
        "the predecessor lives on until it is unbound"
    );
    // Parameters sent with the rotation replace the predecessor's.
    let own = body(
        "plan-rot",
        json!({"predecessor_binding_id": "b-1", "parameters": {"access": "read-write"}}),
    );
    let third = b.put(&bind("i-1", "b-3"), own).await;
    assert_eq!(third.body["credentials"]["access"], "read-write");

    // A bad predecessor is refused with 400, and nothing is created.
    b.put(&bind("i-2", "other"), body("plan-rot", json!({})))
        .await;
    let brief = b
        .put(&bind("i-3", "brief"), body("plan-brief", json!({})))
        .await;
    assert!(
        brief.body["metadata"].get("renew_before").is_none(),
        "{:?}",
        brief.body
    );
    b.put(&bind("i-4", "fixed"), body("plan-fixed", json!({})))
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for (i, plan, predecessor, message) in [
        (
            "i-1",
            "plan-rot",
            "missing",
            "predecessor binding missing does not exist for instance i-1",
        ),
        (
            "i-1",
            "plan-rot",
            "other",
            "predecessor binding other does not exist for instance i-1",
        ),
        (
            "i-1",
            "plan-rot",
            "new",
            "binding new cannot be its own predecessor",
        ),
        (
            "i-3",
            "plan-brief",
            "brief",
            "predecessor binding brief expired at ",
        ),
        (
            "i-4",
            "plan-fixed",
            "fixed",
            "bindings of plan \"fixed\" cannot be rotated",
        ),
    ] {
        let r = b
            .put(
                &bind(i, "new"),
                body(plan, json!({"predecessor_binding_id": predecessor})),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
        assert!(r.description().contains(message), "{message}: {:?}", r.body);
        assert_eq!(
            b.get(&format!("{}/last_operation", bind(i, "new")))
                .await
                .status,
            StatusCode::NOT_FOUND,
            "nothing was created"
        );
    }

    // Once the predecessor is unbound, a repeated rotation is still answered from the successor.
    let q = "service_id=svc-db&plan_id=plan-rot";
    assert_eq!(
        b.delete(&format!("{}?{q}", bind("i-1", "b-1")))
            .await
            .status,
        StatusCode::OK
    );
    let repeat = b.put(&bind("i-1", "b-2"), rotate.clone()).await;
    assert_eq!(repeat.status, StatusCode::OK, "{:?}", repeat.body);
    assert_eq!(repeat.body["credentials"], second.body["credentials"]);
    let late = b.put(&bind("i-1", "b-4"), rotate).await;
    assert_eq!(
        late.status,
        StatusCode::BAD_REQUEST,
        "an unbound predecessor"
    );
}
