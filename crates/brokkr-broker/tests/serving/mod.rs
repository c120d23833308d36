//! A broker served by [`brokkr_broker::server::serve`], as `brokkr serve` runs it, with engine
//! options and connection limits chosen by the test, over a store that outlives it: a test can
//! stop the broker and start another on the same store.

// Shared by several test binaries; each uses only part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use brokkr_broker::server::ServerLimits;
use brokkr_broker::{Auth, Broker};
use brokkr_engine::step::StepKind;
use brokkr_engine::{Engine, EngineOptions};
use serde_json::Value;

pub use crate::harness::TestStore;
use crate::harness::{ADMIN, ADMIN_PASSWORD};

pub const USER: &str = "platform";
pub const PASSWORD: &str = "test-password";

/// A running broker.
pub struct Served {
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub client: reqwest::Client,
    engine: Engine,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

/// Serves `yaml` over `store` with the given engine options, limits and Rust step kinds.
pub async fn serve(
    store: &TestStore,
    yaml: &str,
    options: EngineOptions,
    limits: ServerLimits,
    kinds: &[(&str, Arc<dyn StepKind>)],
) -> Served {
    let config = brokkr_blueprint::load::load_str("test.yaml", yaml).expect("valid test config");
    let keyring = brokkr_engine::crypto::Keyring::from_base64([store.key.as_str()]).unwrap();
    let db = brokkr_engine::connect(&store.url, Some(keyring))
        .await
        .expect("store");
    let engine = Engine::new(db, options);
    for (name, kind) in kinds {
        engine.register(name, kind.clone());
    }
    engine.start().await.unwrap();
    let broker = Arc::new(Broker::new(
        Arc::new(config),
        engine.clone(),
        Auth::default().basic(USER, PASSWORD),
        Some(Auth::default().basic(ADMIN, ADMIN_PASSWORD)),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(brokkr_broker::server::serve(
        listener,
        broker,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    Served {
        base: format!("http://{addr}"),
        addr,
        client: {
            brokkr_osb::client::install_crypto_provider();
            reqwest::Client::new()
        },
        engine,
        stop,
        server,
    }
}

impl Served {
    /// Stops serving and stops the engine, as SIGTERM does; the store is released.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("the server drains")
            .unwrap();
        self.engine.shutdown().await;
    }

    /// Sends a platform (or, with `admin`, an operator) request; returns the status and body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        admin: bool,
    ) -> (reqwest::StatusCode, Value) {
        let mut rb = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("X-Broker-API-Version", "2.17");
        rb = match admin {
            true => rb.basic_auth(ADMIN, Some(ADMIN_PASSWORD)),
            false => rb.basic_auth(USER, Some(PASSWORD)),
        };
        if let Some(body) = body {
            rb = rb.json(&body);
        }
        let response = rb.send().await.expect("request");
        let status = response.status();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.base);
        self.client
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}
