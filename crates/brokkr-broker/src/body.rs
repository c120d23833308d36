//! Reading what a request carries: its body (size and content-type limits), its query string and
//! its path ids, each rejected with a precise OSB error.

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};

use crate::error::ApiError;

/// Reads a JSON request body of at most `limit` bytes.
pub async fn read_json(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let essence = ct
            .to_str()
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if essence != "application/json" {
            return Err(ApiError::bad_request(
                "Content-Type must be application/json",
            ));
        }
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = err.source();
        }
        ApiError::bad_request("the request body could not be read")
    })
}

/// Query-string parameters.
pub struct Query(HashMap<String, String>);

impl Query {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let raw = raw.unwrap_or_default();
        serde_urlencoded::from_str(raw)
            .map(Self)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))
    }

    /// `accepts_incomplete`: absent or `false` is false, `true` is true.
    pub fn accepts_incomplete(&self) -> Result<bool, ApiError> {
        match self.0.get("accepts_incomplete").map(String::as_str) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(_) => Err(ApiError::bad_request(
                "accepts_incomplete must be true or false",
            )),
        }
    }

    /// An optional non-empty parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A required non-empty parameter.
    pub fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::bad_request(format!("the query parameter {name} is required")))
    }
}

/// Longest accepted instance or binding id.
pub const MAX_ID_LEN: usize = 255;

/// Checks a path id: 1 to 255 characters from RFC 3986's unreserved set, other than `.` and
/// `..`, which clients normalise away as path segments (a resource under either could never be
/// reached again).
pub fn check_id(kind: &str, id: &str) -> Result<(), ApiError> {
    let ok = !matches!(id, "" | "." | "..")
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{kind} must be 1 to {MAX_ID_LEN} characters from A-Z a-z 0-9 - . _ ~, \
             and not `.` or `..`"
        )))
    }
}
