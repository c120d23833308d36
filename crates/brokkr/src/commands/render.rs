//! `brokkr render`: what a plan would compute for an instance and a binding, without a store or a
//! target — registry values, the instance's dashboard URL, the resources each step would apply,
//! and credentials — as a YAML stream, for review and tests. Without a store there is no broker's
//! names key: `opaque_name` hashes under the public render-only key ([`NamesKey::RENDER_ONLY`]),
//! so its names have the broker's shape but not its values.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use brokkr_blueprint::evaluate::{Evaluator, Subject, dashboard_url_reads};
use brokkr_blueprint::schema::ParameterSchema;
use brokkr_blueprint::template::Renderer;
use brokkr_blueprint::{Config, NamesKey, Phase, RegistryEntry, Step, TargetConfig};
use clap::Args;
use serde_json::{Map, Value, json};

/// Shown instead of a secret.
const MASK: &str = "********";
/// Credentials entries that are secrets.
const SECRET_ENTRIES: &[&str] = &["password", "private-key"];

#[derive(Args)]
pub struct RenderArgs {
    /// Configuration file or directory (default: the built-in quickstart and local catalogs).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<PathBuf>,
    /// The service offering, by name or id.
    #[arg(long)]
    service: String,
    /// The plan, by name or id.
    #[arg(long)]
    plan: String,
    /// Provision parameters: JSON, or @FILE.
    #[arg(long)]
    params: Option<String>,
    /// Render a bind (its registry, resources and credentials) instead of a provision.
    #[arg(long)]
    binding: bool,
    /// Bind parameters: JSON, or @FILE.
    #[arg(long)]
    binding_params: Option<String>,
    /// Seed for generated values (passwords, names), so that output is reproducible.
    #[arg(long)]
    seed: Option<u64>,
    /// Print registry values first.
    #[arg(long)]
    show_registry: bool,
    /// Print secrets instead of masking them.
    #[arg(long)]
    show_secrets: bool,
    /// The instance id templates see.
    #[arg(long, default_value = "render-instance")]
    instance_id: String,
    /// The binding id templates see.
    #[arg(long, default_value = "render-binding")]
    binding_id: String,
}

fn check(schema: Option<&ParameterSchema>, params: &Value, what: &str) -> Result<()> {
    match schema.map(|s| s.validate(params)) {
        Some(Err(messages)) => bail!("invalid {what} parameters: {}", messages.join("; ")),
        _ => Ok(()),
    }
}

fn masked(values: &Map<String, Value>, secret: impl Fn(&str) -> bool, show: bool) -> Value {
    let out = values
        .iter()
        .map(|(k, v)| {
            let v = if secret(k) && !show {
                json!(MASK)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    Value::Object(out)
}

fn secret_keys(entries: &[RegistryEntry]) -> Vec<&str> {
    entries
        .iter()
        .filter(|e| e.secret)
        .map(|e| e.name.as_str())
        .collect()
}

fn document(comment: &str, value: &Value) -> Result<String> {
    let yaml = serde_saphyr::to_string(value).map_err(|e| anyhow!("{e}"))?;
    Ok(format!("# {comment}\n{}", yaml.trim_end()))
}

/// What templates are told about each target (`targets.NAME.kind/host/port`), as the broker
/// would tell them, with a placeholder host (`NAME.invalid`) when the admin URL cannot be read.
/// The URL itself is never shown.
fn target_facts(targets: &std::collections::BTreeMap<String, TargetConfig>) -> Value {
    for (name, problem) in brokkr_targets::unreadable_admin_urls(targets) {
        match targets.get(name).and_then(|t| t.host.as_deref()) {
            Some(_) => eprintln!("warning: {problem}; rendering with its configured host"),
            None => eprintln!("warning: {problem}; rendering with the host {name}.invalid"),
        }
    }
    let facts = targets
        .iter()
        .map(|(name, target)| {
            (
                name.clone(),
                brokkr_targets::facts_or_placeholder(name, target),
            )
        })
        .collect();
    Value::Object(facts)
}

/// Replaces every occurrence of a secret in the string leaves of `value`.
fn mask_values(value: &mut Value, secrets: &[String]) {
    match value {
        Value::String(s) => {
            for secret in secrets {
                if s.contains(secret.as_str()) {
                    *s = s.replace(secret.as_str(), MASK);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_values(v, secrets)),
        Value::Object(map) => map.values_mut().for_each(|v| mask_values(v, secrets)),
        _ => {}
    }
}

/// The secret registry values of `registry` as they may appear in rendered text.
fn secret_values(registry: &Map<String, Value>, keys: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = keys
        .iter()
        .filter_map(|k| registry.get(*k))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .filter(|s| !s.is_empty())
        .collect();
    // Longer first, so that a secret containing another is masked whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// One document per rendered template of each `target` step of `steps`, in order; secrets
/// masked unless `show_secrets`.
fn step_documents(
    evaluator: &Evaluator,
    steps: &[Step],
    phase: Phase,
    context: &Value,
    secrets: &[String],
    show_secrets: bool,
) -> Result<Vec<String>> {
    let mut documents = Vec::new();
    for step in steps {
        if let Some(when) = &step.when {
            let holds = evaluator
                .condition(when, context)
                .map_err(|e| anyhow!("step {:?}: condition: {e}", step.name))?;
            if !holds {
                continue;
            }
        }
        let Some(target) = &step.target else {
            continue;
        };
        let resources = evaluator
            .resources(&step.templates, context)
            .map_err(|e| anyhow!("step {:?}: {e}", step.name))?;
        let count = resources.len();
        for (i, mut resource) in resources.into_iter().enumerate() {
            if !show_secrets {
                mask_values(&mut resource, secrets);
            }
            let comment = format!(
                "{} step {}, target {target}, template {} of {count}",
                phase.as_str(),
                step.name,
                i + 1
            );
            documents.push(document(&comment, &resource)?);
        }
    }
    Ok(documents)
}

/// The document that shows an instance's dashboard URL: checked when it is known at provision;
/// with placeholders for the values of the steps it waits for (named in the comment) otherwise.
fn dashboard_document(
    evaluator: &Evaluator,
    expression: &str,
    steps: &[Step],
    context: &Value,
    (secrets, show_secrets): (&[String], bool),
) -> Result<String> {
    let reads = dashboard_url_reads(expression);
    let waits: Vec<&str> = (steps.iter())
        .filter(|s| s.outputs.iter().any(|k| reads.contains(k)))
        .map(|s| s.name.as_str())
        .collect();
    let (url, when) = match waits.as_slice() {
        [] => (evaluator.dashboard_url(expression, context)?, String::new()),
        steps => {
            let tree = Value::String(expression.to_owned());
            let url = (evaluator.renderer.render(&tree, context))
                .map_err(|e| anyhow!("dashboard_url: {e}"))?;
            let names = steps.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>();
            let when = format!(" (learnt when step {} has run)", names.join(", "));
            (url.as_str().unwrap_or_default().to_owned(), when)
        }
    };
    let mut shown = json!({ "dashboard_url": url });
    if !show_secrets {
        mask_values(&mut shown, secrets);
    }
    document(&format!("dashboard URL of the instance{when}"), &shown)
}

/// Prints what the plan's provision or bind computes.
pub async fn run(args: RenderArgs) -> Result<()> {
    let config = crate::config::load_config(args.config.as_deref())?;
    let text = render(&args, &config)?;
    if text.is_empty() {
        eprintln!("nothing to print: the operation applies no templates (add --show-registry)");
    }
    println!("{text}");
    Ok(())
}

/// Why no plan matched: the service is unknown (with the known ones), or it has no such plan
/// (with its plans).
fn unknown_plan(config: &Config, service: &str, plan: &str) -> anyhow::Error {
    let services = &config.catalog.services;
    let names = |names: Vec<&str>| names.join(", ");
    match services
        .iter()
        .find(|s| s.name == service || s.id == service)
    {
        None => anyhow!(
            "unknown service {service:?}; known: {}",
            names(services.iter().map(|s| s.name.as_str()).collect())
        ),
        Some(s) => anyhow!(
            "service {:?} has no plan {plan:?}; its plans: {}",
            s.name,
            names(s.plans.iter().map(|p| p.name.as_str()).collect())
        ),
    }
}

/// The YAML stream `render` prints.
fn render(args: &RenderArgs, config: &Config) -> Result<String> {
    let entry = config
        .plans()
        .find(|e| {
            (e.service.name == args.service || e.service.id == args.service)
                && (e.plan.name == args.plan || e.plan.id == args.plan)
        })
        .ok_or_else(|| unknown_plan(config, &args.service, &args.plan))?;
    let renderer = args.seed.map_or_else(Renderer::new, Renderer::with_seed);
    let renderer = renderer.with_names_key(NamesKey::RENDER_ONLY);
    let evaluator = Evaluator::new(renderer, target_facts(&config.targets));
    let params = crate::config::parameters(args.params.as_deref())?;
    check(entry.instance_create_schema.as_ref(), &params, "provision")?;
    let blueprint = &entry.blueprint;
    let nothing = Map::new();
    let mut instance = Subject {
        id: &args.instance_id,
        service_id: &entry.service.id,
        plan_id: &entry.plan.id,
        parameters: params.as_object(),
        context: None,
        registry: &nothing,
    };
    let mut instance_registry =
        evaluator.registry(&blueprint.instance.registry, &instance, None)?;
    // Values steps produce (read from a cluster, returned by a call) are unknown here: a
    // placeholder (`KEY_from_step_STEP`) stands in, masked like a secret since it may be one. A
    // port (`port`, `*_port`: a port a local server was given) stands in as 65535, since
    // credentials must hold a port number.
    for step in &blueprint.instance.steps {
        for key in &step.outputs {
            let placeholder = match key == "port" || key.ends_with("_port") {
                true => Value::from(65535),
                false => Value::String(format!("{key}_from_step_{}", step.name.replace(' ', "_"))),
            };
            instance_registry.entry(key.clone()).or_insert(placeholder);
        }
    }
    instance.registry = &instance_registry;
    let mut documents = Vec::new();
    let mut secrets = secret_keys(&blueprint.instance.registry);
    secrets.extend(
        (blueprint.instance.steps.iter()).flat_map(|s| s.outputs.iter().map(String::as_str)),
    );
    if args.show_registry {
        let shown = masked(
            &instance_registry,
            |k| secrets.contains(&k),
            args.show_secrets,
        );
        documents.push(document(
            &format!("registry of instance {}", args.instance_id),
            &shown,
        )?);
    }
    let instance_secrets = secret_values(&instance_registry, &secrets);
    if !args.binding
        && let Some(expression) = &blueprint.instance.dashboard_url
    {
        let context = evaluator.context(&instance, None);
        let masked = secret_values(
            &instance_registry,
            &secret_keys(&blueprint.instance.registry),
        );
        documents.push(dashboard_document(
            &evaluator,
            expression,
            &blueprint.instance.steps,
            &context,
            (&masked, args.show_secrets),
        )?);
    }
    if !args.binding {
        let context = evaluator.context(&instance, None);
        documents.extend(step_documents(
            &evaluator,
            &entry.instance_steps(Phase::Provision),
            Phase::Provision,
            &context,
            &instance_secrets,
            args.show_secrets,
        )?);
    }
    if args.binding {
        let binding_blueprint = blueprint
            .binding
            .as_ref()
            .ok_or_else(|| anyhow!("plan {:?} is not bindable", entry.plan.name))?;
        let bind_params = crate::config::parameters(args.binding_params.as_deref())?;
        check(entry.binding_create_schema.as_ref(), &bind_params, "bind")?;
        let mut binding = Subject {
            id: &args.binding_id,
            parameters: bind_params.as_object(),
            registry: &nothing,
            ..instance
        };
        let registry =
            evaluator.registry(&binding_blueprint.registry, &instance, Some(&binding))?;
        binding.registry = &registry;
        let mut secrets = secrets.clone();
        secrets.extend(secret_keys(&binding_blueprint.registry));
        if args.show_registry {
            let shown = masked(&registry, |k| secrets.contains(&k), args.show_secrets);
            documents.push(document(
                &format!("registry of binding {}", args.binding_id),
                &shown,
            )?);
        }
        let context = evaluator.context(&instance, Some(&binding));
        documents.extend(step_documents(
            &evaluator,
            &entry.binding_steps(Phase::Bind),
            Phase::Bind,
            &context,
            &secret_values(&registry, &secrets),
            args.show_secrets,
        )?);
        let credentials =
            evaluator.credentials(&binding_blueprint.credentials, &instance, &binding)?;
        let mut shown = masked(
            &credentials,
            |k| SECRET_ENTRIES.contains(&k),
            args.show_secrets,
        );
        if !args.show_secrets {
            // Secrets also hide inside other entries, such as `uri`.
            mask_values(&mut shown, &secret_values(&registry, &secrets));
        }
        documents.push(document(
            &format!("credentials of binding {}", args.binding_id),
            &shown,
        )?);
    }
    Ok(documents.join("\n---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brokkr_blueprint::TargetKind;
    use clap::Parser;

    const CONFIG: &str = r#"
targets:
  pg: {kind: postgres, url_env: BROKKR_RENDER_TEST_NEVER_SET, port: 6432}
catalog:
  services:
  - name: db
    id: svc-db
    description: d
    bindable: true
    plans: [{name: small, id: plan-small, description: d}]
blueprints:
- service: db
  plan: small
  instance:
    registry:
    - {name: database, value: "db-{{ instance_id }}"}
    - {name: owner_password, value: "{{ password(20) }}", secret: true}
    steps:
    - name: database
      target: pg
      templates:
      - {kind: Database, name: "{{ registry.database }}", at: "{{ targets.pg.host }}",
         port: "{{ targets.pg.port }}"}
      - {kind: Owner, password: "{{ registry.owner_password }}"}
    - {name: pause, delay: 1s}
    - name: backups
      target: pg
      when: parameters.backups
      templates: [{kind: Backup, of: "{{ registry.database }}"}]
  binding:
    registry:
    - {name: password, value: "{{ password(16) }}", secret: true}
    steps:
    - name: login
      target: pg
      templates: [{kind: Login, password: "pw={{ registry.password }}"}]
    credentials: {type: postgresql, database: "{{ registry('database') }}",
                  password: "{{ registry('password') }}"}
"#;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RenderArgs,
    }

    fn render_with(flags: &[&str]) -> Result<String> {
        let config = brokkr_blueprint::load::load_str("test.yaml", CONFIG).unwrap();
        let mut argv = vec!["render", "--service", "db", "--plan", "small"];
        argv.extend_from_slice(flags);
        render(&Cli::parse_from(argv).args, &config)
    }

    #[test]
    fn every_catalog_in_the_repository_renders_without_showing_a_password() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../catalogs");
        for dir in std::fs::read_dir(root).unwrap() {
            let dir = dir.unwrap().path();
            let config = brokkr_blueprint::load::load_path(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for entry in config.plans() {
                let (service, plan) = (&entry.service.name, &entry.plan.name);
                let mut argv = vec!["render", "--service", service, "--plan", plan];
                argv.extend(["--binding", "--seed", "7"]);
                if service == "user-provided" {
                    argv.extend([
                        "--params",
                        r#"{"credentials": {"type": "t", "password": "pw"}}"#,
                    ]);
                }
                let shown = render(&Cli::parse_from(argv.clone()).args, &config).unwrap();
                argv.push("--show-secrets");
                let secrets = render(&Cli::parse_from(argv).args, &config).unwrap();
                let Some(password) = secrets.lines().find_map(|l| l.strip_prefix("password: "))
                else {
                    // Memcached has no users: its credentials are an address.
                    assert_eq!(service, "local-memcached", "no password in {secrets}");
                    continue;
                };
                let password = password.trim_matches('"');
                assert!(
                    !shown.contains(password),
                    "{service}/{plan} shows its password: {shown}"
                );
            }
        }
    }

    #[test]
    fn masks_secrets_unless_asked_and_seeds_reproduce() {
        let masked = render_with(&["--binding", "--show-registry", "--seed", "1"]).unwrap();
        assert!(
            masked.contains("# registry of instance render-instance\ndatabase: db-render-instance")
        );
        assert_eq!(
            masked.matches(MASK).count(),
            5,
            "instance registry 1, binding registry 2, login resource 1, credentials 1: {masked}"
        );
        let shown = render_with(&["--binding", "--show-secrets", "--seed", "1"]).unwrap();
        assert!(!shown.contains(MASK), "{shown}");
        assert_eq!(
            shown,
            render_with(&["--binding", "--show-secrets", "--seed", "1"]).unwrap()
        );
        assert_ne!(
            shown,
            render_with(&["--binding", "--show-secrets", "--seed", "2"]).unwrap()
        );
    }

    #[test]
    fn prints_each_target_steps_resources_in_order_with_secrets_masked() {
        let out = render_with(&["--seed", "3"]).unwrap();
        let documents: Vec<&str> = out.split("\n---\n").collect();
        assert_eq!(documents.len(), 2, "{out}");
        assert!(
            documents[0].starts_with(
                "# provision step database, target pg, template 1 of 2\nkind: Database\n\
                 name: db-render-instance\nat: pg.invalid\nport: 6432"
            ),
            "{out}"
        );
        assert_eq!(
            documents[1],
            format!(
                "# provision step database, target pg, template 2 of 2\nkind: Owner\npassword: \"{MASK}\""
            )
        );
        let shown = render_with(&["--seed", "3", "--show-secrets", "--show-registry"]).unwrap();
        let password = shown
            .lines()
            .find_map(|l| l.strip_prefix("owner_password: "))
            .unwrap();
        assert!(
            shown.ends_with(&format!("kind: Owner\npassword: {password}")),
            "{shown}"
        );
        let with_backups = render_with(&["--params", r#"{"backups": true}"#]).unwrap();
        assert!(
            with_backups.ends_with(
                "# provision step backups, target pg, template 1 of 1\nkind: Backup\nof: db-render-instance"
            ),
            "{with_backups}"
        );
        let bind = render_with(&["--binding"]).unwrap();
        assert!(
            bind.starts_with(&format!(
                "# bind step login, target pg, template 1 of 1\nkind: Login\npassword: pw={MASK}\n---\n# credentials"
            )),
            "{bind}"
        );
    }

    #[test]
    fn target_facts_come_from_the_config_then_the_admin_url() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("url");
        std::fs::write(&file, "postgres://admin:s3cret@db.internal:5433/postgres\n").unwrap();
        let url_file = Some(file.display().to_string());
        let target = |kind, host: Option<&str>, url_file: &Option<String>| TargetConfig {
            kind,
            url_env: None,
            url_file: url_file.clone(),
            host: host.map(str::to_owned),
            port: None,
            timeout: None,
            kubeconfig: None,
            context: None,
            namespace: None,
            pvc_policy: None,
            root: None,
            keep_running: None,
            run_as: None,
        };
        let targets = [
            (
                "a".to_owned(),
                target(TargetKind::Postgres, None, &url_file),
            ),
            (
                "b".to_owned(),
                // An admin URL that is not at hand here: the configured host, the usual port.
                target(
                    TargetKind::Redis,
                    Some("cache"),
                    &Some("/nonexistent/url".into()),
                ),
            ),
            ("d".to_owned(), target(TargetKind::Postgres, None, &None)),
            (
                "c".to_owned(),
                target(TargetKind::Mysql, Some("my"), &url_file),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            target_facts(&targets),
            json!({
                "a": {"kind": "postgres", "host": "db.internal", "port": 5433},
                "b": {"kind": "redis", "host": "cache", "port": 6379},
                "c": {"kind": "mysql", "host": "my", "port": 5433},
                // No admin URL: its steps name their servers.
                "d": {"kind": "postgres"},
            })
        );
    }

    #[test]
    fn explains_what_cannot_be_rendered() {
        let err = render_with(&["--params", "[1]"]).unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
        let config = brokkr_blueprint::load::load_str("test.yaml", CONFIG).unwrap();
        let args = Cli::parse_from(["render", "--service", "db", "--plan", "large"]).args;
        let err = render(&args, &config).unwrap_err().to_string();
        assert!(err.contains("has no plan \"large\"; its plans: "), "{err}");
        let args = Cli::parse_from(["render", "--service", "postgres", "--plan", "small"]).args;
        let err = render(&args, &config).unwrap_err().to_string();
        assert!(
            err.starts_with("unknown service \"postgres\"; known: db"),
            "{err}"
        );
    }
}
