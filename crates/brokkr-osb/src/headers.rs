//! The `X-Broker-API-*` headers: the API version a platform speaks, who asked, and the request id.

use base64::Engine as _;
use serde_json::Value;

/// `X-Broker-API-Version`, required on every request.
pub const API_VERSION: &str = "x-broker-api-version";
/// `X-Broker-API-Originating-Identity`: the platform user behind a request.
pub const ORIGINATING_IDENTITY: &str = "x-broker-api-originating-identity";
/// `X-Broker-API-Request-Identity`: a platform-chosen id, echoed in the response.
pub const REQUEST_IDENTITY: &str = "x-broker-api-request-identity";

/// The newest API version this crate implements.
pub const LATEST: ApiVersion = ApiVersion {
    major: 2,
    minor: 17,
};
/// The oldest API version a broker built on this crate accepts.
pub const OLDEST_SUPPORTED: ApiVersion = ApiVersion {
    major: 2,
    minor: 13,
};

/// A `MAJOR.MINOR` API version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion {
    /// Major version; only 2 exists.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ApiVersion {
    /// Parses `MAJOR.MINOR` (surrounding white space is ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let (major, minor) = text.trim().split_once('.')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return None;
        }
        Some(Self {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }

    /// Whether a broker implementing [`LATEST`] serves this version. Minor versions only add
    /// optional fields, so every 2.x from [`OLDEST_SUPPORTED`] on is served, newer ones included.
    pub fn is_supported(self) -> bool {
        self.major == LATEST.major && self >= OLDEST_SUPPORTED
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A decoded `X-Broker-API-Originating-Identity`: `<platform> <base64(JSON object)>`.
#[derive(Debug, Clone, PartialEq)]
pub struct OriginatingIdentity {
    /// The platform, e.g. `cloudfoundry` or `kubernetes`.
    pub platform: String,
    /// The decoded identity object.
    pub value: Value,
}

impl OriginatingIdentity {
    /// An identity for `platform`, e.g. `kubernetes` with `{"username", "uid", "groups", "extra"}`.
    pub fn new(platform: impl Into<String>, value: Value) -> Self {
        Self {
            platform: platform.into(),
            value,
        }
    }

    /// The header value: `<platform> <base64(JSON object)>`.
    pub fn to_header(&self) -> String {
        let encoded = base64::engine::general_purpose::STANDARD.encode(self.value.to_string());
        format!("{} {encoded}", self.platform)
    }

    /// Parses the header value; `None` when it is not `<platform> <base64 JSON object>`.
    pub fn parse(header: &str) -> Option<Self> {
        let (platform, encoded) = header.trim().split_once(' ')?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let value: Value = serde_json::from_slice(&bytes).ok()?;
        if platform.is_empty() || !value.is_object() {
            return None;
        }
        Some(Self {
            platform: platform.to_owned(),
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_gate() {
        assert_eq!(
            ApiVersion::parse("2.17"),
            Some(ApiVersion {
                major: 2,
                minor: 17
            })
        );
        assert!(ApiVersion::parse("2.17").unwrap().is_supported());
        assert!(ApiVersion::parse("2.13").unwrap().is_supported());
        assert!(ApiVersion::parse("2.18").unwrap().is_supported());
        assert!(!ApiVersion::parse("2.12").unwrap().is_supported());
        assert!(!ApiVersion::parse("3.0").unwrap().is_supported());
        for bad in ["", "2", "2.", ".17", "2.x", "v2.17", "2.17.1", "+2.17"] {
            assert_eq!(ApiVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn originating_identity_decodes_platform_and_object() {
        let id = OriginatingIdentity::parse(
            "cloudfoundry eyJ1c2VyX2lkIjogIjY4M2VhNzQ4In0=", // {"user_id": "683ea748"}
        )
        .unwrap();
        assert_eq!(id.platform, "cloudfoundry");
        assert_eq!(id.value["user_id"], "683ea748");
        assert!(OriginatingIdentity::parse("cloudfoundry not-base64!").is_none());
        assert!(OriginatingIdentity::parse("kubernetes WzFd").is_none()); // [1]: not an object
    }

    #[test]
    fn originating_identity_round_trips_through_its_header() {
        let id = OriginatingIdentity::new(
            "kubernetes",
            serde_json::json!({"username": "jane", "uid": "1", "groups": ["dev"], "extra": {}}),
        );
        assert!(id.to_header().starts_with("kubernetes "));
        assert_eq!(OriginatingIdentity::parse(&id.to_header()), Some(id));
    }
}
