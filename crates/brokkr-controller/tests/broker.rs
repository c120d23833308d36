//! The broker controller against the fake API server and a small OSB catalog server: a
//! ClusterServiceBroker's catalog becomes ClusterServiceClasses and ClusterServicePlans owned by
//! it, a plan the catalog drops is marked removed, wrong credentials show in the broker's status
//! without the password, a namespaced ServiceBroker with a bearer token lists into its namespace,
//! and a second broker offering the same ids never takes the first one's classes and plans.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use brokkr_controller::metrics::Metrics;
use brokkr_controller::resources::{self, ClusterServiceBroker, ClusterServicePlan, ServiceBroker};
use brokkr_fake_kube::FakeCluster;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A broker that serves only its catalog, to callers with the right credentials.
struct CatalogServer {
    url: String,
    catalog: Arc<Mutex<Value>>,
}

async fn catalog_server(authorization: &'static str) -> CatalogServer {
    let catalog = Arc::new(Mutex::new(json!({"services": [{
    "id": "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468", "name": "postgresql",
    "description": "PostgreSQL", "bindable": true, "tags": ["sql"],
    "metadata": {"displayName": "PostgreSQL"},
    "plans": [
        {"id": "86064792-7ea2-467b-af93-ac9694d96d52", "name": "small", "description": "1 GB",
         "maximum_polling_duration": 600,
         "schemas": {"service_instance": {"create": {"parameters": {
             "$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
             "properties": {"version": {"type": "string"}}}}}}},
        {"id": "Large_Plan", "name": "large", "description": "100 GB", "free": false}
    ]}]})));
    let served = catalog.clone();
    let app = axum::Router::new().route(
        "/v2/catalog",
        get(move |headers: HeaderMap| {
            let catalog = served.clone();
            async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(authorization)
                {
                    return Err((
                        StatusCode::UNAUTHORIZED,
                        axum::Json(json!({"description": "who are you?"})),
                    ));
                }
                assert_eq!(headers["x-broker-api-version"], "2.17");
                Ok(axum::Json(catalog.lock().unwrap().clone()))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    CatalogServer { url, catalog }
}

/// A fake API server serving brokkr's kinds.
async fn cluster() -> FakeCluster {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    fake
}

/// Polls `check` until it returns something, for up to 10 seconds.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(value) = check() {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

const API: &str = "services.brokkr.dev/v1alpha1";
const SMALL: &str = "86064792-7ea2-467b-af93-ac9694d96d52";

#[tokio::test]
async fn a_cluster_broker_lists_its_catalog_and_marks_what_it_drops() {
    // "platform:s3cret!" in base64.
    let broker = catalog_server("Basic cGxhdGZvcm06czNjcmV0IQ==").await;
    let fake = cluster().await;
    fake.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "brokkr-system"}}),
    );
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "broker-auth", "namespace": "brokkr-system"},
        "data": {"username": "cGxhdGZvcm0=", "password": "d3Jvbmc="}}));
    let client = fake.client();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ctx = brokkr_controller::Context {
        metrics,
        cluster_id: None,
        wait_timeout: brokkr_controller::DEFAULT_WAIT_TIMEOUT,
        ..brokkr_controller::Context::new(client.clone())
    };
    let controllers = tokio::spawn(brokkr_controller::run(ctx, async {
        let _ = stopped.await;
    }));

    let brokers: Api<ClusterServiceBroker> = Api::all(client.clone());
    let manifest: ClusterServiceBroker = serde_json::from_value(json!({
        "apiVersion": API, "kind": "ClusterServiceBroker", "metadata": {"name": "brokkr"},
        "spec": {"url": broker.url, "relistBehavior": "Manual",
                 "authInfo": {"basic": {"secretRef": {"namespace": "brokkr-system", "name": "broker-auth"}}}}
    }))
    .unwrap();
    brokers
        .create(&PostParams::default(), &manifest)
        .await
        .unwrap();

    // The Secret holds the wrong password: the status says so, without the password.
    let ready = |fake: &FakeCluster, want: &'static str| {
        let broker = fake.get(API, "ClusterServiceBroker", None, "brokkr")?;
        let ready = broker["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")?
            .clone();
        (ready["status"] == want).then_some(ready)
    };
    let failed = eventually("a failed Ready condition", || ready(&fake, "False")).await;
    assert_eq!(failed["reason"], "ErrorFetchingCatalog");
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("401") && message.contains("who are you?"),
        "{message}"
    );
    assert!(
        !message.contains("wrong") && !message.contains("d3Jvbmc"),
        "{message}"
    );
    assert!(fake.list(API, "ClusterServiceClass").is_empty());

    // With the right password, the catalog is listed.
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "broker-auth", "namespace": "brokkr-system"},
        "data": {"username": "cGxhdGZvcm0=", "password": "czNjcmV0IQ=="}}));
    brokers
        .patch(
            "brokkr",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"relistRequests": 1}})),
        )
        .await
        .unwrap();
    // A retry after the Secret changed may list the catalog before the relist request is seen:
    // wait for the status of the generation that asked for the relist.
    let status = eventually("a Ready broker at generation 2", || {
        let status = fake.get(API, "ClusterServiceBroker", None, "brokkr")?["status"].clone();
        (status["reconciledGeneration"] == 2).then_some(status)
    })
    .await;
    let ready = ready(&fake, "True").expect("a Ready condition");
    assert_eq!(ready["reason"], "FetchedCatalog");
    assert_eq!(status["lastConditionState"], "Ready");
    assert!(status["lastCatalogRetrievalTime"].is_string());

    let class = fake
        .get(
            API,
            "ClusterServiceClass",
            None,
            "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468",
        )
        .unwrap();
    assert_eq!(class["spec"]["externalName"], "postgresql");
    assert_eq!(
        class["spec"]["externalID"],
        "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468"
    );
    assert_eq!(class["spec"]["clusterServiceBrokerName"], "brokkr");
    assert_eq!(class["spec"]["bindable"], true);
    assert_eq!(
        class["spec"]["externalMetadata"]["displayName"],
        "PostgreSQL"
    );
    assert_eq!(
        class["metadata"]["labels"]["services.brokkr.dev/broker"],
        "brokkr"
    );
    let owner = &class["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["name"].as_str(),
            owner["controller"].as_bool()
        ),
        (Some("ClusterServiceBroker"), Some("brokkr"), Some(true))
    );

    let small = fake.get(API, "ClusterServicePlan", None, SMALL).unwrap();
    assert_eq!(small["spec"]["externalName"], "small");
    assert_eq!(
        small["spec"]["clusterServiceClassRef"]["name"],
        "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468"
    );
    assert_eq!(small["spec"]["free"], true);
    assert_eq!(small["spec"]["maximumPollingDuration"], 600);
    assert_eq!(
        small["spec"]["instanceCreateParameterSchema"]["properties"]["version"]["type"],
        "string"
    );
    // A catalog id that is not a DNS name is made one.
    let large = fake
        .get(API, "ClusterServicePlan", None, "large-plan")
        .unwrap();
    assert_eq!(large["spec"]["externalID"], "Large_Plan");
    assert_eq!(large["spec"]["free"], false);

    // The catalog drops the large plan: it stays, marked removed; the small one does not.
    broker.catalog.lock().unwrap()["services"][0]["plans"]
        .as_array_mut()
        .unwrap()
        .pop();
    brokers
        .patch(
            "brokkr",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"relistRequests": 2}})),
        )
        .await
        .unwrap();
    let plans: Api<ClusterServicePlan> = Api::all(client.clone());
    let mut removed = None;
    for _ in 0..200 {
        let plan = plans.get("large-plan").await.unwrap();
        if plan
            .status
            .as_ref()
            .is_some_and(|s| s.removed_from_broker_catalog)
        {
            removed = Some(plan);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(removed.is_some(), "the dropped plan is not marked removed");
    let small = plans.get(SMALL).await.unwrap();
    assert!(!small.status.is_some_and(|s| s.removed_from_broker_catalog));

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"brokkr_controller_osb_calls_total{verb="catalog",status="401"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"brokkr_controller_osb_calls_total{verb="catalog",status="200"}"#),
        "{text}"
    );
    // The errors' series exists from the first reconcile; these reconciles failed.
    assert!(
        text.contains(
            r#"brokkr_controller_reconcile_errors_total{controller="ClusterServiceBroker"}"#
        ) && !text.contains(
            "brokkr_controller_reconcile_errors_total{controller=\"ClusterServiceBroker\"} 0\n"
        ),
        "{text}"
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), controllers)
        .await
        .expect("the controllers stop")
        .unwrap();
}

#[tokio::test]
async fn a_namespaced_broker_lists_into_its_namespace_with_a_bearer_token() {
    let broker = catalog_server("Bearer t0ken").await;
    let fake = cluster().await;
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "team-broker-token", "namespace": "team-a"}, "data": {"token": "dDBrZW4="}}));
    let client = fake.client();
    let mut ctx = brokkr_controller::Context::new(client.clone());
    // The broker is on loopback, which namespaced brokers may use only when allowed.
    ctx.brokers.namespaced_urls.allow("127.0.0.1").unwrap();
    let controllers = tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()));
    let brokers: Api<ServiceBroker> = Api::namespaced(client.clone(), "team-a");
    let manifest: ServiceBroker = serde_json::from_value(json!({
        "apiVersion": API, "kind": "ServiceBroker", "metadata": {"name": "team-broker", "namespace": "team-a"},
        "spec": {"url": broker.url, "authInfo": {"bearer": {"secretRef": {"name": "team-broker-token"}}}}
    }))
    .unwrap();
    brokers
        .create(&PostParams::default(), &manifest)
        .await
        .unwrap();
    let plan = eventually("a ServicePlan", || {
        fake.get(API, "ServicePlan", Some("team-a"), SMALL)
    })
    .await;
    assert_eq!(plan["spec"]["serviceBrokerName"], "team-broker");
    assert_eq!(
        plan["spec"]["serviceClassRef"]["name"],
        "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468"
    );
    assert!(
        fake.get(
            API,
            "ServiceClass",
            Some("team-a"),
            "4f6e6cf6-ffdd-425f-a2c7-3c9258ad2468"
        )
        .is_some()
    );
    assert!(fake.list(API, "ClusterServiceClass").is_empty());
    controllers.abort();
}

#[tokio::test]
async fn a_broker_never_takes_over_the_classes_of_another_broker_with_the_same_ids() {
    let first = catalog_server("Bearer t").await;
    let second = catalog_server("Bearer t").await;
    let fake = cluster().await;
    fake.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "brokkr-system"}}),
    );
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token", "namespace": "brokkr-system"},
        "data": {"token": "dA=="}}));
    let ctx = brokkr_controller::Context::new(fake.client());
    let controllers = tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()));
    let broker = |name: &str, url: &str| {
        json!({"apiVersion": API, "kind": "ClusterServiceBroker", "metadata": {"name": name},
            "spec": {"url": url, "relistBehavior": "Manual",
                     "authInfo": {"bearer": {"secretRef": {"namespace": "brokkr-system", "name": "token"}}}}})
    };
    fake.create(broker("first", &first.url));
    eventually("the first broker's plans", || {
        let plan = fake.get(API, "ClusterServicePlan", None, SMALL)?;
        (plan["spec"]["clusterServiceBrokerName"] == "first").then_some(())
    })
    .await;
    fake.create(broker("second", &second.url));
    let refused = eventually("the second broker to be refused", || {
        let b = fake.get(API, "ClusterServiceBroker", None, "second")?;
        let c = b["status"]["conditions"].as_array()?.first()?.clone();
        (c["status"] == "False").then_some(c)
    })
    .await;
    let message = refused["message"].as_str().unwrap();
    assert!(
        message
            .contains("ClusterServicePlan/86064792-7ea2-467b-af93-ac9694d96d52 (broker \"first\")"),
        "{message}"
    );
    let plan = fake.get(API, "ClusterServicePlan", None, SMALL).unwrap();
    assert_eq!(plan["spec"]["clusterServiceBrokerName"], "first");
    assert_eq!(
        plan["metadata"]["labels"]["services.brokkr.dev/broker"],
        "first"
    );
    controllers.abort();
}
