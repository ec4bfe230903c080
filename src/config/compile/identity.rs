//! `[identity]`: trusted proxies, subnet prefixes, JWT verification and API keys.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use toml::Spanned;

use super::{in_range, resolve, Check};
use crate::config::raw;

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let hi = (chunk[0] as char).to_digit(16)?;
        let lo = (chunk[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

const JWT_ALGORITHMS: &[&str] = &[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

pub(super) fn identity(
    c: &mut Check,
    i: raw::Identity,
    base: &Path,
    rate_claims: &[String],
) -> crate::identity::Resolver {
    let mut trusted = Vec::new();
    for (n, p) in i.trusted_proxies.iter().enumerate() {
        let s = p.get_ref().trim();
        let parsed = s.parse::<IpNet>().or_else(|_| s.parse::<IpAddr>().map(IpNet::from));
        match parsed {
            Ok(net) => trusted.push(net.trunc()),
            Err(_) => c.at(
                p.span(),
                format!("identity.trusted_proxies[{n}]"),
                format!("{s:?} is not a CIDR such as \"10.0.0.0/8\" or an IP address"),
            ),
        }
    }
    let ipv4_prefix = in_range(c, &i.ipv4_prefix, "identity.ipv4_prefix", 0, 32, 24);
    let ipv6_prefix = in_range(c, &i.ipv6_prefix, "identity.ipv6_prefix", 0, 128, 64);

    let verifier = i.jwt.and_then(|j| jwt(c, j, base, rate_claims));

    let mut keys = api_keys(c, i.api_keys, "identity.api_keys");
    if let Some(file) = &i.api_keys_file {
        for k in api_keys_file(c, file, base) {
            if keys.iter().any(|o| o.sha256 == k.sha256) {
                let name = k.id.as_deref().or(k.tenant.as_deref()).unwrap_or("?");
                c.at(
                    file.span(),
                    "identity.api_keys_file",
                    format!("key {name:?} is also in [[identity.api_keys]]"),
                );
            }
            keys.push(k);
        }
    }
    let reject_invalid = super::choice(
        c,
        i.on_invalid_credentials.as_ref(),
        "identity.on_invalid_credentials",
        &[("fall_through", false), ("reject", true)],
        false,
    );
    crate::identity::Resolver {
        trusted_proxies: trusted,
        ipv4_prefix,
        ipv6_prefix,
        api_keys: keys.into(),
        reject_invalid,
        max_token_bytes: in_range(
            c,
            &i.max_token_bytes,
            "identity.max_token_bytes",
            64,
            1 << 20,
            crate::identity::DEFAULT_MAX_TOKEN_BYTES,
        ),
        jwt: verifier.map(Arc::new),
        order: i.order.as_ref().map(|o| order(c, o)).unwrap_or_default(),
    }
}

/// `[identity] order`: the waterfall's tiers, each once, `subnet` last
/// (it always applies: anything after it would never be tried).
fn order(c: &mut Check, o: &Spanned<Vec<String>>) -> Vec<crate::identity::Tier> {
    use crate::identity::Tier;
    let mut out: Vec<Tier> = Vec::new();
    for name in o.get_ref() {
        match Tier::parse(name) {
            Some(t) if out.contains(&t) => c.at(o.span(), "identity.order", format!("{name:?} is listed twice")),
            Some(t) => out.push(t),
            None => c.at(
                o.span(),
                "identity.order",
                format!("unknown tier {name:?}: use \"user\", \"key\", \"cert\", \"fingerprint\" or \"subnet\""),
            ),
        }
    }
    if out.last() != Some(&Tier::Subnet) {
        c.at(
            o.span(),
            "identity.order",
            "end the list with \"subnet\": it always applies, so a tier after it would never be tried",
        );
    }
    out
}

/// `[identity.jwt]`: the algorithms allowed and the keys to verify with,
/// loaded now so a bad key is a config error, not a request-time surprise.
fn jwt(
    c: &mut Check,
    j: Spanned<raw::Jwt>,
    base: &Path,
    rate_claims: &[String],
) -> Option<crate::identity::jwt::Verifier> {
    use crate::identity::jwt::{self, Keys};
    use jsonwebtoken::{Algorithm, DecodingKey};
    let span = j.span();
    let j = j.into_inner();
    let mut algorithms = Vec::new();
    for a in j.algorithms.get_ref() {
        match (JWT_ALGORITHMS.contains(&a.as_str()), a.parse::<Algorithm>()) {
            (true, Ok(alg)) => algorithms.push(alg),
            _ => c.at(
                j.algorithms.span(),
                "identity.jwt.algorithms",
                format!("unknown algorithm {a:?}: use {}", JWT_ALGORITHMS.join(", ")),
            ),
        }
    }
    if j.algorithms.get_ref().is_empty() {
        c.at(
            j.algorithms.span(),
            "identity.jwt.algorithms",
            "list at least one algorithm",
        );
    }
    let symmetric = algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
    let asymmetric = algorithms
        .iter()
        .any(|a| !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
    let mut keys = Vec::new();
    let mut ok = true;
    match (&j.secret, &j.secret_env) {
        (Some(_), Some(_)) => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "set secret or secret_env, not both",
            );
            ok = false;
        }
        (Some(secret), None) if secret.is_empty() => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "must not be empty: anyone could sign tokens",
            );
            ok = false;
        }
        (Some(secret), None) => keys.push(Keys::Secret(secret.as_bytes().to_vec())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(secret) if !secret.is_empty() => keys.push(Keys::Secret(secret.into_bytes())),
            _ => {
                c.at(
                    span.clone(),
                    "identity.jwt.secret_env",
                    format!("environment variable {var:?} is not set"),
                );
                ok = false;
            }
        },
        (None, None) if symmetric => {
            c.at(
                span.clone(),
                "identity.jwt.secret",
                "HS* algorithms need secret or secret_env",
            );
            ok = false;
        }
        (None, None) => {}
    }
    if let Some(p) = &j.public_key {
        let path = resolve(base, p);
        let pem = std::fs::read(&path);
        let parsed = pem.map_err(|e| e.to_string()).and_then(|pem| {
            let family = algorithms
                .iter()
                .find(|a| !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
            match family {
                Some(Algorithm::ES256 | Algorithm::ES384) => DecodingKey::from_ec_pem(&pem),
                Some(Algorithm::EdDSA) => DecodingKey::from_ed_pem(&pem),
                _ => DecodingKey::from_rsa_pem(&pem),
            }
            .map_err(|e| e.to_string())
        });
        match parsed {
            Ok(key) => keys.push(Keys::Public(key)),
            Err(e) => {
                c.at(
                    span.clone(),
                    "identity.jwt.public_key",
                    format!("{}: {e}", path.display()),
                );
                ok = false;
            }
        }
    }
    if let Some(p) = &j.jwks_file {
        let path = resolve(base, p);
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|json| jwt::jwks(&json))
        {
            Ok(set) => keys.push(Keys::Set(set)),
            Err(e) => {
                c.at(
                    span.clone(),
                    "identity.jwt.jwks_file",
                    format!("{}: {e}", path.display()),
                );
                ok = false;
            }
        }
    }
    if asymmetric && j.public_key.is_none() && j.jwks_file.is_none() {
        c.at(
            span.clone(),
            "identity.jwt.public_key",
            "RS/PS/ES/EdDSA algorithms need public_key = \"PATH.pem\" or jwks_file",
        );
        ok = false;
    }
    let leeway: u64 = in_range(c, &j.leeway_secs, "identity.jwt.leeway_secs", 0, 300, 5);
    (ok && !algorithms.is_empty()).then(|| {
        jwt::Verifier::new(jwt::Settings {
            algorithms,
            keys,
            issuer: j.issuer,
            audience: j.audience,
            tenant_claim: j.tenant_claim,
            plan_claim: j.plan_claim,
            rate_claims: rate_claims.to_vec(),
            leeway_secs: leeway,
        })
    })
}

/// `[[api_keys]]` entries, from the config or from a keys file.
fn api_keys(c: &mut Check, list: Vec<Spanned<raw::ApiKey>>, prefix: &str) -> Vec<crate::identity::ApiKey> {
    let mut out: Vec<crate::identity::ApiKey> = Vec::new();
    for (n, k) in list.into_iter().enumerate() {
        let span = k.span();
        let k = k.into_inner();
        let key = format!("{prefix}[{n}]");
        let sha256 = match (&k.key, &k.sha256) {
            (Some(plain), None) if !plain.is_empty() => Some(Sha256::digest(plain.as_bytes()).into()),
            (None, Some(h)) => {
                let parsed = hex32(&h.get_ref().to_ascii_lowercase());
                if parsed.is_none() {
                    c.at(
                        h.span(),
                        format!("{key}.sha256"),
                        "must be 64 hex digits (the SHA-256 of the key)",
                    );
                }
                parsed
            }
            (Some(_), Some(_)) => {
                c.at(span.clone(), key, "set key or sha256, not both");
                None
            }
            _ => {
                c.at(span.clone(), key, "set key or sha256");
                None
            }
        };
        if k.id.is_none() && k.tenant.is_none() {
            c.at(
                span.clone(),
                format!("{prefix}[{n}]"),
                "set id or tenant: the identity is key:<id or tenant>",
            );
        }
        if let Some(sha256) = sha256 {
            if out.iter().any(|o| o.sha256 == sha256) {
                c.at(span, format!("{prefix}[{n}]"), "the same key is listed twice");
            }
            out.push(crate::identity::ApiKey {
                sha256,
                id: k.id.map(Arc::from),
                tenant: k.tenant.map(Arc::from),
                plan: k.plan.map(Arc::from),
            });
        }
    }
    out
}

/// Keys kept outside gateway.toml (so secrets can live elsewhere): a TOML
/// file of `[[api_keys]]` tables. Its problems name its own file and lines.
fn api_keys_file(c: &mut Check, file: &Spanned<String>, base: &Path) -> Vec<crate::identity::ApiKey> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KeysFile {
        #[serde(default)]
        api_keys: Vec<Spanned<raw::ApiKey>>,
    }
    let path = resolve(base, file.get_ref());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            c.at(
                file.span(),
                "identity.api_keys_file",
                format!("{}: {e}", path.display()),
            );
            return Vec::new();
        }
    };
    let name = path.display().to_string();
    match toml::from_str::<KeysFile>(&text) {
        Ok(keys) => {
            let mut inner = Check {
                file: &name,
                text: &text,
                problems: Vec::new(),
            };
            let out = api_keys(&mut inner, keys.api_keys, "api_keys");
            c.problems.extend(inner.problems);
            out
        }
        Err(e) => {
            c.problems.push(crate::config::error::from_toml(&name, &text, &e));
            Vec::new()
        }
    }
}
