//! A broker on an ephemeral port over a fresh store (SQLite file or PostgreSQL schema), and
//! black-box requests to it through brokkr-osb's client.

// Shared by several test binaries; each uses only part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use brokkr_broker::{Auth, Broker};
use brokkr_engine::{Engine, EngineOptions};
use brokkr_test_support::PgSchema;
use reqwest::StatusCode;
use serde_json::{Value, json};

pub const SERVICE: &str = "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10";
pub const ASYNC_PLAN: &str = "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21";
pub const SYNC_PLAN: &str = "0f6a9b3d-1c2e-4b7a-9d8f-5e4c3b2a1f32";
const USER: &str = "platform";
const PASSWORD: &str = "test-password";
pub const ADMIN: &str = "operator";
pub const ADMIN_PASSWORD: &str = "admin-password";

/// Runs each named `async fn(Backend)` as two tests: `sqlite::name` and `postgres::name`.
#[allow(unused_macros)]
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { super::$name(super::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() { super::$name(super::Backend::Postgres).await })*
        }
    };
}

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct TestBroker {
    pub base: String,
    /// The OSB client, with the platform's credentials.
    pub osb: brokkr_osb::client::Client,
    /// For requests that are deliberately not well-formed OSB, and for the admin API.
    pub client: reqwest::Client,
    store: TestStore,
    broker: Arc<Broker>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A store (a SQLite file, or a PostgreSQL schema dropped at the end) and its encryption key.
pub struct TestStore {
    pub url: String,
    pub key: String,
    dir: tempfile::TempDir,
    schema: Option<(sqlx::AnyPool, String)>,
}

impl TestStore {
    /// Where `local` targets keep their servers: inside the test's directory, which the
    /// servers' unprivileged account (when tests run as root) may pass through.
    pub fn local_root(&self) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::Permissions::from_mode(0o711);
        std::fs::set_permissions(self.dir.path(), perms).unwrap();
        self.dir.path().join("local")
    }

    pub async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (url, schema) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/brokkr.db", dir.path().display()), None),
            Backend::Postgres => {
                let PgSchema { admin, name, url } = PgSchema::create().await;
                (url, Some((admin, name)))
            }
        };
        Self {
            url,
            key: brokkr_engine::crypto::Keyring::generate_key(),
            dir,
            schema,
        }
    }
}

impl TestStore {
    /// Every byte the store holds about resources: the SQLite files, or the PostgreSQL rows.
    pub async fn contents(&self) -> Vec<u8> {
        match &self.schema {
            None => {
                let mut all = Vec::new();
                for entry in std::fs::read_dir(self.dir.path()).unwrap() {
                    all.extend(std::fs::read(entry.unwrap().path()).unwrap());
                }
                all
            }
            Some((pool, schema)) => {
                let sql = format!(
                    "SELECT COALESCE(string_agg(attrs || outputs || op_request, ''), '') AS all \
                     FROM \"{schema}\".brokkr_resources"
                );
                let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .fetch_one(pool)
                    .await
                    .unwrap();
                sqlx::Row::get::<String, _>(&row, "all").into_bytes()
            }
        }
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some((pool, schema)) = self.schema.take() {
            // Drop cannot await: drop the schema from a thread of its own.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
                });
            })
            .join()
            .ok();
        }
    }
}

/// The quickstart with short delays, optionally changed further by `tweak`.
pub fn quickstart(tweak: impl Fn(String) -> String) -> String {
    tweak(brokkr_blueprint::QUICKSTART.replace("delay: 2s", "delay: 300ms"))
}

pub async fn start(backend: Backend) -> TestBroker {
    start_with(backend, &quickstart(|s| s)).await
}

pub async fn start_with(backend: Backend, yaml: &str) -> TestBroker {
    start_with_steps(backend, yaml, Vec::new()).await
}

/// A broker whose engine also runs the given Rust step kinds.
pub async fn start_with_steps(
    backend: Backend,
    yaml: &str,
    kinds: Vec<(&str, Arc<dyn brokkr_engine::step::StepKind>)>,
) -> TestBroker {
    start_on(TestStore::new(backend).await, yaml, kinds).await
}

/// A broker, with an engine of its own, on `test_store`.
async fn start_on(
    test_store: TestStore,
    yaml: &str,
    kinds: Vec<(&str, Arc<dyn brokkr_engine::step::StepKind>)>,
) -> TestBroker {
    let config = brokkr_blueprint::load::load_str("test.yaml", yaml).expect("valid test config");
    let keyring = brokkr_engine::crypto::Keyring::from_base64([test_store.key.as_str()]).unwrap();
    let store = brokkr_engine::connect(&test_store.url, Some(keyring))
        .await
        .expect("store");
    let root = test_store.local_root();
    let targets = brokkr_targets::Targets::from_config(&config.targets, &root).expect("targets");
    let engine = Engine::with_targets(
        store,
        EngineOptions {
            poll_interval: Duration::from_millis(50),
            retention: config
                .broker
                .retention
                .unwrap_or(EngineOptions::default().retention),
            ..EngineOptions::default()
        },
        targets,
    );
    for (name, kind) in kinds {
        engine.register(name, kind);
    }
    engine.start().await.unwrap();
    let broker = Arc::new(Broker::new(
        Arc::new(config),
        engine,
        Auth::default().basic(USER, PASSWORD),
        Some(Auth::default().basic(ADMIN, ADMIN_PASSWORD)),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = broker.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, brokkr_broker::router(served))
            .await
            .unwrap();
    });
    let osb = brokkr_osb::client::Client::builder(&base)
        .basic_auth(USER, PASSWORD)
        .build()
        .unwrap();
    TestBroker {
        base,
        osb,
        client: reqwest::Client::new(),
        store: test_store,
        broker,
        server,
    }
}

impl TestBroker {
    /// Another broker serving `yaml` on this one's store, as a replica: an engine of its own
    /// (another lease owner) over the same rows. Only for a PostgreSQL store.
    pub async fn replica(&self, yaml: &str) -> TestBroker {
        assert!(
            self.store.schema.is_some(),
            "replicas share a PostgreSQL store"
        );
        let store = TestStore {
            url: self.store.url.clone(),
            key: self.store.key.clone(),
            dir: tempfile::tempdir().unwrap(),
            schema: None, // the first broker's store drops the schema
        };
        start_on(store, yaml, Vec::new()).await
    }

    /// The broker itself.
    pub fn broker(&self) -> Arc<Broker> {
        self.broker.clone()
    }

    /// Where the broker's `local` targets keep their servers.
    pub fn local_root(&self) -> std::path::PathBuf {
        self.store.local_root()
    }

    /// Serves the configuration `yaml` from now on, as a reload of the configuration file does.
    pub fn replace_config(&self, yaml: &str) {
        let config = brokkr_blueprint::load::load_str("test.yaml", yaml).expect("valid config");
        self.broker.replace_config(Arc::new(config));
    }

    /// Every byte the store holds about resources: the SQLite files, or the PostgreSQL rows.
    pub async fn store_contents(&self) -> Vec<u8> {
        self.store.contents().await
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn operation(&self) -> String {
        self.body["operation"]
            .as_str()
            .expect("an operation id")
            .to_owned()
    }

    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub fn description(&self) -> &str {
        self.body["description"].as_str().unwrap_or("")
    }
}

impl TestBroker {
    /// An OSB request with the standard headers and the platform's credentials.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.osb.request(method, path)
    }

    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Reply {
        let response = rb.send().await.expect("request");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.send(self.request(reqwest::Method::PUT, path).json(&body))
            .await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Reply {
        self.send(self.request(reqwest::Method::PATCH, path).json(&body))
            .await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    /// Polls a last_operation endpoint until the state is terminal.
    pub async fn wait_done(&self, path: &str) -> Reply {
        for _ in 0..400 {
            let r = self.get(path).await;
            if r.status != StatusCode::OK || r.body["state"] != "in progress" {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{path} never finished");
    }

    /// Provisions `id` on the async plan and waits for success.
    pub async fn provisioned(&self, id: &str) {
        let r = self
            .put(
                &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
                provision_body(ASYNC_PLAN),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done.body["state"], "succeeded");
    }
}

pub fn credentials() -> Value {
    json!({"type": "postgresql", "host": "db.example.com", "port": 5432,
           "username": "app", "password": "pw-1"})
}

pub fn provision_body(plan: &str) -> Value {
    json!({
        "service_id": SERVICE, "plan_id": plan,
        "organization_guid": "org", "space_guid": "space",
        "context": {"platform": "kubernetes", "namespace": "team-a"},
        "parameters": {"credentials": credentials()},
    })
}

pub fn deprovision_query(plan: &str) -> String {
    format!("service_id={SERVICE}&plan_id={plan}")
}
