//! The catalog and the rules every request follows: the `X-Broker-API-Version` header,
//! basic authentication, the request identity echoed back, the health endpoint.

use reqwest::{Method, StatusCode};

use crate::harness::*;

store_tests!(catalog_and_headers);

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
