//! The four kinds of server a `local` target runs, and for each: the programs it needs (and the
//! Debian package that has them), how a data directory is made, the command line that starts
//! the server with a plan's limits, and the readiness check by protocol (a login and a query,
//! `PING`, `version`).
//!
//! Every server listens on 127.0.0.1 only. Its admin account is `brokkr` with a password
//! brokkr generated; files that hold it are in the server's directory, readable by the server's
//! account only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The admin account of every local server.
pub(super) const ADMIN: &str = "brokkr";

/// A kind of server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// PostgreSQL: `initdb`, then `postgres`.
    Postgres,
    /// Redis: `redis-server`, with an ACL file and an append-only file.
    Redis,
    /// MariaDB: `mariadb-install-db`, then `mariadbd`.
    Mariadb,
    /// Memcached: `memcached`, nothing on disk.
    Memcached,
}

/// What a plan sets: the server honours them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// MiB of memory: PostgreSQL `shared_buffers`, Redis `maxmemory`, MariaDB
    /// `innodb_buffer_pool_size`, Memcached `-m`.
    pub memory_mb: u32,
    /// Most client connections at once.
    pub max_connections: u32,
    /// Redis `maxmemory-policy` (default `noeviction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxmemory_policy: Option<String>,
}

/// Redis eviction policies a plan may name.
const POLICIES: &[&str] = &[
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

impl Engine {
    /// Every engine, for reports.
    pub const ALL: [Engine; 4] = [
        Engine::Postgres,
        Engine::Redis,
        Engine::Mariadb,
        Engine::Memcached,
    ];

    /// The name used in resources.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::Mariadb => "mariadb",
            Self::Memcached => "memcached",
        }
    }

    /// The programs the engine needs, in the order they run.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Self::Postgres => &["initdb", "postgres"],
            Self::Redis => &["redis-server"],
            Self::Mariadb => &["mariadb-install-db", "mariadbd"],
            Self::Memcached => &["memcached"],
        }
    }

    /// The Debian package that installs the programs.
    pub fn package(self) -> &'static str {
        match self {
            Self::Postgres => "postgresql",
            Self::Redis => "redis-server",
            Self::Mariadb => "mariadb-server",
            Self::Memcached => "memcached",
        }
    }

    /// Each program's path, or the first one missing.
    pub fn binaries(self) -> Result<Vec<PathBuf>, &'static str> {
        self.programs()
            .iter()
            .map(|p| find_program(p).ok_or(*p))
            .collect()
    }

    /// Checks limits this engine cannot honour.
    pub(super) fn check(self, limits: &Limits) -> Result<(), String> {
        if limits.memory_mb == 0 || limits.max_connections == 0 {
            return Err("`memory_mb` and `max_connections` must be at least 1".into());
        }
        match (&limits.maxmemory_policy, self) {
            (None, _) => Ok(()),
            (Some(p), Self::Redis) if POLICIES.contains(&p.as_str()) => Ok(()),
            (Some(p), Self::Redis) => Err(format!(
                "`maxmemory_policy` {p:?} is none of {}",
                POLICIES.join(", ")
            )),
            (Some(_), _) => Err("only a redis server takes `maxmemory_policy`".into()),
        }
    }

    /// Files written into a new server's data directory before its first start, with their
    /// contents (the admin password inside).
    pub(super) fn initial_files(self, data: &Path, password: &str) -> Vec<(PathBuf, String)> {
        match self {
            Self::Postgres => vec![(data.with_file_name("pwfile"), format!("{password}\n"))],
            Self::Redis => vec![(
                data.join("users.acl"),
                format!("user default off\nuser {ADMIN} on >{password} ~* &* +@all\n"),
            )],
            Self::Mariadb | Self::Memcached => Vec::new(),
        }
    }

    /// The command that makes the data directory (run once, as the server's account).
    pub(super) fn init_command(self, bins: &[PathBuf], data: &Path) -> Option<Vec<String>> {
        let data = data.display().to_string();
        match self {
            Self::Postgres => Some(vec![
                bins[0].display().to_string(),
                "-D".into(),
                data.clone(),
                "-U".into(),
                ADMIN.into(),
                format!(
                    "--pwfile={}",
                    Path::new(&data).with_file_name("pwfile").display()
                ),
                "--auth=scram-sha-256".into(),
                "--encoding=UTF8".into(),
                "--locale=C".into(),
            ]),
            Self::Mariadb => Some(vec![
                bins[0].display().to_string(),
                "--no-defaults".into(),
                format!("--datadir={data}"),
                "--auth-root-authentication-method=socket".into(),
                "--skip-test-db".into(),
            ]),
            Self::Redis | Self::Memcached => None,
        }
    }

    /// Files rewritten before every start (they carry the limits and the admin password).
    pub(super) fn start_files(
        self,
        data: &Path,
        port: u16,
        password: &str,
        limits: &Limits,
    ) -> Vec<(PathBuf, String)> {
        match self {
            Self::Redis => {
                let policy = limits.maxmemory_policy.as_deref().unwrap_or("noeviction");
                let conf = format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\ndaemonize no\nappendonly yes\n\
                     appendfsync everysec\nsave \"\"\naclfile {dir}/users.acl\n\
                     maxmemory {mem}mb\nmaxmemory-policy {policy}\nmaxclients {conns}\n",
                    dir = data.display(),
                    mem = limits.memory_mb,
                    conns = limits.max_connections,
                );
                vec![(data.join("redis.conf"), conf)]
            }
            Self::Mariadb => {
                let quoted = password.replace('\\', "\\\\").replace('\'', "\\'");
                let sql = format!(
                    "CREATE USER IF NOT EXISTS '{ADMIN}'@'%' IDENTIFIED BY '{quoted}';\n\
                     ALTER USER '{ADMIN}'@'%' IDENTIFIED BY '{quoted}';\n\
                     GRANT ALL PRIVILEGES ON *.* TO '{ADMIN}'@'%' WITH GRANT OPTION;\n"
                );
                vec![(data.join("init.sql"), sql)]
            }
            Self::Postgres | Self::Memcached => Vec::new(),
        }
    }

    /// The command line that runs the server in the foreground.
    pub(super) fn start_command(
        self,
        bins: &[PathBuf],
        data: &Path,
        port: u16,
        limits: &Limits,
    ) -> Vec<String> {
        let d = data.display();
        let (mem, conns) = (limits.memory_mb, limits.max_connections);
        match self {
            Self::Postgres => vec![
                bins[1].display().to_string(),
                "-D".into(),
                d.to_string(),
                "-p".into(),
                port.to_string(),
                "-k".into(),
                d.to_string(),
                "-c".into(),
                "listen_addresses=127.0.0.1".into(),
                "-c".into(),
                format!("max_connections={conns}"),
                "-c".into(),
                format!("shared_buffers={mem}MB"),
            ],
            Self::Redis => vec![
                bins[0].display().to_string(),
                data.join("redis.conf").display().to_string(),
            ],
            Self::Mariadb => vec![
                bins[1].display().to_string(),
                "--no-defaults".into(),
                format!("--datadir={d}"),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={d}/mysqld.sock"),
                format!("--pid-file={d}/mysqld.pid"),
                format!("--log-error={d}/error.log"),
                format!("--init-file={d}/init.sql"),
                "--skip-name-resolve".into(),
                format!("--max-connections={conns}"),
                format!("--innodb-buffer-pool-size={mem}M"),
            ],
            Self::Memcached => vec![
                bins[0].display().to_string(),
                "-l".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-U".into(),
                "0".into(),
                "-m".into(),
                mem.to_string(),
                "-c".into(),
                conns.to_string(),
            ],
        }
    }

    /// The files a server in `dir` writes its messages to: its output (`server.log`), and
    /// MariaDB's error log, where `mariadbd` writes once it has read its options.
    pub(super) fn log_files(self, dir: &Path) -> Vec<PathBuf> {
        let mut logs = vec![dir.join("server.log")];
        if self == Self::Mariadb {
            logs.push(dir.join("data").join("error.log"));
        }
        logs
    }

    /// The admin URL of a server on `port`, for the shared-server targets (none for Memcached).
    pub fn admin_url(self, port: u16, password: &str) -> Option<String> {
        let password = url_escape(password);
        match self {
            Self::Postgres => Some(format!(
                "postgres://{ADMIN}:{password}@127.0.0.1:{port}/postgres"
            )),
            Self::Mariadb => Some(format!("mysql://{ADMIN}:{password}@127.0.0.1:{port}/mysql")),
            Self::Redis => Some(format!("redis://{ADMIN}:{password}@127.0.0.1:{port}")),
            Self::Memcached => None,
        }
    }

    /// Whether the server on `port` answers its protocol as the admin: a login and `SELECT 1`,
    /// `PING`, `version`. The error says what failed (never the password).
    pub(super) async fn probe(self, port: u16, password: &str) -> Result<(), String> {
        const WITHIN: Duration = Duration::from_secs(3);
        let url = self.admin_url(port, password);
        let probe = async {
            match self {
                Self::Postgres => {
                    let url = url.expect("postgres has an admin URL");
                    let mut c = sqlx::PgConnection::connect(&url).await.map_err(sql_error)?;
                    sqlx::query("SELECT 1")
                        .execute(&mut c)
                        .await
                        .map_err(sql_error)?;
                    let _ = c.close().await;
                    Ok(())
                }
                Self::Mariadb => {
                    let url = url.expect("mariadb has an admin URL");
                    let mut c = sqlx::MySqlConnection::connect(&url)
                        .await
                        .map_err(sql_error)?;
                    sqlx::query("SELECT 1")
                        .execute(&mut c)
                        .await
                        .map_err(sql_error)?;
                    let _ = c.close().await;
                    Ok(())
                }
                Self::Redis => {
                    let url = url.expect("redis has an admin URL");
                    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                    let mut c = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| e.to_string())?;
                    let pong: String = redis::cmd("PING")
                        .query_async(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                    (pong == "PONG")
                        .then_some(())
                        .ok_or_else(|| format!("PING answered {pong:?}"))
                }
                Self::Memcached => {
                    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .map_err(|e| e.to_string())?;
                    s.write_all(b"version\r\n")
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut buf = [0u8; 64];
                    let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
                    (buf[..n].starts_with(b"VERSION "))
                        .then_some(())
                        .ok_or_else(|| "`version` got no VERSION answer".to_owned())
                }
            }
        };
        match tokio::time::timeout(WITHIN, probe).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {}s", WITHIN.as_secs())),
        }
    }
}

/// What went wrong with a probe's SQL connection (sqlx's errors name no URL or password).
fn sql_error(e: sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(e) => e.message().to_owned(),
        e => e.to_string(),
    }
}

/// Percent-encodes what a URL's user-info may not hold.
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Where `program` is: on the PATH, in `/usr/sbin` or `/sbin` (MariaDB's server), or, for
/// PostgreSQL's programs, in the newest `/usr/lib/postgresql/<version>/bin` (where Debian puts
/// them, off the PATH).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/sbin"].map(PathBuf::from));
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev().map(|(_, bin)| bin));
    }
    dirs.into_iter()
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_an_engine_cannot_honour_are_refused() {
        let mut limits = Limits {
            memory_mb: 64,
            max_connections: 10,
            maxmemory_policy: Some("allkeys-lru".into()),
        };
        assert!(Engine::Redis.check(&limits).is_ok());
        assert!(Engine::Postgres.check(&limits).is_err());
        limits.maxmemory_policy = Some("sometimes".into());
        assert!(Engine::Redis.check(&limits).is_err());
        limits.maxmemory_policy = None;
        limits.memory_mb = 0;
        assert!(Engine::Memcached.check(&limits).is_err());
    }

    #[test]
    fn admin_urls_escape_the_password() {
        let url = Engine::Postgres.admin_url(5999, "a@b/c").unwrap();
        assert_eq!(url, "postgres://brokkr:a%40b%2Fc@127.0.0.1:5999/postgres");
    }
}
