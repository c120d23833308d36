//! Encryption at rest of what the store keeps about resources.
//!
//! A [`Keyring`] holds one or more AES-256-GCM keys. The first key encrypts; every key decrypts,
//! so keys can be rotated by putting a new key first and running `brokkr store rekey`. Each sealed
//! value is `enc:v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>`, where the key id is the first
//! 8 hex digits of the key's SHA-256, and the associated data binds the ciphertext to its row and
//! column: a sealed value copied into another row does not open.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom, SystemRandom};

const PREFIX: &str = "enc:v1:";

/// A key that cannot be used, or a value that cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// A key is not 32 bytes of base64.
    #[error("encryption key {index} is not 32 bytes encoded in base64")]
    BadKey {
        /// Position in the key list, from 1.
        index: usize,
    },
    /// No keys were given.
    #[error("no encryption key given")]
    NoKey,
    /// A stored value was sealed with a key the keyring does not hold.
    #[error("a stored value was encrypted with key {0}, which is not configured")]
    UnknownKey(String),
    /// A stored value is damaged or was moved from another row.
    #[error("a stored value failed authentication (damaged, or moved from another row)")]
    Corrupt,
    /// A stored value is plaintext but the keyring requires encryption.
    #[error("a stored value is not encrypted; run `brokkr store rekey` to encrypt it")]
    Plaintext,
}

struct Key {
    id: String,
    key: LessSafeKey,
}

/// The keys that seal and open stored secrets.
pub struct Keyring {
    keys: Vec<Key>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<_> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("key_ids", &ids).finish()
    }
}

impl Keyring {
    /// Builds a keyring from base64 keys, newest (the one that encrypts) first.
    pub fn from_base64<'a>(keys: impl IntoIterator<Item = &'a str>) -> Result<Self, CryptoError> {
        let mut out = Vec::new();
        for (i, text) in keys.into_iter().enumerate() {
            let bytes = B64
                .decode(text.trim())
                .ok()
                .filter(|b| b.len() == 32)
                .ok_or(CryptoError::BadKey { index: i + 1 })?;
            let id = digest(&SHA256, &bytes).as_ref()[..4]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes).expect("32 bytes");
            out.push(Key {
                id,
                key: LessSafeKey::new(unbound),
            });
        }
        if out.is_empty() {
            return Err(CryptoError::NoKey);
        }
        Ok(Self {
            keys: out,
            rng: SystemRandom::new(),
        })
    }

    /// A fresh random key, base64-encoded.
    pub fn generate_key() -> String {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system random source works");
        B64.encode(bytes)
    }

    /// The id of the key that encrypts.
    pub fn current_key_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Encrypts `plaintext`, bound to `context` (row and column).
    pub fn seal(&self, plaintext: &str, context: &str) -> String {
        let key = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the system random source works");
        let mut data = plaintext.as_bytes().to_vec();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .expect("AES-GCM sealing does not fail for these sizes");
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&data);
        format!("{PREFIX}{}:{}", key.id, B64.encode(blob))
    }

    /// Decrypts a sealed value; rejects plaintext.
    pub fn open(&self, stored: &str, context: &str) -> Result<String, CryptoError> {
        let rest = stored.strip_prefix(PREFIX).ok_or(CryptoError::Plaintext)?;
        let (id, body) = rest.split_once(':').ok_or(CryptoError::Corrupt)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| CryptoError::UnknownKey(id.to_owned()))?;
        let mut blob = B64.decode(body).map_err(|_| CryptoError::Corrupt)?;
        if blob.len() < NONCE_LEN {
            return Err(CryptoError::Corrupt);
        }
        let mut data = blob.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&blob).map_err(|_| CryptoError::Corrupt)?;
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| CryptoError::Corrupt)?;
        String::from_utf8(plain.to_vec()).map_err(|_| CryptoError::Corrupt)
    }

    /// Whether `stored` was sealed with the current key (so `rekey` can skip it).
    pub fn is_current(&self, stored: &str) -> bool {
        stored
            .strip_prefix(PREFIX)
            .and_then(|r| r.split_once(':'))
            .is_some_and(|(id, _)| id == self.keys[0].id)
    }
}

/// Whether a stored value is sealed (as opposed to plaintext JSON).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_opens_and_rotates() {
        let old = Keyring::generate_key();
        let new = Keyring::generate_key();
        let ring_old = Keyring::from_base64([old.as_str()]).unwrap();
        let sealed = ring_old.seal("{\"password\":\"hunter2\"}", "row-1/outputs");
        assert!(!sealed.contains("hunter2"));
        assert_ne!(
            sealed,
            ring_old.seal("{\"password\":\"hunter2\"}", "row-1/outputs"),
            "fresh nonce"
        );
        let rotated = Keyring::from_base64([new.as_str(), old.as_str()]).unwrap();
        assert_eq!(
            rotated.open(&sealed, "row-1/outputs").unwrap(),
            "{\"password\":\"hunter2\"}"
        );
        assert!(!rotated.is_current(&sealed));
        assert!(rotated.is_current(&rotated.seal("x", "c")));
        let only_new = Keyring::from_base64([new.as_str()]).unwrap();
        assert!(matches!(
            only_new.open(&sealed, "row-1/outputs"),
            Err(CryptoError::UnknownKey(_))
        ));
    }

    #[test]
    fn refuses_moved_damaged_and_plaintext_values() {
        let ring = Keyring::from_base64([Keyring::generate_key().as_str()]).unwrap();
        let sealed = ring.seal("secret", "row-1/attrs");
        assert_eq!(ring.open(&sealed, "row-2/attrs"), Err(CryptoError::Corrupt));
        let mut damaged = sealed.clone();
        damaged.replace_range(damaged.len() - 3.., "AAA");
        assert_eq!(
            ring.open(&damaged, "row-1/attrs"),
            Err(CryptoError::Corrupt)
        );
        assert_eq!(ring.open("{}", "row-1/attrs"), Err(CryptoError::Plaintext));
        assert!(matches!(
            Keyring::from_base64(["c2hvcnQ="]),
            Err(CryptoError::BadKey { index: 1 })
        ));
        assert!(matches!(Keyring::from_base64([]), Err(CryptoError::NoKey)));
    }
}
