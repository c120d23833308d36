//! What the ServiceInstance tests share: the fake API server with brokkr's CRDs and the
//! controllers running against it, and a scripted OSB broker that records every request.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use brokkr_controller::resources;
use brokkr_fake_kube::FakeCluster;
use serde_json::{Value, json};

pub const API: &str = "services.brokkr.dev/v1alpha1";

/// One request the broker received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
    /// The user named by `X-Broker-API-Originating-Identity`, if the request carried one.
    pub user: Option<String>,
}

impl Seen {
    /// `PUT`, `PATCH`, `DELETE` or `GET` on an instance (`last_operation` polls are `POLL`);
    /// calls about a binding (the ServiceBinding controller runs too) are `BIND`, `UNBIND`,
    /// `BINDING_POLL` and `FETCH_BINDING`, so that they never count as the instance's.
    pub fn verb(&self) -> &str {
        let poll = self.path.ends_with("/last_operation");
        if self.path.contains("/service_bindings/") {
            return match (poll, self.method.as_str()) {
                (true, _) => "BINDING_POLL",
                (false, "PUT") => "BIND",
                (false, "DELETE") => "UNBIND",
                _ => "FETCH_BINDING",
            };
        }
        if poll { "POLL" } else { self.method.as_str() }
    }
}

type Script = Box<dyn FnMut(&Seen) -> (StatusCode, Value) + Send>;

/// A broker offering service `svc` with plans `small` (id `plan-small`, whose bindings are
/// rotatable) and `large` (`plan-large`), answering instance requests as its script says.
pub struct Broker {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The `maintenance_info` of plan `small` in the catalog, if any.
    small_version: Arc<Mutex<Option<Value>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Broker {
    pub async fn start(script: impl FnMut(&Seen) -> (StatusCode, Value) + Send + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Box::new(script)));
        let recorded = seen.clone();
        let small_version = Arc::new(Mutex::new(None));
        let version = small_version.clone();
        let app = axum::Router::new().fallback(move |request: Request| {
            let (seen, script, version) = (recorded.clone(), script.clone(), version.clone());
            async move {
                let (parts, body) = request.into_parts();
                let bytes: Bytes = axum::body::to_bytes(body, 1 << 20)
                    .await
                    .unwrap_or_default();
                if parts.uri.path() == "/v2/catalog" {
                    let version = version.lock().unwrap().clone();
                    return (StatusCode::OK, Json(catalog(version)));
                }
                let request = Seen {
                    method: parts.method.clone(),
                    path: parts.uri.path().to_owned(),
                    query: parts.uri.query().unwrap_or_default().to_owned(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    user: parts
                        .headers
                        .get("X-Broker-API-Originating-Identity")
                        .map(|h| originating_user(h.to_str().unwrap())),
                };
                seen.lock().unwrap().push(request.clone());
                let (status, body) = (script.lock().unwrap())(&request);
                (status, Json(body))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url,
            seen,
            small_version,
            server,
        }
    }

    /// From now on the catalog gives plan `small` this `maintenance_info`.
    pub fn set_small_version(&self, maintenance_info: Value) {
        *self.small_version.lock().unwrap() = Some(maintenance_info);
    }

    /// Every request so far but catalog fetches.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests with this verb (see [`Seen::verb`]).
    pub fn seen_verb(&self, verb: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.verb() == verb)
            .collect()
    }

    /// The broker stops answering: connections are refused from now on.
    pub fn stop(&self) {
        self.server.abort();
    }
}

/// The username in an `X-Broker-API-Originating-Identity` value (`kubernetes <base64 JSON>`).
fn originating_user(header: &str) -> String {
    use base64::Engine as _;
    let (platform, value) = header.split_once(' ').unwrap();
    assert_eq!(platform, "kubernetes");
    let json = base64::engine::general_purpose::STANDARD
        .decode(value)
        .unwrap();
    let user: Value = serde_json::from_slice(&json).unwrap();
    user["username"].as_str().unwrap().to_owned()
}

/// A broker whose provisions, binds, deprovisions and unbinds are accepted (202) and whose polls
/// answer `in progress` while `busy` holds, `succeeded` after.
pub async fn asynchronous_broker(busy: Arc<Mutex<bool>>) -> Broker {
    Broker::start(move |seen| {
        let state = if *busy.lock().unwrap() {
            "in progress"
        } else {
            "succeeded"
        };
        match seen.verb() {
            "PUT" | "BIND" | "DELETE" | "UNBIND" => {
                (StatusCode::ACCEPTED, json!({"operation": "op-1"}))
            }
            "POLL" | "BINDING_POLL" => (StatusCode::OK, json!({"state": state})),
            "FETCH_BINDING" => (StatusCode::OK, json!({"credentials": {"password": "p"}})),
            _ => (StatusCode::OK, json!({})),
        }
    })
    .await
}

/// The usual answers: provision 201, update 200, deprovision 200, polls succeeded.
pub fn synchronous(seen: &Seen) -> (StatusCode, Value) {
    match seen.verb() {
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    }
}

fn catalog(small_version: Option<Value>) -> Value {
    let mut small = json!({"id": "plan-small", "name": "small", "description": "",
        "binding_rotatable": true});
    if let Some(version) = small_version {
        small["maintenance_info"] = version;
    }
    json!({"services": [{"id": "svc", "name": "db", "description": "", "bindable": true,
        "plan_updateable": true,
        "plans": [small, {"id": "plan-large", "name": "large", "description": ""}]}]})
}

/// The fake API server, the controllers, and a ClusterServiceBroker `db` for `broker` whose
/// plans are listed.
pub struct Cluster {
    pub fake: FakeCluster,
    controllers: tokio::task::JoinHandle<()>,
    configure: fn(&mut brokkr_controller::Context),
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controllers.abort();
    }
}

impl Cluster {
    pub async fn start(broker: &Broker) -> Self {
        Self::start_with(broker, |_| {}).await
    }

    /// [`Cluster::start`] with the controllers' context changed by `configure`.
    pub async fn start_with(
        broker: &Broker,
        configure: fn(&mut brokkr_controller::Context),
    ) -> Self {
        let fake = FakeCluster::start().await;
        for crd in resources::crds() {
            fake.add_crd(&crd);
        }
        fake.add_kind("events.k8s.io", "v1", "Event", "events", true);
        let controllers = Self::controllers(&fake, configure);
        fake.create(json!({"apiVersion": API, "kind": "ClusterServiceBroker",
            "metadata": {"name": "db"}, "spec": {"url": broker.url}}));
        let cluster = Self {
            fake,
            controllers,
            configure,
        };
        cluster
            .eventually("the plans listed", || {
                cluster
                    .fake
                    .get(API, "ClusterServicePlan", None, "plan-large")
                    .map(|_| ())
            })
            .await;
        cluster
    }

    fn controllers(
        fake: &FakeCluster,
        configure: fn(&mut brokkr_controller::Context),
    ) -> tokio::task::JoinHandle<()> {
        let mut ctx = brokkr_controller::Context::new(fake.client());
        // The brokers of these tests are on loopback, which the URL policy refuses by default.
        ctx.brokers.namespaced_urls.allow("127.0.0.1").unwrap();
        configure(&mut ctx);
        tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()))
    }

    /// Stops the controllers, as a crash would, and starts new ones (with nothing remembered).
    pub async fn restart_controllers(&mut self) {
        self.stop_controllers().await;
        self.start_controllers();
    }

    /// Stops the controllers, as a crash would.
    pub async fn stop_controllers(&mut self) {
        self.controllers.abort();
        let _ = (&mut self.controllers).await;
    }

    /// Starts new controllers (with nothing remembered) after [`Cluster::stop_controllers`].
    pub fn start_controllers(&mut self) {
        self.controllers = Self::controllers(&self.fake, self.configure);
    }

    /// The status writes of `kind` (`serviceinstances`, `servicebindings`) served so far.
    pub fn status_writes(&self, kind: &str) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.starts_with("PATCH") && r.contains(&format!("/{kind}/")))
            .filter(|r| r.contains("/status"))
            .count()
    }

    /// Polls `check` until it returns something, for up to 30 seconds.
    pub async fn eventually<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(value) = check() {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn instance(&self, ns: &str, name: &str) -> Option<Value> {
        self.fake.get(API, "ServiceInstance", Some(ns), name)
    }

    /// Creates a ServiceInstance of class `db`, plan `small`, with `spec` merged in.
    pub fn create_instance(&self, ns: &str, name: &str, spec: Value) {
        let mut object = json!({"apiVersion": API, "kind": "ServiceInstance",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterServiceClassExternalName": "db",
                     "clusterServicePlanExternalName": "small", "externalID": name}});
        if let (Some(target), Value::Object(more)) = (object["spec"].as_object_mut(), spec) {
            target.extend(more);
        }
        self.fake.create(object);
    }

    /// Changes a stored object as a user would (a spec change bumps its generation).
    pub fn edit(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let mut object = self.fake.get(api_version, kind, ns, name).unwrap();
        change(&mut object);
        self.fake.create(object);
    }

    /// Waits for the instance's Ready condition to have `reason`, and returns the instance.
    pub async fn ready_reason(&self, ns: &str, name: &str, reason: &str) -> Value {
        self.eventually(&format!("{ns}/{name} Ready reason {reason}"), || {
            let instance = self.instance(ns, name)?;
            condition(&instance, "Ready")
                .is_some_and(|c| c["reason"] == reason)
                .then_some(instance)
        })
        .await
    }

    /// Waits for the instance to be Ready=True.
    pub async fn ready(&self, ns: &str, name: &str) -> Value {
        self.eventually(&format!("{ns}/{name} Ready"), || {
            let instance = self.instance(ns, name)?;
            condition(&instance, "Ready")
                .is_some_and(|c| c["status"] == "True")
                .then_some(instance)
        })
        .await
    }

    /// The Events about `name`, as (reason, note).
    pub fn events(&self, name: &str) -> Vec<(String, String)> {
        self.fake
            .list("events.k8s.io/v1", "Event")
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name)
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

/// The condition `type_` of an object, if set.
pub fn condition(object: &Value, type_: &str) -> Option<Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

pub const ADMISSION: &str = "admissionregistration.k8s.io/v1";

/// Installs the `brokkr-user-info` policy and its binding as deploy/base ships them, created
/// (and so in force) before the fake's objects (which it dates 2026-01-01).
pub fn install_user_info_policy(fake: &FakeCluster) {
    install_user_info_policy_as(fake, |_, _| {});
}

/// Installs the `brokkr-user-info` policy and its binding as deploy/base ships them, with
/// `change` made to them (policy, binding), created before the fake's objects.
pub fn install_user_info_policy_as(
    fake: &FakeCluster,
    change: impl FnOnce(&mut Value, &mut Value),
) {
    fake.add_kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        false,
    );
    fake.add_kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        false,
    );
    let shipped = include_str!("../../../../deploy/base/user-info-policy.yaml");
    let mut documents: Vec<Value> = serde_saphyr::from_multiple(shipped).unwrap();
    let (mut policy, mut binding) = (documents.remove(0), documents.remove(0));
    change(&mut policy, &mut binding);
    for mut object in [policy, binding] {
        object["metadata"]["creationTimestamp"] = json!("2025-12-01T00:00:00Z");
        fake.create(object);
    }
}
