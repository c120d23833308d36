//! Loading a configuration: reading YAML files (one, or every `*.yaml`/`*.yml` of a directory),
//! parsing them with source positions (the `parse` module), and handing them to validation,
//! which checks everything that can be known before a request and builds the [`Config`] index.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::parse;
use crate::span::SourceMap;
use crate::validate;

pub use crate::error::{ConfigError, ConfigErrors};
pub use crate::index::{Config, PlanEntry};

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
    let mut complete = true;
    for (name, text) in sources {
        let map = SourceMap::new(text);
        let parsed = parse::parse(name, text, &map);
        errors.extend(parsed.errors);
        match parsed.file {
            Some(file) => files.push((name.clone(), file)),
            None => complete = false,
        }
        maps.insert(name.clone(), map);
    }
    if !complete {
        return Err(ConfigErrors(errors));
    }
    // Unknown keys do not stop validation, so one run shows every problem; a problem of an
    // object that holds an unknown key is left out (the misspelt key explains it: a step whose
    // `delay:` is written `delya:` has no action).
    match validate::validate(files, maps) {
        Ok(config) if errors.is_empty() => Ok(config),
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(found)) => {
            let explained = |e: &ConfigError| {
                errors
                    .iter()
                    .any(|u| u.file == e.file && parse::object_of(&u.field) == e.field)
            };
            let found: Vec<ConfigError> = found.into_iter().filter(|e| !explained(e)).collect();
            errors.extend(found);
            errors.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
            Err(ConfigErrors(errors))
        }
    }
}

/// Loads a single YAML document.
pub fn load_str(name: &str, yaml: &str) -> Result<Config, ConfigErrors> {
    load_sources(&[(name.to_owned(), yaml.to_owned())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Phase;
    use crate::template::Renderer;
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
}
