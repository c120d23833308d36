//! Lookups: `param` reads the request's parameters by JSON pointer, `registry` the values of
//! earlier registry entries, and `required` stops a render at a missing value.

use std::sync::Arc;

use minijinja::value::{Enumerator, Object, Rest, Serde, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, State, Value};

use super::args::{Args, fail};

/// `param(pointer, default?)`: the value at JSON pointer `pointer` in `parameters`.
pub(super) fn param(state: &State, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("param", &["pointer", "default"], args)?;
    let pointer = a.req_str(0)?;
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(fail(
            "param",
            format!("`{pointer}` is not a JSON pointer: it must be empty or start with '/'"),
        ));
    }
    let params = state
        .lookup("parameters")
        .filter(|p| !p.is_undefined())
        .map(|p| serde_json::to_value(&p))
        .transpose()
        .map_err(|_| fail("param", "parameters are not JSON"))?
        .unwrap_or(serde_json::Value::Null);
    match params.pointer(pointer).filter(|v| !v.is_null()) {
        Some(v) => Ok(Value::from(Serde(v))),
        // A default given as none or undefined removes the key, like any none leaf.
        None if a.values[1].is_some() => Ok(a.values[1].clone().unwrap_or_default()),
        None => Err(fail(
            "param",
            format!("no parameter at `{pointer}` and no default"),
        )),
    }
}

/// `registry(key)` when the context has no `registry` map: there is no entry to find.
pub(super) fn registry(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("registry", &["key"], args)?;
    Err(no_entry(a.req_str(0)?))
}

fn no_entry(key: &str) -> Error {
    fail("registry", format!("no registry entry `{key}` (yet)"))
}

/// The `registry` context value: a map (`registry.password`) that can also be called
/// (`registry('password')`), which fails, naming the key, when the entry does not exist.
///
/// A context value shadows a global function of the same name, so the context's `registry` map
/// itself has to answer calls.
#[derive(Debug)]
struct Registry(Value);

impl Object for Registry {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.0.try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }

    fn call(self: &Arc<Self>, _state: &mut State<'_, '_>, args: &[Value]) -> Result<Value, Error> {
        let a = Args::bind(
            "registry",
            &["key"],
            Rest(args.iter().cloned().map(Into::into).collect()),
        )?;
        let key = a.req_str(0)?;
        self.get_value(&Value::from(key))
            .ok_or_else(|| no_entry(key))
    }
}

/// `ctx` with its `registry` map, if any, made callable as `registry(key)`.
pub(crate) fn with_callable_registry(ctx: Value) -> Value {
    match ctx.get_attr("registry") {
        Ok(reg) if reg.kind() == ValueKind::Map => {
            minijinja::context! { registry => Value::from_object(Registry(reg)), ..ctx }
        }
        _ => ctx,
    }
}

/// `required(value, message?)`: `value`, unless it is undefined, none or the empty string.
pub(super) fn required(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("required", &["value", "message"], args)?;
    let message = a.opt_str(1)?;
    match a.opt(0) {
        Some(v) if v.as_str() != Some("") => Ok(v.clone()),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            message
                .unwrap_or("required(): a required value is missing")
                .to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::functions::tests::{err, ok};
    use crate::template::Renderer;
    use serde_json::json;

    // -- param ------------------------------------------------------------------------------

    #[test]
    fn param_reads_json_pointers_with_their_type() {
        let p = json!({"db": {"port": 5432, "tags": ["a", "b"], "a/b": {"~x": true}}});
        assert_eq!(ok("{{ param('/db/port') }}", p.clone()), json!(5432));
        assert_eq!(ok("{{ param('/db/tags') }}", p.clone()), json!(["a", "b"]));
        assert_eq!(ok("{{ param('/db/tags/1') }}", p.clone()), json!("b"));
        assert_eq!(ok("{{ param('/db/a~1b/~0x') }}", p.clone()), json!(true));
        assert_eq!(ok("{{ param('') }}", p.clone()), p);
        assert_eq!(ok("{{ param('/db/port', 1) }}", p.clone()), json!(5432));
    }

    #[test]
    fn param_defaults_apply_to_absent_and_null_values() {
        let p = json!({"a": null});
        assert_eq!(ok("{{ param('/a', 3) }}", p.clone()), json!(3));
        assert_eq!(ok("{{ param('/b', 'x') }}", p.clone()), json!("x"));
        assert_eq!(ok("{{ param('/b', default=[1]) }}", p.clone()), json!([1]));
        let out = Renderer::new()
            .render(
                &json!({"keep": 1, "gone": "{{ param('/b', none) }}"}),
                &json!({"parameters": p}),
            )
            .unwrap();
        assert_eq!(out, json!({"keep": 1}));
        // Without parameters in the context at all, only defaults work.
        let out = Renderer::new()
            .render(&json!("{{ param('/x', 2) }}"), &json!({}))
            .unwrap();
        assert_eq!(out, json!(2));
    }

    #[test]
    fn param_errors_name_the_pointer_and_the_leaf() {
        let e = Renderer::new()
            .render(
                &json!({"spec": {"replicas": "{{ param('/size/replicas') }}"}}),
                &json!({"parameters": {"size": {}}}),
            )
            .unwrap_err();
        assert_eq!(e.path, "/spec/replicas");
        assert_eq!(
            e.message,
            "param(): no parameter at `/size/replicas` and no default"
        );
        assert!(err("{{ param('replicas') }}", json!({})).contains("not a JSON pointer"));
        assert!(err("{{ param(3) }}", json!({})).contains("`pointer` must be a string"));
    }

    // -- registry ---------------------------------------------------------------------------

    #[test]
    fn registry_reads_earlier_entries() {
        let r = Renderer::new();
        let ctx = json!({"registry": {"password": "hunter2", "port": 5432}});
        assert_eq!(
            r.render(&json!("{{ registry('port') }}"), &ctx).unwrap(),
            json!(5432)
        );
        let e = r
            .render(&json!("{{ registry('user') }}"), &ctx)
            .unwrap_err();
        assert_eq!(e.message, "registry(): no registry entry `user` (yet)");
        assert!(!e.message.contains("hunter2"));
        let e = r
            .render(&json!("{{ registry('user') }}"), &json!({}))
            .unwrap_err();
        assert_eq!(e.message, "registry(): no registry entry `user` (yet)");
        // The map stays a map.
        let out = r
            .render(
                &json!({"a": "{{ registry.port }}", "b": "{{ registry['port'] }}", "all": "{{ registry }}", "gone": "{{ registry.nope }}"}),
                &ctx,
            )
            .unwrap();
        assert_eq!(
            out,
            json!({"a": 5432, "b": 5432, "all": {"password": "hunter2", "port": 5432}})
        );
    }

    // -- required ---------------------------------------------------------------------------

    #[test]
    fn required_passes_values_and_rejects_missing_ones() {
        let p = json!({"name": "db", "zero": 0, "empty": ""});
        assert_eq!(
            ok("{{ required(parameters.name) }}", p.clone()),
            json!("db")
        );
        assert_eq!(ok("{{ parameters.zero | required }}", p.clone()), json!(0));
        assert_eq!(
            err(
                "{{ required(parameters.nope, 'name is needed') }}",
                p.clone()
            ),
            "name is needed"
        );
        assert_eq!(
            err(
                "{{ parameters.empty | required('name is needed') }}",
                p.clone()
            ),
            "name is needed"
        );
        assert_eq!(
            err("{{ required(none) }}", p.clone()),
            "required(): a required value is missing"
        );
        assert_eq!(
            err("{{ required(param('/nope', none), message='x?') }}", p),
            "x?"
        );
    }
}
