//! What the fake answers with: a `Status` failure (a not-found among them), a success with its
//! JSON body, and an object as the client asked for it (whole, or its metadata alone).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A `Status` failure response.
pub(crate) fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

/// A `NotFound` failure.
pub(crate) fn not_found(message: String) -> Response {
    status(StatusCode::NOT_FOUND, "NotFound", message)
}

/// A success with `body`.
pub(crate) fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// An object as the client asked for it: whole, or as a `PartialObjectMetadata` (its
/// `metadata` alone).
pub(crate) fn shown(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": object["metadata"]})
    } else {
        object.clone()
    }
}
