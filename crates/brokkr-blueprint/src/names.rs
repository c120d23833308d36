//! Names and marks that tell outsiders nothing: a keyed hash of a value under the broker's names
//! key.
//!
//! What brokkr creates on a shared server is seen by every user of that server: PostgreSQL lists
//! every database and role, and their comments, to anyone who can log in. A name derived from an
//! instance id in a way anyone can repeat (the id itself, or its plain SHA-256) tells a bound
//! application which instances exist and lets it confirm a guessed id. [`NamesKey`] is a secret
//! of the broker's — 32 random bytes, made once and kept in its store, the same on every replica
//! and across restarts — and everything here is HMAC-SHA256 under it, so without the key a name
//! or mark says nothing about the value behind it, yet the broker derives the same one every time.
//!
//! Each use hashes a `[purpose, value]` pair written as JSON, so values never run into each other
//! (`["a b", "c"]` and `["a", "b c"]` differ) and a name never equals a mark made for another
//! purpose.

use data_encoding::BASE32_NOPAD;
use ring::hmac;
use serde_json::{Value, json};

/// Bytes of a names key.
const KEY_LEN: usize = 32;
/// The most digest characters a name carries: 26 base32 characters, 130 bits.
const MAX_DIGEST_CHARS: usize = 26;
/// The fewest: 16 base32 characters, 80 bits, so that names of different values do not collide.
pub const MIN_DIGEST_CHARS: usize = 16;
/// Characters of a mark: 26 base32 characters, 130 bits.
const MARK_CHARS: usize = 26;

/// The broker's secret for names and ownership marks. Its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct NamesKey([u8; KEY_LEN]);

impl std::fmt::Debug for NamesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NamesKey(…)")
    }
}

/// A names key that is not 32 bytes of base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the names key is not 32 bytes encoded in base64")]
pub struct BadNamesKey;

impl NamesKey {
    /// A new key from the operating system's generator.
    pub fn generate() -> Self {
        let mut bytes = [0; KEY_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .expect("the operating system's generator works");
        Self(bytes)
    }

    /// The fixed key of `brokkr render` and of tests: public, so names made with it hide
    /// nothing. A broker never uses it; it uses the key kept in its store.
    pub const RENDER_ONLY: Self = Self(*b"brokkr render-only key: public!!");

    /// The key from its stored form ([`NamesKey::to_base64`]).
    pub fn from_base64(text: &str) -> Result<Self, BadNamesKey> {
        let bytes = data_encoding::BASE64
            .decode(text.trim().as_bytes())
            .map_err(|_| BadNamesKey)?;
        Ok(Self(bytes.try_into().map_err(|_| BadNamesKey)?))
    }

    /// The key's stored form: standard base64.
    pub fn to_base64(&self) -> String {
        data_encoding::BASE64.encode(&self.0)
    }

    /// Lower-case base32 of HMAC-SHA256 under this key of `[purpose, value]` as JSON.
    fn digest(&self, purpose: &str, value: &Value) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let message = json!([purpose, value]).to_string();
        let tag = hmac::sign(&key, message.as_bytes());
        BASE32_NOPAD.encode(tag.as_ref()).to_ascii_lowercase()
    }

    /// `prefix` followed by as many digest characters of `value` as fit in `max_len`, at most
    /// 26 (130 bits). `None` when fewer than [`MIN_DIGEST_CHARS`] fit.
    pub fn name(&self, prefix: &str, value: &Value, max_len: usize) -> Option<String> {
        let room = max_len.checked_sub(prefix.len())?.min(MAX_DIGEST_CHARS);
        if room < MIN_DIGEST_CHARS {
            return None;
        }
        let mut digest = self.digest("name", value);
        digest.truncate(room);
        Some(format!("{prefix}{digest}"))
    }

    /// A mark standing for `value` for `purpose` (such as who owns an object), 26 base32
    /// characters; never equal to a [`NamesKey::name`] digest of the same value.
    pub fn mark(&self, purpose: &str, value: &Value) -> String {
        let mut digest = self.digest(&format!("mark {purpose}"), value);
        digest.truncate(MARK_CHARS);
        digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_depend_on_key_and_value_only() {
        let key = NamesKey::generate();
        let id = json!("7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc");
        let name = key.name("db_", &id, 63).unwrap();
        assert_eq!(name.len(), 3 + 26);
        assert!(name.starts_with("db_"));
        assert!(!name.contains("7b7c"));
        assert_eq!(key.name("db_", &id, 63).unwrap(), name);
        let again = NamesKey::from_base64(&key.to_base64()).unwrap();
        assert_eq!(again.name("db_", &id, 63).unwrap(), name);
        assert_ne!(NamesKey::generate().name("db_", &id, 63).unwrap(), name);
        assert_ne!(key.name("db_", &json!("other"), 63).unwrap(), name);
        // Parts of a list never run into each other.
        assert_ne!(
            key.name("u_", &json!(["a b", "c"]), 63),
            key.name("u_", &json!(["a", "b c"]), 63)
        );
        assert_ne!(key.mark("instance", &id), name[3..]);
    }

    #[test]
    fn names_fit_and_keep_enough_bits() {
        let key = NamesKey::RENDER_ONLY;
        assert_eq!(key.name("u_", &json!("x"), 20).unwrap().len(), 20);
        assert!(key.name("u_", &json!("x"), 17).is_none());
        assert!(key.name("a_much_longer_prefix_", &json!("x"), 32).is_none());
    }

    #[test]
    fn keys_never_show_and_must_be_whole() {
        let key = NamesKey::generate();
        assert!(!format!("{key:?}").contains(&key.to_base64()));
        assert_eq!(NamesKey::from_base64("c2hvcnQ="), Err(BadNamesKey));
        assert_eq!(NamesKey::from_base64("not base64"), Err(BadNamesKey));
    }
}
