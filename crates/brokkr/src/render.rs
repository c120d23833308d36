//! `brokkr render`: what a plan would compute for an instance and a binding, without a store or a
//! target — registry values and credentials — as a YAML stream, for review and tests.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use brokkr_blueprint::evaluate::{Evaluator, Subject};
use brokkr_blueprint::schema::ParameterSchema;
use brokkr_blueprint::template::Renderer;
use brokkr_blueprint::{Config, RegistryEntry};
use clap::Args;
use serde_json::{Map, Value, json};

/// Shown instead of a secret.
const MASK: &str = "********";
/// Credentials entries that are secrets.
const SECRET_ENTRIES: &[&str] = &["password", "private-key"];

#[derive(Args)]
pub struct RenderArgs {
    /// Configuration file or directory (default: the built-in quickstart).
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
    /// Also render a binding.
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

impl RenderArgs {
    /// The configuration to render from.
    pub fn config(&self) -> Option<&PathBuf> {
        self.config.as_ref()
    }
}

fn parameters(arg: Option<&str>) -> Result<Value> {
    let Some(arg) = arg else {
        return Ok(json!({}));
    };
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?
        }
        None => arg.to_owned(),
    };
    let value: Value = serde_json::from_str(&text).context("parameters must be JSON")?;
    if !value.is_object() {
        bail!("parameters must be a JSON object");
    }
    Ok(value)
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

/// Renders and prints; errors name what failed.
pub fn run(args: RenderArgs, config: &Config) -> Result<()> {
    let text = render(&args, config)?;
    if text.is_empty() {
        eprintln!("nothing to print: add --show-registry or --binding");
    }
    println!("{text}");
    Ok(())
}

/// The YAML stream `render` prints.
fn render(args: &RenderArgs, config: &Config) -> Result<String> {
    let entry = config
        .plans()
        .find(|e| {
            (e.service.name == args.service || e.service.id == args.service)
                && (e.plan.name == args.plan || e.plan.id == args.plan)
        })
        .ok_or_else(|| anyhow!("no plan {:?} of service {:?}", args.plan, args.service))?;
    let renderer = args.seed.map_or_else(Renderer::new, Renderer::with_seed);
    let evaluator = Evaluator::new(renderer, Value::Null);
    let params = parameters(args.params.as_deref())?;
    check(entry.instance_create_schema.as_ref(), &params, "provision")?;
    let attrs = json!({ "parameters": params });
    let blueprint = &entry.blueprint;
    let mut instance = Subject {
        id: &args.instance_id,
        service_id: &entry.service.id,
        plan_id: &entry.plan.id,
        attrs: &attrs,
        registry: &Value::Null,
    };
    let instance_registry = evaluator.registry(&blueprint.instance.registry, &instance, None)?;
    let instance_registry = Value::Object(instance_registry);
    instance.registry = &instance_registry;
    let mut documents = Vec::new();
    let secrets = secret_keys(&blueprint.instance.registry);
    if args.show_registry {
        let shown = masked(
            instance_registry.as_object().expect("a map"),
            |k| secrets.contains(&k),
            args.show_secrets,
        );
        documents.push(document(
            &format!("registry of instance {}", args.instance_id),
            &shown,
        )?);
    }
    if args.binding {
        let binding_blueprint = blueprint
            .binding
            .as_ref()
            .ok_or_else(|| anyhow!("plan {:?} is not bindable", entry.plan.name))?;
        let bind_params = parameters(args.binding_params.as_deref())?;
        check(entry.binding_create_schema.as_ref(), &bind_params, "bind")?;
        let bind_attrs = json!({ "parameters": bind_params });
        let mut binding = Subject {
            id: &args.binding_id,
            attrs: &bind_attrs,
            registry: &Value::Null,
            ..instance
        };
        let registry =
            evaluator.registry(&binding_blueprint.registry, &instance, Some(&binding))?;
        let registry = Value::Object(registry);
        binding.registry = &registry;
        if args.show_registry {
            let mut secrets = secrets.clone();
            secrets.extend(secret_keys(&binding_blueprint.registry));
            let shown = masked(
                registry.as_object().expect("a map"),
                |k| secrets.contains(&k),
                args.show_secrets,
            );
            documents.push(document(
                &format!("registry of binding {}", args.binding_id),
                &shown,
            )?);
        }
        let credentials =
            evaluator.credentials(&binding_blueprint.credentials, &instance, &binding)?;
        let shown = masked(
            &credentials,
            |k| SECRET_ENTRIES.contains(&k),
            args.show_secrets,
        );
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
    use clap::Parser;

    const CONFIG: &str = r#"
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
  binding:
    registry:
    - {name: password, value: "{{ password(16) }}", secret: true}
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
    fn masks_secrets_unless_asked_and_seeds_reproduce() {
        let masked = render_with(&["--binding", "--show-registry", "--seed", "1"]).unwrap();
        assert!(
            masked.contains("# registry of instance render-instance\ndatabase: db-render-instance")
        );
        assert_eq!(
            masked.matches(MASK).count(),
            2,
            "registry and credentials: {masked}"
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
    fn explains_what_cannot_be_rendered() {
        let err = render_with(&["--params", "[1]"]).unwrap_err().to_string();
        assert!(err.contains("JSON object"), "{err}");
        let config = brokkr_blueprint::load::load_str("test.yaml", CONFIG).unwrap();
        let args = Cli::parse_from(["render", "--service", "db", "--plan", "large"]).args;
        let err = render(&args, &config).unwrap_err().to_string();
        assert!(err.contains("no plan \"large\""), "{err}");
    }
}
