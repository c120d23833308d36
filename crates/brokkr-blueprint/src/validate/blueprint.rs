//! Checks of a blueprint against its plan: the registry definitions in order, the registry keys
//! every template, condition and credentials entry reads, an instance's dashboard URL, the
//! `binding` section a bindable plan needs, and its rotation.

use serde_json::Value;

use crate::check;
use crate::config::{Blueprint, INSTANCE_STEP_DEFAULTS, Phase, RegistryEntry, Rotation, Step};
use crate::evaluate::{SCOPE, check_dashboard_url};
use crate::template::Renderer;

use super::steps::{Names, target_extras};
use super::validator::Validator;

/// For reads where no key is defined later.
const NONE_LATER: (&[String], &str) = (&[], "");

impl Validator {
    /// Checks one blueprint (written at `at`) of a plan that is `bindable` or not.
    pub(super) fn check_blueprint(
        &mut self,
        file: &str,
        at: &str,
        blueprint: &mut Blueprint,
        bindable: bool,
        renderer: &Renderer,
        names: &Names<'_>,
    ) {
        let instance_phases = [
            Phase::Provision,
            Phase::Update,
            Phase::Upgrade,
            Phase::Deprovision,
        ];
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
        if let Some(expression) = &blueprint.instance.dashboard_url {
            // It sees the registry and what the steps of a provision or an update output.
            let mut keys = instance_keys.clone();
            let builds = |s: &Step| {
                s.runs_in(Phase::Provision, INSTANCE_STEP_DEFAULTS)
                    || s.runs_in(Phase::Update, INSTANCE_STEP_DEFAULTS)
                    || s.runs_in(Phase::Upgrade, INSTANCE_STEP_DEFAULTS)
            };
            let (building, other): (Vec<&Step>, Vec<&Step>) =
                blueprint.instance.steps.iter().partition(|s| builds(s));
            keys.extend(step_outputs_of(&building));
            let teardown: Vec<String> = step_outputs_of(&other).collect();
            let why = "is output only by steps that run in neither provision nor update";
            let field = format!("{at}.instance.dashboard_url");
            self.check_dashboard_url(file, &field, expression, renderer, &keys, (&teardown, why));
        }
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
                if let Some(rotation) = &binding.rotation {
                    self.check_rotation(file, &format!("{at}.binding.rotation"), rotation);
                }
            }
            (None, false) => {}
        }
    }

    /// Checks a binding's `rotation` (written at `at`): a `renew_before` needs a `lifetime`
    /// longer than it, a lifetime is not zero, and `revoke_expired` needs a lifetime.
    fn check_rotation(&mut self, file: &str, at: &str, rotation: &Rotation) {
        if rotation.revoke_expired && rotation.lifetime.is_none() {
            self.error(
                file,
                format!("{at}.revoke_expired"),
                "needs `lifetime`: bindings are revoked when their credentials expire",
            );
        }
        match (rotation.lifetime, rotation.renew_before) {
            (Some(lifetime), _) if lifetime.is_zero() => self.error(
                file,
                format!("{at}.lifetime"),
                "must be longer than zero",
            ),
            (None, Some(_)) => self.error(
                file,
                format!("{at}.renew_before"),
                "needs `lifetime`: it is how long before the credentials expire a platform renews them",
            ),
            (Some(lifetime), Some(renew)) if renew >= lifetime => self.error(
                file,
                format!("{at}.renew_before"),
                format!(
                    "must be shorter than `lifetime` ({})",
                    humantime::format_duration(lifetime)
                ),
            ),
            _ => {}
        }
    }

    /// Checks an instance's `dashboard_url` expression (written at `field`): it parses, reads
    /// only variables in scope and registry keys in `keys`, and a fixed URL, or the fixed text
    /// before the first expression, is the start of an absolute http(s) URL.
    fn check_dashboard_url(
        &mut self,
        file: &str,
        field: &str,
        expression: &str,
        renderer: &Renderer,
        keys: &[String],
        later: (&[String], &str),
    ) {
        let tree = Value::String(expression.to_owned());
        if let Err(e) = renderer.check(&tree) {
            self.template_error(file, field, &tree, &e);
            return;
        }
        self.check_reads(file, field, &tree, keys, later);
        for name in renderer.unknown_variables(expression, SCOPE) {
            self.error(
                file,
                field,
                format!("unknown variable `{name}` (in scope: {})", SCOPE.join(", ")),
            );
        }
        let first = [expression.find("{{"), expression.find("{%")];
        let Some(end) = first.into_iter().flatten().min() else {
            if let Err(e) = check_dashboard_url(expression) {
                self.error(file, field, format!("the URL {e}"));
            }
            return;
        };
        let fixed = &expression[..end];
        let start = fixed.trim_start().to_ascii_lowercase();
        let schemes = ["http://", "https://"];
        if !schemes
            .iter()
            .any(|s| s.starts_with(&start) || start.starts_with(s))
        {
            self.error(
                file,
                field,
                format!("must render to an absolute http(s) URL, but starts with {fixed:?}"),
            );
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
}

/// Whether `name` is a registry key: `[A-Za-z_][A-Za-z0-9_]*`.
pub(super) fn is_registry_key(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The registry keys `steps` produce.
fn step_outputs(steps: &[Step]) -> impl Iterator<Item = String> + '_ {
    steps.iter().flat_map(|s| s.outputs.iter().cloned())
}

/// The registry keys `steps` output.
fn step_outputs_of<'a>(steps: &'a [&Step]) -> impl Iterator<Item = String> + 'a {
    steps.iter().flat_map(|s| s.outputs.iter().cloned())
}
