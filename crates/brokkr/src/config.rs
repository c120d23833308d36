//! Where commands' inputs come from: the configuration (a file or directory, or the built-in
//! quickstart and local catalogs), parameters given as JSON or @FILE, durations.

use std::path::Path;

use brokkr_blueprint::load::{ConfigErrors, load_path, load_sources};
use brokkr_blueprint::{Config, LOCAL, QUICKSTART};

/// Loads `path`, or the built-in configuration when `None`: the quickstart and the local
/// catalog.
pub fn load_config(path: Option<&Path>) -> Result<Config, ConfigErrors> {
    match path {
        Some(p) => load_path(p),
        None => load_sources(&[
            ("<built-in quickstart>".to_owned(), QUICKSTART.to_owned()),
            ("<built-in local>".to_owned(), LOCAL.to_owned()),
        ]),
    }
}

/// Parses a duration argument such as `10s` or `200ms`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Parameters given as JSON or `@FILE`: a JSON object (`{}` when absent).
pub fn parameters(arg: Option<&str>) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context as _;
    let Some(arg) = arg else {
        return Ok(serde_json::json!({}));
    };
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?
        }
        None => arg.to_owned(),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).context("parameters must be JSON")?;
    if !value.is_object() {
        anyhow::bail!("parameters must be a JSON object");
    }
    Ok(value)
}
