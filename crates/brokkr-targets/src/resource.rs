//! Reading a rendered resource: parsing it into a target's own type, and checking the names and
//! secrets it carries before they reach a server.

use serde_json::Value;

use crate::target::TargetError;

/// Parses a resource into `T`, naming the target and the resource's kind on failure.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    target: &str,
    resource: &Value,
) -> Result<T, TargetError> {
    serde_json::from_value(resource.clone()).map_err(|e| {
        let kind = resource["kind"].as_str().unwrap_or("(no kind)");
        TargetError::Invalid(format!("target {target}: resource of kind {kind}: {e}"))
    })
}

/// Checks that `name` (a database, role or user name) has 1 to `max` bytes and no NUL, so the
/// server stores exactly the name given (PostgreSQL would silently truncate a longer one).
pub(crate) fn check_name(
    target: &str,
    what: &str,
    name: &str,
    max: usize,
) -> Result<(), TargetError> {
    if name.is_empty() || name.len() > max || name.contains('\0') {
        return Err(TargetError::Invalid(format!(
            "target {target}: a {what} name must be 1 to {max} bytes without NUL (got {} bytes); \
             `safe_name(text, {max})` makes one",
            name.len()
        )));
    }
    Ok(())
}

/// Checks that a secret has no NUL byte (servers cut or refuse them); never shows it.
pub(crate) fn check_secret(target: &str, what: &str, secret: &str) -> Result<(), TargetError> {
    if secret.is_empty() || secret.contains('\0') {
        return Err(TargetError::Invalid(format!(
            "target {target}: the {what} must be non-empty and without NUL"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_for_length_and_nul() {
        assert!(check_name("t", "role", "orders", 63).is_ok());
        assert!(check_name("t", "role", &"a".repeat(64), 63).is_err());
        assert!(check_name("t", "role", "", 63).is_err());
        let e = check_name("t", "role", "a\0b", 63).unwrap_err();
        assert!(e.to_string().contains("without NUL"), "{e}");
    }

    #[test]
    fn secrets_never_appear_in_their_errors() {
        let e = check_secret("t", "password", "hunter2\0").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
