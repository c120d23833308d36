//! OSB error responses.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brokkr_osb::{ErrorBody, ErrorCode};

/// An error answered with an OSB error body.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with a description and no code.
    pub fn new(status: StatusCode, description: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                description: Some(description.into()),
                ..ErrorBody::default()
            },
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(description: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, description)
    }

    /// 422 with a reserved error code.
    pub fn unprocessable(code: ErrorCode, description: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNPROCESSABLE_ENTITY, description);
        e.body.error = Some(code);
        e
    }

    /// 422 ConcurrencyError.
    pub fn concurrency(description: impl Into<String>) -> Self {
        Self::unprocessable(ErrorCode::ConcurrencyError, description)
    }

    /// 422 AsyncRequired.
    pub fn async_required() -> Self {
        Self::unprocessable(
            ErrorCode::AsyncRequired,
            "This service plan requires client support for asynchronous service operations \
             (add ?accepts_incomplete=true).",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<brokkr_engine::StoreError> for ApiError {
    fn from(e: brokkr_engine::StoreError) -> Self {
        tracing::error!(error = %e, "store failure");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the broker's store is unavailable; retry later",
        )
    }
}
