//! What the tests of `brokkr upgrade` share: a broker started on a test directory's
//! configuration (on its SQLite store, or another), its OSB and admin APIs, and the command.

use std::path::Path;
use std::process::{Command, Stdio};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{BIN, Process, eventually, free_port};

pub const ADMIN: (&str, &str) = ("admin", "upgrade-test-admin");

/// One service whose plan is at `version`; an upgrade runs `migrate` (long enough to interrupt)
/// and, for an instance provisioned with `broken: true`, a step that fails.
pub fn config(version: &str) -> String {
    format!(
        r#"
catalog:
  services:
  - name: fleet
    id: fleet-svc
    description: A fleet
    bindable: false
    instances_retrievable: true
    plans:
    - name: small
      id: small-plan
      description: Small
      maintenance_info: {{version: "{version}"}}
blueprints:
- service: fleet
  plan: small
  instance:
    steps:
    - {{name: build, delay: 10ms, on: [provision]}}
    - {{name: migrate, delay: 300ms, on: [upgrade]}}
    - name: break
      on: [upgrade]
      when: parameters.broken
      run: http
      with: {{url: "not a url"}}
"#
    )
}

pub struct Broker {
    process: Process,
    pub url: String,
    pub http: reqwest::Client,
}

impl Broker {
    /// `brokkr serve` on `dir`'s configuration and SQLite store.
    pub async fn start(dir: &Path) -> Self {
        let store = format!("sqlite://{}", dir.join("brokkr.db").display());
        Self::start_on(dir, &store, &[]).await
    }

    /// `brokkr serve` on `dir`'s configuration and `store`, with more environment variables.
    pub async fn start_on(dir: &Path, store: &str, env: &[(&str, &str)]) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("brokkr.log"))
            .unwrap();
        let port = free_port();
        let child = Command::new(BIN)
            .args(["serve", "--insecure-plaintext-secrets", "--config"])
            .arg(dir.join("brokkr.yaml"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--store", store, "--poll-interval", "50ms"])
            .env_remove("BROKKR_CONFIG")
            .env_remove("BROKKR_STORE")
            .env_remove("BROKKR_LEASE")
            .envs(env.iter().copied())
            .env("BROKKR_BROKER_USERNAME", "platform")
            .env("BROKKR_BROKER_PASSWORD", "s3cret")
            .env("BROKKR_ADMIN_USERNAME", ADMIN.0)
            .env("BROKKR_ADMIN_PASSWORD", ADMIN.1)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start brokkr serve");
        let process = Process(child);
        let url = format!("http://127.0.0.1:{port}");
        brokkr_osb::client::install_crypto_provider();
        let http = reqwest::Client::new();
        let healthz = format!("{url}/healthz");
        eventually("brokkr to answer /healthz", async || {
            let ok = http.get(&healthz).send().await.ok()?.status().is_success();
            ok.then_some(())
        })
        .await;
        Self { process, url, http }
    }

    /// Stops the broker gracefully: the `local` target's servers stop with it.
    pub fn terminate(&mut self) {
        let pid = self.process.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.process.0.wait().unwrap();
    }

    pub async fn osb(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = (self.http.request(method, format!("{}{path}", self.url)))
            .basic_auth("platform", Some("s3cret"))
            .header("X-Broker-API-Version", "2.17");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = (self.http.request(method, format!("{}{path}", self.url)))
            .basic_auth(ADMIN.0, Some(ADMIN.1));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Provisions `ids` in order, `broken` ones with `broken: true`; returns their provision
    /// operations once all succeeded.
    pub async fn provision(&self, ids: &[String], broken: &[&str]) -> Vec<String> {
        let mut ops = Vec::new();
        for id in ids {
            let body = json!({
                "service_id": "fleet-svc", "plan_id": "small-plan",
                "organization_guid": "org", "space_guid": "space",
                "parameters": {"broken": broken.contains(&id.as_str())},
            });
            let path = format!("/v2/service_instances/{id}?accepts_incomplete=true");
            let (status, answer) = self.osb(Method::PUT, &path, Some(body)).await;
            assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
            ops.push(answer["operation"].as_str().unwrap().to_owned());
        }
        for id in ids {
            self.last_operation_ends(id).await;
        }
        ops
    }

    /// The last operation of instance `id`, once it ended.
    pub async fn last_operation_ends(&self, id: &str) -> Value {
        let path = format!("/v2/service_instances/{id}/last_operation");
        eventually("the operation to end", async || {
            let (_, last) = self.osb(Method::GET, &path, None).await;
            (last["state"] != "in progress").then_some(last)
        })
        .await
    }

    /// Every instance the admin API lists.
    pub async fn instances(&self) -> Vec<Value> {
        let (status, list) =
            (self.admin(Method::GET, "/admin/v1/instances?limit=1000", None)).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        list["instances"].as_array().unwrap().clone()
    }

    pub async fn upgrade(&self, id: &str) -> Value {
        let (status, upgrade) = self
            .admin(Method::GET, &format!("/admin/v1/upgrades/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{upgrade}");
        upgrade
    }

    /// Upgrade `id` once it is in `state`.
    pub async fn upgrade_reaches(&self, id: &str, state: &str) -> Value {
        eventually(&format!("upgrade {id} to be {state}"), async || {
            let upgrade = self.upgrade(id).await;
            (upgrade["state"] == state).then_some(upgrade)
        })
        .await
    }

    pub async fn start_upgrade(&self, body: Value) -> String {
        let (status, answer) = (self.admin(Method::POST, "/admin/v1/upgrades", Some(body))).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        answer["id"].as_str().unwrap().to_owned()
    }
}

/// A fleet behind its plan: `n` instances `prefix-NN` provisioned at 1.0.0 by a broker on
/// the store in `dir` (stopped again), then the plan moved to 1.1.0 and a broker started on it.
/// The provisions' operations, and the broker.
pub async fn fleet_behind(dir: &Path, prefix: &str, n: usize) -> (Vec<String>, Broker) {
    std::fs::write(dir.join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids(prefix, n);
    let provisions = {
        let broker = Broker::start(dir).await;
        broker.provision(&fleet, &[]).await
    };
    std::fs::write(dir.join("brokkr.yaml"), config("1.1.0")).unwrap();
    (provisions, Broker::start(dir).await)
}

pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

/// `brokkr upgrade ARGS` against `broker`, expected to succeed; its standard output.
pub fn cli(broker: &Broker, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("upgrade")
        .args(args)
        .env("BROKKR_ADMIN_URL", &broker.url)
        .env("BROKKR_ADMIN_USERNAME", ADMIN.0)
        .env("BROKKR_ADMIN_PASSWORD", ADMIN.1)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "brokkr upgrade {args:?}: {stdout}\n{stderr}"
    );
    stdout
}
