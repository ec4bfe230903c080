//! Tier 1 of the waterfall: a verified JWT lends its `sub`.
//!
//! A token counts only after its signature verifies with an allowed
//! algorithm and a configured key, and `exp`/`nbf` (with a small leeway),
//! issuer and audience check out. `alg: none`, an algorithm outside the
//! allow-list, a wrong key, an expired or not-yet-valid token: never
//! `user:`. Verified tokens are cached (bounded, keyed by the token's
//! SHA-256, until their `exp`) so RS256/ES256 verification does not run on
//! every request; so are refused ones (bounded, for a minute), so a forged
//! token repeated costs no more than a request without one. No I/O: keys
//! are loaded by the config layer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::sync::Recover;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use sha2::{Digest, Sha256};

/// Most verified tokens remembered at once.
const CACHE_MAX: usize = 10_000;
/// Most refused tokens remembered at once, and for how long: a forged
/// ES256/RS256 token repeated (HPACK makes a repeat nearly free to send)
/// costs a digest and a lookup, not a signature check. A minute, since a
/// token refused as not yet valid (`nbf`) may become valid.
const REFUSED_MAX: usize = 10_000;
const REFUSED_SECS: u64 = 60;

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub sub: Arc<str>,
    pub tenant: Option<Arc<str>>,
    pub plan: Option<Arc<str>>,
    /// The claims limits take their rate from (`rate_from`), in the
    /// verifier's `rate_claims` order: each a string claim (a rate such as
    /// `"100/min"`, which the limit reads), `None` when absent or not a
    /// string. Empty when no limit asks.
    pub rates: Arc<[Option<Arc<str>>]>,
    /// Seconds since the epoch.
    pub exp: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("invalid token: algorithm {0:?} is not allowed")]
    Algorithm(String),
    #[error("invalid token: no key for it (kid {0:?})")]
    NoKey(Option<String>),
}

/// Where verification keys come from.
pub enum Keys {
    /// HS* secret.
    Secret(Vec<u8>),
    /// One public key (RS*, PS*, ES*, EdDSA).
    Public(DecodingKey),
    /// A local JWKS: the token's `kid` picks the key.
    Set(Vec<(String, DecodingKey)>),
}

pub struct Verifier {
    algorithms: Vec<Algorithm>,
    symmetric: Option<DecodingKey>,
    public: Option<DecodingKey>,
    by_kid: Vec<(String, DecodingKey)>,
    validation: Validation,
    tenant_claim: Option<String>,
    plan_claim: Option<String>,
    rate_claims: Vec<String>,
    cache: Mutex<HashMap<[u8; 32], Claims>>,
    /// Tokens that failed, by a keyed 64-bit hash of the token (seeded per
    /// process, so no one can aim a collision at another's token): why,
    /// and until when (seconds). Looked up before the SHA-256 the good
    /// tokens' cache needs, so a repeated forgery costs one fast hash.
    refused: Mutex<HashMap<u64, (JwtError, u64)>>,
    refused_seed: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("algorithms", &self.algorithms)
            .finish_non_exhaustive()
    }
}

/// The settings a verifier is built from.
pub struct Settings {
    pub algorithms: Vec<Algorithm>,
    pub keys: Vec<Keys>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub tenant_claim: Option<String>,
    pub plan_claim: Option<String>,
    /// Claims read as rates for limits' `rate_from`, in the order limits
    /// index them.
    pub rate_claims: Vec<String>,
    pub leeway_secs: u64,
}

/// Parses a JWKS document into `(kid, key)` pairs.
pub fn jwks(json: &str) -> Result<Vec<(String, DecodingKey)>, String> {
    let set: JwkSet = serde_json::from_str(json).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut out = Vec::new();
    for jwk in &set.keys {
        let Some(kid) = jwk.common.key_id.clone() else {
            return Err("every key in the JWKS needs a \"kid\"".into());
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {kid:?}: {e}"))?;
        out.push((kid, key));
    }
    if out.is_empty() {
        return Err("the JWKS has no keys".into());
    }
    Ok(out)
}

impl Verifier {
    pub fn new(s: Settings) -> Verifier {
        let mut validation = Validation::new(s.algorithms.first().copied().unwrap_or(Algorithm::HS256));
        validation.algorithms = s.algorithms.clone();
        validation.leeway = s.leeway_secs;
        validation.validate_nbf = true;
        validation.validate_exp = true;
        // A configured issuer or audience must be present, not just match
        // when present.
        let mut required = vec!["exp", "sub"];
        if let Some(iss) = &s.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &s.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        let (mut symmetric, mut public, mut by_kid) = (None, None, Vec::new());
        for k in s.keys {
            match k {
                Keys::Secret(secret) => symmetric = Some(DecodingKey::from_secret(&secret)),
                Keys::Public(key) => public = Some(key),
                Keys::Set(keys) => by_kid.extend(keys),
            }
        }
        Verifier {
            algorithms: s.algorithms,
            symmetric,
            public,
            by_kid,
            validation,
            tenant_claim: s.tenant_claim,
            plan_claim: s.plan_claim,
            rate_claims: s.rate_claims,
            cache: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            refused_seed: foldhash::fast::RandomState::default(),
        }
    }

    /// Verifies `token` at `now_secs`, from the cache when it can.
    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, JwtError> {
        let quick = std::hash::BuildHasher::hash_one(&self.refused_seed, token.as_bytes());
        if let Some((e, until)) = self.refused.lock().recover().get(&quick) {
            if *until > now_secs {
                return Err(e.clone());
            }
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        {
            let cache = self.cache.lock().recover();
            if let Some(c) = cache.get(&digest) {
                if c.exp.saturating_add(self.validation.leeway) > now_secs {
                    return Ok(c.clone());
                }
            }
        }
        let claims = match self.verify_uncached(token) {
            Ok(c) => c,
            Err(e) => {
                {
                    let mut refused = self.refused.lock().recover();
                    if refused.len() >= REFUSED_MAX {
                        refused.retain(|_, (_, until)| *until > now_secs);
                        if refused.len() >= REFUSED_MAX {
                            refused.clear(); // a flood of distinct forgeries: start over
                        }
                    }
                    refused.insert(quick, (e.clone(), now_secs.saturating_add(REFUSED_SECS)));
                }
                return Err(e);
            }
        };
        {
            let mut cache = self.cache.lock().recover();
            if cache.len() >= CACHE_MAX {
                cache.retain(|_, c| c.exp.saturating_add(self.validation.leeway) > now_secs);
                if cache.len() >= CACHE_MAX {
                    cache.clear(); // a flood of distinct valid tokens: start over
                }
            }
            cache.insert(digest, claims.clone());
        }
        Ok(claims)
    }

    /// Verifies without the cache (benchmarks compare the two).
    pub fn verify_uncached(&self, token: &str) -> Result<Claims, JwtError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| JwtError::Invalid(e.to_string()))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(JwtError::Algorithm(format!("{:?}", header.alg)));
        }
        let symmetric = matches!(header.alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512);
        let key = if symmetric {
            self.symmetric.as_ref()
        } else if let Some(kid) = &header.kid {
            self.by_kid
                .iter()
                .find(|(k, _)| k == kid)
                .map(|(_, key)| key)
                .or(self.public.as_ref())
        } else {
            self.public
                .as_ref()
                .or(self.by_kid.first().map(|(_, k)| k).filter(|_| self.by_kid.len() == 1))
        }
        .ok_or_else(|| JwtError::NoKey(header.kid.clone()))?;
        // jsonwebtoken wants every listed algorithm to fit the key: verify
        // against the token's own algorithm, already checked against the list.
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, key, &validation)
            .map_err(|e| JwtError::Invalid(e.to_string()))?;
        let claims = data.claims;
        let text = |name: &Option<String>| -> Option<Arc<str>> {
            let value = claims.get(name.as_deref()?)?;
            match value {
                serde_json::Value::String(s) => Some(Arc::from(s.as_str())),
                serde_json::Value::Number(n) => Some(Arc::from(n.to_string())),
                _ => None,
            }
        };
        let sub = match claims.get("sub") {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Arc::from(s.as_str()),
            _ => return Err(JwtError::Invalid("sub must be a non-empty string".into())),
        };
        let exp = claims.get("exp").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let rates = self
            .rate_claims
            .iter()
            .map(|name| match claims.get(name) {
                Some(serde_json::Value::String(s)) if s.len() <= 64 => Some(Arc::from(s.as_str())),
                _ => None,
            })
            .collect();
        Ok(Claims {
            sub,
            tenant: text(&self.tenant_claim),
            plan: text(&self.plan_claim),
            rates,
            exp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    fn now() -> u64 {
        crate::clock::unix_ms() / 1000
    }

    fn hs(algorithms: &[Algorithm]) -> Verifier {
        Verifier::new(Settings {
            algorithms: algorithms.to_vec(),
            keys: vec![Keys::Secret(b"dev-only-secret".to_vec())],
            issuer: Some("https://issuer.example".into()),
            audience: Some("api".into()),
            tenant_claim: Some("tenant".into()),
            plan_claim: Some("plan".into()),
            rate_claims: vec![],
            leeway_secs: 5,
        })
    }

    fn token(alg: Algorithm, secret: &[u8], claims: serde_json::Value) -> String {
        encode(&Header::new(alg), &claims, &EncodingKey::from_secret(secret)).unwrap()
    }

    fn good_claims() -> serde_json::Value {
        json!({"sub": "alice", "exp": now() + 600, "iss": "https://issuer.example", "aud": "api", "tenant": "acme", "plan": "gold"})
    }

    #[test]
    fn a_good_token_lends_its_sub_tenant_and_plan() {
        let v = hs(&[Algorithm::HS256]);
        let c = v
            .verify(&token(Algorithm::HS256, b"dev-only-secret", good_claims()), now())
            .unwrap();
        assert_eq!(
            (&*c.sub, c.tenant.as_deref(), c.plan.as_deref()),
            ("alice", Some("acme"), Some("gold"))
        );
    }

    #[test]
    fn forged_expired_early_and_misaddressed_tokens_never_count() {
        let v = hs(&[Algorithm::HS256]);
        let mut c = good_claims();
        assert!(
            v.verify(&token(Algorithm::HS256, b"wrong-secret", c.clone()), now())
                .is_err(),
            "wrong key"
        );
        assert!(matches!(
            v.verify(&token(Algorithm::HS512, b"dev-only-secret", c.clone()), now()),
            Err(JwtError::Algorithm(_))
        ));
        c["exp"] = json!(now() - 3600);
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c.clone()), now())
                .is_err(),
            "expired"
        );
        let mut c = good_claims();
        c["nbf"] = json!(now() + 3600);
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                .is_err(),
            "not yet valid"
        );
        let mut c = good_claims();
        c["iss"] = json!("https://evil.example");
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                .is_err(),
            "issuer"
        );
        let mut c = good_claims();
        c["aud"] = json!("other");
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                .is_err(),
            "audience"
        );
        let mut c = good_claims();
        c.as_object_mut().unwrap().remove("sub");
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                .is_err(),
            "no sub"
        );
    }

    #[test]
    fn alg_none_is_refused() {
        let v = hs(&[Algorithm::HS256]);
        // A real token's claims under `{"alg":"none","typ":"JWT"}`, unsigned.
        let signed = token(Algorithm::HS256, b"dev-only-secret", good_claims());
        let claims = signed.split('.').nth(1).unwrap();
        assert!(v
            .verify(&format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims}."), now())
            .is_err());
    }

    #[test]
    fn es256_with_a_public_key_and_a_cache() {
        let key = rcgen::KeyPair::generate().unwrap();
        let verifier = Verifier::new(Settings {
            algorithms: vec![Algorithm::ES256],
            keys: vec![Keys::Public(
                DecodingKey::from_ec_pem(key.public_key_pem().as_bytes()).unwrap(),
            )],
            issuer: None,
            audience: None,
            tenant_claim: None,
            plan_claim: None,
            rate_claims: vec![],
            leeway_secs: 0,
        });
        let signing = EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap();
        let sign = |claims: serde_json::Value| encode(&Header::new(Algorithm::ES256), &claims, &signing).unwrap();
        let t = sign(json!({"sub": "bob", "exp": now() + 100}));
        assert_eq!(&*verifier.verify(&t, now()).unwrap().sub, "bob");
        assert_eq!(verifier.cache.lock().unwrap().len(), 1);
        assert_eq!(&*verifier.verify(&t, now()).unwrap().sub, "bob", "from the cache");
        // The cache never vouches past exp: then the token is verified again.
        assert!(
            verifier.verify(&t, now() + 1_000).is_ok(),
            "still valid by the real clock"
        );
        let expired = sign(json!({"sub": "bob", "exp": now() - 10}));
        assert!(verifier.verify(&expired, now()).is_err());
        // An HS256 token cannot pass as ES256 with the public key as secret.
        let confused = token(
            Algorithm::HS256,
            key.public_key_pem().as_bytes(),
            json!({"sub": "eve", "exp": now() + 100}),
        );
        assert!(matches!(verifier.verify(&confused, now()), Err(JwtError::Algorithm(_))));
    }

    #[test]
    fn refused_tokens_are_remembered_for_a_minute_and_never_vouched_for() {
        let v = hs(&[Algorithm::HS256]);
        let forged = token(Algorithm::HS256, b"not-the-secret", good_claims());
        let first = v.verify(&forged, now()).unwrap_err();
        assert_eq!(v.refused.lock().unwrap().len(), 1);
        // Again: the same refusal, from memory.
        assert_eq!(v.verify(&forged, now()).unwrap_err(), first);
        // A minute on, verified afresh (and refused again).
        assert!(v.verify(&forged, now() + REFUSED_SECS + 1).is_err());
        // A good token is never refused by another's entry.
        assert!(v
            .verify(&token(Algorithm::HS256, b"dev-only-secret", good_claims()), now())
            .is_ok());
        // Bounded: a flood of distinct forgeries starts the table over.
        for i in 0..REFUSED_MAX + 5 {
            let mut c = good_claims();
            c["sub"] = json!(format!("s{i}"));
            let _ = v.verify(&token(Algorithm::HS256, b"x", c), now());
        }
        assert!(v.refused.lock().unwrap().len() <= REFUSED_MAX);
    }

    /// Every asymmetric family with a real key: sign, verify, and refuse the
    /// same token from another key of the family.
    #[test]
    fn every_algorithm_family_verifies_and_refuses_other_keys() {
        let families = [
            (Algorithm::ES256, &rcgen::PKCS_ECDSA_P256_SHA256),
            (Algorithm::RS256, &rcgen::PKCS_RSA_SHA256),
            (Algorithm::PS256, &rcgen::PKCS_RSA_SHA256),
            (Algorithm::EdDSA, &rcgen::PKCS_ED25519),
        ];
        for (alg, kind) in families {
            let key = rcgen::KeyPair::generate_for(kind).unwrap();
            let other = rcgen::KeyPair::generate_for(kind).unwrap();
            let public = |k: &rcgen::KeyPair| match alg {
                Algorithm::ES256 => DecodingKey::from_ec_pem(k.public_key_pem().as_bytes()).unwrap(),
                Algorithm::EdDSA => DecodingKey::from_ed_pem(k.public_key_pem().as_bytes()).unwrap(),
                _ => DecodingKey::from_rsa_pem(k.public_key_pem().as_bytes()).unwrap(),
            };
            let signing = match alg {
                Algorithm::ES256 => EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap(),
                Algorithm::EdDSA => EncodingKey::from_ed_pem(key.serialize_pem().as_bytes()).unwrap(),
                _ => EncodingKey::from_rsa_pem(key.serialize_pem().as_bytes()).unwrap(),
            };
            let settings = |k: DecodingKey| Settings {
                algorithms: vec![alg],
                keys: vec![Keys::Public(k)],
                issuer: None,
                audience: None,
                tenant_claim: None,
                plan_claim: None,
                rate_claims: vec![],
                leeway_secs: 0,
            };
            let t = encode(&Header::new(alg), &json!({"sub": "s", "exp": now() + 60}), &signing).unwrap();
            assert!(
                Verifier::new(settings(public(&key))).verify(&t, now()).is_ok(),
                "{alg:?}"
            );
            assert!(
                Verifier::new(settings(public(&other))).verify(&t, now()).is_err(),
                "{alg:?} with another key"
            );
        }
    }

    #[test]
    fn a_configured_issuer_and_audience_must_be_present() {
        let v = hs(&[Algorithm::HS256]);
        for claim in ["iss", "aud"] {
            let mut c = good_claims();
            c.as_object_mut().unwrap().remove(claim);
            assert!(
                v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                    .is_err(),
                "{claim} left out"
            );
        }
    }

    #[test]
    fn mixed_families_in_the_allow_list_each_verify() {
        let key = rcgen::KeyPair::generate().unwrap();
        let v = Verifier::new(Settings {
            algorithms: vec![Algorithm::HS256, Algorithm::ES256],
            keys: vec![
                Keys::Secret(b"dev-only-secret".to_vec()),
                Keys::Public(DecodingKey::from_ec_pem(key.public_key_pem().as_bytes()).unwrap()),
            ],
            issuer: None,
            audience: None,
            tenant_claim: None,
            plan_claim: None,
            rate_claims: vec![],
            leeway_secs: 0,
        });
        let claims = json!({"sub": "s", "exp": now() + 60});
        assert!(v
            .verify(&token(Algorithm::HS256, b"dev-only-secret", claims.clone()), now())
            .is_ok());
        let es = encode(
            &Header::new(Algorithm::ES256),
            &claims,
            &EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        assert!(v.verify(&es, now()).is_ok());
    }

    #[test]
    fn leeway_forgives_a_little_clock_skew_and_no_more() {
        let v = hs(&[Algorithm::HS256]);
        let mut c = good_claims();
        c["exp"] = json!(now() - 2);
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c.clone()), now())
                .is_ok(),
            "within 5 s"
        );
        c["exp"] = json!(now() - 30);
        assert!(
            v.verify(&token(Algorithm::HS256, b"dev-only-secret", c), now())
                .is_err(),
            "past the leeway"
        );
    }

    #[test]
    fn a_jwks_picks_the_key_by_kid() {
        let a = rcgen::KeyPair::generate().unwrap();
        let b = rcgen::KeyPair::generate().unwrap();
        let enc = |k: &rcgen::KeyPair| EncodingKey::from_ec_pem(k.serialize_pem().as_bytes()).unwrap();
        let jwk = |k: &rcgen::KeyPair, kid: &str| {
            let mut j = jsonwebtoken::jwk::Jwk::from_encoding_key(&enc(k), Algorithm::ES256).unwrap();
            j.common.key_id = Some(kid.into());
            j
        };
        let set = jsonwebtoken::jwk::JwkSet {
            keys: vec![jwk(&a, "a"), jwk(&b, "b")],
        };
        let keys = jwks(&serde_json::to_string(&set).unwrap()).unwrap();
        let v = Verifier::new(Settings {
            algorithms: vec![Algorithm::ES256],
            keys: vec![Keys::Set(keys)],
            issuer: None,
            audience: None,
            tenant_claim: None,
            plan_claim: None,
            rate_claims: vec![],
            leeway_secs: 0,
        });
        let signed = |k: &rcgen::KeyPair, kid: &str| {
            let mut h = Header::new(Algorithm::ES256);
            h.kid = Some(kid.into());
            encode(&h, &json!({"sub": kid, "exp": now() + 60}), &enc(k)).unwrap()
        };
        assert_eq!(&*v.verify(&signed(&a, "a"), now()).unwrap().sub, "a");
        assert_eq!(&*v.verify(&signed(&b, "b"), now()).unwrap().sub, "b");
        assert!(
            v.verify(&signed(&a, "b"), now()).is_err(),
            "kid b's key does not verify a's signature"
        );
        assert!(matches!(v.verify(&signed(&a, "zzz"), now()), Err(JwtError::NoKey(_))));
    }

    #[test]
    fn jwks_documents_need_kids() {
        assert!(jwks("{}").is_err());
        assert!(jwks(r#"{"keys":[]}"#).is_err());
    }
}
