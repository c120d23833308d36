//! An upgrade through `brokkr upgrade` of an instance of the `local` target, on the real binary:
//! a PostgreSQL server moved to a plan version with another `max_connections` answers the new
//! setting, and keeps its data and its binding's login.

mod support;

use std::process::{Command, Stdio};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::eventually;
use support::upgrade::{Broker, cli};

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
