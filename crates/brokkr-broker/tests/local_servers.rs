//! The local catalog (catalogs/local) end to end through the OSB API, on real servers that the
//! `local` target runs from the programs installed here (scripts/test installs them): for each
//! of PostgreSQL, MariaDB, Redis and Memcached, provision, two bindings that read each other's
//! data with their own credentials, unbind revoking one, deprovision removing the process and
//! the directory. Also: a PostgreSQL and a Redis server killed with `kill -9` are restarted, the
//! instance reported not usable until it answers again, its data intact; an update to another
//! plan restarts the server with the plan's limits, data kept.
//!
//! Every server a test starts is killed when the test ends, even when it fails.

#[macro_use]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, MySqlConnection, PgConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCAL: &str = include_str!("../../../catalogs/local/local.yaml");
const PG: (&str, &str) = (
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d41",
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d42",
);
const PG_LARGE: &str = "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d43";
const MARIADB: (&str, &str) = (
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d51",
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d52",
);
const REDIS: (&str, &str) = (
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d61",
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d62",
);
const MEMCACHED: (&str, &str) = (
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d71",
    "7a2d4c6e-1b3f-4a5c-8d7e-9f0a1b2c3d72",
);

/// A broker serving the local catalog, and the servers it started, killed on drop.
struct Local {
    broker: TestBroker,
    root: PathBuf,
}

impl Drop for Local {
    fn drop(&mut self) {
        for pid in server_pids(&self.root) {
            kill_group(pid);
        }
    }
}

async fn local() -> Local {
    let broker = start_with(Backend::Sqlite, LOCAL).await;
    let root = broker.local_root();
    Local { broker, root }
}

/// The pid of every server under `root`, from their `state.json`.
fn server_pids(root: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("state.json")).ok())
        .filter_map(|s| serde_json::from_str::<Value>(&s).ok())
        .filter_map(|v| v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()))
        .collect()
}

/// Kills a server and its process group.
fn kill_group(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

impl Local {
    /// The directory and current pid of the instance's server.
    fn server(&self, instance: &str) -> (PathBuf, u32) {
        for entry in std::fs::read_dir(&self.root).unwrap().flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path().join("state.json")) else {
                continue;
            };
            let state: Value = serde_json::from_str(&text).unwrap();
            if state["instance_id"] == instance {
                let pid = u32::try_from(state["pid"].as_u64().unwrap()).unwrap();
                return (entry.path(), pid);
            }
        }
        panic!("no server for instance {instance}");
    }

    async fn provision(&self, (service, plan): (&str, &str), id: &str) {
        let r = (self.broker)
            .put(
                &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
                json!({"organization_guid": "o", "space_guid": "s", "service_id": service, "plan_id": plan}),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = (self.broker)
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        assert_eq!(done.body["instance_usable"], true, "{:?}", done.body);
    }

    async fn bind(&self, (service, plan): (&str, &str), id: &str, b: &str) -> Value {
        let path = format!("/v2/service_instances/{id}/service_bindings/{b}");
        let r = (self.broker)
            .put(
                &format!("{path}?accepts_incomplete=true"),
                json!({"service_id": service, "plan_id": plan}),
            )
            .await;
        if r.status != StatusCode::CREATED {
            // A binding without steps (Memcached's) is made within the request.
            assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
            let done = self
                .broker
                .wait_done(&format!("{path}/last_operation"))
                .await;
            assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        }
        let fetched = self.broker.get(&path).await;
        assert_eq!(fetched.status, StatusCode::OK);
        fetched.body["credentials"].clone()
    }

    async fn unbind(&self, (service, plan): (&str, &str), id: &str, b: &str) {
        let path = format!("/v2/service_instances/{id}/service_bindings/{b}");
        let q = format!("accepts_incomplete=true&service_id={service}&plan_id={plan}");
        let r = self.broker.delete(&format!("{path}?{q}")).await;
        if r.status != StatusCode::OK {
            assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
            let done = self
                .broker
                .wait_done(&format!("{path}/last_operation"))
                .await;
            assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        }
        assert_eq!(self.broker.get(&path).await.status, StatusCode::NOT_FOUND);
    }

    /// Deprovisions and checks that the server's process and directory are gone.
    async fn deprovision(&self, (service, plan): (&str, &str), id: &str) {
        let (dir, pid) = self.server(id);
        let q = format!("accepts_incomplete=true&service_id={service}&plan_id={plan}");
        let r = (self.broker)
            .delete(&format!("/v2/service_instances/{id}?{q}"))
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = (self.broker)
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        assert!(!alive(pid), "the server process {pid} still runs");
        assert!(!dir.exists(), "{} is still there", dir.display());
    }

    /// Kills the instance's server with `kill -9` (only its main process: what a crash leaves)
    /// and waits until `last_operation` says `instance_usable` true again with a new process.
    /// (It says false while the server is down, but that window — the supervisor's restart
    /// backoff — is shorter than a poll can take on a loaded machine, so it is not required.)
    async fn kill_and_wait_back(&self, id: &str) {
        let (_, pid) = self.server(id);
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "the server did not come back");
            let restarted = self.server(id).1 != pid;
            if restarted && self.usable(id).await == Value::Bool(true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn usable(&self, id: &str) -> Value {
        let r = (self.broker)
            .get(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        r.body["instance_usable"].clone()
    }
}

async fn pg(credentials: &Value) -> Result<PgConnection, sqlx::Error> {
    PgConnection::connect(credentials["uri"].as_str().unwrap()).await
}

async fn mariadb(credentials: &Value) -> Result<MySqlConnection, sqlx::Error> {
    MySqlConnection::connect(credentials["uri"].as_str().unwrap()).await
}

async fn redis(credentials: &Value) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(credentials["uri"].as_str().unwrap())?;
    client.get_multiplexed_async_connection().await
}

/// Sends one Memcached text command to the server of `credentials`; returns the answer.
async fn memcached(credentials: &Value, command: &str) -> String {
    let port = u16::try_from(credentials["port"].as_u64().unwrap()).unwrap();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(command.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = s.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn postgresql_bindings_share_the_database_an_update_restarts_with_new_limits_and_a_kill_is_survived()
 {
    let t = local().await;
    let id = "pg-e2e";
    t.provision(PG, id).await;
    let (a, b) = (t.bind(PG, id, "a").await, t.bind(PG, id, "b").await);
    assert_ne!(a["username"], b["username"]);
    let mut ca = pg(&a).await.unwrap();
    sqlx::raw_sql("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('from a')")
        .execute(&mut ca)
        .await
        .unwrap();
    let mut cb = pg(&b).await.unwrap();
    let text: String = sqlx::query_scalar("SELECT text FROM notes")
        .fetch_one(&mut cb)
        .await
        .unwrap();
    assert_eq!(text, "from a");
    sqlx::query("INSERT INTO notes VALUES ('from b')")
        .execute(&mut cb)
        .await
        .unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&mut ca)
        .await
        .unwrap();
    assert_eq!(count, 2);
    let shared_buffers: String = sqlx::query_scalar("SHOW shared_buffers")
        .fetch_one(&mut ca)
        .await
        .unwrap();
    assert_eq!(shared_buffers, "32MB");
    drop((ca, cb));

    // An update to the large plan restarts the server with its limits; the data stays.
    let (_, before) = t.server(id);
    let r = (t.broker)
        .patch(
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
            json!({"service_id": PG.0, "plan_id": PG_LARGE}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = (t.broker)
        .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
        .await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    let (_, after) = t.server(id);
    assert_ne!(before, after, "the server was not restarted");
    let mut ca = pg(&a).await.unwrap();
    let settings: (String, String) = sqlx::query_as(
        "SELECT current_setting('shared_buffers'), current_setting('max_connections')",
    )
    .fetch_one(&mut ca)
    .await
    .unwrap();
    assert_eq!(settings, ("256MB".to_owned(), "100".to_owned()));
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&mut ca)
        .await
        .unwrap();
    assert_eq!(count, 2);
    drop(ca);

    // kill -9 of the postmaster: restarted (its orphaned backends killed first), data intact.
    t.kill_and_wait_back(id).await;
    let mut cb = pg(&b).await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&mut cb)
        .await
        .unwrap();
    assert_eq!(count, 2);
    drop(cb);

    t.unbind(PG, id, "a").await;
    assert!(pg(&a).await.is_err(), "an unbound role can still log in");
    pg(&b).await.expect("the other binding still logs in");
    t.deprovision((PG.0, PG_LARGE), id).await;
}

#[tokio::test]
async fn mariadb_bindings_share_the_database() {
    let t = local().await;
    let id = "mariadb-e2e";
    t.provision(MARIADB, id).await;
    let (a, b) = (
        t.bind(MARIADB, id, "a").await,
        t.bind(MARIADB, id, "b").await,
    );
    let mut ca = mariadb(&a).await.unwrap();
    sqlx::raw_sql("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('from a')")
        .execute(&mut ca)
        .await
        .unwrap();
    let mut cb = mariadb(&b).await.unwrap();
    let text: String = sqlx::query_scalar("SELECT text FROM notes")
        .fetch_one(&mut cb)
        .await
        .unwrap();
    assert_eq!(text, "from a");
    drop((ca, cb));
    t.unbind(MARIADB, id, "a").await;
    assert!(
        mariadb(&a).await.is_err(),
        "an unbound user can still log in"
    );
    mariadb(&b).await.expect("the other binding still logs in");
    t.deprovision(MARIADB, id).await;
}

#[tokio::test]
async fn redis_bindings_share_the_keys_and_a_killed_server_comes_back_with_them() {
    let t = local().await;
    let id = "redis-e2e";
    t.provision(REDIS, id).await;
    let (a, b) = (t.bind(REDIS, id, "a").await, t.bind(REDIS, id, "b").await);
    assert_eq!(a["key-prefix"], "app:");
    let mut ca = redis(&a).await.unwrap();
    let () = redis::cmd("SET")
        .arg("app:note")
        .arg("from a")
        .query_async(&mut ca)
        .await
        .unwrap();
    let mut cb = redis(&b).await.unwrap();
    let text: String = redis::cmd("GET")
        .arg("app:note")
        .query_async(&mut cb)
        .await
        .unwrap();
    assert_eq!(text, "from a");

    // kill -9 of the server: not usable, then restarted with its data and its ACL users. The
    // append-only file reaches the disk every second (`appendfsync everysec`): a kill within
    // that second may lose the write, as docs/targets.md says.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    t.kill_and_wait_back(id).await;
    let fetched = t.broker.get(&format!("/v2/service_instances/{id}")).await;
    assert_eq!(fetched.body["instance_usable"], true, "{:?}", fetched.body);
    let mut cb = redis(&b)
        .await
        .expect("the binding's user survived the restart");
    let text: String = redis::cmd("GET")
        .arg("app:note")
        .query_async(&mut cb)
        .await
        .unwrap();
    assert_eq!(text, "from a");

    t.unbind(REDIS, id, "a").await;
    assert!(redis(&a).await.is_err(), "an unbound user can still log in");
    t.deprovision(REDIS, id).await;
}

#[tokio::test]
async fn memcached_bindings_reach_the_same_server() {
    let t = local().await;
    let id = "memcached-e2e";
    t.provision(MEMCACHED, id).await;
    let (a, b) = (
        t.bind(MEMCACHED, id, "a").await,
        t.bind(MEMCACHED, id, "b").await,
    );
    assert_eq!(a["type"], "memcached");
    assert_eq!(
        memcached(&a, "set note 0 0 6\r\nfrom a\r\n").await,
        "STORED\r\n"
    );
    let got = memcached(&b, "get note\r\n").await;
    assert!(got.contains("from a"), "{got:?}");
    t.unbind(MEMCACHED, id, "a").await;
    t.deprovision(MEMCACHED, id).await;
}
