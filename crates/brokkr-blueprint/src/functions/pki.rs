//! Keys and certificates: `private_key` makes a PKCS#8 key, `certificate` a self-signed or
//! CA-signed X.509 certificate for a server, a client or a CA, checking the CA it is given.

use std::net::IpAddr;
use std::time::Duration;

use minijinja::value::{Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, Value};
use rand::Rng;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use time::OffsetDateTime;

use super::args::{Args, fail};
use super::rng::{SharedRng, lock};

/// Longest certificate lifetime accepted (100 years of 365 days).
const MAX_LIFETIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `private_key(kind, bits?)`: a new private key as a PKCS#8 PEM string.
pub(super) fn private_key(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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
pub(super) fn certificate(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::tests::{err, key, text};
    use crate::template::Renderer;
    use serde_json::{Value as Json, json};
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::X509Certificate;

    // -- keys -------------------------------------------------------------------------------

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
}
