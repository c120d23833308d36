//! Credentials and the well-known entries of the servicebinding.io provider contract.
//!
//! Credentials are a flat map of scalar values. `type` is required and `provider` defaults to
//! [`DEFAULT_PROVIDER`]. The well-known entries are checked before credentials are ever returned:
//! `host` (a DNS name or an IP address), `port` (1–65535), `uri` (RFC 3986), `username` and
//! `password` (strings), `certificates` (a PEM certificate chain) and `private-key` (a PEM private
//! key). Every entry name must be usable as a file name (`[-._a-zA-Z0-9]+`), since a projected
//! binding is a directory of files. Messages name the entry, never its value.

use std::net::IpAddr;

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Map, Value};

/// The provider written when credentials do not name one.
pub const DEFAULT_PROVIDER: &str = "brokkr";

/// The entries the specification reserves (`type`, `provider`) or gives requirements to.
pub const WELL_KNOWN_ENTRIES: &[&str] = &[
    "type",
    "provider",
    "host",
    "port",
    "uri",
    "username",
    "password",
    "certificates",
    "private-key",
];

/// Credentials that break the provider contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("credentials: {0}")]
pub struct CredentialsError(pub String);

/// Checks `value` and returns it as a flat map with `provider` filled in.
pub fn finalize(value: Value) -> Result<Map<String, Value>, CredentialsError> {
    let Value::Object(mut map) = value else {
        return Err(CredentialsError("must be a map of entries".into()));
    };
    map.entry("provider")
        .or_insert_with(|| Value::String(DEFAULT_PROVIDER.into()));
    validate(&map)?;
    Ok(map)
}

/// Checks a credentials map against the well-known entry rules.
pub fn validate(map: &Map<String, Value>) -> Result<(), CredentialsError> {
    let fail = |msg: String| Err(CredentialsError(msg));
    for (key, value) in map {
        if !valid_key(key) {
            return fail(format!(
                "entry name {key:?} must match [-._a-zA-Z0-9]+ (it becomes a file name)"
            ));
        }
        if value.is_object() || value.is_array() || value.is_null() {
            return fail(format!("`{key}` must be a string, number or boolean"));
        }
    }
    for key in ["type", "provider"] {
        match map.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            Some(_) => return fail(format!("`{key}` must be a non-empty string")),
            None if key == "type" => return fail("`type` is required".into()),
            None => {}
        }
    }
    for key in ["username", "password"] {
        if let Some(v) = map.get(key)
            && !v.is_string()
        {
            return fail(format!("`{key}` must be a string"));
        }
    }
    if let Some(host) = map.get("host")
        && !host.as_str().is_some_and(valid_host)
    {
        return fail("`host` must be a DNS name or an IP address".into());
    }
    if let Some(port) = map.get("port") {
        let n = match port {
            Value::Number(n) => n.as_u64(),
            Value::String(s) if s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
            _ => None,
        };
        if !n.is_some_and(|n| (1..=65535).contains(&n)) {
            return fail("`port` must be an integer from 1 to 65535".into());
        }
    }
    if let Some(uri) = map.get("uri") {
        let ok = uri
            .as_str()
            .is_some_and(|u| fluent_uri::Uri::parse(u).is_ok());
        if !ok {
            return fail("`uri` must be an absolute URI (RFC 3986)".into());
        }
    }
    if let Some(pem) = map.get("certificates") {
        let count = pem.as_str().map(|p| {
            CertificateDer::pem_slice_iter(p.as_bytes())
                .map(|c| c.is_ok())
                .try_fold(0usize, |n, ok| ok.then_some(n + 1))
        });
        if !matches!(count, Some(Some(n)) if n > 0) {
            return fail("`certificates` must be one or more PEM certificates".into());
        }
    }
    if let Some(pem) = map.get("private-key") {
        let ok = pem
            .as_str()
            .is_some_and(|p| PrivateKeyDer::from_pem_slice(p.as_bytes()).is_ok());
        if !ok {
            return fail("`private-key` must be a PEM private key".into());
        }
    }
    Ok(())
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

/// A DNS name (RFC 1123 labels) or an IPv4/IPv6 address.
fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<Map<String, Value>, CredentialsError> {
        finalize(v)
    }

    #[test]
    fn accepts_well_formed_entries_and_fills_provider() {
        let map = check(json!({
            "type": "postgresql", "host": "db.example.com", "port": 5432,
            "uri": "postgresql://u:p@db.example.com:5432/app", "username": "u", "password": "p",
            "database": "app"
        }))
        .unwrap();
        assert_eq!(map["provider"], "brokkr");
        check(json!({"type": "redis", "host": "10.0.0.7", "port": "6379"})).unwrap();
        check(json!({"type": "redis", "host": "::1"})).unwrap();
    }

    #[test]
    fn every_well_known_entry_is_checked() {
        for entry in WELL_KNOWN_ENTRIES {
            let mut map = Map::new();
            map.insert("type".into(), json!("x"));
            map.insert((*entry).into(), json!(false));
            let err = validate(&map).unwrap_err().to_string();
            assert!(err.contains(&format!("`{entry}`")), "{entry}: {err}");
        }
    }

    #[test]
    fn rejects_each_broken_entry_without_echoing_it() {
        let cases = [
            (json!({"host": "h"}), "`type` is required"),
            (json!({"type": ""}), "`type` must be"),
            (json!({"type": "x", "host": "bad host!"}), "`host`"),
            (json!({"type": "x", "host": "-a.example"}), "`host`"),
            (json!({"type": "x", "port": 0}), "`port`"),
            (json!({"type": "x", "port": 70000}), "`port`"),
            (json!({"type": "x", "port": "54x"}), "`port`"),
            (json!({"type": "x", "uri": "not a uri"}), "`uri`"),
            (json!({"type": "x", "password": 5}), "`password`"),
            (json!({"type": "x", "nested": {"a": 1}}), "`nested`"),
            (json!({"type": "x", "bad/key": "v"}), "entry name"),
            (
                json!({"type": "x", "certificates": "secret-not-pem"}),
                "`certificates`",
            ),
            (
                json!({"type": "x", "private-key": "secret-not-pem"}),
                "`private-key`",
            ),
            (json!(["type"]), "map"),
        ];
        for (value, expected) in cases {
            let err = check(value.clone()).unwrap_err().to_string();
            assert!(err.contains(expected), "{value}: {err}");
            assert!(!err.contains("secret-not-pem") && !err.contains("bad host!"));
        }
    }
}
