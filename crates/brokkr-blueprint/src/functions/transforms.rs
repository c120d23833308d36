//! Transforms of one string: base64, JSON text, SHA-256, database-safe names, opaque names and
//! case.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use minijinja::value::{Rest, ValueOrKwargs};
use minijinja::{Error, Value};

use super::args::{Args, fail, one_str};
use crate::names::{MIN_DIGEST_CHARS, NamesKey};

/// Standard base64 alphabet; padding optional when decoding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `b64encode(s)`: standard base64 of the UTF-8 bytes of `s`, padded.
pub(super) fn b64encode(value: Value) -> Result<Value, Error> {
    Ok(Value::from(BASE64.encode(one_str("b64encode", &value)?)))
}

/// `b64decode(s)`: the text whose standard base64 is `s` (padding optional); must be UTF-8.
pub(super) fn b64decode(value: Value) -> Result<Value, Error> {
    let bytes = BASE64
        .decode(one_str("b64decode", &value)?.trim())
        .map_err(|_| fail("b64decode", "input is not valid base64"))?;
    String::from_utf8(bytes)
        .map(Value::from)
        .map_err(|_| fail("b64decode", "decoded bytes are not UTF-8 text"))
}

/// `tojson(v)`: compact JSON text of any value (no HTML escaping, key order kept).
pub(super) fn tojson(value: Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Err(fail("tojson", "needs a value, got undefined"));
    }
    serde_json::to_string(&value)
        .map(Value::from)
        .map_err(|_| fail("tojson", "value cannot be written as JSON"))
}

/// `sha256(s)`: lowercase hex SHA-256 of the UTF-8 bytes of `s`.
pub(super) fn sha256(value: Value) -> Result<Value, Error> {
    let digest = ring::digest::digest(&ring::digest::SHA256, one_str("sha256", &value)?.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Value::from(hex))
}

/// Longest name `safe_name` may be asked for (MySQL user names allow 32, PostgreSQL 63).
const MAX_SAFE_NAME_LEN: i64 = 128;
/// Shortest: room for a readable part, `_` and the digest.
const MIN_SAFE_NAME_LEN: i64 = 24;
/// Characters of the digest suffix: 20 base32 characters carry 100 bits of SHA-256.
const SAFE_NAME_DIGEST: usize = 20;

/// `safe_name(text, max_len?)`: `text` as a database-safe identifier of at most `max_len`
/// (default 63) characters: lower-case ASCII letters, digits and `_`, starting with a letter.
/// Every name is a readable, sanitized and shortened form of `text` followed by `_` and 100 bits
/// of its SHA-256 in base32, so two texts get the same name only if SHA-256 collides: tenants who
/// choose their instance ids cannot choose another instance's names.
pub(super) fn safe_name(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("safe_name", &["text", "max_len"], args)?;
    let text = a.req_str(0)?;
    let max = usize::try_from(a.int_in(1, Some(63), MIN_SAFE_NAME_LEN..=MAX_SAFE_NAME_LEN)?)
        .unwrap_or(63);
    let mut readable: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if !readable.starts_with(|c: char| c.is_ascii_lowercase()) {
        readable.insert(0, 'n');
    }
    readable.truncate(max - SAFE_NAME_DIGEST - 1);
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut suffix = data_encoding::BASE32_NOPAD
        .encode(digest.as_ref())
        .to_ascii_lowercase();
    suffix.truncate(SAFE_NAME_DIGEST);
    Ok(Value::from(format!("{readable}_{suffix}")))
}

/// Longest prefix `opaque_name` takes.
const MAX_OPAQUE_PREFIX: usize = 16;

/// `opaque_name(prefix, value, max_len?)`: `prefix` followed by a lower-case base32 HMAC-SHA256
/// of `value` (a string, or a list of strings and numbers, hashed as JSON so that list items
/// never run into each other) under the broker's names key: up to 26 characters (130 bits), as
/// many as fit in `max_len` (default 63), never fewer than 16 (80 bits). The name is the same on
/// every replica and after every restart, yet tells nothing about `value` to whoever does not
/// hold the key. `prefix` is 1 to 16 of lower-case letters, digits and `_`, starting with a
/// letter, so the name is a valid unquoted identifier on PostgreSQL, MySQL and Redis.
pub(super) fn opaque_name(
    key: Option<&NamesKey>,
    args: Rest<ValueOrKwargs>,
) -> Result<Value, Error> {
    let a = Args::bind("opaque_name", &["prefix", "value", "max_len"], args)?;
    let prefix = a.req_str(0)?;
    let valid = prefix.len() <= MAX_OPAQUE_PREFIX
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(fail(
            "opaque_name",
            format!(
                "`prefix` must be 1 to {MAX_OPAQUE_PREFIX} of a-z, 0-9 and `_`, starting with a \
                 letter"
            ),
        ));
    }
    let value = a.req(1)?;
    let value = serde_json::to_value(value)
        .ok()
        .filter(|v| match v {
            serde_json::Value::String(_) => true,
            serde_json::Value::Array(items) => items.iter().all(|i| i.is_string() || i.is_number()),
            _ => false,
        })
        .ok_or_else(|| {
            fail(
                "opaque_name",
                "`value` must be a string or a list of strings and numbers",
            )
        })?;
    let max = usize::try_from(a.int_in(2, Some(63), 20..=MAX_SAFE_NAME_LEN)?).unwrap_or(63);
    let Some(key) = key else {
        return Err(fail(
            "opaque_name",
            "the broker's names key is not loaded (it comes from the store when the engine starts)",
        ));
    };
    key.name(prefix, &value, max)
        .map(Value::from)
        .ok_or_else(|| {
            fail(
                "opaque_name",
                format!(
                    "`max_len` leaves fewer than {MIN_DIGEST_CHARS} characters after the prefix"
                ),
            )
        })
}

/// `upper(s)`: `s` in upper case (Unicode).
pub(super) fn upper(value: Value) -> Result<Value, Error> {
    Ok(Value::from(one_str("upper", &value)?.to_uppercase()))
}

/// `lower(s)`: `s` in lower case (Unicode).
pub(super) fn lower(value: Value) -> Result<Value, Error> {
    Ok(Value::from(one_str("lower", &value)?.to_lowercase()))
}

#[cfg(test)]
mod tests {
    use crate::functions::tests::{err, ok};
    use serde_json::json;

    // -- safe_name --------------------------------------------------------------------------

    #[test]
    fn safe_names_are_valid_and_never_shared_by_two_texts() {
        let name = |text: &str, max: u32| {
            ok(
                "{{ safe_name(param('/t'), param('/m')) }}",
                json!({"t": text, "m": max}),
            )
            .as_str()
            .unwrap()
            .to_owned()
        };
        let victim_id = "7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc";
        let victim = name(&format!("db_{victim_id}"), 63);
        // A tenant that chooses its id as the victim's name without the prefix (the name is
        // already a valid identifier) gets a name of its own.
        let crafted = victim.strip_prefix("db_").unwrap();
        assert_ne!(name(&format!("db_{crafted}"), 63), victim);
        // Texts that sanitize alike stay apart.
        let alike = ["a-b", "a_b", "A_b", "a.b", "a b"].map(|t| name(t, 63));
        let distinct: std::collections::BTreeSet<_> = alike.iter().collect();
        assert_eq!(distinct.len(), alike.len(), "{alike:?}");
        for (text, max) in [
            ("", 24),
            ("9lives", 63),
            (&"x".repeat(300) as &str, 32),
            ("Ünïcode ✓", 40),
        ] {
            let n = name(text, max);
            assert!(n.len() <= max as usize, "{n}");
            assert!(n.starts_with(|c: char| c.is_ascii_lowercase()), "{n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{n}"
            );
        }
        assert!(err("{{ safe_name('a', 23) }}", json!({})).contains("24"));
    }

    // -- opaque_name ------------------------------------------------------------------------

    #[test]
    fn opaque_names_hide_their_value_and_fit() {
        let id = "7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc";
        let p = json!({"id": id, "b": "b-1"});
        let db = ok("{{ opaque_name('db_', param('/id')) }}", p.clone());
        let db = db.as_str().unwrap();
        assert_eq!(db.len(), 29, "{db}");
        assert!(db.starts_with("db_"));
        assert!(!db.contains("7b7c") && !db.contains(&id.replace('-', "_")[..8]));
        assert!(
            db[3..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(ok("{{ opaque_name('db_', param('/id')) }}", p.clone()), db);
        let user = ok(
            "{{ opaque_name('u_', [param('/id'), param('/b')], 20) }}",
            p.clone(),
        );
        assert_eq!(user.as_str().unwrap().len(), 20);
        assert_ne!(
            ok(
                "{{ opaque_name('u_', [param('/id') ~ 'x', param('/b')]) }}",
                p.clone()
            ),
            ok(
                "{{ opaque_name('u_', [param('/id'), 'x' ~ param('/b')]) }}",
                p.clone()
            )
        );
        for (expr, says) in [
            ("{{ opaque_name('Db', 'x') }}", "`prefix`"),
            ("{{ opaque_name('1_', 'x') }}", "`prefix`"),
            ("{{ opaque_name('a_very_long_prefix_', 'x') }}", "`prefix`"),
            ("{{ opaque_name('db_', none) }}", "`value` is required"),
            ("{{ opaque_name('db_', {'a': 1}) }}", "`value` must be"),
            ("{{ opaque_name('db_', 'x', 18) }}", "`max_len`"),
            ("{{ opaque_name('db_abcdefgh', 'x', 24) }}", "fewer than 16"),
        ] {
            assert!(err(expr, json!({})).contains(says), "{expr}");
        }
    }

    #[test]
    fn opaque_names_need_the_key() {
        let e = crate::template::Renderer::new()
            .render(&json!("{{ opaque_name('db_', 'x') }}"), &json!({}))
            .unwrap_err();
        assert!(e.message.contains("names key is not loaded"), "{e}");
    }

    // -- transforms -------------------------------------------------------------------------

    #[test]
    fn base64_round_trips_text() {
        let p = json!({"s": "päss: wörd\n{{ x }}"});
        assert_eq!(ok("{{ b64encode('hello') }}", json!({})), json!("aGVsbG8="));
        assert_eq!(
            ok("{{ 'aGVsbG8=' | b64decode }}", json!({})),
            json!("hello")
        );
        assert_eq!(ok("{{ 'aGVsbG8' | b64decode }}", json!({})), json!("hello"));
        assert_eq!(
            ok("{{ parameters.s | b64encode | b64decode }}", p.clone()),
            p["s"]
        );
        assert_eq!(
            err("{{ b64decode('***') }}", json!({})),
            "b64decode(): input is not valid base64"
        );
        // 0xff 0xfe is not UTF-8.
        assert_eq!(
            err("{{ b64decode('//4=') }}", json!({})),
            "b64decode(): decoded bytes are not UTF-8 text"
        );
        assert_eq!(
            err("{{ b64encode(5) }}", json!({})),
            "b64encode(): takes a string, got number"
        );
    }

    #[test]
    fn tojson_writes_plain_json_text() {
        let p = json!({"cfg": {"b": [1, "<&>"], "a": null}});
        assert_eq!(
            ok("{{ parameters.cfg | tojson }}", p.clone()),
            json!(r#"{"b":[1,"<&>"],"a":null}"#)
        );
        assert_eq!(ok("{{ tojson('x\"y') }}", json!({})), json!(r#""x\"y""#));
        assert_eq!(ok("{{ tojson(none) }}", json!({})), json!("null"));
    }

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(
            ok("{{ sha256('abc') }}", json!({})),
            json!("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(
            ok("{{ '' | sha256 }}", json!({})),
            json!("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
    }

    #[test]
    fn upper_and_lower_are_functions_and_filters() {
        assert_eq!(ok("{{ upper('dB-ß') }}", json!({})), json!("DB-SS"));
        assert_eq!(ok("{{ 'DB-Ä' | lower }}", json!({})), json!("db-ä"));
        assert_eq!(
            ok("{{ lower(param('/n')) }}", json!({"n": "X"})),
            json!("x")
        );
        assert!(err("{{ upper(none) }}", json!({})).contains("upper(): needs a value"));
    }
}
