//! Resource names for catalog entries: a broker's ids made into DNS subdomain names.

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
    use super::object_name;

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
