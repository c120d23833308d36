//! Checks of steps: names, the one action each has, the `target` it names (and the `server` it
//! administers), its templates — each template name replaced with its tree, so that a plan's
//! steps are self-contained — and its `readiness`, `read`, `secret` and `server` trees.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::config::{Phase, Step, TargetConfig, TargetKind};
use crate::template::Renderer;

use super::validator::Validator;

/// Names defined at the top level of a configuration, for steps to refer to.
pub(super) struct Names<'a> {
    pub(super) targets: &'a HashMap<String, TargetConfig>,
    pub(super) templates: &'a HashMap<String, Value>,
}

impl Validator {
    /// Checks steps and replaces template names with the trees they name, so that a plan's
    /// steps are self-contained.
    pub(super) fn check_steps(
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
                    Some(tree) => {
                        self.template_uses
                            .insert((file.to_owned(), field), name.clone());
                        *entry = tree.clone();
                    }
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
                } else if config.kind == TargetKind::Local {
                    format!(
                        "target {target:?} runs servers itself; only a postgres, mysql or \
                             redis target without an admin URL takes a `server`"
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

/// A target step's `readiness`, `read`, `secret` and `server` trees, each with its field name.
pub(super) fn target_extras(step: &Step) -> impl Iterator<Item = (String, &Value)> {
    let readiness = step.readiness.iter().enumerate();
    let read = step.read.iter().enumerate();
    readiness
        .map(|(j, t)| (format!("readiness[{j}]"), t))
        .chain(read.map(|(j, t)| (format!("read[{j}]"), t)))
        .chain(step.secret.iter().map(|t| ("secret".to_owned(), t)))
        .chain(step.server.iter().map(|t| ("server".to_owned(), t)))
}
