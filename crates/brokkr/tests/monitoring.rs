//! brokkr's alerts and dashboard (deploy/overlays/monitoring), tested like code.
//!
//! - promtool checks the PrometheusRule's groups and runs the unit tests of rules-test.yaml on
//!   them, which hold, for every alert, a case where it fires and one where it does not (and a
//!   healthy install where none does); promtool is `PROMTOOL` or `promtool` on the PATH
//!   (scripts/test installs it);
//! - every alert has a severity, a summary, a description and a runbook that docs/operations.md
//!   holds;
//! - every metric, label and label value that a rule or a panel of the dashboard names is one
//!   that a real `brokkr serve` and `brokkr controller` (on the fake API server) export, after
//!   traffic that gives every family they use series: provisions that succeed, fail, and stay in
//!   progress, a deprovision that leaves a step behind, a binding, a fleet upgrade, a namespaced
//!   ServiceBroker that is refused. Counters that alerts take the increase of exist at
//!   zero from the start (the janitor's results, reconcile errors, releases with a namespace).
//!   Only `up` (Prometheus's own) and kube-state-metrics' Deployment and StatefulSet series are
//!   named without being brokkr's.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use brokkr_fake_kube::FakeCluster;
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, LabelModifier};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::upgrade::Broker;
use support::{BIN, Process, free_port};

const RUNBOOKS: &str = "https://github.com/brokkr-dev/brokkr/blob/main/docs/operations.md#";

/// Labels Prometheus adds to every series it scrapes through a ServiceMonitor.
const TARGET_LABELS: &[&str] = &[
    "job",
    "namespace",
    "pod",
    "instance",
    "service",
    "endpoint",
    "container",
];

/// Series the rules read that are not brokkr's: Prometheus's `up`, kube-state-metrics'.
const EXTERNAL: &[&str] = &[
    "up",
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_available",
    "kube_statefulset_replicas",
    "kube_statefulset_status_replicas_ready",
];

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/overlays/monitoring")
        .join(file)
}

fn prometheus_rule() -> Value {
    let text = std::fs::read_to_string(monitoring("prometheus-rule.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn alerts() -> Vec<Value> {
    let rule = prometheus_rule();
    let groups = rule["spec"]["groups"].as_array().unwrap();
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter().cloned())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(monitoring("brokkr-dashboard.json")).unwrap())
        .unwrap()
}

/// Every PromQL expression of the dashboard's panels, rows' panels included.
fn panel_exprs(panels: &Value, out: &mut Vec<(String, String)>) {
    for panel in panels.as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap().to_owned();
            out.push((format!("panel {:?}", panel["title"]), expr));
        }
        panel_exprs(&panel["panels"], out);
    }
}

/// What the rules and panels query, each with where it comes from; the dashboard's variables
/// stand for a rate interval and a namespace.
fn queries() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = alerts()
        .iter()
        .map(|a| {
            let name = format!("alert {}", a["alert"].as_str().unwrap());
            (name, a["expr"].as_str().unwrap().to_owned())
        })
        .collect();
    let mut panels = Vec::new();
    panel_exprs(&dashboard()["panels"], &mut panels);
    assert!(panels.len() >= 20, "{panels:?}");
    out.extend(panels.into_iter().map(|(at, expr)| {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$namespace", "brokkr");
        (at, expr)
    }));
    out
}

fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".to_owned())
}

fn run_promtool(dir: &Path, args: &[&str]) {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): scripts/test installs promtool from Debian's prometheus package",
                promtool()
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let dir = tempfile::tempdir().unwrap();
    // promtool reads plain rule files: the PrometheusRule's spec is one (JSON is YAML).
    let groups = prometheus_rule()["spec"].to_string();
    std::fs::write(dir.path().join("brokkr.rules.yaml"), groups).unwrap();
    std::fs::copy(
        monitoring("rules-test.yaml"),
        dir.path().join("rules-test.yaml"),
    )
    .unwrap();
    run_promtool(dir.path(), &["check", "rules", "brokkr.rules.yaml"]);
    run_promtool(dir.path(), &["test", "rules", "rules-test.yaml"]);
}

#[test]
fn every_alert_is_unit_tested_firing_and_quiet() {
    let text = std::fs::read_to_string(monitoring("rules-test.yaml")).unwrap();
    let tests: Value = serde_saphyr::from_str(&text).unwrap();
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        let of = |firing: bool| {
            cases.iter().any(|c| {
                let expected = c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
                c["alertname"] == name && expected == firing
            })
        };
        assert!(of(true), "no unit test where {name} fires");
        assert!(of(false), "no unit test where {name} stays quiet");
    }
}

/// The anchors GitHub gives the headings of a Markdown file.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| {
            let text = heading.trim_start_matches('#').trim().to_lowercase();
            text.chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_says_how_bad_what_and_where_and_links_its_runbook() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let anchors = anchors(&std::fs::read_to_string(docs).unwrap());
    let all = alerts();
    assert!(all.len() >= 15, "{}", all.len());
    for alert in all {
        let name = alert["alert"].as_str().unwrap();
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: {severity:?}"
        );
        let notes = &alert["annotations"];
        for key in ["summary", "description"] {
            assert!(
                notes[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: {key}"
            );
        }
        let runbook = notes["runbook_url"].as_str().unwrap_or_default();
        let anchor = runbook.strip_prefix(RUNBOOKS).unwrap_or_else(|| {
            panic!("{name}: runbook_url {runbook:?} is not in docs/operations.md")
        });
        assert!(
            anchors.contains(anchor),
            "{name}: docs/operations.md has no #{anchor}"
        );
    }
}

/// What one `/metrics` says: each sample name with its label names and the values each took;
/// and the sample names of every family declared (`# TYPE`), whether it has series or not.
#[derive(Default)]
struct Exported {
    declared: BTreeSet<String>,
    series: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exported {
    fn read(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let samples: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                for suffix in samples {
                    self.declared.insert(format!("{name}{suffix}"));
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let (name, labels) = sample(line);
                let family = self.series.entry(name).or_default();
                for (label, value) in labels {
                    family.entry(label).or_default().insert(value);
                }
            }
        }
    }
}

/// A sample line's name and labels (values unescaped enough for comparison).
fn sample(line: &str) -> (String, Vec<(String, String)>) {
    let Some((name, rest)) = line.split_once('{') else {
        return (line.split(' ').next().unwrap().to_owned(), Vec::new());
    };
    let mut labels = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        let label: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let label = label.trim_start_matches(',').to_owned();
        if label.starts_with('}') || label.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(chars.next().unwrap()),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((label, value));
        if chars.peek() == Some(&'}') {
            break;
        }
    }
    (name.to_owned(), labels)
}

/// A selector's metric name and its matchers: (label, the value an equality asks for).
type Selector = (String, Vec<(String, Option<String>)>);

/// The selectors of `expr` and the labels it groups or matches by.
fn walk(expr: &Expr, selectors: &mut Vec<Selector>, grouping: &mut BTreeSet<String>) {
    let labels = |modifier: &Option<LabelModifier>, grouping: &mut BTreeSet<String>| {
        if let Some(m) = modifier {
            grouping.extend(m.labels().labels.iter().cloned());
        }
    };
    match expr {
        Expr::Aggregate(a) => {
            labels(&a.modifier, grouping);
            walk(&a.expr, selectors, grouping);
            if let Some(p) = &a.param {
                walk(p, selectors, grouping);
            }
        }
        Expr::Unary(u) => walk(&u.expr, selectors, grouping),
        Expr::Binary(b) => {
            if let Some(m) = &b.modifier {
                labels(&m.matching, grouping);
            }
            walk(&b.lhs, selectors, grouping);
            walk(&b.rhs, selectors, grouping);
        }
        Expr::Paren(p) => walk(&p.expr, selectors, grouping),
        Expr::Subquery(s) => walk(&s.expr, selectors, grouping),
        Expr::Call(c) => c
            .args
            .args
            .iter()
            .for_each(|a| walk(a, selectors, grouping)),
        Expr::VectorSelector(vs) => selectors.push(selector(vs)),
        Expr::MatrixSelector(ms) => selectors.push(selector(&ms.vs)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

fn selector(vs: &parser::VectorSelector) -> Selector {
    let mut name = vs.name.clone().unwrap_or_default();
    let mut matchers = Vec::new();
    for m in &vs.matchers.matchers {
        if m.name == "__name__" {
            name = m.value.clone();
            continue;
        }
        let equal = matches!(m.op, MatchOp::Equal).then(|| m.value.clone());
        matchers.push((m.name.clone(), equal));
    }
    (name, matchers)
}

/// What `exported` lacks of what `queries` name, one line each.
fn unexported(queries: &[(String, String)], exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    for (at, query) in queries {
        let expr = match parser::parse(query) {
            Ok(expr) => expr,
            Err(e) => {
                problems.push(format!("{at}: does not parse: {e}"));
                continue;
            }
        };
        let (mut selectors, mut grouping) = (Vec::new(), BTreeSet::new());
        walk(&expr, &mut selectors, &mut grouping);
        let mut known: BTreeSet<&str> = TARGET_LABELS.iter().copied().collect();
        for (name, matchers) in &selectors {
            if EXTERNAL.contains(&name.as_str()) {
                known.extend(matchers.iter().map(|(l, _)| l.as_str()));
                continue;
            }
            if !exported.declared.contains(name) {
                problems.push(format!("{at}: brokkr exports no metric {name}"));
                continue;
            }
            let Some(labels) = exported.series.get(name) else {
                problems.push(format!("{at}: {name} has no series yet"));
                continue;
            };
            known.extend(labels.keys().map(String::as_str));
            for (label, value) in matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                match (labels.get(label), value) {
                    (None, _) => problems.push(format!("{at}: {name} has no label {label}")),
                    (Some(values), Some(value)) if !values.contains(value) => problems.push(
                        format!("{at}: {name}{{{label}={value:?}}} not seen (only {values:?})"),
                    ),
                    _ => {}
                }
            }
        }
        for label in &grouping {
            if !known.contains(label.as_str()) {
                problems.push(format!(
                    "{at}: groups by {label}, which no metric it reads has"
                ));
            }
        }
    }
    problems
}

/// One service, four plans: `small` provisions, binds, and on deprovision leaves a step behind
/// (its server is never there); `slow` provisions for an hour; `failing` cannot provision
/// within its deadline; `small` is at maintenance version `version`.
fn config(version: &str) -> String {
    format!(
        r#"
catalog:
  services:
  - name: fleet
    id: fleet-svc
    description: A fleet
    bindable: true
    instances_retrievable: true
    plans:
    - {{name: small, id: small-plan, description: Small, maintenance_info: {{version: "{version}"}}}}
    - {{name: slow, id: slow-plan, description: Slow}}
    - {{name: failing, id: failing-plan, description: Failing}}
blueprints:
- service: fleet
  plan: small
  instance:
    steps:
    - {{name: build, delay: 10ms, on: [provision, upgrade]}}
    - name: dns
      on: [deprovision]
      run: http
      with: {{url: "http://127.0.0.1:1/records"}}
      budget: 200ms
  binding:
    credentials: {{type: fleet, username: app}}
- service: fleet
  plan: slow
  instance:
    steps:
    - {{name: build, delay: 1h, on: [provision]}}
  binding:
    credentials: {{type: fleet}}
- service: fleet
  plan: failing
  deadline: 2s
  instance:
    steps:
    - name: dns
      on: [provision]
      run: http
      with: {{url: "http://127.0.0.1:1/records"}}
  binding:
    credentials: {{type: fleet}}
"#
    )
}

fn provision_body(plan: &str) -> Value {
    json!({"service_id": "fleet-svc", "plan_id": plan,
           "organization_guid": "org", "space_guid": "space"})
}

async fn accepted(broker: &Broker, method: Method, path: &str, body: Option<Value>) {
    let (status, answer) = broker.osb(method, path, body).await;
    assert!(
        [StatusCode::ACCEPTED, StatusCode::CREATED, StatusCode::OK].contains(&status),
        "{path}: {status} {answer}"
    );
}

/// The broker of [`config`] after traffic that gives every family of its `/metrics` series.
async fn busy_broker(dir: &Path) -> Broker {
    std::fs::write(dir.join("brokkr.yaml"), config("1.0.0")).unwrap();
    {
        let broker = Broker::start(dir).await;
        for id in ["i-1", "i-2", "i-3"] {
            let path = format!("/v2/service_instances/{id}?accepts_incomplete=true");
            accepted(
                &broker,
                Method::PUT,
                &path,
                Some(provision_body("small-plan")),
            )
            .await;
            broker.last_operation_ends(id).await;
        }
        let path = "/v2/service_instances/i-1/service_bindings/b-1?accepts_incomplete=true";
        let body = json!({"service_id": "fleet-svc", "plan_id": "small-plan"});
        accepted(&broker, Method::PUT, path, Some(body)).await;
    }
    // The plan moves to a new maintenance version; its instances are behind.
    std::fs::write(dir.join("brokkr.yaml"), config("1.1.0")).unwrap();
    let broker = Broker::start(dir).await;
    let path =
        "/v2/service_instances/i-3?service_id=fleet-svc&plan_id=small-plan&accepts_incomplete=true";
    accepted(&broker, Method::DELETE, path, None).await;
    let gone = broker.last_operation_ends("i-3").await;
    assert!(
        gone["description"].as_str().unwrap().contains("dns"),
        "{gone}"
    );
    for (id, plan) in [("s-1", "slow-plan"), ("f-1", "failing-plan")] {
        let path = format!("/v2/service_instances/{id}?accepts_incomplete=true");
        accepted(&broker, Method::PUT, &path, Some(provision_body(plan))).await;
    }
    let failed = broker.last_operation_ends("f-1").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    broker
        .start_upgrade(json!({"service": "fleet", "plan": "small"}))
        .await;
    let (status, _) = broker.osb(Method::GET, "/v2/catalog", None).await;
    assert_eq!(status, StatusCode::OK);
    broker
}

/// `brokkr controller` on a fake API server, listing `broker_url`'s catalog, and refusing a
/// namespaced ServiceBroker whose URL is the node's loopback; its metrics address.
async fn busy_controller(dir: &Path, broker_url: &str) -> (FakeCluster, Process, String) {
    let fake = FakeCluster::start().await;
    fake.add_kind("coordination.k8s.io", "v1", "Lease", "leases", true);
    for crd in brokkr_controller::resources::crds() {
        fake.add_crd(&crd);
    }
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    let api = "services.brokkr.dev/v1alpha1";
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "brokkr-auth", "namespace": "default"},
        "data": {"username": "cGxhdGZvcm0=", "password": "czNjcmV0"}}));
    fake.create(json!({"apiVersion": api, "kind": "ClusterServiceBroker",
        "metadata": {"name": "brokkr"},
        "spec": {"url": broker_url,
                 "authInfo": {"basic": {"secretRef": {"namespace": "default", "name": "brokkr-auth"}}}}}));
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    fake.create(json!({"apiVersion": api, "kind": "ServiceBroker",
        "metadata": {"name": "refused", "namespace": "team-a"},
        "spec": {"url": "http://127.0.0.1:1"}}));
    let listen = format!("127.0.0.1:{}", free_port());
    let controller = Process(
        Command::new(BIN)
            .args(["controller", "--listen", &listen, "--lease-duration", "3s"])
            .args(["--identity", "replica-1"])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start brokkr controller"),
    );
    (fake, controller, format!("http://{listen}"))
}

#[tokio::test]
async fn rules_and_dashboard_name_only_what_brokkr_exports() {
    let dir = tempfile::tempdir().unwrap();
    let broker = busy_broker(dir.path()).await;
    let (_fake, _controller, controller_url) = busy_controller(dir.path(), &broker.url).await;
    let queries = queries();
    let http = reqwest::Client::new();
    let mut problems = Vec::new();
    let ok = eventually_or_timeout(async || {
        let mut exported = Exported::default();
        for url in [&broker.url, &controller_url] {
            let response = http.get(format!("{url}/metrics")).send().await.ok()?;
            exported.read(&response.text().await.ok()?);
        }
        problems = unexported(&queries, &exported);
        problems.is_empty().then_some(())
    })
    .await;
    assert!(
        ok.is_some(),
        "the rules and the dashboard name what brokkr does not export:\n{}",
        problems.join("\n")
    );
}

/// Polls `check` for up to 60 seconds; `None` if it never answered.
async fn eventually_or_timeout<T>(mut check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Some(value) = check().await {
            return Some(value);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    None
}

#[test]
fn the_check_finds_a_metric_or_label_brokkr_does_not_export() {
    let mut exported = Exported::default();
    exported.read(
        "# TYPE brokkr_operations counter\n\
         brokkr_operations_total{kind=\"provision\",state=\"failed\",service=\"s\",plan=\"p\"} 1\n",
    );
    let query = |q: &str| vec![("q".to_owned(), q.to_owned())];
    let good = "sum by (namespace, kind) (rate(brokkr_operations_total{state=\"failed\"}[5m]))";
    assert_eq!(unexported(&query(good), &exported), Vec::<String>::new());
    for bad in [
        "rate(brokkr_operation_total[5m])",
        "rate(brokkr_operations_total{outcome=\"failed\"}[5m])",
        "rate(brokkr_operations_total{state=\"broken\"}[5m])",
        "sum by (tenant) (rate(brokkr_operations_total[5m]))",
    ] {
        assert_eq!(unexported(&query(bad), &exported).len(), 1, "{bad}");
    }
}
