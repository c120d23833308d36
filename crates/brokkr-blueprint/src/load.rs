//! Reading a configuration from YAML and checking everything that can be known before a request.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brokkr_osb::{Catalog, Plan, Service};
use serde_json::Value;

use crate::check;
use crate::config::{
    BINDING_STEP_DEFAULTS, Blueprint, BrokerConfig, File, INSTANCE_STEP_DEFAULTS, NamespacePolicy,
    Phase, RegistryEntry, Step, TargetConfig, TargetKind,
};
use crate::schema::ParameterSchema;
use crate::span::{Position, SourceMap};
use crate::template::{Renderer, TemplateError};

/// One problem in a configuration, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as given.
    pub file: String,
    /// The field path, e.g. `catalog.services[0].plans[1].id`; empty when the problem is not
    /// one field's (a syntax error, an unreadable file).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// 1-based line of the field (or of its nearest written ancestor); 0 when unknown.
    pub line: usize,
    /// 1-based column, in characters; 0 when unknown.
    pub column: usize,
    /// The source line, for the snippet; empty when it is not shown.
    pub source: String,
    /// How many characters of the line the caret underlines.
    pub width: usize,
}

impl ConfigError {
    fn new(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            field: field.into(),
            message: message.into(),
            line: 0,
            column: 0,
            source: String::new(),
            width: 0,
        }
    }

    /// Places the error at `position` of `map`, with the line as its snippet. Lines of the
    /// broker's credentials, and lines that may hold a literal password, token or key, are never
    /// shown.
    fn at(mut self, map: &SourceMap, position: Option<Position>) -> Self {
        if let Some(p) = position {
            self.line = p.line;
            self.column = p.column;
            self.width = p.width;
            let sensitive = self.field.contains("auth")
                || map.line(p.line).is_some_and(|l| {
                    let l = l.to_ascii_lowercase();
                    ["password", "token", "private-key"]
                        .iter()
                        .any(|word| l.contains(word))
                        && !l.contains("{{")
                });
            if !sensitive {
                self.source = map.line(p.line).unwrap_or_default().to_owned();
            }
        }
        self
    }
}

/// `field: message`, then rustc-style `--> file:line:column` and the line with a caret.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)?;
        } else {
            write!(f, "{}: {}", self.field, self.message)?;
        }
        if self.line == 0 {
            return write!(f, "\n  --> {}", self.file);
        }
        let gutter = " ".repeat(self.line.to_string().len());
        write!(
            f,
            "\n{gutter}--> {}:{}:{}",
            self.file, self.line, self.column
        )?;
        if !self.source.is_empty() {
            let line = self.source.trim_end();
            // Columns count characters; a tab in the indentation is kept so carets line up.
            let pad: String = line
                .chars()
                .take(self.column - 1)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let carets = "^".repeat(self.width.max(1));
            write!(
                f,
                "\n{gutter} |\n{} | {line}\n{gutter} | {pad}{carets}",
                self.line
            )?;
        }
        Ok(())
    }
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A plan with everything needed to serve it.
#[derive(Debug)]
pub struct PlanEntry {
    /// The service offering (its `plans` list is left empty here).
    pub service: Service,
    /// The plan.
    pub plan: Plan,
    /// What the plan does.
    pub blueprint: Blueprint,
    /// Compiled `service_instance.create` schema.
    pub instance_create_schema: Option<ParameterSchema>,
    /// Compiled `service_instance.update` schema.
    pub instance_update_schema: Option<ParameterSchema>,
    /// Compiled `service_binding.create` schema.
    pub binding_create_schema: Option<ParameterSchema>,
}

impl PlanEntry {
    /// Whether instances of the plan can be bound.
    pub fn bindable(&self) -> bool {
        self.plan.is_bindable(&self.service)
    }

    /// Whether the plan may be changed by an update.
    pub fn plan_updateable(&self) -> bool {
        self.plan.is_plan_updateable(&self.service)
    }

    /// The steps an instance operation of `phase` runs, in order.
    pub fn instance_steps(&self, phase: Phase) -> Vec<Step> {
        select(
            &self.blueprint.instance.steps,
            phase,
            INSTANCE_STEP_DEFAULTS,
        )
    }

    /// The steps a binding operation of `phase` runs, in order.
    pub fn binding_steps(&self, phase: Phase) -> Vec<Step> {
        let steps = self.blueprint.binding.as_ref().map(|b| b.steps.as_slice());
        select(steps.unwrap_or_default(), phase, BINDING_STEP_DEFAULTS)
    }
}

/// The steps of `phase`, in order; teardown phases run them last to first.
fn select(steps: &[Step], phase: Phase, defaults: &[Phase]) -> Vec<Step> {
    let mut selected: Vec<Step> = steps
        .iter()
        .filter(|s| s.runs_in(phase, defaults))
        .cloned()
        .collect();
    if phase.is_teardown() {
        selected.reverse();
    }
    selected
}

/// A validated configuration.
#[derive(Debug)]
pub struct Config {
    /// Broker settings.
    pub broker: BrokerConfig,
    /// Store URL, if the configuration names one.
    pub store: Option<String>,
    /// The catalog as served.
    pub catalog: Catalog,
    /// Where plans create resources, by name.
    pub targets: BTreeMap<String, TargetConfig>,
    catalog_json: Arc<[u8]>,
    plans: HashMap<(String, String), Arc<PlanEntry>>,
}

impl Config {
    /// Looks up a plan by service offering id and plan id.
    pub fn plan(&self, service_id: &str, plan_id: &str) -> Option<&Arc<PlanEntry>> {
        self.plans.get(&(service_id.to_owned(), plan_id.to_owned()))
    }

    /// Every plan.
    pub fn plans(&self) -> impl Iterator<Item = &Arc<PlanEntry>> {
        self.plans.values()
    }

    /// The serialized `GET /v2/catalog` body.
    pub fn catalog_json(&self) -> Arc<[u8]> {
        self.catalog_json.clone()
    }
}

/// Loads a configuration from a YAML file or from every `*.yaml`/`*.yml` file of a directory.
pub fn load_path(path: &Path) -> Result<Config, ConfigErrors> {
    let io_err = |file: &Path, e: std::io::Error| {
        ConfigErrors(vec![ConfigError::new(
            &file.display().to_string(),
            "",
            format!("cannot read: {e}"),
        )])
    };
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| io_err(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut sources = Vec::with_capacity(files.len());
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| io_err(file, e))?;
        sources.push((file.display().to_string(), text));
    }
    load_sources(&sources)
}

/// Loads a configuration from `(name, yaml)` pairs; names appear in error messages.
pub fn load_sources(sources: &[(String, String)]) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut files = Vec::new();
    let mut maps = HashMap::new();
    for (name, text) in sources {
        let map = SourceMap::new(text);
        match parse(text) {
            Ok(file) => files.push((name.clone(), file)),
            Err((message, position)) => {
                errors.push(ConfigError::new(name, "", message).at(&map, position))
            }
        }
        maps.insert(name.clone(), map);
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Validator { errors, maps }.run(files)
}

/// Loads a single YAML document.
pub fn load_str(name: &str, yaml: &str) -> Result<Config, ConfigErrors> {
    load_sources(&[(name.to_owned(), yaml.to_owned())])
}

/// Parses one file; an error comes with its message (without a snippet) and position.
fn parse(text: &str) -> Result<File, (String, Option<Position>)> {
    if text.trim().is_empty() {
        return Ok(File::default());
    }
    let options = serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let position = e.location().filter(|l| l.line() > 0).map(|l| Position {
            line: l.line() as usize,
            column: (l.column() as usize).max(1),
            width: 1,
        });
        let message = e.without_snippet().to_string();
        let mut message = message.strip_prefix("error: ").unwrap_or(&message);
        if let Some(p) = position {
            // The position is shown below the message, rustc-style.
            let suffix = format!(" at line {}, column {}", p.line, p.column);
            message = message.strip_suffix(&suffix).unwrap_or(message);
        }
        (message.to_owned(), position)
    })
}

/// For reads where no key is defined later.
const NONE_LATER: (&[String], &str) = (&[], "");

struct Validator {
    errors: Vec<ConfigError>,
    maps: HashMap<String, SourceMap>,
}

impl Validator {
    fn error(&mut self, file: &str, field: impl Into<String>, message: impl Into<String>) {
        let field = field.into();
        self.error_at(file, field.clone(), &field, message);
    }

    /// An error about `field`, shown at `place` (a field path that may go deeper, e.g. into a
    /// template tree).
    fn error_at(
        &mut self,
        file: &str,
        field: impl Into<String>,
        place: &str,
        message: impl Into<String>,
    ) {
        let error = ConfigError::new(file, field, message);
        let error = match self.maps.get(file) {
            Some(map) => error.at(map, map.locate(place)),
            None => error,
        };
        self.errors.push(error);
    }

    /// A template error in `tree`, written at `field`, shown at the failing leaf.
    fn template_error(&mut self, file: &str, field: &str, tree: &Value, e: &TemplateError) {
        let place = format!("{field}{}", check::pointer_to_field(tree, &e.path));
        self.error_at(file, field, &place, e.to_string());
    }

    /// Reports registry reads in `tree` (written at `field`) of keys not in `defined`; `later`
    /// are keys defined after this point, and `why` says where, for a better message.
    fn check_reads(
        &mut self,
        file: &str,
        field: &str,
        tree: &Value,
        defined: &[String],
        (later, why): (&[String], &str),
    ) {
        for (at, key) in check::registry_reads(tree) {
            if defined.contains(&key) {
                continue;
            }
            let message = if later.contains(&key) {
                format!("registry key {key:?} {why}")
            } else if defined.is_empty() {
                format!("registry key {key:?} is not defined (no registry entry is defined here)")
            } else {
                format!(
                    "registry key {key:?} is not defined (defined here: {})",
                    defined.join(", ")
                )
            };
            self.error_at(file, field, &format!("{field}{at}"), message);
        }
    }

    fn run(mut self, files: Vec<(String, File)>) -> Result<Config, ConfigErrors> {
        let mut broker: Option<(String, BrokerConfig)> = None;
        let mut store: Option<(String, String)> = None;
        let mut services: Vec<(String, usize, Service)> = Vec::new();
        let mut blueprints: Vec<(String, usize, Blueprint)> = Vec::new();
        let mut targets: BTreeMap<String, (String, TargetConfig)> = BTreeMap::new();
        let mut templates: BTreeMap<String, (String, Value)> = BTreeMap::new();
        for (name, file) in files {
            for (t, target) in file.targets {
                if let Some((first, _)) = targets.get(&t) {
                    let message = format!("target {t:?} is already defined in {first}");
                    self.error(&name, format!("targets.{t}"), message);
                } else {
                    self.check_target(&name, &t, &target);
                    targets.insert(t, (name.clone(), target));
                }
            }
            for (t, tree) in file.templates {
                if let Some((first, _)) = templates.get(&t) {
                    let message = format!("template {t:?} is already defined in {first}");
                    self.error(&name, format!("templates.{t}"), message);
                } else {
                    templates.insert(t, (name.clone(), tree));
                }
            }
            if let Some(b) = file.broker {
                match &broker {
                    Some((first, _)) => {
                        self.error(&name, "broker", format!("already defined in {first}"))
                    }
                    None => broker = Some((name.clone(), b)),
                }
            }
            if let Some(s) = file.store {
                match &store {
                    Some((first, _)) => {
                        self.error(&name, "store", format!("already defined in {first}"))
                    }
                    None => store = Some((name.clone(), s)),
                }
            }
            for (i, s) in file
                .catalog
                .unwrap_or_default()
                .services
                .into_iter()
                .enumerate()
            {
                services.push((name.clone(), i, s));
            }
            for (i, b) in file.blueprints.into_iter().enumerate() {
                blueprints.push((name.clone(), i, b));
            }
        }
        if let Some((file, b)) = &broker
            && let Some(listen) = &b.listen
            && listen.parse::<std::net::SocketAddr>().is_err()
        {
            self.error(
                file,
                "broker.listen",
                "must be an address like 127.0.0.1:8080",
            );
        }

        self.check_catalog(&services);
        let renderer = Renderer::new();
        for (t, (file, tree)) in &templates {
            if let Err(e) = renderer.check(tree) {
                self.template_error(file, &format!("templates.{t}"), tree, &e);
            }
        }
        let target_configs: HashMap<String, TargetConfig> = targets
            .iter()
            .map(|(name, (_, target))| (name.clone(), target.clone()))
            .collect();
        let template_trees: HashMap<String, Value> = templates
            .into_iter()
            .map(|(name, (_, tree))| (name, tree))
            .collect();
        let names = Names {
            targets: &target_configs,
            templates: &template_trees,
        };
        let mut plans = HashMap::new();
        let mut seen = HashSet::new();
        for (file, i, mut blueprint) in blueprints {
            let field = format!("blueprints[{i}]");
            let found = services.iter().find_map(|(_, _, s)| {
                (s.name == blueprint.service)
                    .then(|| {
                        s.plans
                            .iter()
                            .find(|p| p.name == blueprint.plan)
                            .map(|p| (s, p))
                    })
                    .flatten()
            });
            let Some((service, plan)) = found else {
                self.error(
                    &file,
                    &field,
                    format!(
                        "no plan {:?} of service {:?} in the catalog",
                        blueprint.plan, blueprint.service
                    ),
                );
                continue;
            };
            if !seen.insert((service.id.clone(), plan.id.clone())) {
                self.error(
                    &file,
                    &field,
                    format!(
                        "plan {:?} of service {:?} already has a blueprint",
                        plan.name, service.name
                    ),
                );
                continue;
            }
            self.check_blueprint(
                &file,
                &field,
                &mut blueprint,
                plan.is_bindable(service),
                &renderer,
                &names,
            );
            let entry = plan_entry(service, plan, blueprint);
            plans.insert((service.id.clone(), plan.id.clone()), Arc::new(entry));
        }
        for (file, i, service) in &services {
            for (j, plan) in service.plans.iter().enumerate() {
                if !seen.contains(&(service.id.clone(), plan.id.clone())) {
                    self.error(
                        file,
                        format!("catalog.services[{i}].plans[{j}]"),
                        format!(
                            "plan {:?} of service {:?} has no blueprint",
                            plan.name, service.name
                        ),
                    );
                }
            }
        }
        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        let catalog = Catalog {
            services: services.into_iter().map(|(_, _, s)| s).collect(),
        };
        let catalog_json = serde_json::to_vec(&catalog)
            .expect("a catalog always serializes")
            .into();
        Ok(Config {
            broker: broker.map(|(_, b)| b).unwrap_or_default(),
            store: store.map(|(_, s)| s),
            catalog,
            targets: targets.into_iter().map(|(n, (_, t))| (n, t)).collect(),
            catalog_json,
            plans,
        })
    }

    fn check_target(&mut self, file: &str, name: &str, target: &TargetConfig) {
        let at = format!("targets.{name}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.error(file, &at, "a target name is letters, digits, `-` and `_`");
        }
        if target.kind == TargetKind::Kubernetes {
            let fields = [
                ("url_env", target.url_env.is_some()),
                ("url_file", target.url_file.is_some()),
                ("host", target.host.is_some()),
                ("port", target.port.is_some()),
            ];
            self.refuse_fields(file, &at, &fields, |_| {
                "a kubernetes target has no admin URL, host or port; it reaches the cluster \
                 through `kubeconfig` (or in-cluster configuration)"
                    .into()
            });
            if let Some(NamespacePolicy::Fixed(ns)) = &target.namespace
                && !is_dns_label(ns)
            {
                self.error(
                    file,
                    format!("{at}.namespace.fixed"),
                    "a namespace name is a DNS label: lowercase letters, digits and `-`, at most 63",
                );
            }
            return;
        }
        let fields = [
            ("kubeconfig", target.kubeconfig.is_some()),
            ("context", target.context.is_some()),
            ("namespace", target.namespace.is_some()),
            ("pvc_policy", target.pvc_policy.is_some()),
        ];
        let kind = target.kind.as_str();
        self.refuse_fields(file, &at, &fields, |field| {
            format!("only a kubernetes target has `{field}` (this one is {kind})")
        });
        if target.url_env.is_some() && target.url_file.is_some() {
            self.error(
                file,
                &at,
                "give the admin URL once: `url_env` or `url_file`, not both",
            );
        }
        if target.servers_per_step() {
            let fields = [
                ("host", target.host.is_some()),
                ("port", target.port.is_some()),
            ];
            self.refuse_fields(file, &at, &fields, |_| {
                "a target without an admin URL administers the servers its steps name \
                 (`server:`); give bindings their host and port in the credentials"
                    .into()
            });
        }
        if target.port == Some(0) {
            self.error(file, format!("{at}.port"), "must be 1-65535");
        }
    }

    /// Reports each of `fields` (name, whether it is set) that is set at `at`.
    fn refuse_fields(
        &mut self,
        file: &str,
        at: &str,
        fields: &[(&str, bool)],
        message: impl Fn(&str) -> String,
    ) {
        for (field, _) in fields.iter().filter(|(_, set)| *set) {
            self.error(file, format!("{at}.{field}"), message(field));
        }
    }

    fn check_catalog(&mut self, services: &[(String, usize, Service)]) {
        let mut service_ids = HashSet::new();
        let mut service_names = HashSet::new();
        let mut plan_ids = HashSet::new();
        for (file, i, s) in services {
            let at = format!("catalog.services[{i}]");
            for (field, value) in [
                ("id", &s.id),
                ("name", &s.name),
                ("description", &s.description),
            ] {
                if value.trim().is_empty() {
                    self.error(file, format!("{at}.{field}"), "must be a non-empty string");
                }
            }
            if !service_ids.insert(&s.id) {
                self.error(
                    file,
                    format!("{at}.id"),
                    format!("duplicate service id {:?}", s.id),
                );
            }
            if !service_names.insert(&s.name) {
                self.error(
                    file,
                    format!("{at}.name"),
                    format!("duplicate service name {:?}", s.name),
                );
            }
            if s.plans.is_empty() {
                self.error(
                    file,
                    format!("{at}.plans"),
                    "a service needs at least one plan",
                );
            }
            let mut plan_names = HashSet::new();
            for (j, p) in s.plans.iter().enumerate() {
                let at = format!("{at}.plans[{j}]");
                for (field, value) in [
                    ("id", &p.id),
                    ("name", &p.name),
                    ("description", &p.description),
                ] {
                    if value.trim().is_empty() {
                        self.error(file, format!("{at}.{field}"), "must be a non-empty string");
                    }
                }
                if !plan_ids.insert(&p.id) {
                    self.error(
                        file,
                        format!("{at}.id"),
                        format!("duplicate plan id {:?}", p.id),
                    );
                }
                if !plan_names.insert(&p.name) {
                    self.error(
                        file,
                        format!("{at}.name"),
                        format!("duplicate plan name {:?}", p.name),
                    );
                }
                if let Some(mi) = &p.maintenance_info
                    && semver::Version::parse(&mi.version).is_err()
                {
                    self.error(
                        file,
                        format!("{at}.maintenance_info.version"),
                        "must be a semantic version 2.0 string, like 1.2.3",
                    );
                }
                let schemas = [
                    ("service_instance.create", p.instance_create_schema()),
                    ("service_instance.update", p.instance_update_schema()),
                    ("service_binding.create", p.binding_create_schema()),
                ];
                for (name, schema) in schemas {
                    if let Some(Err(e)) = schema.map(ParameterSchema::compile) {
                        self.error(file, format!("{at}.schemas.{name}.parameters"), e);
                    }
                }
            }
        }
    }

    fn check_blueprint(
        &mut self,
        file: &str,
        at: &str,
        blueprint: &mut Blueprint,
        bindable: bool,
        renderer: &Renderer,
        names: &Names<'_>,
    ) {
        let instance_phases = [Phase::Provision, Phase::Update, Phase::Deprovision];
        let instance_keys = self.check_registry(
            file,
            &format!("{at}.instance.registry"),
            &blueprint.instance.registry,
            renderer,
            &[],
        );
        // A binding's registry starts from everything the instance's holds once provisioned.
        let mut provisioned = instance_keys.clone();
        provisioned.extend(step_outputs(&blueprint.instance.steps));
        let binding_keys = match &blueprint.binding {
            Some(binding) => self.check_registry(
                file,
                &format!("{at}.binding.registry"),
                &binding.registry,
                renderer,
                &provisioned,
            ),
            None => provisioned.clone(),
        };
        self.check_steps(
            file,
            &format!("{at}.instance.steps"),
            &mut blueprint.instance.steps,
            &instance_phases,
            renderer,
            names,
        );
        self.check_step_reads(
            file,
            &format!("{at}.instance.steps"),
            &blueprint.instance.steps,
            &instance_keys,
            (&binding_keys, "is defined only in the binding's registry"),
        );
        match (&mut blueprint.binding, bindable) {
            (None, true) => self.error(
                file,
                at,
                "the plan is bindable, so its blueprint needs a `binding` section",
            ),
            (Some(_), false) => self.error(
                file,
                format!("{at}.binding"),
                "the plan is not bindable; remove this section or set `bindable: true`",
            ),
            (Some(binding), true) => {
                let steps_at = format!("{at}.binding.steps");
                self.check_steps(
                    file,
                    &steps_at,
                    &mut binding.steps,
                    &[Phase::Bind, Phase::Unbind],
                    renderer,
                    names,
                );
                self.check_step_reads(file, &steps_at, &binding.steps, &binding_keys, NONE_LATER);
                let field = format!("{at}.binding.credentials");
                if let Err(e) = renderer.check(&binding.credentials) {
                    self.template_error(file, &field, &binding.credentials, &e);
                }
                let mut bound = binding_keys.clone();
                bound.extend(step_outputs(&binding.steps));
                self.check_reads(file, &field, &binding.credentials, &bound, NONE_LATER);
                for (suffix, message) in check::credentials_literals(&binding.credentials) {
                    self.error_at(file, &field, &format!("{field}{suffix}"), message);
                }
            }
            (None, false) => {}
        }
    }

    /// Reports registry reads of unknown keys in steps' templates and conditions; `later` are
    /// keys only a binding defines.
    fn check_step_reads(
        &mut self,
        file: &str,
        at: &str,
        steps: &[Step],
        keys: &[String],
        later: (&[String], &str),
    ) {
        // Each step sees the registry and what the steps before it produced.
        let mut keys = keys.to_vec();
        for (i, step) in steps.iter().enumerate() {
            for (j, tree) in step.templates.iter().enumerate() {
                self.check_reads(
                    file,
                    &format!("{at}[{i}].templates[{j}]"),
                    tree,
                    &keys,
                    later,
                );
            }
            if let Some(when) = &step.when {
                let tree = Value::String(format!("{{{{ {when} }}}}"));
                self.check_reads(file, &format!("{at}[{i}].when"), &tree, &keys, later);
            }
            for (field, tree) in target_extras(step) {
                self.check_reads(file, &format!("{at}[{i}].{field}"), tree, &keys, later);
            }
            for (j, name) in step.outputs.iter().enumerate() {
                if !is_registry_key(name) {
                    let field = format!("{at}[{i}].outputs[{j}]");
                    self.error(file, field, "must match [A-Za-z_][A-Za-z0-9_]*");
                }
            }
            keys.extend(step.outputs.iter().cloned());
        }
    }

    /// Checks registry definitions; returns the keys they define, after `inherited`.
    fn check_registry(
        &mut self,
        file: &str,
        at: &str,
        entries: &[RegistryEntry],
        renderer: &Renderer,
        inherited: &[String],
    ) -> Vec<String> {
        let mut keys = inherited.to_vec();
        let all: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("{at}[{i}]");
            if !is_registry_key(&entry.name) {
                self.error(
                    file,
                    format!("{at}.name"),
                    "must match [A-Za-z_][A-Za-z0-9_]*",
                );
            }
            if keys.contains(&entry.name) && !inherited.contains(&entry.name) {
                self.error(
                    file,
                    format!("{at}.name"),
                    format!("duplicate registry key {:?}", entry.name),
                );
            }
            let field = format!("{at}.value");
            if let Err(e) = renderer.check(&entry.value) {
                self.template_error(file, &field, &entry.value, &e);
            }
            self.check_reads(
                file,
                &field,
                &entry.value,
                &keys,
                (&all[i..], "is used before it is defined"),
            );
            keys.push(entry.name.clone());
        }
        keys
    }

    /// Checks steps and replaces template names with the trees they name, so that a plan's
    /// steps are self-contained.
    fn check_steps(
        &mut self,
        file: &str,
        at: &str,
        steps: &mut [Step],
        allowed: &[Phase],
        renderer: &Renderer,
        known: &Names<'_>,
    ) {
        let mut names = HashSet::new();
        for (i, step) in steps.iter_mut().enumerate() {
            let at = format!("{at}[{i}]");
            if step.name.trim().is_empty() {
                self.error(file, format!("{at}.name"), "must be a non-empty string");
            }
            if !names.insert(step.name.clone()) {
                self.error(
                    file,
                    format!("{at}.name"),
                    format!("duplicate step name {:?}", step.name),
                );
            }
            let actions = [
                step.delay.is_some(),
                step.run.is_some(),
                step.target.is_some(),
            ];
            match actions.iter().filter(|a| **a).count() {
                0 => self.error(
                    file,
                    &at,
                    "a step needs an action (`delay`, `run` or `target`)",
                ),
                1 => {}
                _ => self.error(
                    file,
                    &at,
                    "a step has one action: `delay`, `run` or `target`",
                ),
            }
            self.resolve_templates(file, &at, step, renderer, known);
            if step.secret.is_some() && !allowed.contains(&Phase::Bind) {
                let message = "only a binding's steps publish credentials as a `secret`";
                self.error(file, format!("{at}.secret"), message);
            }
            if let Some(when) = &step.when
                && let Err(e) = renderer.check(&Value::String(format!("{{{{ {when} }}}}")))
            {
                self.error(file, format!("{at}.when"), e.message);
            }
            for phase in step.on.iter().flatten() {
                if !allowed.contains(phase) {
                    let allowed: Vec<_> = allowed.iter().map(|p| p.as_str()).collect();
                    self.error(
                        file,
                        format!("{at}.on"),
                        format!("`{}` is not one of {}", phase.as_str(), allowed.join(", ")),
                    );
                }
            }
        }
    }
}

/// A target step's `readiness`, `read`, `secret` and `server` trees, each with its field name.
fn target_extras(step: &Step) -> impl Iterator<Item = (String, &Value)> {
    let readiness = step.readiness.iter().enumerate();
    let read = step.read.iter().enumerate();
    readiness
        .map(|(j, t)| (format!("readiness[{j}]"), t))
        .chain(read.map(|(j, t)| (format!("read[{j}]"), t)))
        .chain(step.secret.iter().map(|t| ("secret".to_owned(), t)))
        .chain(step.server.iter().map(|t| ("server".to_owned(), t)))
}

/// Whether `name` is a registry key: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_registry_key(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The registry keys `steps` produce.
fn step_outputs(steps: &[Step]) -> impl Iterator<Item = String> + '_ {
    steps.iter().flat_map(|s| s.outputs.iter().cloned())
}

/// Names defined at the top level of a configuration, for steps to refer to.
struct Names<'a> {
    targets: &'a HashMap<String, TargetConfig>,
    templates: &'a HashMap<String, Value>,
}

impl Validator {
    /// Checks a step's `target` and `templates`, replacing each template name with its tree.
    fn resolve_templates(
        &mut self,
        file: &str,
        at: &str,
        step: &mut Step,
        renderer: &Renderer,
        known: &Names<'_>,
    ) {
        let Some(target) = &step.target else {
            if !step.templates.is_empty() {
                self.error(
                    file,
                    format!("{at}.templates"),
                    "templates are applied by a `target` step; add `target: NAME`",
                );
            }
            for (field, set) in [
                ("readiness", !step.readiness.is_empty()),
                ("read", !step.read.is_empty()),
                ("secret", step.secret.is_some()),
                ("server", step.server.is_some()),
            ] {
                if set {
                    let message =
                        format!("`{field}` belongs to a `target` step; add `target: NAME`");
                    self.error(file, format!("{at}.{field}"), message);
                }
            }
            return;
        };
        if let Some(config) = known.targets.get(target) {
            self.check_server(file, at, step, target, config);
        } else {
            let mut defined: Vec<_> = known.targets.keys().map(String::as_str).collect();
            defined.sort_unstable();
            let defined = if defined.is_empty() {
                "none is defined under `targets:`".to_owned()
            } else {
                format!("defined: {}", defined.join(", "))
            };
            self.error(
                file,
                format!("{at}.target"),
                format!("unknown target {target:?} ({defined})"),
            );
        }
        let acts = step.secret.is_some() || !step.readiness.is_empty() || !step.read.is_empty();
        if step.templates.is_empty() && !acts {
            self.error(
                file,
                format!("{at}.templates"),
                "a `target` step needs at least one template (or `secret`, `readiness` or `read`)",
            );
        }
        self.check_target_extras(file, at, step, renderer);
        for (j, entry) in step.templates.iter_mut().enumerate() {
            let field = format!("{at}.templates[{j}]");
            match entry {
                Value::String(name) => match known.templates.get(name.as_str()) {
                    Some(tree) => *entry = tree.clone(),
                    None => self.error(file, field, format!("unknown template {name:?}")),
                },
                Value::Object(_) => {
                    if let Err(e) = renderer.check(entry) {
                        self.template_error(file, &field, entry, &e);
                    }
                }
                _ => self.error(
                    file,
                    field,
                    "a template is a name from `templates:` or an inline mapping",
                ),
            }
        }
    }
}

impl Validator {
    /// Checks that a step names its `server` exactly when its target has no admin URL.
    fn check_server(
        &mut self,
        file: &str,
        at: &str,
        step: &Step,
        target: &str,
        config: &TargetConfig,
    ) {
        match (&step.server, config.servers_per_step()) {
            (None, true) => self.error(
                file,
                format!("{at}.target"),
                format!(
                    "target {target:?} has no admin URL (`url_env`/`url_file`), so the step \
                     must name the server it administers: `server: {{host, port, username, \
                     password, database}}`"
                ),
            ),
            (Some(_), false) => {
                let message = if config.kind == TargetKind::Kubernetes {
                    format!(
                        "target {target:?} is a cluster; only a postgres, mysql or redis \
                             target without an admin URL takes a `server`"
                    )
                } else {
                    format!(
                        "target {target:?} administers the server of its admin URL; \
                             `server` is for a target without `url_env`/`url_file`"
                    )
                };
                self.error(file, format!("{at}.server"), message);
            }
            (Some(server), true) => {
                if server.get("host").is_none() {
                    self.error(
                        file,
                        format!("{at}.server"),
                        "needs `host` (and `username`, `password`; `port` and `database` are \
                         optional)",
                    );
                }
                let known = ["host", "port", "username", "password", "database"];
                for key in server.as_object().into_iter().flat_map(|m| m.keys()) {
                    if !known.contains(&key.as_str()) {
                        self.error(
                            file,
                            format!("{at}.server.{key}"),
                            format!("unknown field; expected one of {}", known.join(", ")),
                        );
                    }
                }
            }
            (None, false) => {}
        }
    }

    /// Checks a target step's `readiness`, `read`, `secret` and `server` trees.
    fn check_target_extras(&mut self, file: &str, at: &str, step: &Step, renderer: &Renderer) {
        for (field, tree) in target_extras(step) {
            let field = format!("{at}.{field}");
            if !tree.is_object() {
                self.error(file, field, "must be a mapping");
                continue;
            }
            if let Err(e) = renderer.check(tree) {
                self.template_error(file, &field, tree, &e);
            }
        }
        for (j, read) in step.read.iter().enumerate() {
            let field = format!("{at}.read[{j}].values");
            let Some(values) = read.get("values").and_then(Value::as_object) else {
                self.error(
                    file,
                    field,
                    "maps registry keys (declared in `outputs`) to JSON pointers",
                );
                continue;
            };
            for key in values.keys() {
                if !step.outputs.contains(key) {
                    let message =
                        format!("{key:?} is read but not declared in the step's `outputs`");
                    self.error(file, format!("{field}.{key}"), message);
                }
            }
        }
        if let Some(secret) = &step.secret
            && secret.get("name").is_none()
        {
            self.error(
                file,
                format!("{at}.secret"),
                "needs `name`, the Secret's name",
            );
        }
    }
}

/// Whether `name` is a DNS label (a Kubernetes namespace name).
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Builds the served form of a plan; its schemas have already been checked.
fn plan_entry(service: &Service, plan: &Plan, blueprint: Blueprint) -> PlanEntry {
    let compile = |s: Option<&Value>| s.and_then(|s| ParameterSchema::compile(s).ok());
    PlanEntry {
        service: Service {
            plans: Vec::new(),
            ..service.clone()
        },
        plan: plan.clone(),
        instance_create_schema: compile(plan.instance_create_schema()),
        instance_update_schema: compile(plan.instance_update_schema()),
        binding_create_schema: compile(plan.binding_create_schema()),
        blueprint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quickstart_loads_and_renders_credentials() {
        let config = load_str("quickstart.yaml", crate::QUICKSTART).unwrap();
        let service = &config.catalog.services[0];
        let entry = config.plan(&service.id, &service.plans[0].id).unwrap();
        assert!(entry.bindable() && entry.plan_updateable());
        assert_eq!(entry.instance_steps(Phase::Deprovision).len(), 1);
        let credentials = &entry.blueprint.binding.as_ref().unwrap().credentials;
        let instance = json!({"parameters": {"credentials": {"type": "mysql", "host": "a"}}});
        let out = Renderer::new()
            .render(
                credentials,
                &json!({"instance": instance, "parameters": {}}),
            )
            .unwrap();
        assert_eq!(out, json!({"type": "mysql", "host": "a"}));
        let out = Renderer::new()
            .render(
                credentials,
                &json!({"instance": instance, "parameters": {"credentials": {"host": "b"}}}),
            )
            .unwrap();
        assert_eq!(out, json!({"type": "mysql", "host": "b"}));
    }

    fn errors(yaml: &str) -> Vec<String> {
        load_str("broken.yaml", yaml)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_plan_needs_exactly_one_matching_blueprint() {
        let base = "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: true,\n     plans: [{name: p, id: p1, description: d}, {name: q, id: q1, description: d}]}\n";
        let errs = errors(&format!(
            "{base}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}}}}}\n- {{service: s, plan: p}}\n- {{service: s, plan: nope}}\n"
        ));
        assert!(
            errs.iter().any(|e| e
                .contains("blueprints[1]: plan \"p\" of service \"s\" already has a blueprint")),
            "{errs:#?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("blueprints[2]: no plan \"nope\"")),
            "{errs:#?}"
        );
        assert!(
            errs.iter().any(|e| e.contains(
                "catalog.services[0].plans[1]: plan \"q\" of service \"s\" has no blueprint"
            )),
            "{errs:#?}"
        );
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let errs = errors("catalog:\n  services: [\n");
        assert!(errs[0].contains("\n --> broken.yaml:2:13\n"), "{errs:?}");
        let errs = errors("catalog:\n  servics: []\n");
        assert!(errs[0].contains("servics"), "{errs:?}");
        assert!(
            errs[0].contains("--> broken.yaml:2"),
            "the snippet names the file: {errs:?}"
        );
        assert!(
            !errs[0].contains("error:"),
            "the prefix is added once, by ConfigErrors: {errs:?}"
        );
        assert!(errs[0].contains('2'), "names line 2: {errs:?}");
    }

    #[test]
    fn catalog_rules_are_enforced() {
        let errs = errors(
            "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: false, plans: [\n      {name: p, id: p1, description: d, maintenance_info: {version: one},\n       schemas: {service_instance: {create: {parameters: {type: object}}}}}]}\n  - {name: s, id: s1, description: '', bindable: false, plans: []}\nblueprints:\n- {service: s, plan: p, binding: {credentials: {}}, instance: {steps: [{name: a}, {name: a, delay: 1s, on: [bind]}]}}\n",
        );
        for expected in [
            "maintenance_info.version: must be a semantic version",
            "schemas.service_instance.create.parameters: a schema must declare its draft",
            "catalog.services[1].id: duplicate service id",
            "catalog.services[1].description: must be a non-empty string",
            "catalog.services[1].plans: a service needs at least one plan",
            "blueprints[0].binding: the plan is not bindable",
            "instance.steps[0]: a step needs an action",
            "instance.steps[1].name: duplicate step name",
            "instance.steps[1].on: `bind` is not one of provision, update, deprovision",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected}\n{errs:#?}"
            );
        }
    }

    #[test]
    fn kubernetes_targets_and_their_step_fields_are_checked() {
        let yaml = r#"
targets:
  cluster: {kind: kubernetes, url_env: X, namespace: {fixed: Team_A}}
  pg: {kind: postgres, url_env: PG, namespace: per-instance}
catalog:
  services:
  - {name: s, id: s1, description: d, bindable: true, plans: [{name: p, id: p1, description: d}]}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - {name: a, run: noop, readiness: [{kind: Pod}]}
    - name: b
      target: cluster
      read: [{apiVersion: v1, kind: Secret, name: x, values: {password: /data/password}}]
      outputs: [username]
    - {name: c, target: cluster, secret: {name: x}}
  binding:
    steps:
    - {name: s, target: cluster, secret: {}}
    credentials: {type: t}
"#;
        let errs = errors(yaml);
        for expected in [
            "targets.cluster.url_env: a kubernetes target has no admin URL",
            "targets.cluster.namespace.fixed: a namespace name is a DNS label",
            "targets.pg.namespace: only a kubernetes target has `namespace` (this one is postgres)",
            "instance.steps[0].readiness: `readiness` belongs to a `target` step",
            "instance.steps[1].read[0].values.password: \"password\" is read but not declared",
            "instance.steps[2].secret: only a binding's steps publish credentials",
            "binding.steps[0].secret: needs `name`",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected}\n{errs:#?}"
            );
        }
        let fine = r#"
targets:
  cluster: {kind: kubernetes, namespace: per-instance, pvc_policy: retain}
catalog:
  services:
  - {name: s, id: s1, description: d, bindable: true, plans: [{name: p, id: p1, description: d}]}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - name: db
      target: cluster
      templates: [{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}]
      readiness: [{apiVersion: v1, kind: ConfigMap, name: x, jsonpath: "{.data.a}", equals: "1"}]
      read: [{apiVersion: v1, kind: ConfigMap, name: x, values: {a: /data/a}}]
      outputs: [a]
  binding:
    steps:
    - {name: s, target: cluster, secret: {name: "b-{{ binding_id }}"}}
    credentials: {type: t, value: "{{ registry('a') }}"}
"#;
        load_str("fine.yaml", fine).unwrap();
    }
}
