//! Platform authentication: requests without credentials that [`Auth`] accepts are rejected
//! with 401 ([`require_auth`]). The credentials themselves, kept as SHA-256 digests and compared
//! in constant time, are [`Auth`]'s.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::broker::AppState;
use crate::error::ApiError;

pub use crate::credentials::{Auth, Digest32, digest};

/// Rejects requests without accepted credentials with 401.
pub async fn require_auth(
    State(broker): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let ok = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| broker.auth.accepts(v));
    if ok {
        return next.run(request).await;
    }
    unauthorized("authentication required", "Basic realm=\"brokkr\"")
}

/// A 401 with an OSB error body and the `WWW-Authenticate` challenge of its realm.
pub(crate) fn unauthorized(description: &str, challenge: &'static str) -> Response {
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, description).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}
