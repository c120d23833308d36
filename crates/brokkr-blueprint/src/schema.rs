//! A plan's parameter schemas, compiled once and applied to every request.
//!
//! The OSB specification requires each schema to declare `$schema`, to hold no external
//! references, and to stay under 64 kB. Remote references are never fetched. Validation messages
//! name the offending parameter by JSON pointer and mask its value.

use serde_json::Value;

/// Largest schema the OSB specification allows.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// A compiled parameter schema.
pub struct ParameterSchema {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for ParameterSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParameterSchema")
    }
}

impl ParameterSchema {
    /// Compiles a schema, enforcing the OSB rules for catalog schemas.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        if !schema.is_object() {
            return Err("a schema must be a JSON object".into());
        }
        if !schema.get("$schema").is_some_and(Value::is_string) {
            return Err("a schema must declare its draft in `$schema`".into());
        }
        let size = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
        if size > MAX_SCHEMA_BYTES {
            return Err(format!(
                "a schema must not exceed 64 kB (this one is {size} bytes)"
            ));
        }
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(schema)
            .map_err(|e| format!("invalid JSON Schema: {}", e.masked()))?;
        Ok(Self { validator })
    }

    /// Validates `parameters` (an absent object counts as `{}`); returns every violation.
    pub fn validate(&self, parameters: &Value) -> Result<(), Vec<String>> {
        let messages: Vec<String> = self
            .validator
            .iter_errors(parameters)
            .map(|e| {
                let path = e.instance_path().to_string();
                let at = if path.is_empty() { "/".into() } else { path };
                format!("{at}: {}", e.masked_with("the value"))
            })
            .collect();
        if messages.is_empty() {
            Ok(())
        } else {
            Err(messages)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRAFT7: &str = "http://json-schema.org/draft-07/schema#";

    #[test]
    fn reports_each_violation_by_pointer_without_values() {
        let s = ParameterSchema::compile(&json!({
            "$schema": DRAFT7, "type": "object", "required": ["size"],
            "properties": {"size": {"type": "integer"}, "name": {"type": "string", "maxLength": 3}}
        }))
        .unwrap();
        assert!(s.validate(&json!({"size": 1})).is_ok());
        let errs = s.validate(&json!({"name": "hunter2"})).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("/name:")));
        assert!(
            errs.iter()
                .any(|e| e.contains("\"size\" is a required property"))
        );
        assert!(errs.iter().all(|e| !e.contains("hunter2")));
    }

    #[test]
    fn enforces_osb_schema_rules() {
        assert!(ParameterSchema::compile(&json!({"type": "object"})).is_err());
        assert!(ParameterSchema::compile(&json!({"$schema": DRAFT7, "type": 5})).is_err());
        let remote = json!({"$schema": DRAFT7, "$ref": "http://127.0.0.1:9/evil.json"});
        assert!(ParameterSchema::compile(&remote).is_err());
        let big = json!({"$schema": DRAFT7, "description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(
            ParameterSchema::compile(&big)
                .unwrap_err()
                .contains("64 kB")
        );
    }
}
