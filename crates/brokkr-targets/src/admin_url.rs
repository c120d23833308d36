//! A target's admin connection URL, read from an environment variable or a file and shown only
//! with its password removed.

use std::fmt;

use brokkr_blueprint::{TargetConfig, TargetKind};
use serde_json::Value;
use url::Url;

use crate::target::TargetError;

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

    /// The URL of a server a step names: a rendered `{host, port, username, password,
    /// database}` tree, for a target of `kind`. Each part is encoded into its place, so a
    /// password with `@`, `/` or `?` stays a password. Errors never repeat the password.
    pub fn from_server(name: &str, kind: TargetKind, server: &Value) -> Result<Self, TargetError> {
        let invalid = |m: &str| TargetError::Invalid(format!("target {name}: server: {m}"));
        let text = |key: &str| -> Result<Option<&str>, TargetError> {
            match server.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(invalid(&format!("`{key}` must be a string"))),
            }
        };
        let scheme = match kind {
            TargetKind::Postgres => "postgres",
            TargetKind::Mysql => "mysql",
            TargetKind::Redis => "redis",
            TargetKind::Kubernetes | TargetKind::Local => {
                return Err(invalid(
                    "only a postgres, mysql or redis target names a server",
                ));
            }
        };
        let host = text("host")?.ok_or_else(|| invalid("`host` is missing"))?;
        let mut url =
            Url::parse(&format!("{scheme}://server")).map_err(|_| invalid("cannot build a URL"))?;
        let host_set = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => url.set_ip_host(ip).is_ok(),
            Err(_) => url.set_host(Some(host)).is_ok() && url.host_str() == Some(host),
        };
        if !host_set {
            return Err(invalid(&format!(
                "{host:?} is not a host name or IP address"
            )));
        }
        let port = match server.get("port") {
            None | Some(Value::Null) => None,
            Some(p) => Some(
                (p.as_u64()
                    .or_else(|| p.as_str().and_then(|s| s.parse().ok())))
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0)
                .ok_or_else(|| invalid("`port` must be 1-65535"))?,
            ),
        };
        let _ = url.set_port(port);
        if let Some(user) = text("username")? {
            let _ = url.set_username(user);
        }
        if let Some(password) = text("password")? {
            let _ = url.set_password(Some(password));
        }
        if let Some(database) = text("database")? {
            url.path_segments_mut()
                .map_err(|_| invalid("cannot build a URL"))?
                .push(database);
        }
        Ok(Self { url })
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
    fn a_named_server_keeps_every_part_in_its_place() {
        let server = serde_json::json!({"host": "pg-1.team-a.svc", "port": 5433,
            "username": "postgres", "password": "p@ss/w?rd#1", "database": "app"});
        let url = AdminUrl::from_server("db", TargetKind::Postgres, &server).unwrap();
        assert_eq!(url.server(), "pg-1.team-a.svc:5433");
        assert!(!url.to_string().contains("p@ss"), "{url}");
        let parsed = Url::parse(url.expose()).unwrap();
        assert_eq!(parsed.password(), Some("p%40ss%2Fw%3Frd%231"));
        assert_eq!(parsed.path(), "/app");
        assert_eq!(parsed.query(), None);

        let v6 = serde_json::json!({"host": "::1"});
        let url = AdminUrl::from_server("r", TargetKind::Redis, &v6).unwrap();
        assert_eq!(url.server(), "[::1]:6379");

        for bad in [
            serde_json::json!({"host": "db/evil"}),
            serde_json::json!({"host": "db", "port": 70000}),
            serde_json::json!({"host": "db", "port": "x"}),
            serde_json::json!({"port": 5432}),
            serde_json::json!({"host": "db", "password": 5}),
        ] {
            assert!(
                AdminUrl::from_server("db", TargetKind::Mysql, &bad).is_err(),
                "{bad}"
            );
        }
        let e = AdminUrl::from_server(
            "db",
            TargetKind::Mysql,
            &serde_json::json!({"host": "x y",
            "password": "hunter2"}),
        )
        .unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
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
