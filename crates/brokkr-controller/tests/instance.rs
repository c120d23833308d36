//! The ServiceInstance controller against the fake API server and a scripted OSB broker whose
//! operations never finish: what a provision sends (context, originating identity only where
//! the API server checked it, accepts incomplete) and a poll that outlives the plan's maximum
//! polling duration ending in `Failed`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use brokkr_controller::metrics::Metrics;
use brokkr_controller::resources;
use brokkr_fake_kube::FakeCluster;
use serde_json::{Value, json};

mod support;

const API: &str = "services.brokkr.dev/v1alpha1";

/// What the broker received: (headers, query, body) of each provision.
type Seen = Arc<Mutex<Vec<(HeaderMap, String, Value)>>>;

/// A broker with one plan (maximum polling duration 1 s) whose provisions are accepted and never
/// finish.
async fn slow_broker(seen: Seen) -> String {
    let catalog = json!({"services": [{"id": "svc", "name": "slow", "description": "", "bindable": false,
        "plans": [{"id": "plan", "name": "forever", "description": "", "maximum_polling_duration": 1}]}]});
    let app = axum::Router::new()
        .route("/v2/catalog", get(move || async move { Json(catalog) }))
        .route(
            "/v2/service_instances/{id}",
            put(
                move |_: Path<String>,
                      RawQuery(query): RawQuery,
                      headers: HeaderMap,
                      Json(body): Json<Value>| {
                    let seen = seen.clone();
                    async move {
                        seen.lock()
                            .unwrap()
                            .push((headers, query.unwrap_or_default(), body));
                        (StatusCode::ACCEPTED, Json(json!({"operation": "op-1"})))
                    }
                },
            ),
        )
        .route(
            "/v2/service_instances/{id}/last_operation",
            get(|| async { Json(json!({"state": "in progress", "description": "still working"})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// Provisions an instance of a plan whose operations outlive its maximum polling duration,
/// `spec.userInfo` checked by the API server or not; checks that it fails, and returns what
/// the one provision sent.
async fn provision_until_it_times_out(user_info_checked: bool) -> (HeaderMap, String, Value) {
    let seen = Seen::default();
    let url = slow_broker(seen.clone()).await;
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    if user_info_checked {
        support::install_user_info_policy(&fake);
    }
    let ctx = brokkr_controller::Context {
        metrics: Metrics::default(),
        cluster_id: Some("cluster-1".into()),
        wait_timeout: brokkr_controller::DEFAULT_WAIT_TIMEOUT,
        ..brokkr_controller::Context::new(fake.client())
    };
    let controllers = tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()));
    fake.create(
        json!({"apiVersion": API, "kind": "ClusterServiceBroker", "metadata": {"name": "slow"},
        "spec": {"url": url}}),
    );
    for _ in 0..200 {
        if fake.get(API, "ClusterServicePlan", None, "plan").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fake.create(json!({"apiVersion": API, "kind": "ServiceInstance",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"clusterServiceClassExternalName": "slow", "clusterServicePlanExternalName": "forever",
                 "externalID": "instance-1", "parameters": {"size": 3},
                 "userInfo": {"username": "alice", "groups": ["team-a"]}}}));

    let mut failed = None;
    for _ in 0..200 {
        let instance = fake
            .get(API, "ServiceInstance", Some("default"), "db")
            .unwrap();
        let conditions = instance["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(c) = conditions.iter().find(|c| c["type"] == "Failed") {
            failed = Some((c.clone(), instance));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (condition, instance) = failed.expect("the instance fails");
    assert_eq!(condition["reason"], "ProvisionTimedOut");
    assert!(
        condition["message"].as_str().unwrap().contains("1s"),
        "{condition:#}"
    );
    assert_eq!(instance["status"]["asyncOpInProgress"], false);
    assert_eq!(
        instance["status"]["externalID"], "instance-1",
        "the id recorded"
    );
    assert_eq!(
        instance["status"]["lastConditionState"],
        "ProvisionTimedOut"
    );

    controllers.abort();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "provisioned once");
    seen[0].clone()
}

#[tokio::test]
async fn a_provision_polled_past_the_plans_maximum_polling_duration_fails() {
    let (headers, query, body) = provision_until_it_times_out(true).await;
    assert_eq!(query, "accepts_incomplete=true");
    assert_eq!(body["service_id"], "svc");
    assert_eq!(body["plan_id"], "plan");
    assert_eq!(body["parameters"], json!({"size": 3}));
    assert_eq!(
        body["context"],
        json!({"platform": "kubernetes", "namespace": "default", "instance_name": "db", "clusterid": "cluster-1"})
    );
    // OSB 2.17 still requires them; brokers built on openbrokerapi refuse a provision without.
    assert_eq!(body["organization_guid"], "cluster-1");
    assert_eq!(body["space_guid"], "default");
    let identity = headers["x-broker-api-originating-identity"]
        .to_str()
        .unwrap();
    let parsed = brokkr_osb::headers::OriginatingIdentity::parse(identity).unwrap();
    assert_eq!(parsed.platform, "kubernetes");
    assert_eq!(parsed.value["username"], "alice");
    assert!(headers.contains_key("x-broker-api-request-identity"));
}

/// Without the API server's check of `spec.userInfo`, what a tenant wrote there is not sent as
/// the originating identity: nothing is.
#[tokio::test]
async fn an_unchecked_user_info_is_not_forwarded() {
    let (headers, _, body) = provision_until_it_times_out(false).await;
    assert_eq!(body["service_id"], "svc");
    assert!(
        !headers.contains_key("x-broker-api-originating-identity"),
        "{headers:?}"
    );
}
