//! Checks of a blueprint against its plan: the registry definitions in order, the registry keys
//! every template, condition and credentials entry reads, and the `binding` section a bindable
//! plan needs.

use serde_json::Value;

use crate::check;
use crate::config::{Blueprint, Phase, RegistryEntry, Step};
use crate::template::Renderer;

use super::Validator;
use super::steps::{Names, target_extras};

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
