//! Loading a configuration: reading YAML files (one, or every `*.yaml`/`*.yml` of a directory),
//! parsing them with source positions, and handing them to validation, which checks everything
//! that can be known before a request and builds the [`Config`] index.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::File;
use crate::span::{Position, SourceMap};
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
    validate::validate(files, maps)
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
