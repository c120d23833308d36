//! The OSB error body and the error codes the specification reserves.

use serde::{Deserialize, Serialize};

/// An error code the specification requires for a given failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request needs `accepts_incomplete=true`.
    AsyncRequired,
    /// Another operation on the same resource is in progress.
    ConcurrencyError,
    /// The request body lacks `app_guid`.
    RequiresApp,
    /// `maintenance_info.version` does not match the catalog.
    MaintenanceInfoConflict,
}

/// The body of every OSB error response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A reserved error code, when the failure has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorCode>,
    /// A message for the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// For failed updates and deprovisions: whether the instance is still usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_usable: Option<bool>,
    /// For failed updates: whether repeating the update may succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_repeatable: Option<bool>,
}
