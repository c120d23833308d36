//! The [`Validator`]: the problems found so far, and how each is recorded — with its file,
//! field and position, and registry reads reported where they are written.

use std::collections::HashMap;

use serde_json::Value;

use crate::check;
use crate::error::ConfigError;
use crate::span::SourceMap;
use crate::template::TemplateError;

/// Collects every problem found.
pub(super) struct Validator {
    pub(super) errors: Vec<ConfigError>,
    maps: HashMap<String, SourceMap>,
    /// The file that defines each named template.
    pub(super) template_files: HashMap<String, String>,
    /// Which named template each step template entry (`file`, field path) was resolved from,
    /// so that a problem inside it is shown where it is written.
    pub(super) template_uses: HashMap<(String, String), String>,
}

impl Validator {
    /// A validator with no problems found yet; `maps` give positions in each file.
    pub(super) fn new(maps: HashMap<String, SourceMap>) -> Self {
        Self {
            errors: Vec::new(),
            maps,
            template_files: HashMap::new(),
            template_uses: HashMap::new(),
        }
    }

    pub(super) fn error(
        &mut self,
        file: &str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let field = field.into();
        self.error_at(file, field.clone(), &field, message);
    }

    /// An error about `field`, shown at `place` (a field path that may go deeper, e.g. into a
    /// template tree).
    pub(super) fn error_at(
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
    pub(super) fn template_error(
        &mut self,
        file: &str,
        field: &str,
        tree: &Value,
        e: &TemplateError,
    ) {
        let place = format!("{field}{}", check::pointer_to_field(tree, &e.path));
        self.error_at(file, field, &place, e.to_string());
    }

    /// Reports registry reads in `tree` (written at `field`) of keys not in `defined`; `later`
    /// are keys defined after this point, and `why` says where, for a better message. A tree
    /// that a step took from a named template is reported inside that template, naming the use.
    pub(super) fn check_reads(
        &mut self,
        file: &str,
        field: &str,
        tree: &Value,
        defined: &[String],
        later: (&[String], &str),
    ) {
        let named = self
            .template_uses
            .get(&(file.to_owned(), field.to_owned()))
            .and_then(|name| Some((self.template_files.get(name)?.clone(), name.clone())));
        match named {
            Some((template_file, name)) => {
                let used = format!("; template {name:?} is used by {field} in {file}");
                let at = format!("templates.{name}");
                self.report_reads(&template_file, &at, tree, defined, later, &used);
            }
            None => self.report_reads(file, field, tree, defined, later, ""),
        }
    }

    /// [`Self::check_reads`] at `field` of `file`, each message ending with `suffix`.
    fn report_reads(
        &mut self,
        file: &str,
        field: &str,
        tree: &Value,
        defined: &[String],
        (later, why): (&[String], &str),
        suffix: &str,
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
            self.error_at(
                file,
                field,
                &format!("{field}{at}"),
                format!("{message}{suffix}"),
            );
        }
    }
}
