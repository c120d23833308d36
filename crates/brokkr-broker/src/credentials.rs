//! Accepted platform credentials ([`Auth`]): HTTP basic credentials and bearer tokens.
//!
//! Secrets are kept only as SHA-256 digests and compared in constant time with `subtle`, so
//! neither their length nor their prefix leaks through timing.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// SHA-256 digest of a secret.
pub type Digest32 = [u8; 32];

/// Hashes a secret for [`Auth`].
pub fn digest(secret: &str) -> Digest32 {
    Sha256::digest(secret.as_bytes()).into()
}

/// Accepted platform credentials.
#[derive(Clone, Default)]
pub struct Auth {
    basic: Vec<(Digest32, Digest32)>,
    bearer: Vec<Digest32>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("basic", &self.basic.len())
            .field("bearer", &self.bearer.len())
            .finish()
    }
}

impl Auth {
    /// Accepts `username`/`password` as basic credentials.
    pub fn basic(mut self, username: &str, password: &str) -> Self {
        self.basic.push((digest(username), digest(password)));
        self
    }

    /// Accepts a basic password given by its digest.
    pub fn basic_digest(mut self, username: &str, password: Digest32) -> Self {
        self.basic.push((digest(username), password));
        self
    }

    /// Accepts a bearer token.
    pub fn bearer(mut self, token: &str) -> Self {
        self.bearer.push(digest(token));
        self
    }

    /// Whether an `Authorization` header value is accepted.
    pub fn accepts(&self, authorization: &str) -> bool {
        let (scheme, value) = authorization.trim().split_once(' ').unwrap_or(("", ""));
        let value = value.trim();
        if scheme.eq_ignore_ascii_case("basic") {
            let Some(decoded) = base64::engine::general_purpose::STANDARD
                .decode(value)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
            else {
                return false;
            };
            let Some((user, pass)) = decoded.split_once(':') else {
                return false;
            };
            let (user, pass) = (digest(user), digest(pass));
            // Check every entry so that timing does not reveal which one matched.
            self.basic.iter().fold(false, |ok, (u, p)| {
                let matched = u.ct_eq(&user) & p.ct_eq(&pass);
                ok | bool::from(matched)
            })
        } else if scheme.eq_ignore_ascii_case("bearer") {
            let token = digest(value);
            self.bearer
                .iter()
                .fold(false, |ok, t| ok | bool::from(t.ct_eq(&token)))
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, pass: &str) -> String {
        let raw = format!("{user}:{pass}");
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    #[test]
    fn basic_and_bearer_credentials() {
        let auth = Auth::default().basic("admin", "s3cret:x").bearer("tok");
        assert!(auth.accepts(&basic("admin", "s3cret:x")));
        assert!(auth.accepts("bearer tok"));
        assert!(!auth.accepts(&basic("admin", "s3cret")));
        assert!(!auth.accepts(&basic("Admin", "s3cret:x")));
        assert!(!auth.accepts("Bearer tok2"));
        assert!(!auth.accepts("Basic !!!"));
        assert!(!auth.accepts("Digest abc"));
        assert!(!Auth::default().accepts(&basic("", "")));
    }
}
