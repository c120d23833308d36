//! The addresses the API server advertises, refused to namespaced brokers, against the fake API
//! server playing the API server's endpoint reconciler: read from the `discovery.k8s.io/v1`
//! EndpointSlices of the Service `default/kubernetes` (never from the deprecated Endpoints where
//! the slices are served), followed as they change, and read from the core `v1` Endpoints on an
//! API server that does not serve EndpointSlices at `v1` (Kubernetes 1.20).

use std::net::SocketAddr;
use std::time::Duration;

use brokkr_controller::Context;
use brokkr_controller::resources;
use brokkr_controller::url_policy::{AdvertisedBy, UrlPolicy};
use brokkr_fake_kube::FakeCluster;
use serde_json::{Value, json};

const API: &str = "services.brokkr.dev/v1alpha1";
/// How often the tests' policies read the addresses again (the controller's: 30 s).
const EVERY: Duration = Duration::from_millis(100);

async fn fake() -> FakeCluster {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    fake
}

fn at(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The Ready condition of the ServiceBroker `name` in `team-a` once it has one (up to 20 s).
async fn ready(fake: &FakeCluster, name: &str) -> Value {
    for _ in 0..400 {
        if let Some(ready) = fake
            .get(API, "ServiceBroker", Some("team-a"), name)
            .and_then(|b| {
                b["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .cloned()
            })
        {
            return ready;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for the Ready condition of ServiceBroker {name}");
}

fn tenant_broker(fake: &FakeCluster, name: &str, url: &str) {
    fake.create(json!({"apiVersion": API, "kind": "ServiceBroker",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"url": url, "relistBehavior": "Manual"}}));
}

/// Waits up to 5 s for `policy` to refuse (or accept) `address`.
async fn until_policy(policy: &UrlPolicy, address: &str, accepted: bool) {
    for _ in 0..100 {
        if policy.accepts(at(address)) == accepted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the policy never {} {address}",
        if accepted { "accepted" } else { "refused" }
    );
}

#[tokio::test]
async fn the_addresses_the_api_server_advertises_are_refused_to_a_tenants_broker_as_they_change() {
    let fake = fake().await;
    fake.advertise_api_server(&["192.0.2.2"]);
    let ctx = Context::new(fake.client());
    let follow = ctx
        .brokers
        .namespaced_urls
        .follow_api_server(fake.client(), EVERY)
        .await;
    let policy = ctx.brokers.namespaced_urls.clone();
    let controllers = tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()));

    // Refused before any connection (nothing listens at 192.0.2.2, TEST-NET-1).
    tenant_broker(&fake, "advertised", "https://192.0.2.2:6443");
    let refused = ready(&fake, "advertised").await;
    assert_eq!(refused["reason"], "ErrorBrokerURLNotAllowed", "{refused}");
    assert!(policy.accepts(at("192.0.2.4:6443")));

    // The API server moves: the new address is refused at the next read, the old one is not.
    fake.advertise_api_server(&["192.0.2.4", "2001:db8::4"]);
    until_policy(&policy, "192.0.2.4:6443", false).await;
    assert!(policy.accepts(at("192.0.2.2:6443")));
    assert!(!policy.accepts(at("[2001:db8::4]:443")));
    tenant_broker(&fake, "moved", "https://192.0.2.4:6443");
    let refused = ready(&fake, "moved").await;
    assert_eq!(refused["reason"], "ErrorBrokerURLNotAllowed", "{refused}");

    // Read from the EndpointSlices, by their label; never from the deprecated Endpoints.
    let requests = fake.requests();
    assert!(
        requests.iter().any(|r| r
            .starts_with("GET /apis/discovery.k8s.io/v1/namespaces/default/endpointslices?")
            && r.contains("labelSelector=kubernetes.io")),
        "{requests:#?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.contains("/endpoints/") || r.contains("/endpoints?")),
        "the Endpoints were read: {requests:#?}"
    );
    follow.abort();
    controllers.abort();
}

#[tokio::test]
async fn an_api_server_without_endpoint_slices_at_v1_is_read_from_its_endpoints() {
    // Kubernetes 1.20: discovery.k8s.io/v1beta1 only.
    let fake = fake().await;
    fake.stop_serving("discovery.k8s.io", "v1", "endpointslices");
    fake.advertise_api_server(&["192.0.2.7"]);
    let policy = UrlPolicy::default();
    assert_eq!(
        policy
            .read_api_server_addresses(&fake.client())
            .await
            .unwrap(),
        AdvertisedBy::Endpoints
    );
    assert!(!policy.accepts(at("192.0.2.7:443")));

    // With EndpointSlices served, they are what counts, whatever the Endpoints say.
    let fake = self::fake().await;
    fake.advertise_api_server(&["192.0.2.8"]);
    fake.create(json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "192.0.2.9"}]}]}));
    assert_eq!(
        policy
            .read_api_server_addresses(&fake.client())
            .await
            .unwrap(),
        AdvertisedBy::EndpointSlices
    );
    assert!(!policy.accepts(at("192.0.2.8:443")));
    assert!(policy.accepts(at("192.0.2.7:443")));
    assert!(policy.accepts(at("192.0.2.9:443")));

    // None advertised (an API server without its endpoint reconciler): none refused.
    let fake = self::fake().await;
    assert_eq!(
        policy
            .read_api_server_addresses(&fake.client())
            .await
            .unwrap(),
        AdvertisedBy::EndpointSlices
    );
    assert!(policy.accepts(at("192.0.2.8:443")));
}
