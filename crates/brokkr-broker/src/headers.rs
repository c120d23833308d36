//! The `X-Broker-API-*` header rules: version gate, request identity echo, originating identity.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use brokkr_osb::ApiVersion;
use brokkr_osb::headers::{
    API_VERSION, LATEST, OLDEST_SUPPORTED, ORIGINATING_IDENTITY, OriginatingIdentity,
    REQUEST_IDENTITY,
};
use tracing::Instrument;

use crate::error::ApiError;

/// Answers 412 unless `X-Broker-API-Version` names a supported version.
pub async fn require_api_version(request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(API_VERSION)
        .map(|v| v.to_str().unwrap_or_default());
    let supported = |v: &str| ApiVersion::parse(v).is_some_and(ApiVersion::is_supported);
    let problem = match header {
        None => Some("the X-Broker-API-Version header is required".to_owned()),
        Some(v) if v.trim().is_empty() => {
            Some("the X-Broker-API-Version header is empty".to_owned())
        }
        Some(v) if !supported(v) => Some(format!(
            "X-Broker-API-Version {:?} is not supported",
            v.chars().take(32).collect::<String>()
        )),
        Some(_) => None,
    };
    match problem {
        None => next.run(request).await,
        Some(p) => ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("{p}; this broker serves every 2.x version from {OLDEST_SUPPORTED} on (it implements {LATEST} and later minor versions add only optional fields)"),
        )
        .into_response(),
    }
}

/// Opens the request's log span (request identity, originating platform and user) and echoes
/// `X-Broker-API-Request-Identity` on the response.
pub async fn request_context(request: Request, next: Next) -> Response {
    let request_id = request.headers().get(REQUEST_IDENTITY).cloned();
    let origin = request
        .headers()
        .get(ORIGINATING_IDENTITY)
        .and_then(|v| v.to_str().ok())
        .and_then(OriginatingIdentity::parse);
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        request_id = request_id.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""),
        platform = origin.as_ref().map_or("", |o| o.platform.as_str()),
        user = %origin.as_ref().map(|o| o.value.to_string()).unwrap_or_default(),
    );
    let response = next.run(request).instrument(span.clone()).await;
    let mut response = osb_error_body(response).await;
    span.in_scope(|| tracing::debug!(status = response.status().as_u16(), "answered"));
    if let Some(id) = request_id.filter(|v| !v.is_empty()) {
        response.headers_mut().insert(REQUEST_IDENTITY, id);
    }
    if !response
        .headers()
        .contains_key(axum::http::header::CACHE_CONTROL)
    {
        response.headers_mut().insert(
            axum::http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
    }
    response
}

/// Gives error responses produced outside the handlers (path decoding, unsupported methods) an
/// OSB error body, so that a platform always gets JSON with a `description`.
async fn osb_error_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let description = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    ApiError::new(status, description).into_response()
}
