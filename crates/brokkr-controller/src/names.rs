//! Names the controllers make: a broker's ids as DNS subdomain names for catalog entries,
//! object names as label values; the label and field manager they write with.

use sha2::{Digest as _, Sha256};

/// The label on every class and plan that names the broker whose catalog lists it.
pub const BROKER_LABEL: &str = "services.brokkr.dev/broker";
/// The field manager of everything the controllers write.
pub const FIELD_MANAGER: &str = "brokkr-controller";

/// The longest label value Kubernetes accepts.
const LABEL_VALUE_MAX: usize = 63;

/// `name` (any object name Kubernetes allows, up to 253 characters) as a label value: as it is
/// when it fits in 63 characters, else its first 52 characters, `-` and 10 hexadecimal digits
/// of its SHA-256, so that two long names that share a beginning get different values.
pub fn label_value(name: &str) -> String {
    if name.len() <= LABEL_VALUE_MAX {
        return name.to_owned();
    }
    let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
    let head = name[..52].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{}", &digest[..10])
}

/// `id` as a Kubernetes object name (RFC 1123 subdomain: lower-case letters, digits, `-` and `.`,
/// starting and ending with a letter or digit, at most 253 characters). UUIDs stay as they are;
/// other characters become `-`. `None` when nothing usable is left.
pub fn object_name(id: &str) -> Option<String> {
    let mapped: String = id
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let name: String = trimmed.chars().take(253).collect();
    let name = name.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::{label_value, object_name};

    #[test]
    fn long_names_become_valid_distinct_label_values() {
        assert_eq!(label_value("orders-app"), "orders-app");
        let long = format!("{}.x", "a".repeat(51));
        let other = format!("{}.y", "a".repeat(51));
        let (a, b) = (label_value(&long), label_value(&other));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert!(
            a.starts_with(&"a".repeat(51)) && a.chars().last().unwrap().is_ascii_alphanumeric()
        );
        assert_eq!(label_value(&"b".repeat(63)), "b".repeat(63));
    }

    #[test]
    fn ids_become_dns_names() {
        let uuid = "86064792-7ea2-467b-af93-ac9694d96d52";
        assert_eq!(object_name(uuid).as_deref(), Some(uuid));
        assert_eq!(
            object_name("PostgreSQL_Small").as_deref(),
            Some("postgresql-small")
        );
        assert_eq!(object_name("_db:v1.2_").as_deref(), Some("db-v1.2"));
        assert_eq!(object_name("___"), None);
        assert_eq!(object_name(&"a".repeat(300)).map(|n| n.len()), Some(253));
    }
}
