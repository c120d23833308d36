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
//!
//! Randomness comes from one ChaCha20 generator per renderer: seeded from the operating system by
//! default, or from a fixed seed ([`Renderer::with_seed`](crate::template::Renderer::with_seed)) so
//! that `password`, `pet_name` and certificate serial numbers are reproducible. Keys always come
//! from the operating system's generator (ring's and the `rsa` crate's), so private keys — and
//! therefore certificates — differ on every render even with a seed.
//!
//! Errors name the function and the argument at fault, never the argument's value: a value may be a
//! user's parameter or a generated secret, and errors end up in logs and in OSB responses.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use minijinja::value::{
    Enumerator, Kwargs, Object, Rest, Serde, ValueKind, ValueOrKwargs, from_args,
};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use rand::Rng;
use rand::rngs::ChaCha20Rng;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use time::OffsetDateTime;

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
    "upper",
    "lower",
];

/// The generator behind `password`, `pet_name` and certificate serial numbers.
pub(crate) type SharedRng = Arc<Mutex<ChaCha20Rng>>;

/// Longest `password` a template may ask for.
pub const MAX_PASSWORD_LEN: i64 = 1024;
/// Most words `pet_name` joins.
pub const MAX_PET_NAME_WORDS: i64 = 8;
/// Longest certificate lifetime accepted (100 years of 365 days).
const MAX_LIFETIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The default `password` alphabet.
const ALPHANUMERIC: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Adds the function library to `env`; `rng` feeds `password`, `pet_name` and serial numbers.
pub(crate) fn register(env: &mut Environment<'static>, rng: &SharedRng) {
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

// ---------------------------------------------------------------------------------------------
// Arguments

/// A function's arguments, bound to its parameter names by position or by keyword.
struct Args {
    func: &'static str,
    names: &'static [&'static str],
    values: Vec<Option<Value>>,
}

impl Args {
    fn bind(
        func: &'static str,
        names: &'static [&'static str],
        raw: Rest<ValueOrKwargs>,
    ) -> Result<Self, Error> {
        let raw = raw.into_values();
        let (positional, kwargs): (&[Value], Kwargs) = from_args(&raw)?;
        if positional.len() > names.len() {
            return Err(fail(
                func,
                format!("takes at most {} arguments", names.len()),
            ));
        }
        let mut values: Vec<Option<Value>> = positional.iter().cloned().map(Some).collect();
        values.resize(names.len(), None);
        for key in kwargs.args() {
            let Some(i) = names.iter().position(|n| *n == key) else {
                return Err(fail(func, format!("has no argument named `{key}`")));
            };
            if values[i].is_some() {
                return Err(fail(func, format!("got `{key}` twice")));
            }
            values[i] = Some(kwargs.get::<Value>(key)?);
        }
        Ok(Self {
            func,
            names,
            values,
        })
    }

    /// The argument, or `None` when it was not given or is undefined or none.
    fn opt(&self, i: usize) -> Option<&Value> {
        self.values[i]
            .as_ref()
            .filter(|v| !v.is_undefined() && !v.is_none())
    }

    fn req(&self, i: usize) -> Result<&Value, Error> {
        self.opt(i)
            .ok_or_else(|| fail(self.func, format!("`{}` is required", self.names[i])))
    }

    fn req_str(&self, i: usize) -> Result<&str, Error> {
        let v = self.req(i)?;
        v.as_str()
            .ok_or_else(|| fail(self.func, format!("`{}` must be a string", self.names[i])))
    }

    fn opt_str(&self, i: usize) -> Result<Option<&str>, Error> {
        self.opt(i)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| fail(self.func, format!("`{}` must be a string", self.names[i])))
            })
            .transpose()
    }

    /// An integer argument in `range`, or `default` when absent.
    fn int_in(
        &self,
        i: usize,
        default: Option<i64>,
        range: std::ops::RangeInclusive<i64>,
    ) -> Result<i64, Error> {
        let out_of_range = || {
            fail(
                self.func,
                format!(
                    "`{}` must be an integer from {} to {}",
                    self.names[i],
                    range.start(),
                    range.end()
                ),
            )
        };
        let n = match (self.opt(i), default) {
            (Some(v), _) => v.as_i64().ok_or_else(out_of_range)?,
            (None, Some(d)) => d,
            (None, None) => {
                return Err(fail(self.func, format!("`{}` is required", self.names[i])));
            }
        };
        if range.contains(&n) {
            Ok(n)
        } else {
            Err(out_of_range())
        }
    }
}

/// An error from function `func`; `what` must never contain an argument's value.
fn fail(func: &str, what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{func}(): {what}"))
}

/// The single string a transform works on.
fn one_str<'a>(func: &'static str, value: &'a Value) -> Result<&'a str, Error> {
    if value.is_undefined() || value.is_none() {
        return Err(fail(func, "needs a value, got none"));
    }
    value
        .as_str()
        .ok_or_else(|| fail(func, format!("takes a string, got {}", value.kind())))
}

// ---------------------------------------------------------------------------------------------
// Lookups

/// `param(pointer, default?)`: the value at JSON pointer `pointer` in `parameters`.
fn param(state: &State, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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
fn registry(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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
fn required(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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

// ---------------------------------------------------------------------------------------------
// Random values

/// A uniform index below `n` (`0 < n <= u32::MAX`), by rejection sampling: draws at or above the
/// largest multiple of `n` that fits in 32 bits are thrown away, so no index is favoured.
pub(crate) fn uniform_index(rng: &mut impl Rng, n: usize) -> usize {
    let n = u64::try_from(n).expect("n fits in u64");
    assert!(
        n > 0 && n <= u64::from(u32::MAX),
        "index bound out of range"
    );
    let zone = (1u64 << 32) / n * n;
    loop {
        let x = u64::from(rng.next_u32());
        if x < zone {
            return usize::try_from(x % n).expect("index fits in usize");
        }
    }
}

fn lock(rng: &SharedRng) -> std::sync::MutexGuard<'_, ChaCha20Rng> {
    // The generator holds no invariant a panic could break.
    rng.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `password(len, alphabet?)`: `len` characters drawn uniformly and independently from the
/// distinct characters of `alphabet` (letters and digits by default).
fn password(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("password", &["len", "alphabet"], args)?;
    let len = a.int_in(0, None, 1..=MAX_PASSWORD_LEN)?;
    let mut alphabet: Vec<char> = Vec::new();
    for c in a.opt_str(1)?.unwrap_or(ALPHANUMERIC).chars() {
        if !alphabet.contains(&c) {
            alphabet.push(c);
        }
    }
    if alphabet.len() < 2 {
        return Err(fail(
            "password",
            "`alphabet` needs at least 2 distinct characters",
        ));
    }
    let mut rng = lock(rng);
    let out: String = (0..len)
        .map(|_| alphabet[uniform_index(&mut *rng, alphabet.len())])
        .collect();
    Ok(Value::from(out))
}

/// `pet_name(words?, sep?)`: `words - 1` adjectives and an animal, joined by `sep`.
fn pet_name(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("pet_name", &["words", "sep"], args)?;
    let words = a.int_in(0, Some(2), 1..=MAX_PET_NAME_WORDS)?;
    let sep = a.opt_str(1)?.unwrap_or("-");
    let mut rng = lock(rng);
    let mut parts: Vec<&str> = (1..words)
        .map(|_| ADJECTIVES[uniform_index(&mut *rng, ADJECTIVES.len())])
        .collect();
    parts.push(ANIMALS[uniform_index(&mut *rng, ANIMALS.len())]);
    Ok(Value::from(parts.join(sep)))
}

/// Adjectives for `pet_name`: lowercase ASCII, at most 8 letters, safe in DNS labels.
const ADJECTIVES: &[&str] = &[
    "able", "active", "agile", "amber", "ample", "azure", "bold", "brave", "bright", "brisk",
    "calm", "candid", "cheery", "civil", "clever", "cosmic", "cozy", "crisp", "curious", "daring",
    "dapper", "deft", "eager", "early", "easy", "epic", "exact", "fair", "famous", "fancy", "fast",
    "fine", "fit", "fluent", "fond", "free", "fresh", "frank", "gentle", "giant", "glad", "golden",
    "grand", "great", "happy", "hardy", "hearty", "honest", "humble", "ideal", "jolly", "just",
    "keen", "kind", "lively", "loyal", "lucky", "lunar", "merry", "mighty", "modest", "neat",
    "nimble", "noble", "polite", "proud", "quick", "quiet", "rapid", "ready", "robust", "rosy",
    "sharp", "shiny", "silent", "simple", "sincere", "smart", "snappy", "solar", "solid", "sound",
    "steady", "stellar", "sturdy", "sunny", "superb", "swift", "tender", "tidy", "tough", "trusty",
    "upbeat", "vast", "vivid", "warm", "wise", "witty", "young", "zesty",
];

/// Animals for `pet_name`: lowercase ASCII, at most 8 letters, safe in DNS labels.
const ANIMALS: &[&str] = &[
    "alpaca", "ant", "badger", "bat", "bear", "beaver", "bee", "bison", "boar", "bobcat", "camel",
    "carp", "cat", "cheetah", "cobra", "condor", "cougar", "coyote", "crab", "crane", "crow",
    "deer", "dingo", "dog", "dolphin", "donkey", "dove", "duck", "eagle", "eel", "elk", "emu",
    "falcon", "ferret", "finch", "fox", "frog", "gazelle", "gecko", "gibbon", "goat", "goose",
    "gopher", "heron", "horse", "hyena", "ibex", "ibis", "impala", "jackal", "jaguar", "koala",
    "krill", "lemur", "lion", "llama", "lynx", "magpie", "marten", "mink", "mole", "moose", "moth",
    "mouse", "mule", "newt", "ocelot", "orca", "oriole", "osprey", "otter", "owl", "ox", "panda",
    "panther", "parrot", "pelican", "penguin", "pika", "puffin", "puma", "quail", "rabbit",
    "raven", "robin", "salmon", "seal", "shark", "sloth", "snail", "sparrow", "squid", "stork",
    "swan", "tapir", "tiger", "toad", "trout", "turtle", "viper", "walrus", "wombat", "wren",
    "yak", "zebra",
];

// ---------------------------------------------------------------------------------------------
// Keys and certificates

/// `private_key(kind, bits?)`: a new private key as a PKCS#8 PEM string.
fn private_key(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("private_key", &["kind", "bits"], args)?;
    let kind = a.req_str(0)?;
    let alg = match kind {
        "rsa" => {
            let bits = a.int_in(1, Some(2048), 2048..=4096)?;
            if ![2048, 3072, 4096].contains(&bits) {
                return Err(fail("private_key", "`bits` must be 2048, 3072 or 4096"));
            }
            return rsa_key(bits as usize).map(Value::from);
        }
        "ecdsa-p256" => &rcgen::PKCS_ECDSA_P256_SHA256,
        "ecdsa-p384" => &rcgen::PKCS_ECDSA_P384_SHA384,
        "ed25519" => &rcgen::PKCS_ED25519,
        _ => {
            return Err(fail(
                "private_key",
                "`kind` must be one of rsa, ecdsa-p256, ecdsa-p384, ed25519",
            ));
        }
    };
    if a.opt(1).is_some() {
        return Err(fail("private_key", "`bits` applies to rsa keys only"));
    }
    let key =
        KeyPair::generate_for(alg).map_err(|_| fail("private_key", "key generation failed"))?;
    Ok(Value::from(key.serialize_pem()))
}

/// A new RSA key with the `rsa` crate (ring cannot generate RSA keys), as PKCS#8 PEM.
fn rsa_key(bits: usize) -> Result<String, Error> {
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits)
        .map_err(|_| fail("private_key", "RSA key generation failed"))?;
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|_| fail("private_key", "RSA key encoding failed"))?;
    Ok(pem.as_str().to_owned())
}

fn is_rsa(key: &KeyPair) -> bool {
    [
        &rcgen::PKCS_RSA_SHA256,
        &rcgen::PKCS_RSA_SHA384,
        &rcgen::PKCS_RSA_SHA512,
    ]
    .contains(&key.algorithm())
}

/// What a certificate is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Usage {
    Server,
    Client,
    Ca,
}

/// `certificate(key, cn, lifetime="365d", usage="server", sans=[], ca_key=none, ca_cert=none)`.
fn certificate(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    const F: &str = "certificate";
    let a = Args::bind(
        F,
        &[
            "key", "cn", "lifetime", "usage", "sans", "ca_key", "ca_cert",
        ],
        args,
    )?;
    let key = KeyPair::from_pem(a.req_str(0)?)
        .map_err(|_| fail(F, "`key` is not a PKCS#8 PEM private key"))?;
    let cn = a.req_str(1)?;
    if cn.is_empty() || cn.chars().count() > 64 {
        return Err(fail(F, "`cn` must have 1 to 64 characters"));
    }
    let lifetime = humantime::parse_duration(a.opt_str(2)?.unwrap_or("365d"))
        .ok()
        .filter(|d| d.as_secs() > 0 && *d <= MAX_LIFETIME)
        .ok_or_else(|| {
            fail(
                F,
                "`lifetime` must be a duration from 1s to 100 years, such as \"90d\"",
            )
        })?;
    let usage = match a.opt_str(3)?.unwrap_or("server") {
        "server" => Usage::Server,
        "client" => Usage::Client,
        "ca" => Usage::Ca,
        _ => return Err(fail(F, "`usage` must be server, client or ca")),
    };
    let sans = match a.opt(4) {
        None => Vec::new(),
        Some(v) if v.kind() == ValueKind::Seq => v
            .try_iter()?
            .enumerate()
            .map(|(i, san)| san_type(i, &san))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(fail(F, "`sans` must be a list of strings")),
    };

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.subject_alt_names = sans;
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("0 is a valid nanosecond");
    params.not_before = now;
    params.not_after = now + lifetime;
    let mut serial = [0u8; 16];
    lock(rng).fill_bytes(&mut serial);
    serial[0] = (serial[0] & 0x7f) | 0x40; // positive, and always 16 bytes long
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    match usage {
        Usage::Ca => {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
        }
        Usage::Server | Usage::Client => {
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            if is_rsa(&key) {
                params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
            }
            params.extended_key_usages = vec![if usage == Usage::Server {
                ExtendedKeyUsagePurpose::ServerAuth
            } else {
                ExtendedKeyUsagePurpose::ClientAuth
            }];
        }
    }

    let cert = match (a.opt_str(5)?, a.opt_str(6)?) {
        (None, None) => params.self_signed(&key),
        (Some(ca_key), Some(ca_cert)) => {
            let ca_key = KeyPair::from_pem(ca_key)
                .map_err(|_| fail(F, "`ca_key` is not a PKCS#8 PEM private key"))?;
            let ca_not_after = check_ca(&ca_key, ca_cert)?;
            if ca_not_after <= now {
                return Err(fail(F, "`ca_cert` has expired"));
            }
            // A certificate never outlives its CA.
            params.not_after = params.not_after.min(ca_not_after);
            params.use_authority_key_identifier_extension = true;
            let issuer = Issuer::from_ca_cert_pem(ca_cert, &ca_key)
                .map_err(|_| fail(F, "`ca_cert` is not a PEM certificate"))?;
            params.signed_by(&key, &issuer)
        }
        _ => return Err(fail(F, "`ca_key` and `ca_cert` go together")),
    }
    .map_err(|_| fail(F, "signing failed"))?;
    Ok(Value::from(cert.pem()))
}

/// One SAN: an IP address, or else a DNS name.
fn san_type(i: usize, san: &Value) -> Result<SanType, Error> {
    let bad = || {
        fail(
            "certificate",
            format!("`sans` entry {i} is not a DNS name or an IP address"),
        )
    };
    let s = san.as_str().ok_or_else(bad)?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns_ok = !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'*'));
    if !dns_ok {
        return Err(bad());
    }
    Ok(SanType::DnsName(s.try_into().map_err(|_| bad())?))
}

/// Checks that `ca_cert` is a CA certificate for `ca_key`; returns its expiry.
fn check_ca(ca_key: &KeyPair, ca_cert: &str) -> Result<OffsetDateTime, Error> {
    const F: &str = "certificate";
    let not_pem = || fail(F, "`ca_cert` is not a PEM certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_cert.as_bytes()).map_err(|_| not_pem())?;
    let cert = pem.parse_x509().map_err(|_| not_pem())?;
    if !cert.is_ca() {
        return Err(fail(F, "`ca_cert` is not a CA certificate"));
    }
    if let Ok(Some(ku)) = cert.key_usage()
        && !ku.value.key_cert_sign()
    {
        return Err(fail(
            F,
            "`ca_cert` may not sign certificates (no keyCertSign)",
        ));
    }
    if cert.public_key().raw != ca_key.subject_public_key_info().as_slice() {
        return Err(fail(F, "`ca_key` is not the key of `ca_cert`"));
    }
    OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp())
        .map_err(|_| fail(F, "`ca_cert` has an unusable expiry"))
}

// ---------------------------------------------------------------------------------------------
// Transforms

/// Standard base64 alphabet; padding optional when decoding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `b64encode(s)`: standard base64 of the UTF-8 bytes of `s`, padded.
fn b64encode(value: Value) -> Result<Value, Error> {
    Ok(Value::from(BASE64.encode(one_str("b64encode", &value)?)))
}

/// `b64decode(s)`: the text whose standard base64 is `s` (padding optional); must be UTF-8.
fn b64decode(value: Value) -> Result<Value, Error> {
    let bytes = BASE64
        .decode(one_str("b64decode", &value)?.trim())
        .map_err(|_| fail("b64decode", "input is not valid base64"))?;
    String::from_utf8(bytes)
        .map(Value::from)
        .map_err(|_| fail("b64decode", "decoded bytes are not UTF-8 text"))
}

/// `tojson(v)`: compact JSON text of any value (no HTML escaping, key order kept).
fn tojson(value: Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Err(fail("tojson", "needs a value, got undefined"));
    }
    serde_json::to_string(&value)
        .map(Value::from)
        .map_err(|_| fail("tojson", "value cannot be written as JSON"))
}

/// `sha256(s)`: lowercase hex SHA-256 of the UTF-8 bytes of `s`.
fn sha256(value: Value) -> Result<Value, Error> {
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
fn safe_name(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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

/// `upper(s)`: `s` in upper case (Unicode).
fn upper(value: Value) -> Result<Value, Error> {
    Ok(Value::from(one_str("upper", &value)?.to_uppercase()))
}

/// `lower(s)`: `s` in lower case (Unicode).
fn lower(value: Value) -> Result<Value, Error> {
    Ok(Value::from(one_str("lower", &value)?.to_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{Renderer, TemplateError};
    use serde_json::{Value as Json, json};
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::X509Certificate;

    fn eval(r: &Renderer, expr: &str, params: Json) -> Result<Json, TemplateError> {
        r.render(&json!(expr), &json!({ "parameters": params }))
    }

    fn ok(expr: &str, params: Json) -> Json {
        eval(&Renderer::new(), expr, params).unwrap()
    }

    fn err(expr: &str, params: Json) -> String {
        eval(&Renderer::new(), expr, params).unwrap_err().message
    }

    fn text(expr: &str) -> String {
        ok(expr, json!({})).as_str().unwrap().to_owned()
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

    // -- password ---------------------------------------------------------------------------

    #[test]
    fn password_has_the_length_and_alphabet_asked_for() {
        let pw = text("{{ password(32) }}");
        assert_eq!(pw.len(), 32);
        assert!(pw.chars().all(|c| c.is_ascii_alphanumeric()));
        let pw = text("{{ password(1024, 'xyz') }}");
        assert_eq!(pw.chars().count(), 1024);
        assert!(pw.chars().all(|c| "xyz".contains(c)));
        for c in ['x', 'y', 'z'] {
            assert!(pw.contains(c));
        }
        let pw = text("{{ password(64, 'αβγ!') }}");
        assert_eq!(pw.chars().count(), 64);
        assert!(pw.chars().all(|c| "αβγ!".contains(c)));
        assert_eq!(text("{{ password(1) }}").len(), 1);
    }

    #[test]
    fn password_rejects_bad_lengths_and_alphabets() {
        for expr in [
            "{{ password(0) }}",
            "{{ password(1025) }}",
            "{{ password(-1) }}",
            "{{ password('8') }}",
            "{{ password(2.5) }}",
        ] {
            assert_eq!(
                err(expr, json!({})),
                "password(): `len` must be an integer from 1 to 1024",
                "{expr}"
            );
        }
        for expr in [
            "{{ password(8, 'a') }}",
            "{{ password(8, 'aaaa') }}",
            "{{ password(8, '') }}",
        ] {
            assert!(
                err(expr, json!({})).contains("at least 2 distinct"),
                "{expr}"
            );
        }
        assert!(err("{{ password(8, 5) }}", json!({})).contains("`alphabet` must be a string"));
    }

    #[test]
    fn seeds_make_passwords_and_names_reproducible() {
        let tree = json!({"pw": "{{ password(24) }}", "name": "{{ pet_name(3) }}"});
        let a = Renderer::with_seed(7);
        let b = Renderer::with_seed(7);
        let first = a.render(&tree, &json!({})).unwrap();
        assert_eq!(first, b.render(&tree, &json!({})).unwrap());
        // Successive renders draw successive values, still in step.
        let second = a.render(&tree, &json!({})).unwrap();
        assert_ne!(first, second);
        assert_eq!(second, b.render(&tree, &json!({})).unwrap());
        let other = Renderer::with_seed(8).render(&tree, &json!({})).unwrap();
        assert_ne!(first["pw"], other["pw"]);
        // Unseeded renderers differ from each other.
        let x = Renderer::new().render(&tree, &json!({})).unwrap();
        let y = Renderer::new().render(&tree, &json!({})).unwrap();
        assert_ne!(x["pw"], y["pw"]);
    }

    /// Pearson's chi-square statistic of `counts` against a uniform distribution.
    fn chi_square(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum()
    }

    #[test]
    fn password_characters_are_uniform_over_the_alphabet() {
        // 62 symbols (61 degrees of freedom: mean 61, sd 11); and a 7-symbol alphabet that does
        // not divide 2^32, where modulo reduction would be biased.
        for (alphabet, bound) in [
            (ALPHANUMERIC, 61.0 + 6.0 * 11.05),
            ("abcdefg", 6.0 + 6.0 * 3.5),
        ] {
            let r = Renderer::with_seed(42);
            let symbols: Vec<char> = alphabet.chars().collect();
            let mut counts = vec![0u64; symbols.len()];
            let mut first = vec![0u64; symbols.len()];
            for _ in 0..200 {
                let pw = r
                    .render(&json!("{{ password(1024, a) }}"), &json!({ "a": alphabet }))
                    .unwrap();
                let pw = pw.as_str().unwrap();
                for (i, c) in pw.chars().enumerate() {
                    let k = symbols.iter().position(|s| *s == c).unwrap();
                    counts[k] += 1;
                    if i == 0 {
                        first[k] += 1;
                    }
                }
            }
            let stat = chi_square(&counts);
            assert!(stat < bound, "chi-square {stat} over {alphabet}");
            assert!(counts.iter().all(|&c| c > 0));
        }
    }

    /// A generator that plays back fixed words, to watch rejection sampling at work.
    struct Script(Vec<u32>);

    impl rand::TryRng for Script {
        type Error = std::convert::Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            Ok(self.0.remove(0))
        }
        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            Ok(u64::from(self.0.remove(0)))
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            dst.fill(0);
            Ok(())
        }
    }

    #[test]
    fn uniform_index_rejects_the_biased_tail() {
        // 2^32 = 3 * 1431655765 + 1: only u32::MAX falls outside the last whole block of 3.
        let mut rng = Script(vec![u32::MAX, u32::MAX, 4]);
        assert_eq!(uniform_index(&mut rng, 3), 1);
        assert!(rng.0.is_empty(), "both tail draws are rejected");
        // 2^32 = 62 * 69273666 + 4: the last four words are rejected, the one below is kept.
        let zone = (1u64 << 32) / 62 * 62;
        let mut rng = Script(vec![u32::MAX, u32::MAX - 3, (zone - 1) as u32]);
        assert_eq!(uniform_index(&mut rng, 62), ((zone - 1) % 62) as usize);
        assert!(rng.0.is_empty());
        // Powers of two never reject.
        let mut rng = Script(vec![u32::MAX]);
        assert_eq!(uniform_index(&mut rng, 64), 63);
    }

    // -- pet_name ---------------------------------------------------------------------------

    #[test]
    fn pet_names_are_adjectives_then_an_animal() {
        let name = text("{{ pet_name() }}");
        let (adj, animal) = name.split_once('-').unwrap();
        assert!(
            ADJECTIVES.contains(&adj) && ANIMALS.contains(&animal),
            "{name}"
        );
        assert!(ANIMALS.contains(&text("{{ pet_name(1) }}").as_str()));
        let name = text("{{ pet_name(4, sep='_') }}");
        let parts: Vec<&str> = name.split('_').collect();
        assert_eq!(parts.len(), 4);
        assert!(parts[..3].iter().all(|w| ADJECTIVES.contains(w)));
        assert!(ANIMALS.contains(&parts[3]));
        assert!(err("{{ pet_name(0) }}", json!({})).contains("from 1 to 8"));
        assert!(err("{{ pet_name(9) }}", json!({})).contains("from 1 to 8"));
    }

    #[test]
    fn pet_name_words_are_dns_safe_and_unique() {
        for list in [ADJECTIVES, ANIMALS] {
            let mut seen = std::collections::HashSet::new();
            for w in list {
                assert!(
                    w.len() <= 8 && w.bytes().all(|b| b.is_ascii_lowercase()),
                    "{w}"
                );
                assert!(seen.insert(w), "{w} twice");
            }
        }
    }

    // -- keys -------------------------------------------------------------------------------

    fn key(kind: &str) -> String {
        text(&format!("{{{{ private_key('{kind}') }}}}"))
    }

    #[test]
    fn private_keys_are_pkcs8_pem_of_the_kind_asked_for() {
        for (kind, alg) in [
            ("ecdsa-p256", &rcgen::PKCS_ECDSA_P256_SHA256),
            ("ecdsa-p384", &rcgen::PKCS_ECDSA_P384_SHA384),
            ("ed25519", &rcgen::PKCS_ED25519),
            ("rsa", &rcgen::PKCS_RSA_SHA256),
        ] {
            let pem = key(kind);
            assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{kind}");
            assert!(
                pem.trim_end().ends_with("-----END PRIVATE KEY-----"),
                "{kind}"
            );
            let parsed = KeyPair::from_pem(&pem).unwrap();
            assert_eq!(parsed.algorithm(), alg, "{kind}");
        }
        assert_ne!(key("ed25519"), key("ed25519"));
    }

    #[test]
    fn rsa_keys_have_the_size_asked_for() {
        use rsa::pkcs8::DecodePrivateKey;
        use rsa::traits::PublicKeyParts;
        let pem = text("{{ private_key('rsa', 2048) }}");
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(&pem).unwrap();
        assert_eq!(key.size() * 8, 2048);
        key.validate().unwrap();
        for expr in [
            "{{ private_key('rsa', 1024) }}",
            "{{ private_key('rsa', 2047) }}",
            "{{ private_key('rsa', 8192) }}",
            "{{ private_key('rsa', bits=2500) }}",
        ] {
            assert!(err(expr, json!({})).contains("bits"), "{expr}");
        }
    }

    /// Slow in unoptimised builds (about a minute): `cargo test -- --ignored`.
    #[test]
    #[ignore]
    fn rsa_keys_of_3072_and_4096_bits() {
        use rsa::pkcs8::DecodePrivateKey;
        use rsa::traits::PublicKeyParts;
        for bits in [3072, 4096] {
            let pem = text(&format!("{{{{ private_key('rsa', bits={bits}) }}}}"));
            let key = rsa::RsaPrivateKey::from_pkcs8_pem(&pem).unwrap();
            assert_eq!(key.size() * 8, bits);
        }
    }

    #[test]
    fn private_key_rejects_unknown_kinds_and_stray_bits() {
        assert_eq!(
            err("{{ private_key('dsa') }}", json!({})),
            "private_key(): `kind` must be one of rsa, ecdsa-p256, ecdsa-p384, ed25519"
        );
        assert!(err("{{ private_key('ed25519', 2048) }}", json!({})).contains("rsa keys only"));
    }

    // -- certificates -----------------------------------------------------------------------

    /// Renders `expr` with `vars` in the context and returns the PEM it yields.
    fn pem_of(expr: &str, vars: Json) -> String {
        Renderer::new()
            .render(&json!(expr), &vars)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn der_of(pem: &str) -> Vec<u8> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        assert_eq!(pem.label, "CERTIFICATE");
        pem.contents
    }

    fn parse(der: &[u8]) -> X509Certificate<'_> {
        let (rest, cert) = x509_parser::parse_x509_certificate(der).unwrap();
        assert!(rest.is_empty());
        cert
    }

    fn cn(cert: &X509Certificate<'_>) -> String {
        let cn = cert.subject().iter_common_name().next().unwrap();
        cn.as_str().unwrap().to_owned()
    }

    fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
        let Some(ext) = cert.subject_alternative_name().unwrap() else {
            return Vec::new();
        };
        ext.value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => format!("dns:{d}"),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => format!("ip:{}", IpAddr::from(<[u8; 4]>::try_from(*ip).unwrap())),
                    _ => format!("ip:{}", IpAddr::from(<[u8; 16]>::try_from(*ip).unwrap())),
                },
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn lifetime_secs(cert: &X509Certificate<'_>) -> i64 {
        cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()
    }

    fn key_ids(cert: &X509Certificate<'_>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        let (mut ski, mut aki) = (None, None);
        for ext in cert.extensions() {
            match ext.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => ski = Some(k.0.to_vec()),
                ParsedExtension::AuthorityKeyIdentifier(k) => {
                    aki = k.key_identifier.as_ref().map(|k| k.0.to_vec());
                }
                _ => {}
            }
        }
        (ski, aki)
    }

    #[test]
    fn self_signed_server_certificates_carry_cn_sans_and_lifetime() {
        for kind in ["ecdsa-p256", "ecdsa-p384", "ed25519", "rsa"] {
            let pem = pem_of(
                "{{ certificate(k, 'db.example.svc', '90d', sans=['db.example.svc', '*.db.example.svc', '10.0.0.7', '::1']) }}",
                json!({"k": key(kind)}),
            );
            let der = der_of(&pem);
            let cert = parse(&der);
            assert_eq!(cn(&cert), "db.example.svc", "{kind}");
            assert_eq!(
                sans(&cert),
                [
                    "dns:db.example.svc",
                    "dns:*.db.example.svc",
                    "ip:10.0.0.7",
                    "ip:::1"
                ],
                "{kind}"
            );
            assert_eq!(lifetime_secs(&cert), 90 * 86400, "{kind}");
            let now = OffsetDateTime::now_utc().unix_timestamp();
            assert!((cert.validity().not_before.timestamp() - now).abs() < 60);
            assert!(!cert.is_ca());
            assert_eq!(cert.issuer(), cert.subject());
            cert.verify_signature(None).unwrap();
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.server_auth && !eku.client_auth);
            let ku = cert.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature() && !ku.key_cert_sign());
            assert_eq!(ku.key_encipherment(), kind == "rsa", "{kind}");
            let serial = cert.raw_serial();
            assert_eq!(serial.len(), 16);
            assert!(serial[0] & 0x80 == 0 && serial[0] != 0);
        }
    }

    #[test]
    fn certificate_defaults_to_a_year_for_a_server_without_sans() {
        let cert_pem = pem_of(
            "{{ k | certificate('plain') }}",
            json!({"k": key("ecdsa-p256")}),
        );
        let der = der_of(&cert_pem);
        let cert = parse(&der);
        assert_eq!(lifetime_secs(&cert), 365 * 86400);
        assert!(sans(&cert).is_empty());
        assert!(
            cert.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .server_auth
        );
    }

    #[test]
    fn client_certificates_are_for_client_auth() {
        let pem = pem_of(
            "{{ certificate(k, 'app', usage='client', lifetime='12h') }}",
            json!({"k": key("ed25519")}),
        );
        let der = der_of(&pem);
        let cert = parse(&der);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert_eq!(lifetime_secs(&cert), 12 * 3600);
    }

    #[test]
    fn ca_certificates_sign_leaves_that_verify_against_them() {
        for (ca_kind, leaf_kind) in [
            ("ecdsa-p256", "ecdsa-p256"),
            ("ecdsa-p384", "ed25519"),
            ("ed25519", "ecdsa-p384"),
            ("rsa", "ecdsa-p256"),
            ("ecdsa-p256", "rsa"),
        ] {
            let ca_key = key(ca_kind);
            let ca_pem = pem_of(
                "{{ certificate(k, 'Example CA', '3650d', 'ca') }}",
                json!({"k": ca_key}),
            );
            let ca_der = der_of(&ca_pem);
            let ca = parse(&ca_der);
            assert!(ca.is_ca());
            let bc = ca.basic_constraints().unwrap().unwrap();
            assert!(bc.critical && bc.value.ca);
            let ku = ca.key_usage().unwrap().unwrap().value;
            assert!(ku.key_cert_sign() && ku.crl_sign());
            ca.verify_signature(None).unwrap();

            let leaf_pem = pem_of(
                "{{ certificate(k, 'db', sans=['db.ns.svc'], ca_key=ca_key, ca_cert=ca_cert) }}",
                json!({"k": key(leaf_kind), "ca_key": ca_key, "ca_cert": ca_pem}),
            );
            let leaf_der = der_of(&leaf_pem);
            let leaf = parse(&leaf_der);
            let what = format!("{ca_kind} CA, {leaf_kind} leaf");
            assert_eq!(cn(&leaf), "db", "{what}");
            assert_eq!(sans(&leaf), ["dns:db.ns.svc"], "{what}");
            assert!(!leaf.is_ca(), "{what}");
            assert_eq!(leaf.issuer(), ca.subject(), "{what}");
            leaf.verify_signature(Some(ca.public_key())).unwrap();
            assert!(
                leaf.verify_signature(None).is_err(),
                "{what}: not self-signed"
            );
            let (ca_ski, _) = key_ids(&ca);
            let (_, leaf_aki) = key_ids(&leaf);
            assert!(ca_ski.is_some());
            assert_eq!(leaf_aki, ca_ski, "{what}");
        }
    }

    #[test]
    fn a_leaf_does_not_verify_against_another_ca() {
        let ca_key = key("ecdsa-p256");
        let vars = json!({"k": ca_key});
        let ca_pem = pem_of("{{ certificate(k, 'CA', usage='ca') }}", vars.clone());
        let other_pem = pem_of(
            "{{ certificate(k, 'CA', usage='ca') }}",
            json!({"k": key("ecdsa-p256")}),
        );
        let leaf_pem = pem_of(
            "{{ certificate(k, 'leaf', ca_key=ca_key, ca_cert=ca_cert) }}",
            json!({"k": key("ecdsa-p256"), "ca_key": ca_key, "ca_cert": ca_pem}),
        );
        let (other_der, leaf_der) = (der_of(&other_pem), der_of(&leaf_pem));
        let (other, leaf) = (parse(&other_der), parse(&leaf_der));
        assert!(leaf.verify_signature(Some(other.public_key())).is_err());
    }

    #[test]
    fn intermediate_cas_chain_to_their_root() {
        let (root_key, int_key) = (key("ecdsa-p384"), key("ecdsa-p256"));
        let root_pem = pem_of(
            "{{ certificate(k, 'Root', usage='ca') }}",
            json!({"k": root_key}),
        );
        let int_pem = pem_of(
            "{{ certificate(k, 'Intermediate', usage='ca', ca_key=rk, ca_cert=rc) }}",
            json!({"k": int_key, "rk": root_key, "rc": root_pem}),
        );
        let leaf_pem = pem_of(
            "{{ certificate(k, 'leaf', ca_key=ik, ca_cert=ic) }}",
            json!({"k": key("ed25519"), "ik": int_key, "ic": int_pem}),
        );
        let (root_der, int_der, leaf_der) =
            (der_of(&root_pem), der_of(&int_pem), der_of(&leaf_pem));
        let (root, int, leaf) = (parse(&root_der), parse(&int_der), parse(&leaf_der));
        assert!(int.is_ca());
        int.verify_signature(Some(root.public_key())).unwrap();
        leaf.verify_signature(Some(int.public_key())).unwrap();
        assert_eq!(leaf.issuer(), int.subject());
        assert_eq!(int.issuer(), root.subject());
    }

    #[test]
    fn leaves_never_outlive_their_ca() {
        let ca_key = key("ecdsa-p256");
        let ca_pem = pem_of(
            "{{ certificate(k, 'CA', '30d', 'ca') }}",
            json!({"k": ca_key}),
        );
        let leaf_pem = pem_of(
            "{{ certificate(k, 'leaf', '365d', ca_key=ca_key, ca_cert=ca_cert) }}",
            json!({"k": key("ecdsa-p256"), "ca_key": ca_key, "ca_cert": ca_pem}),
        );
        let (ca_der, leaf_der) = (der_of(&ca_pem), der_of(&leaf_pem));
        let (ca, leaf) = (parse(&ca_der), parse(&leaf_der));
        assert_eq!(
            leaf.validity().not_after.timestamp(),
            ca.validity().not_after.timestamp()
        );
    }

    #[test]
    fn certificate_rejects_bad_arguments_without_echoing_them() {
        let k = key("ecdsa-p256");
        let ca_key = key("ecdsa-p256");
        let vars = |extra: Json| {
            let mut v = json!({"k": k, "ca_key": ca_key});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let leaf_pem = pem_of("{{ certificate(k, 'leaf') }}", vars(json!({})));
        let ca_pem = pem_of(
            "{{ certificate(ca_key, 'CA', usage='ca') }}",
            vars(json!({})),
        );
        let cases = [
            (
                "{{ certificate('not a key', 'x') }}",
                "`key` is not a PKCS#8 PEM private key",
            ),
            ("{{ certificate(k, '') }}", "`cn` must have 1 to 64"),
            (
                "{{ certificate(k, 'x', 'forever') }}",
                "`lifetime` must be a duration",
            ),
            (
                "{{ certificate(k, 'x', '0s') }}",
                "`lifetime` must be a duration",
            ),
            (
                "{{ certificate(k, 'x', '101years') }}",
                "`lifetime` must be a duration",
            ),
            (
                "{{ certificate(k, 'x', usage='both') }}",
                "`usage` must be server, client or ca",
            ),
            (
                "{{ certificate(k, 'x', sans='a.b') }}",
                "`sans` must be a list",
            ),
            (
                "{{ certificate(k, 'x', sans=['ok', 'not ok']) }}",
                "`sans` entry 1 is not",
            ),
            (
                "{{ certificate(k, 'x', sans=[7]) }}",
                "`sans` entry 0 is not",
            ),
            (
                "{{ certificate(k, 'x', ca_key=ca_key) }}",
                "`ca_key` and `ca_cert` go together",
            ),
            (
                "{{ certificate(k, 'x', ca_key=ca_key, ca_cert=leaf) }}",
                "`ca_cert` is not a CA certificate",
            ),
            (
                "{{ certificate(k, 'x', ca_key=k, ca_cert=ca) }}",
                "`ca_key` is not the key of `ca_cert`",
            ),
            (
                "{{ certificate(k, 'x', ca_key=ca_key, ca_cert='junk') }}",
                "`ca_cert` is not a PEM certificate",
            ),
            (
                "{{ certificate(k, 'x', ca_key='junk', ca_cert=ca) }}",
                "`ca_key` is not a PKCS#8",
            ),
        ];
        for (expr, expected) in cases {
            let e = Renderer::new()
                .render(&json!(expr), &vars(json!({"leaf": leaf_pem, "ca": ca_pem})))
                .unwrap_err();
            assert!(e.message.contains(expected), "{expr}: {}", e.message);
            assert!(!e.message.contains("BEGIN"), "{expr}: {}", e.message);
        }
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
