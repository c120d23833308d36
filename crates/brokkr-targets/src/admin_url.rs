//! A target's admin connection URL, read from an environment variable or a file and shown only
//! with its password removed.

use std::fmt;

use brokkr_blueprint::TargetConfig;
use url::Url;

use crate::TargetError;

/// An admin connection URL. Its `Debug` and `Display` forms hide the password.
#[derive(Clone)]
pub struct AdminUrl {
    url: Url,
}

impl AdminUrl {
    /// Reads the URL of target `name` from its `url_env` variable or its `url_file`.
    pub fn resolve(name: &str, target: &TargetConfig) -> Result<Self, TargetError> {
        let invalid = |m: String| TargetError::Invalid(format!("target {name}: {m}"));
        let text = match (&target.url_env, &target.url_file) {
            (Some(var), _) => std::env::var(var)
                .map_err(|_| invalid(format!("environment variable {var} is not set")))?,
            (None, Some(file)) => std::fs::read_to_string(file)
                .map_err(|e| invalid(format!("cannot read url_file {file}: {e}")))?,
            (None, None) => return Err(invalid("no url_env or url_file".into())),
        };
        Self::parse(name, text.trim())
    }

    /// Parses `text`; the error never repeats it (it may hold a password).
    pub fn parse(name: &str, text: &str) -> Result<Self, TargetError> {
        let url = Url::parse(text).map_err(|e| {
            TargetError::Invalid(format!("target {name}: the admin URL is not a URL: {e}"))
        })?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(TargetError::Invalid(format!(
                "target {name}: the admin URL names no host"
            )));
        }
        Ok(Self { url })
    }

    /// The URL with its password, to connect with.
    pub fn expose(&self) -> &str {
        self.url.as_str()
    }

    /// The server's host (an IPv6 address without brackets).
    pub fn host(&self) -> &str {
        let host = self.url.host_str().unwrap_or_default();
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// The server's port: the URL's, else the scheme's default.
    pub fn port(&self) -> u16 {
        self.url.port().unwrap_or(match self.url.scheme() {
            "postgres" | "postgresql" => 5432,
            "mysql" | "mariadb" => 3306,
            "redis" | "rediss" => 6379,
            _ => 0,
        })
    }

    /// `host:port`, for messages.
    pub fn server(&self) -> String {
        if self.host().contains(':') {
            format!("[{}]:{}", self.host(), self.port())
        } else {
            format!("{}:{}", self.host(), self.port())
        }
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.url.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some("***"));
        }
        f.write_str(shown.as_str())
    }
}

impl fmt::Debug for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_never_shown() {
        let url = AdminUrl::parse("pg", "postgres://admin:s3cret@db.internal/postgres").unwrap();
        assert_eq!(url.host(), "db.internal");
        assert_eq!(url.port(), 5432);
        assert!(!url.to_string().contains("s3cret"));
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(url.expose().contains("s3cret"));
    }

    #[test]
    fn unparsable_urls_are_not_repeated() {
        let e = AdminUrl::parse("pg", "s3cret not a url").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let url = AdminUrl::parse("r", "redis://[::1]:6380").unwrap();
        assert_eq!((url.host(), url.port()), ("::1", 6380));
        assert_eq!(url.server(), "[::1]:6380");
    }
}
