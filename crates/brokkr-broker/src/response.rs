//! What every handler answers with: its result type and a JSON body with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ApiError;

/// A handler's answer: a response, or an OSB error.
pub(crate) type ApiResult = Result<Response, ApiError>;

/// `body` as JSON, with `status`.
pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    (status, axum::Json(body)).into_response()
}
