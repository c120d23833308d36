//! The template function library.
//!
//! Every function here is pure apart from randomness and the clock: none reads a file, the
//! environment or the network. They are registered on the [`Renderer`](crate::template::Renderer)'s
//! minijinja environment as global functions, and those that transform one value also as filters,
//! so `{{ b64encode(x) }}` and `{{ x | b64encode }}` are the same. Arguments after the first can
//! be given by position or by name (`password(24, alphabet="abc")`).
//!
//! | function | result |
//! | --- | --- |
//! | `param(pointer, default?)` | the value at a JSON pointer into `parameters` |
//! | `registry(key)` | the value of an earlier registry entry (the `registry` context value) |
//! | `required(value, message?)` | `value`, or an error when it is undefined, none or `""` |
//! | `password(len, alphabet?)` | a random string, uniform over the alphabet |
//! | `pet_name(words?, sep?)` | a random readable name, `"brave-otter"` |
//! | `private_key(kind, bits?)` | a fresh PKCS#8 PEM private key |
//! | `certificate(key, cn, lifetime?, usage?, sans?, ca_key?, ca_cert?)` | a PEM X.509 certificate |
//! | `b64encode`, `b64decode`, `tojson`, `sha256`, `upper`, `lower` | string transforms |
//! | `safe_name(text, max_len?)` | `text` as a database-safe identifier |
//! | `opaque_name(prefix, value, max_len?)` | `prefix` and a keyed hash of `value`: a name that tells nothing about `value` |
//!
//! Randomness comes from one ChaCha20 generator per renderer: seeded from the operating system by
//! default, or from a fixed seed ([`Renderer::with_seed`](crate::template::Renderer::with_seed)) so
//! that `password`, `pet_name` and certificate serial numbers are reproducible. Keys always come
//! from the operating system's generator (ring's and the `rsa` crate's), so private keys — and
//! therefore certificates — differ on every render even with a seed.
//!
//! Errors name the function and the argument at fault, never the argument's value: a value may be a
//! user's parameter or a generated secret, and errors end up in logs and in OSB responses.
//!
//! The functions live by kind: `lookup` (`param`, `registry`, `required`), `random`
//! (`password`, `pet_name`), `pki` (`private_key`, `certificate`) and `transforms` (encodings,
//! digests, `safe_name`, `opaque_name`, case). This module registers them; `args` binds their
//! arguments and `rng` holds the shared generator. `opaque_name` hashes under the broker's [`NamesKey`], which the renderer is given
//! once (see [`crate::names`]).

use std::sync::{Arc, OnceLock};

use minijinja::Environment;
use minijinja::value::{Rest, ValueOrKwargs};

use crate::names::NamesKey;

mod args;
mod lookup;
mod pki;
mod random;
mod rng;
mod transforms;

pub(crate) use lookup::with_callable_registry;
pub use random::{MAX_PASSWORD_LEN, MAX_PET_NAME_WORDS};

use lookup::{param, registry, required};
use pki::{certificate, private_key};
use random::{password, pet_name};
use rng::SharedRng;
use transforms::{b64decode, b64encode, lower, opaque_name, safe_name, sha256, tojson, upper};

/// The names of every function this module adds to the template environment.
pub const FUNCTIONS: &[&str] = &[
    "param",
    "registry",
    "required",
    "password",
    "pet_name",
    "private_key",
    "certificate",
    "b64encode",
    "b64decode",
    "tojson",
    "sha256",
    "safe_name",
    "opaque_name",
    "upper",
    "lower",
];

/// Adds the function library to `env`; `rng` feeds `password`, `pet_name` and serial numbers,
/// `names` holds (once given) the key of `opaque_name`.
pub(crate) fn register(
    env: &mut Environment<'static>,
    rng: &SharedRng,
    names: &Arc<OnceLock<NamesKey>>,
) {
    env.add_function("param", param);
    env.add_function("registry", registry);

    let r = rng.clone();
    env.add_function("password", move |args: Rest<ValueOrKwargs>| {
        password(&r, args)
    });
    let r = rng.clone();
    env.add_function("pet_name", move |args: Rest<ValueOrKwargs>| {
        pet_name(&r, args)
    });
    env.add_function("private_key", private_key);
    env.add_function("safe_name", safe_name);
    let n = names.clone();
    env.add_function("opaque_name", move |args: Rest<ValueOrKwargs>| {
        opaque_name(n.get(), args)
    });
    let r = rng.clone();
    let cert = move |args: Rest<ValueOrKwargs>| certificate(&r, args);
    env.add_function("certificate", cert.clone());
    env.add_filter("certificate", cert);

    // One-value transforms are filters as well as functions.
    macro_rules! both {
        ($($name:literal => $f:expr),* $(,)?) => {$(
            env.add_function($name, $f);
            env.add_filter($name, $f);
        )*};
    }
    both! {
        "required" => required,
        "b64encode" => b64encode,
        "b64decode" => b64decode,
        "tojson" => tojson,
        "sha256" => sha256,
        "upper" => upper,
        "lower" => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{Renderer, TemplateError};
    use serde_json::{Value as Json, json};

    pub(super) fn eval(r: &Renderer, expr: &str, params: Json) -> Result<Json, TemplateError> {
        r.render(&json!(expr), &json!({ "parameters": params }))
    }

    /// A renderer with the public render-only names key.
    fn renderer() -> Renderer {
        Renderer::new().with_names_key(crate::NamesKey::RENDER_ONLY)
    }

    pub(super) fn ok(expr: &str, params: Json) -> Json {
        eval(&renderer(), expr, params).unwrap()
    }

    pub(super) fn err(expr: &str, params: Json) -> String {
        eval(&renderer(), expr, params).unwrap_err().message
    }

    pub(super) fn text(expr: &str) -> String {
        ok(expr, json!({})).as_str().unwrap().to_owned()
    }

    /// A fresh private key of `kind`, as a template makes it.
    pub(super) fn key(kind: &str) -> String {
        text(&format!("{{{{ private_key('{kind}') }}}}"))
    }

    // -- arguments --------------------------------------------------------------------------

    #[test]
    fn arguments_bind_by_position_or_name() {
        assert_eq!(text("{{ password(5, 'ab') }}").len(), 5);
        assert_eq!(text("{{ password(len=5, alphabet='ab') }}").len(), 5);
        assert_eq!(text("{{ password(5, alphabet='ab') }}").len(), 5);
        assert!(err("{{ password(5, size=3) }}", json!({})).contains("no argument named `size`"));
        assert!(err("{{ password(5, len=5) }}", json!({})).contains("got `len` twice"));
        assert!(err("{{ password(5, 'ab', 3) }}", json!({})).contains("at most 2 arguments"));
        assert!(err("{{ password() }}", json!({})).contains("`len` is required"));
    }

    // -- secrets stay out of errors ---------------------------------------------------------

    #[test]
    fn errors_never_contain_parameter_values() {
        const SECRET: &str = "S3cr3t-Value";
        let p = json!({"s": SECRET, "n": {"deep": SECRET}, "list": [SECRET]});
        for expr in [
            "{{ password(parameters.s) }}",
            "{{ password(8, parameters.list) }}",
            "{{ pet_name(parameters.s) }}",
            "{{ pet_name(2, parameters.n) }}",
            "{{ private_key(parameters.s) }}",
            "{{ private_key('rsa', parameters.s) }}",
            "{{ certificate(parameters.s, 'x') }}",
            "{{ certificate(private_key('ed25519'), parameters.s * 10) }}",
            "{{ certificate(private_key('ed25519'), 'x', parameters.s) }}",
            "{{ certificate(private_key('ed25519'), 'x', usage=parameters.s) }}",
            "{{ certificate(private_key('ed25519'), 'x', sans=[parameters.s ~ ' !']) }}",
            "{{ certificate(private_key('ed25519'), 'x', ca_key=parameters.s, ca_cert=parameters.s) }}",
            "{{ b64decode(parameters.s) }}",
            "{{ b64encode(parameters.n) }}",
            "{{ sha256(parameters.list) }}",
            "{{ opaque_name(parameters.s, 'x') }}",
            "{{ opaque_name('p_', parameters.s, parameters.s) }}",
            "{{ upper(parameters.n) }}",
            "{{ required(parameters.n.nope) }}",
            "{{ param(parameters.list) }}",
            "{{ parameters.s + 1 }}",
            "{{ parameters.s.nope.deeper }}",
            "{{ param('/s') | merge(1) }}",
        ] {
            let e = eval(&Renderer::new(), expr, p.clone()).unwrap_err();
            assert!(!e.to_string().contains(SECRET), "{expr}: {e}");
        }
    }

    #[test]
    fn errors_never_contain_generated_secrets() {
        // With a seed, the password a failing expression generates is known in advance.
        let pw = eval(&Renderer::with_seed(3), "{{ password(40) }}", json!({})).unwrap();
        let pw = pw.as_str().unwrap();
        for expr in [
            "{{ certificate(password(40), 'x') }}",
            "{{ b64decode(password(40) ~ '!') }}",
            "{{ certificate(private_key('ed25519'), password(40) ~ password(40)) }}",
            "{{ certificate(private_key('ed25519'), 'x', password(40)) }}",
            "{{ private_key(password(40)) }}",
        ] {
            let e = eval(&Renderer::with_seed(3), expr, json!({})).unwrap_err();
            assert!(!e.to_string().contains(pw), "{expr}: {e}");
        }
        let k = key("ed25519");
        let body: String = k.lines().nth(1).unwrap().chars().take(20).collect();
        let e = Renderer::new()
            .render(
                &json!("{{ certificate(k, 'x', ca_key=k, ca_cert=k) }}"),
                &json!({"k": k}),
            )
            .unwrap_err();
        assert!(!e.to_string().contains(&body), "{e}");
    }

    #[test]
    fn every_function_is_registered() {
        let r = Renderer::new();
        for name in FUNCTIONS {
            let out = r
                .render(&json!(format!("{{{{ {name} is defined }}}}")), &json!({}))
                .unwrap();
            assert_eq!(out, json!(true), "{name}");
        }
    }
}
