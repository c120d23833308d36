//! Upgrades through `brokkr upgrade` and the admin API, on the real binary and a SQLite store:
//! a PostgreSQL server of the `local` target moved to a plan version with another
//! `max_connections`, its data and binding intact; a fleet moved to the plan's new maintenance version through a `kill -9` of the broker
//! in the middle, each instance upgraded exactly once; a dry run that changes nothing; a failed
//! canary and `max_failures` that stop an upgrade, leaving the failed instances usable at their
//! old version; pause, resume and cancel, and an instance the platform upgraded meanwhile taken
//! as done.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Process, eventually, serve_logged};

const ADMIN: (&str, &str) = ("admin", "upgrade-test-admin");

/// One service whose plan is at `version`; an upgrade runs `migrate` (long enough to interrupt)
/// and, for an instance provisioned with `broken: true`, a step that fails.
fn config(version: &str) -> String {
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

struct Broker {
    process: Process,
    url: String,
    http: reqwest::Client,
}

impl Broker {
    /// `brokkr serve` on `dir`'s configuration and store.
    async fn start(dir: &Path) -> Self {
        let config = dir.join("brokkr.yaml");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("brokkr.log"))
            .unwrap();
        let env = [
            ("BROKKR_ADMIN_USERNAME", ADMIN.0.to_owned()),
            ("BROKKR_ADMIN_PASSWORD", ADMIN.1.to_owned()),
        ];
        let args = ["--config", config.to_str().unwrap()];
        let (process, url) = serve_logged(dir, &args, &env, log);
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
    fn terminate(&mut self) {
        let pid = self.process.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.process.0.wait().unwrap();
    }

    async fn osb(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
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

    async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
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
    async fn provision(&self, ids: &[String], broken: &[&str]) -> Vec<String> {
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
    async fn last_operation_ends(&self, id: &str) -> Value {
        let path = format!("/v2/service_instances/{id}/last_operation");
        eventually("the operation to end", async || {
            let (_, last) = self.osb(Method::GET, &path, None).await;
            (last["state"] != "in progress").then_some(last)
        })
        .await
    }

    /// Every instance the admin API lists.
    async fn instances(&self) -> Vec<Value> {
        let (status, list) =
            (self.admin(Method::GET, "/admin/v1/instances?limit=1000", None)).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        list["instances"].as_array().unwrap().clone()
    }

    async fn upgrade(&self, id: &str) -> Value {
        let (status, upgrade) = self
            .admin(Method::GET, &format!("/admin/v1/upgrades/{id}"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{upgrade}");
        upgrade
    }

    /// Upgrade `id` once it is in `state`.
    async fn upgrade_reaches(&self, id: &str, state: &str) -> Value {
        eventually(&format!("upgrade {id} to be {state}"), async || {
            let upgrade = self.upgrade(id).await;
            (upgrade["state"] == state).then_some(upgrade)
        })
        .await
    }

    async fn start_upgrade(&self, body: Value) -> String {
        let (status, answer) = (self.admin(Method::POST, "/admin/v1/upgrades", Some(body))).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        answer["id"].as_str().unwrap().to_owned()
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

/// `brokkr upgrade ARGS` against `broker`, expected to succeed; its standard output.
fn cli(broker: &Broker, args: &[&str]) -> String {
    let out = Command::new(support::BIN)
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

#[tokio::test]
async fn a_fleet_upgrade_survives_a_kill_and_upgrades_each_instance_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids("f", 50);
    let provisions = {
        let broker = Broker::start(dir.path()).await;
        broker.provision(&fleet, &[]).await
    };
    // The plan moves to 1.1.0.
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.1.0")).unwrap();
    let broker = Broker::start(dir.path()).await;

    // A dry run says what would change, and changes nothing.
    let dry = cli(
        &broker,
        &[
            "--service",
            "fleet",
            "--plan",
            "small",
            "--dry-run",
            "-o",
            "json",
        ],
    );
    let dry: Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["instances"].as_array().unwrap().len(), 50);
    assert_eq!(
        dry["instances"][0],
        json!({"instance_id": "f-00", "from_version": "1.0.0", "to_version": "1.1.0"})
    );
    let (_, list) = broker.admin(Method::GET, "/admin/v1/upgrades", None).await;
    assert_eq!(list, json!({"upgrades": []}));

    let begun = std::time::Instant::now();
    let started = cli(
        &broker,
        &[
            "--service",
            "fleet",
            "--plan",
            "small",
            "--max-parallel",
            "5",
            "-o",
            "json",
        ],
    );
    let started: Value = serde_json::from_str(&started).unwrap();
    let id = started["id"].as_str().unwrap().to_owned();
    assert_eq!(started["state"], "running");

    // Killed in the middle, restarted on the same store: the upgrade goes on from there.
    let midway = eventually("some instances to be upgraded", async || {
        let upgrade = broker.upgrade(&id).await;
        (upgrade["counts"]["succeeded"].as_u64()? >= 10).then_some(upgrade)
    })
    .await;
    assert!(
        midway["counts"]["pending"].as_u64().unwrap() > 0,
        "{midway}"
    );
    drop(broker);
    let broker = Broker::start(dir.path()).await;
    let done = broker.upgrade_reaches(&id, "succeeded").await;
    assert_eq!(done["counts"]["succeeded"], 50, "{done}");
    eprintln!(
        "50 instances upgraded, 5 at a time, through a kill -9 and a restart: {:.1?}",
        begun.elapsed()
    );

    // Each instance ran exactly one update since its provision, and is at 1.1.0.
    let instances = broker.instances().await;
    assert_eq!(instances.len(), 50);
    for i in &instances {
        let n: usize = i["instance_id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(i["maintenance_version"], "1.1.0", "{i}");
        assert_eq!(i["operation"]["kind"], "update", "{i}");
        assert_eq!(i["operation"]["state"], "succeeded", "{i}");
        assert_eq!(i["operation"]["steps"], json!(["migrate", "break"]), "{i}");
        assert_eq!(i["previous_operation"]["id"], provisions[n], "{i}");
    }
    let (_, fetched) = broker
        .osb(Method::GET, "/v2/service_instances/f-07", None)
        .await;
    assert_eq!(fetched["maintenance_info"]["version"], "1.1.0");

    let status = cli(&broker, &["status", &id]);
    assert!(
        status.contains("[####################] 50/50 succeeded"),
        "{status}"
    );
    let metrics = broker
        .http
        .get(format!("{}/metrics", broker.url))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains(r#"brokkr_instances{service="fleet",plan="small",version="1.1.0"} 50"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failed_canary_or_too_many_failures_stop_an_upgrade_and_leave_instances_usable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids("c", 8);
    {
        let broker = Broker::start(dir.path()).await;
        broker.provision(&fleet, &["c-00", "c-05"]).await;
    }
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.1.0")).unwrap();
    let broker = Broker::start(dir.path()).await;

    // c-00 is a canary and fails: nothing past the canaries starts.
    let body = json!({"service": "fleet", "plan": "small-plan", "canary": 2, "max_parallel": 2, "max_failures": 5});
    let id = broker.start_upgrade(body).await;
    let failed = broker.upgrade_reaches(&id, "failed").await;
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("canary instance c-00"),
        "{failed}"
    );
    assert_eq!(failed["counts"]["pending"], 6, "{failed}");
    assert_eq!(failed["instances"][0]["state"], "failed");
    assert!(
        failed["instances"][0]["description"]
            .as_str()
            .unwrap()
            .contains("not a URL"),
        "{failed}"
    );

    // The failed upgrade left c-00 usable at its old version.
    let last = broker.last_operation_ends("c-00").await;
    assert_eq!(last["state"], "failed");
    assert_eq!(last["instance_usable"], true);
    let (_, fetched) = broker
        .osb(Method::GET, "/v2/service_instances/c-00", None)
        .await;
    assert_eq!(fetched["maintenance_info"]["version"], "1.0.0");

    // max_failures 2: c-00 and c-05 fail, and c-06 and c-07 are never started.
    let body = json!({"service": "fleet", "plan": "small", "max_failures": 2});
    let id = broker.start_upgrade(body).await;
    let failed = broker.upgrade_reaches(&id, "failed").await;
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("max_failures 2"),
        "{failed}"
    );
    let states: Vec<&str> = (failed["instances"].as_array().unwrap().iter())
        .map(|i| i["state"].as_str().unwrap())
        .collect();
    // c-01 was upgraded by the canary wave, so it is not taken again.
    assert_eq!(
        states,
        [
            "failed",
            "succeeded",
            "succeeded",
            "succeeded",
            "failed",
            "pending",
            "pending"
        ],
        "{failed}"
    );
    for i in broker.instances().await {
        let upgraded =
            ["c-01", "c-02", "c-03", "c-04"].contains(&i["instance_id"].as_str().unwrap());
        let version = if upgraded { "1.1.0" } else { "1.0.0" };
        assert_eq!(i["maintenance_version"], version, "{i}");
    }
}

#[tokio::test]
async fn an_upgrade_can_be_paused_resumed_and_cancelled_and_takes_the_platforms_own() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids("p", 6);
    let provisions = {
        let broker = Broker::start(dir.path()).await;
        broker.provision(&fleet, &[]).await
    };
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.1.0")).unwrap();
    let broker = Broker::start(dir.path()).await;

    let id = broker
        .start_upgrade(json!({"service": "fleet", "plan": "small"}))
        .await;
    let paused = cli(&broker, &["pause", &id]);
    assert!(paused.contains(": paused"), "{paused}");
    // While paused, what was started ends and nothing more starts.
    let settled = eventually("the paused upgrade to settle", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["in_progress"] == 0).then_some(u)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = broker.upgrade(&id).await;
    assert_eq!(still["counts"], settled["counts"]);
    assert!(still["counts"]["pending"].as_u64().unwrap() >= 5, "{still}");

    // Meanwhile the platform upgrades p-01 itself: the orchestration takes that as done.
    let body = json!({"service_id": "fleet-svc", "maintenance_info": {"version": "1.1.0"}});
    let path = "/v2/service_instances/p-01?accepts_incomplete=true";
    let (status, answer) = broker.osb(Method::PATCH, path, Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let platforms = answer["operation"].as_str().unwrap().to_owned();
    assert_eq!(
        broker.last_operation_ends("p-01").await["state"],
        "succeeded"
    );

    cli(&broker, &["resume", &id]);
    eventually("the upgrade to go on", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["succeeded"].as_u64()? >= 3).then_some(())
    })
    .await;
    let cancelled = cli(&broker, &["cancel", &id]);
    assert!(cancelled.contains(": cancelled"), "{cancelled}");
    let after = eventually("the cancelled upgrade to settle", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["in_progress"] == 0).then_some(u)
    })
    .await;
    assert_eq!(after["state"], "cancelled");
    assert!(after["counts"]["pending"].as_u64().unwrap() >= 1, "{after}");
    let by_platform = &after["instances"][1];
    assert_eq!(by_platform["state"], "succeeded", "{after}");
    let description = by_platform["description"].as_str().unwrap();
    assert!(description.contains(&platforms), "{after}");

    // A cancelled upgrade cannot be resumed; a new one takes the instances left.
    let resume = format!("/admin/v1/upgrades/{id}/resume");
    let (status, answer) = broker.admin(Method::POST, &resume, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    let bad = json!({"service": "fleet", "plan": "small", "max_parallel": 0});
    let (status, _) = (broker.admin(Method::POST, "/admin/v1/upgrades", Some(bad))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let next = broker
        .start_upgrade(json!({"service": "fleet", "plan": "small", "max_parallel": 3}))
        .await;
    let done = broker.upgrade_reaches(&next, "succeeded").await;
    let left = after["counts"]["pending"].as_u64().unwrap();
    assert_eq!(done["counts"]["total"].as_u64().unwrap(), left, "{done}");

    // Every instance had exactly one update since its provision.
    for i in broker.instances().await {
        let n: usize = i["instance_id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(i["maintenance_version"], "1.1.0", "{i}");
        assert_eq!(i["previous_operation"]["id"], provisions[n], "{i}");
    }
}

/// A PostgreSQL server of the `local` target per instance, at `version` with `max_connections`;
/// a database `app`, and a login role per binding.
fn local_config(version: &str, max_connections: u32) -> String {
    format!(
        r#"
targets:
  local: {{kind: local}}
  local-pg: {{kind: postgres}}
catalog:
  services:
  - name: pg
    id: pg-svc
    description: PostgreSQL
    bindable: true
    instances_retrievable: true
    bindings_retrievable: true
    plans:
    - name: small
      id: pg-small
      description: Small
      maintenance_info: {{version: "{version}"}}
blueprints:
- service: pg
  plan: small
  instance:
    registry:
    - {{name: server, value: "pg-{{{{ sha256(instance_id)[:16] }}}}"}}
    steps:
    - name: server
      target: local
      templates:
      - {{kind: Server, engine: postgres, name: "{{{{ registry('server') }}}}", memory_mb: 32, max_connections: {max_connections}}}
      read:
      - kind: Server
        name: "{{{{ registry('server') }}}}"
        values: {{port: /port, admin_username: /admin_username, admin_password: /admin_password}}
      outputs: [port, admin_username, admin_password]
    - name: database
      target: local-pg
      on: [provision, update]
      server: &admin
        host: "{{{{ targets['local'].host }}}}"
        port: "{{{{ registry('port') }}}}"
        username: "{{{{ registry('admin_username') }}}}"
        password: "{{{{ registry('admin_password') }}}}"
        database: postgres
      templates: [{{kind: Database, name: app, owner: app_owner}}]
  binding:
    registry:
    - {{name: username, value: "{{{{ safe_name('u_' ~ binding_id, 63) }}}}"}}
    - {{name: password, value: "{{{{ password(32) }}}}", secret: true}}
    steps:
    - name: user
      target: local-pg
      server: *admin
      templates:
      - {{kind: User, name: "{{{{ registry('username') }}}}", password: "{{{{ registry('password') }}}}", database: app, access: read-write}}
    credentials:
      type: postgresql
      host: "{{{{ targets['local'].host }}}}"
      port: "{{{{ registry('port') }}}}"
      database: app
      username: "{{{{ registry('username') }}}}"
      password: "{{{{ registry('password') }}}}"
"#
    )
}

/// Kills, when dropped, every server of the `local` target whose state is under its root (a
/// test that fails leaves none running).
struct Servers(std::path::PathBuf);

impl Drop for Servers {
    fn drop(&mut self) {
        let states = std::fs::read_dir(&self.0).into_iter().flatten().flatten();
        for state in states {
            let Ok(text) = std::fs::read_to_string(state.path().join("state.json")) else {
                continue;
            };
            let state: Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(pid) = state["pid"].as_u64() {
                let group = format!("-{pid}");
                let mut kill = Command::new("kill");
                let _ = kill
                    .args(["-KILL", "--", &group])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// A connection with a binding's credentials.
async fn connect(credentials: &Value) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    let port = credentials["port"].as_str().map_or_else(
        || credentials["port"].as_u64().unwrap(),
        |p| p.parse().unwrap(),
    );
    let options = sqlx::postgres::PgConnectOptions::new()
        .host(credentials["host"].as_str().unwrap())
        .port(u16::try_from(port).unwrap())
        .database("app")
        .username(credentials["username"].as_str().unwrap())
        .password(credentials["password"].as_str().unwrap());
    sqlx::PgConnection::connect_with(&options).await.unwrap()
}

#[tokio::test]
async fn an_upgrade_restarts_a_local_server_with_its_new_setting_keeping_data_and_bindings() {
    use std::os::unix::fs::PermissionsExt;
    // The servers' unprivileged account (tests may run as root) must pass the directory.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::write(dir.path().join("brokkr.yaml"), local_config("1.0.0", 20)).unwrap();
    let _servers = Servers(dir.path().join("brokkr.db.d"));
    let mut broker = Broker::start(dir.path()).await;
    let body = json!({
        "service_id": "pg-svc", "plan_id": "pg-small",
        "organization_guid": "org", "space_guid": "space",
    });
    let path = "/v2/service_instances/pg-1?accepts_incomplete=true";
    let (status, answer) = broker.osb(Method::PUT, path, Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(
        broker.last_operation_ends("pg-1").await["state"],
        "succeeded"
    );
    let body = json!({"service_id": "pg-svc", "plan_id": "pg-small"});
    let path = "/v2/service_instances/pg-1/service_bindings/b-1?accepts_incomplete=true";
    let (status, answer) = broker.osb(Method::PUT, path, Some(body)).await;
    assert!(status.is_success(), "{answer}");
    let binding = eventually("the binding", async || {
        let (status, b) = (broker.osb(
            Method::GET,
            "/v2/service_instances/pg-1/service_bindings/b-1",
            None,
        ))
        .await;
        (status == StatusCode::OK).then_some(b)
    })
    .await;
    let credentials = &binding["credentials"];
    let mut conn = connect(credentials).await;
    for statement in [
        "CREATE TABLE orders (id int)",
        "INSERT INTO orders VALUES (1), (2)",
    ] {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    let max: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(max, "20");
    drop(conn);
    broker.terminate();

    // The plan moves to 1.1.0, with 30 connections.
    std::fs::write(dir.path().join("brokkr.yaml"), local_config("1.1.0", 30)).unwrap();
    let mut broker = Broker::start(dir.path()).await;
    let out = cli(&broker, &["--service", "pg", "--plan", "small", "--wait"]);
    assert!(
        out.contains("[####################] 1/1 succeeded"),
        "{out}"
    );

    let mut conn = connect(credentials).await;
    let max: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(max, "30");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(orders, 2);
    drop(conn);
    let (_, fetched) = broker
        .osb(Method::GET, "/v2/service_instances/pg-1", None)
        .await;
    assert_eq!(fetched["maintenance_info"]["version"], "1.1.0", "{fetched}");
    broker.terminate();
}
