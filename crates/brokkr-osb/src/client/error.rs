//! What can go wrong when a platform calls a broker.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::answer::{MAX_TEXT, clipped};
use crate::error::ErrorCode;
use crate::messages::LastOperation;

/// A failed call to a broker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker answered with a status the endpoint does not succeed with.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The broker could not be reached, or did not answer in time.
    #[error("{}", transport_message(.url, .source))]
    Transport {
        /// The URL of the request, without its query.
        url: String,
        /// What the HTTP client reported.
        #[source]
        source: reqwest::Error,
    },
    /// The broker answered with a success status and a body that is not what OSB says.
    #[error("the broker answered {status} with a body that is not a valid OSB response: {message}")]
    InvalidResponse {
        /// The status of the answer.
        status: StatusCode,
        /// What is wrong with the body.
        message: String,
    },
    /// The client cannot be built as configured (a bad URL or CA bundle).
    #[error("{0}")]
    Config(String),
    /// The broker's host is, or resolves to, an address the client's
    /// [`AddressFilter`](super::AddressFilter) refuses; nothing was sent.
    #[error("the broker URL {url} leads to {address}, an address this client may not connect to")]
    AddressRefused {
        /// The URL of the request, without its query.
        url: String,
        /// The refused address.
        address: std::net::SocketAddr,
    },
    /// The operation was still in progress when the maximum polling duration was reached; per the
    /// specification, a platform then considers it failed.
    #[error("the operation did not finish within {}", humanize(*.after))]
    PollingTimedOut {
        /// How long the client polled.
        after: Duration,
        /// The last state the broker reported.
        last: Option<LastOperation>,
    },
}

/// A transport error, or [`Error::AddressRefused`] when the resolver refused the host.
pub(super) fn transport(url: String, source: reqwest::Error) -> Error {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&source);
    while let Some(e) = cause {
        if let Some(refused) = e.downcast_ref::<super::address::Refused>() {
            return Error::AddressRefused {
                url,
                address: refused.0,
            };
        }
        cause = e.source();
    }
    Error::Transport { url, source }
}

fn transport_message(url: &str, source: &reqwest::Error) -> String {
    if source.is_timeout() {
        format!("the broker at {url} did not answer in time")
    } else {
        format!("cannot reach the broker at {url}")
    }
}

fn humanize(d: Duration) -> String {
    format!("{}s", d.as_secs_f64().round())
}

impl Error {
    /// Whether the same request may succeed later: the broker could not be reached or did not
    /// answer in time, or answered 5xx or 429 Too Many Requests.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Broker(e) => {
                e.status.is_server_error() || e.status == StatusCode::TOO_MANY_REQUESTS
            }
            _ => false,
        }
    }

    /// The broker's status, when the broker answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Broker(e) => Some(e.status),
            Self::InvalidResponse { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// An error answer of the broker: its status and its OSB error body, read leniently (a broker may
/// use error codes this crate does not know, or send no body at all).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.message())]
pub struct BrokerError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body's `error` code, as sent.
    pub error: Option<String>,
    /// The body's `description`.
    pub description: Option<String>,
    /// For failed updates and deprovisions: whether the instance is still usable.
    pub instance_usable: Option<bool>,
    /// For failed updates: whether repeating the update may succeed.
    pub update_repeatable: Option<bool>,
    /// The `Retry-After` the broker sent, if any.
    pub retry_after: Option<Duration>,
}

impl BrokerError {
    /// Reads an error answer's body; anything but a JSON object leaves the fields empty. The
    /// texts are cut at [`MAX_TEXT`] characters.
    pub(crate) fn new(status: StatusCode, body: &[u8], retry_after: Option<Duration>) -> Self {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let text = |name: &str| {
            body.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(|s| clipped(s, MAX_TEXT).into_owned())
        };
        Self {
            status,
            error: text("error"),
            description: text("description"),
            instance_usable: body.get("instance_usable").and_then(Value::as_bool),
            update_repeatable: body.get("update_repeatable").and_then(Value::as_bool),
            retry_after,
        }
    }

    /// The error code, when it is one the specification reserves.
    pub fn code(&self) -> Option<ErrorCode> {
        serde_json::from_value(Value::String(self.error.clone()?)).ok()
    }

    /// A message for people: what the status means for an OSB request, then the broker's words.
    fn message(&self) -> String {
        let meaning = match self.status {
            StatusCode::BAD_REQUEST => "the broker rejected the request as malformed",
            StatusCode::UNAUTHORIZED => {
                "the broker refused the credentials (check the user name \
                 and password or the token)"
            }
            StatusCode::FORBIDDEN => "the credentials may not do this",
            StatusCode::NOT_FOUND => "not found",
            StatusCode::CONFLICT => "conflict: it already exists with different attributes",
            StatusCode::GONE => "gone: it does not exist (any more)",
            StatusCode::PRECONDITION_FAILED => {
                "the broker does not support this version of \
                 the OSB API (X-Broker-API-Version)"
            }
            StatusCode::UNPROCESSABLE_ENTITY => match self.code() {
                Some(ErrorCode::ConcurrencyError) => {
                    "another operation on it is in progress; try again when it has finished"
                }
                Some(ErrorCode::AsyncRequired) => "the plan needs an asynchronous request",
                Some(ErrorCode::MaintenanceInfoConflict) => {
                    "the maintenance_info does not match the broker's catalog"
                }
                _ => "the broker cannot process the request",
            },
            s if s.is_server_error() => "the broker failed",
            _ => "unexpected answer",
        };
        let mut text = format!("{meaning} ({})", self.status);
        if let Some(error) = &self.error {
            text.push_str(&format!(" {error}"));
        }
        if let Some(description) = &self.description {
            text.push_str(&format!(": {description}"));
        }
        text
    }
}
/// A JSON decoding error's message with every quoted value replaced by `"…"`: serde quotes the
/// strings it did not expect (`invalid type: string "s3cret", expected a map`), and a body that
/// failed to decode may hold credentials, which must never reach a log line or a status.
pub(crate) fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            out.push(c);
            continue;
        }
        out.push_str("\"…\"");
        while let Some(inner) = chars.next() {
            match inner {
                '\\' => {
                    chars.next();
                }
                '"' => break,
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{BrokerError, StatusCode, without_values};

    #[test]
    fn a_brokers_texts_are_cut_to_a_bounded_length() {
        let long = "x".repeat(50_000);
        let body = serde_json::json!({"error": long, "description": long}).to_string();
        let e = BrokerError::new(StatusCode::BAD_REQUEST, body.as_bytes(), None);
        assert_eq!(e.description.as_ref().unwrap().chars().count(), 1025);
        assert_eq!(e.error.as_ref().unwrap().chars().count(), 1025);
        assert!(e.to_string().len() < 2200, "{}", e.to_string().len());
    }

    #[test]
    fn decoding_errors_never_carry_the_bodys_values() {
        let e =
            serde_json::from_str::<std::collections::HashMap<String, u8>>(r#"{"a": "hunter\"2"}"#)
                .unwrap_err();
        let message = without_values(&e.to_string());
        assert!(!message.contains("hunter"), "{message}");
        assert!(
            message.starts_with("invalid type: string \"…\", expected u8"),
            "{message}"
        );
        assert_eq!(
            without_values("missing field `state`"),
            "missing field `state`"
        );
    }
}
