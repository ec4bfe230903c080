//! Who a request is: the identity waterfall, first tier that applies wins.
//!
//! 1. `key:<id or tenant>`: a known API key (`X-API-Key`, or a Bearer value
//!    that is not a JWT), compared by SHA-256 in constant time.
//! 2. `fingerprint:<hash>`: on TLS connections, a hash of the JA4, the order
//!    of the request's header names and the client's subnet. JA4 names the
//!    client software (every Chrome shares one), so the subnet and header
//!    order split one NAT into its distinct clients without ever merging
//!    clients across networks.
//! 3. `subnet:<cidr>`: the client's address at `ipv4_prefix`/`ipv6_prefix`.
//!
//! The client's address is the TCP peer, or the right-most untrusted hop of
//! `X-Forwarded-For` when the peer is a trusted proxy, so a client can never
//! pick its own bucket by sending the header itself. (Verified JWTs, tier 0,
//! come with the JWT work.) Pure: no I/O, no clock.

mod address;
mod credentials;
pub mod jwt;

pub use address::client_ip;
use credentials::{api_key, bearer_jwt, X_API_KEY};
pub use credentials::{ApiKey, ApiKeys};

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// `[identity] max_token_bytes` by default.
pub const DEFAULT_MAX_TOKEN_BYTES: usize = 8_192;

/// Which tier of the waterfall an identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    User,
    Key,
    Fingerprint,
    Subnet,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::User => "user",
            Tier::Key => "key",
            Tier::Fingerprint => "fingerprint",
            Tier::Subnet => "subnet",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Some(match s {
            "user" => Tier::User,
            "key" => Tier::Key,
            "fingerprint" => Tier::Fingerprint,
            "subnet" => Tier::Subnet,
            _ => return None,
        })
    }
}

/// A resolved identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tier: Tier,
    /// `<tier>:<value>`, e.g. `key:acme`, `subnet:198.51.100.0/24`.
    pub value: String,
    pub tenant: Option<Arc<str>>,
    pub plan: Option<Arc<str>>,
    /// The client's address after trusted-proxy handling.
    pub client_ip: IpAddr,
}

/// Credentials that were presented but are not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("unknown API key")]
    UnknownApiKey,
    /// Refused before any verification: no real credential is this long.
    #[error("credential longer than {max} bytes")]
    TooLong { max: usize },
    #[error("{0}")]
    InvalidToken(#[from] jwt::JwtError),
}

/// The waterfall's configuration, compiled once per config.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    pub trusted_proxies: Vec<IpNet>,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    pub api_keys: ApiKeys,
    /// `[identity] max_token_bytes`: a longer `Authorization` or
    /// `X-API-Key` value is refused (401) before any verification or
    /// lookup. 0 means the default, 8192.
    pub max_token_bytes: usize,
    /// Refuse (401) unknown credentials instead of falling through.
    pub reject_invalid: bool,
    /// Verifies bearer JWTs, when `[identity.jwt]` is configured.
    pub jwt: Option<Arc<jwt::Verifier>>,
}

/// What the connection tells the waterfall.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    pub peer: IpAddr,
    /// JA4 of the TLS ClientHello, on TLS connections.
    pub ja4: Option<&'a str>,
}

impl Resolver {
    /// Resolves the identity of a request. `Err` for invalid credentials
    /// under `reject_invalid`, and for a credential longer than
    /// `max_token_bytes` whatever the setting.
    /// `now_secs` (seconds since the epoch) matters only for cached JWTs.
    pub fn resolve(&self, headers: &HeaderMap, conn: Connection<'_>, now_secs: u64) -> Result<Identity, Rejection> {
        let client_ip = client_ip(conn.peer, headers, &self.trusted_proxies);
        // Only a credential that would be checked needs the bound: without
        // JWTs or API keys configured, none is read.
        if self.jwt.is_some() || !self.api_keys.is_empty() {
            let max = self.max_token_bytes();
            for name in [&http::header::AUTHORIZATION, &X_API_KEY] {
                if headers.get_all(name).iter().any(|v| v.len() > max) {
                    return Err(Rejection::TooLong { max });
                }
            }
        }
        if let (Some(verifier), Some(token)) = (&self.jwt, bearer_jwt(headers)) {
            match verifier.verify(token, now_secs) {
                Ok(claims) => {
                    return Ok(Identity {
                        tier: Tier::User,
                        value: format!("user:{}", claims.sub),
                        tenant: claims.tenant,
                        plan: claims.plan,
                        client_ip,
                    })
                }
                Err(e) if self.reject_invalid => return Err(e.into()),
                Err(_) => {} // falls through: an unverifiable token lends nothing
            }
        }
        if let Some(presented) = api_key(headers) {
            match self.find_key(presented) {
                Some(k) => {
                    let name = k.id.as_deref().or(k.tenant.as_deref()).unwrap_or("anonymous");
                    return Ok(Identity {
                        tier: Tier::Key,
                        value: format!("key:{name}"),
                        tenant: k.tenant.clone(),
                        plan: k.plan.clone(),
                        client_ip,
                    });
                }
                None if self.reject_invalid => return Err(Rejection::UnknownApiKey),
                None => {}
            }
        }
        let net = subnet(client_ip, self.ipv4_prefix, self.ipv6_prefix);
        if let Some(ja4) = conn.ja4 {
            return Ok(Identity {
                tier: Tier::Fingerprint,
                value: format!("fingerprint:{}", fingerprint_hash(ja4, headers, &net)),
                tenant: None,
                plan: None,
                client_ip,
            });
        }
        Ok(Identity {
            tier: Tier::Subnet,
            value: subnet_value(&net),
            tenant: None,
            plan: None,
            client_ip,
        })
    }

    /// `max_token_bytes`, its default when unset (0).
    pub fn max_token_bytes(&self) -> usize {
        if self.max_token_bytes == 0 {
            DEFAULT_MAX_TOKEN_BYTES
        } else {
            self.max_token_bytes
        }
    }

    /// Why each tier above `resolved` did not apply to a request, top
    /// down, for `leasegate explain`. Asks the same questions as
    /// [`Resolver::resolve`] (the same header parsing, key lookup and JWT
    /// verification), so the answer cannot drift from the waterfall's.
    pub fn passed_over(
        &self,
        headers: &HeaderMap,
        conn: Connection<'_>,
        now_secs: u64,
        resolved: Tier,
    ) -> Vec<(Tier, String)> {
        let mut out = Vec::new();
        if resolved == Tier::User {
            return out;
        }
        let user = match (&self.jwt, bearer_jwt(headers)) {
            (None, Some(_)) => "a Bearer JWT was sent, but [identity.jwt] is not configured".to_string(),
            (None, None) => "no [identity.jwt] configured".to_string(),
            (Some(_), None) => "no Bearer JWT in Authorization".to_string(),
            (Some(verifier), Some(token)) => match verifier.verify(token, now_secs) {
                Err(e) => format!("the Bearer JWT does not count: {e}"),
                Ok(_) => "the Bearer JWT verifies".to_string(),
            },
        };
        out.push((Tier::User, user));
        if resolved == Tier::Key {
            return out;
        }
        let key = match api_key(headers) {
            None => "no X-API-Key, and no Bearer value that is not a JWT".to_string(),
            Some(presented) if self.find_key(presented).is_none() => {
                "the API key presented is not configured".to_string()
            }
            Some(_) => "the API key is configured".to_string(),
        };
        out.push((Tier::Key, key));
        if resolved == Tier::Fingerprint {
            return out;
        }
        if conn.ja4.is_none() {
            out.push((
                Tier::Fingerprint,
                "not a TLS connection (no ClientHello, no JA4)".to_string(),
            ));
        }
        out
    }

    /// The configured key whose SHA-256 matches the presented key's.
    fn find_key(&self, presented: &[u8]) -> Option<&ApiKey> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        self.api_keys.find(&digest)
    }
}

/// The client's network at the configured prefix lengths.
pub fn subnet(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpNet {
    let ip = ip.to_canonical();
    let prefix = if ip.is_ipv4() {
        ipv4_prefix.min(32)
    } else {
        ipv6_prefix.min(128)
    };
    IpNet::new(ip, prefix).map_or_else(|_| IpNet::from(ip), |n| n.trunc())
}

/// `subnet:<cidr>`. Every request of the subnet tier has one made: an IPv4
/// network is written with `itoa` (no `fmt`), IPv6 by its `Display`
/// (its zero compression is not worth repeating).
fn subnet_value(net: &IpNet) -> String {
    let mut value = String::with_capacity(32);
    value.push_str("subnet:");
    match net {
        IpNet::V4(v4) => {
            for (i, octet) in v4.addr().octets().into_iter().enumerate() {
                if i > 0 {
                    value.push('.');
                }
                value.push_str(itoa::Buffer::new().format(octet));
            }
            value.push('/');
            value.push_str(itoa::Buffer::new().format(v4.prefix_len()));
        }
        IpNet::V6(_) => {
            let _ = write!(value, "{net}");
        }
    }
    value
}

/// 16 hex digits over JA4, header-name order and subnet.
fn fingerprint_hash(ja4: &str, headers: &HeaderMap, net: &IpNet) -> String {
    let mut h = Sha256::new();
    h.update(ja4.as_bytes());
    h.update([0]);
    for name in headers.keys() {
        h.update(name.as_str().as_bytes());
        h.update([b',']);
    }
    h.update([0]);
    h.update(net.to_string().as_bytes());
    h.finalize().iter().take(8).fold(String::with_capacity(16), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn resolver() -> Resolver {
        Resolver {
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            ipv4_prefix: 24,
            ipv6_prefix: 64,
            api_keys: vec![ApiKey {
                sha256: Sha256::digest(b"secret-1").into(),
                id: None,
                tenant: Some("acme".into()),
                plan: Some("enterprise".into()),
            }]
            .into(),
            reject_invalid: false,
            max_token_bytes: 0,
            jwt: Some(Arc::new(jwt::Verifier::new(jwt::Settings {
                algorithms: vec![jsonwebtoken::Algorithm::HS256],
                keys: vec![jwt::Keys::Secret(b"s3cret".to_vec())],
                issuer: None,
                audience: None,
                tenant_claim: Some("tenant".into()),
                plan_claim: None,
                leeway_secs: 0,
            }))),
        }
    }

    fn bearer(claims: serde_json::Value) -> HeaderMap {
        let key = jsonwebtoken::EncodingKey::from_secret(b"s3cret");
        let t = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        headers(&[("authorization", &format!("Bearer {t}")), ("x-api-key", "secret-1")])
    }

    #[test]
    fn a_verified_jwt_wins_and_a_bad_one_falls_through_or_is_refused() {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let r = resolver();
        let id = r
            .resolve(
                &bearer(serde_json::json!({"sub": "alice", "exp": exp, "tenant": "t1"})),
                conn("198.51.100.1"),
                0,
            )
            .unwrap();
        assert_eq!(
            (id.tier, id.value.as_str(), id.tenant.as_deref()),
            (Tier::User, "user:alice", Some("t1"))
        );
        // Expired: the API key sent alongside is the next tier.
        let expired = bearer(serde_json::json!({"sub": "alice", "exp": exp - 7_200}));
        assert_eq!(r.resolve(&expired, conn("198.51.100.1"), 0).unwrap().value, "key:acme");
        let strict = Resolver {
            reject_invalid: true,
            ..resolver()
        };
        assert!(matches!(
            strict.resolve(&expired, conn("198.51.100.1"), 0),
            Err(Rejection::InvalidToken(_))
        ));
    }

    fn conn(peer: &str) -> Connection<'static> {
        Connection {
            peer: peer.parse().unwrap(),
            ja4: None,
        }
    }

    #[test]
    fn subnet_values_are_what_display_writes() {
        for net in [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "198.51.100.0/24",
            "255.255.255.255/32",
            "1.20.100.0/22",
            "2001:db8::/64",
        ] {
            let net: IpNet = net.parse().unwrap();
            assert_eq!(subnet_value(&net), format!("subnet:{net}"));
        }
        for a in 0..=255u8 {
            let net = IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(a, 255 - a, a / 3, 0), 24).unwrap());
            assert_eq!(subnet_value(&net), format!("subnet:{net}"));
        }
    }

    #[test]
    fn subnets_aggregate_to_the_configured_prefix() {
        let r = resolver();
        let id = r.resolve(&HeaderMap::new(), conn("198.51.100.77"), 0).unwrap();
        assert_eq!((id.tier, id.value.as_str()), (Tier::Subnet, "subnet:198.51.100.0/24"));
        let id = r.resolve(&HeaderMap::new(), conn("::ffff:198.51.100.77"), 0).unwrap();
        assert_eq!(id.value, "subnet:198.51.100.0/24");
        let id = r.resolve(&HeaderMap::new(), conn("2001:db8:1:2:3:4:5:6"), 0).unwrap();
        assert_eq!(id.value, "subnet:2001:db8:1:2::/64");
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "203.0.113.9, 10.1.1.1")]);
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
            "203.0.113.9"
        );
        // An untrusted peer's header is ignored: the client cannot pick.
        assert_eq!(
            client_ip("198.51.100.1".parse().unwrap(), &h, &trusted).to_string(),
            "198.51.100.1"
        );
        // The right-most untrusted hop wins over anything a client prepended.
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1, 203.0.113.9"),
            ("x-forwarded-for", "10.9.9.9"),
        ]);
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
            "203.0.113.9"
        );
        // Garbage stops the walk at the last trusted address.
        let h = headers(&[("x-forwarded-for", "not-an-ip, 10.3.3.3")]);
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
            "10.3.3.3"
        );
        let h = headers(&[("x-forwarded-for", "[2001:db8::7]:443, 192.0.2.1:5555")]);
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
            "192.0.2.1"
        );
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &HeaderMap::new(), &trusted).to_string(),
            "10.2.2.2"
        );
        // A non-ASCII byte in a client's own part does not hide the hops a
        // proxy appended to the same line.
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe, 203.0.113.9, 10.1.1.1").unwrap(),
        );
        assert_eq!(
            client_ip("10.2.2.2".parse().unwrap(), &h, &trusted).to_string(),
            "203.0.113.9"
        );
    }

    #[test]
    fn many_api_keys_are_each_found_and_a_stranger_is_not() {
        let keys: Vec<ApiKey> = (0..5_000)
            .map(|i| ApiKey {
                sha256: Sha256::digest(format!("key-{i}").as_bytes()).into(),
                id: Some(format!("k{i}").into()),
                tenant: None,
                plan: None,
            })
            .collect();
        let r = Resolver {
            api_keys: keys.into(),
            ..resolver()
        };
        assert_eq!(r.api_keys.len(), 5_000);
        for i in [0, 1, 2_500, 4_999] {
            let presented = format!("key-{i}");
            assert_eq!(
                r.find_key(presented.as_bytes()).and_then(|k| k.id.as_deref()),
                Some(format!("k{i}").as_str())
            );
        }
        assert!(r.find_key(b"key-5000").is_none());
    }

    #[test]
    fn api_keys_from_either_header_and_only_if_known() {
        let r = resolver();
        for h in [
            headers(&[("x-api-key", "secret-1")]),
            headers(&[("authorization", "Bearer secret-1")]),
        ] {
            let id = r.resolve(&h, conn("198.51.100.1"), 0).unwrap();
            assert_eq!((id.tier, id.value.as_str()), (Tier::Key, "key:acme"));
            assert_eq!(id.plan.as_deref(), Some("enterprise"));
            assert_eq!(id.tenant.as_deref(), Some("acme"));
        }
        let unknown = headers(&[("x-api-key", "guess")]);
        assert_eq!(r.resolve(&unknown, conn("198.51.100.1"), 0).unwrap().tier, Tier::Subnet);
        let strict = Resolver {
            reject_invalid: true,
            ..resolver()
        };
        assert_eq!(
            strict.resolve(&unknown, conn("198.51.100.1"), 0),
            Err(Rejection::UnknownApiKey)
        );
        // A JWT-shaped bearer is not an API key: verified as a JWT if JWTs
        // are configured (and refused if invalid), else ignored.
        let jwt = headers(&[("authorization", "Bearer aaa.bbb.ccc")]);
        assert!(matches!(
            strict.resolve(&jwt, conn("198.51.100.1"), 0),
            Err(Rejection::InvalidToken(_))
        ));
        let no_jwt = Resolver {
            jwt: None,
            ..strict.clone()
        };
        assert_eq!(
            no_jwt.resolve(&jwt, conn("198.51.100.1"), 0).unwrap().tier,
            Tier::Subnet
        );
    }

    #[test]
    fn fingerprints_split_a_nat_by_header_order_and_never_merge_networks() {
        let r = resolver();
        let tls = |peer: &str| Connection {
            peer: peer.parse().unwrap(),
            ja4: Some("t13d1516h2_8daaf6152771_d8a2da3f94cd"),
        };
        let a = headers(&[("host", "x"), ("user-agent", "a"), ("accept", "*/*")]);
        let b = headers(&[("host", "x"), ("accept", "*/*"), ("user-agent", "a")]);
        let id_a = r.resolve(&a, tls("198.51.100.1"), 0).unwrap();
        assert_eq!(id_a.tier, Tier::Fingerprint);
        assert!(id_a.value.starts_with("fingerprint:") && id_a.value.len() == "fingerprint:".len() + 16);
        assert_eq!(
            id_a.value,
            r.resolve(&a, tls("198.51.100.200"), 0).unwrap().value,
            "same client software, same NAT"
        );
        assert_ne!(
            id_a.value,
            r.resolve(&b, tls("198.51.100.1"), 0).unwrap().value,
            "other header order"
        );
        assert_ne!(
            id_a.value,
            r.resolve(&a, tls("203.0.113.1"), 0).unwrap().value,
            "other network"
        );
    }

    #[test]
    fn an_oversized_credential_is_refused_before_any_check() {
        let r = resolver();
        let long = "a".repeat(DEFAULT_MAX_TOKEN_BYTES + 1);
        let c = conn("192.0.2.1");
        for h in [
            headers(&[("authorization", &format!("Bearer {long}"))]),
            headers(&[("x-api-key", &long)]),
        ] {
            assert_eq!(
                r.resolve(&h, c, 0).unwrap_err(),
                Rejection::TooLong {
                    max: DEFAULT_MAX_TOKEN_BYTES
                }
            );
        }
        let fits = "a".repeat(DEFAULT_MAX_TOKEN_BYTES - 7);
        assert!(r
            .resolve(&headers(&[("authorization", &format!("Bearer {fits}"))]), c, 0)
            .is_ok());
    }

    #[test]
    fn tiers_round_trip() {
        for t in [Tier::User, Tier::Key, Tier::Fingerprint, Tier::Subnet] {
            assert_eq!(Tier::parse(t.name()), Some(t));
        }
        assert_eq!(Tier::parse("ip"), None);
    }
}
