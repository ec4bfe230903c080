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
pub mod client_cert;
mod credentials;
pub mod jwt;

pub use address::client_ip;
use credentials::{api_key, bearer_jwt, X_API_KEY};
pub use credentials::{ApiKey, ApiKeys};

use std::fmt::Write;
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
    /// The subject of a client certificate the https listener verified
    /// against `[tls] client_ca`; only where `[identity] order` names it.
    Cert,
    Fingerprint,
    Subnet,
}

/// The waterfall's order without `[identity] order`.
pub const DEFAULT_ORDER: [Tier; 4] = [Tier::User, Tier::Key, Tier::Fingerprint, Tier::Subnet];

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::User => "user",
            Tier::Key => "key",
            Tier::Cert => "cert",
            Tier::Fingerprint => "fingerprint",
            Tier::Subnet => "subnet",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Some(match s {
            "user" => Tier::User,
            "key" => Tier::Key,
            "cert" => Tier::Cert,
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
    /// A verified JWT's rate claims ([`jwt::Claims::rates`]); `None` for
    /// every other tier.
    pub rates: Option<Arc<[Option<Arc<str>>]>>,
    /// The client's address after trusted-proxy handling.
    pub client_ip: IpAddr,
}

impl Identity {
    /// This identity, taken from a request that is done with it (for the
    /// access log, or a wait that outlives the request's borrow): its
    /// strings and shared parts move out, and its tier and address, which
    /// are `Copy`, stay.
    pub fn take(&mut self) -> Identity {
        Identity {
            tier: self.tier,
            value: std::mem::take(&mut self.value),
            tenant: self.tenant.take(),
            plan: self.plan.take(),
            rates: self.rates.take(),
            client_ip: self.client_ip,
        }
    }
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
    /// `[identity] order`: the tiers tried, first match wins; `subnet`
    /// last. Empty means [`DEFAULT_ORDER`].
    pub order: Vec<Tier>,
}

/// What the connection tells the waterfall.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    pub peer: IpAddr,
    /// JA4 of the TLS ClientHello, on TLS connections.
    pub ja4: Option<&'a str>,
    /// The `cert` identity of the client certificate verified against
    /// `[tls] client_ca`, when the client sent one.
    pub client_cert: Option<&'a str>,
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
        // Each tier returns its identity at once: no identity is moved
        // through an `Option` on the way (this runs for every request).
        let plain = |tier: Tier, value: String| Identity {
            tier,
            value,
            tenant: None,
            plan: None,
            rates: None,
            client_ip,
        };
        for &tier in self.order() {
            match tier {
                Tier::User => {
                    // The header only when a token would be checked.
                    let Some(verifier) = &self.jwt else { continue };
                    if let Some(token) = bearer_jwt(headers) {
                        match verifier.verify(token, now_secs) {
                            Ok(claims) => {
                                return Ok(Identity {
                                    tier,
                                    value: format!("user:{}", claims.sub),
                                    tenant: claims.tenant,
                                    plan: claims.plan,
                                    rates: (!claims.rates.is_empty()).then_some(claims.rates),
                                    client_ip,
                                })
                            }
                            Err(e) if self.reject_invalid => return Err(e.into()),
                            Err(_) => {} // falls through: an unverifiable token lends nothing
                        }
                    }
                }
                Tier::Key => {
                    // No key to find and none to refuse: the headers are
                    // not read (this runs for every request).
                    if self.api_keys.is_empty() && !self.reject_invalid {
                        continue;
                    }
                    if let Some(presented) = api_key(headers) {
                        match self.find_key(presented) {
                            Some(k) => {
                                let name = k.id.as_deref().or(k.tenant.as_deref()).unwrap_or("anonymous");
                                return Ok(Identity {
                                    tier,
                                    value: format!("key:{name}"),
                                    tenant: k.tenant.clone(),
                                    plan: k.plan.clone(),
                                    rates: None,
                                    client_ip,
                                });
                            }
                            None if self.reject_invalid => return Err(Rejection::UnknownApiKey),
                            None => {}
                        }
                    }
                }
                Tier::Cert => {
                    if let Some(subject) = conn.client_cert {
                        return Ok(plain(tier, format!("cert:{subject}")));
                    }
                }
                Tier::Fingerprint => {
                    if let Some(ja4) = conn.ja4 {
                        let net = subnet(client_ip, self.ipv4_prefix, self.ipv6_prefix);
                        return Ok(plain(tier, fingerprint(ja4, headers, &net)));
                    }
                }
                Tier::Subnet => break,
            }
        }
        let net = subnet(client_ip, self.ipv4_prefix, self.ipv6_prefix);
        Ok(plain(Tier::Subnet, subnet_value(&net)))
    }

    /// The tiers in the order they are tried.
    pub fn order(&self) -> &[Tier] {
        if self.order.is_empty() {
            &DEFAULT_ORDER
        } else {
            &self.order
        }
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
        for &tier in self.order() {
            if tier == resolved || tier == Tier::Subnet {
                break;
            }
            out.push((tier, self.why_not(tier, headers, conn, now_secs)));
        }
        out
    }

    /// Why `tier` did not give a request its identity.
    fn why_not(&self, tier: Tier, headers: &HeaderMap, conn: Connection<'_>, now_secs: u64) -> String {
        match tier {
            Tier::User => match (&self.jwt, bearer_jwt(headers)) {
                (None, Some(_)) => "a Bearer JWT was sent, but [identity.jwt] is not configured".to_string(),
                (None, None) => "no [identity.jwt] configured".to_string(),
                (Some(_), None) => "no Bearer JWT in Authorization".to_string(),
                (Some(verifier), Some(token)) => match verifier.verify(token, now_secs) {
                    Err(e) => format!("the Bearer JWT does not count: {e}"),
                    Ok(_) => "the Bearer JWT verifies".to_string(),
                },
            },
            Tier::Key => match api_key(headers) {
                None => "no X-API-Key, and no Bearer value that is not a JWT".to_string(),
                Some(presented) if self.find_key(presented).is_none() => {
                    "the API key presented is not configured".to_string()
                }
                Some(_) => "the API key is configured".to_string(),
            },
            Tier::Cert => "no client certificate verified by [tls] client_ca (explain: --client-cert)".to_string(),
            Tier::Fingerprint => match conn.ja4 {
                None => "not a TLS connection (no ClientHello, no JA4)".to_string(),
                Some(_) => "the JA4 is known".to_string(),
            },
            Tier::Subnet => String::new(),
        }
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

/// `subnet:<cidr>`. Every request of the subnet tier has one made.
fn subnet_value(net: &IpNet) -> String {
    let mut value = String::with_capacity(32);
    value.push_str("subnet:");
    push_net(&mut value, net);
    value
}

/// `net` as CIDR text, as its `Display` writes it: an IPv4 network with
/// `itoa` (no `fmt`; every request on the subnet and fingerprint tiers
/// writes one), IPv6 by its `Display` (its zero compression is not worth
/// repeating).
fn push_net(out: &mut impl Write, net: &IpNet) {
    let _ = match net {
        IpNet::V4(v4) => {
            for (i, octet) in v4.addr().octets().into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_str(".");
                }
                let _ = out.write_str(itoa::Buffer::new().format(octet));
            }
            let _ = out.write_str("/");
            out.write_str(itoa::Buffer::new().format(v4.prefix_len()))
        }
        IpNet::V6(_) => write!(out, "{net}"),
    };
}

/// `fingerprint:` and 16 hex digits of SHA-256 over JA4, header-name
/// order and subnet. Runs for every request on a TLS connection without a
/// better identity: what is hashed is gathered on the stack and given to
/// the hash in one update, the subnet written without `fmt`, and the
/// digits are written by hand, into the one string it returns.
fn fingerprint(ja4: &str, headers: &HeaderMap, net: &IpNet) -> String {
    const PREFIX: &str = "fingerprint:";
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = Gathered::default();
    text.put(ja4.as_bytes());
    text.put(&[0]);
    for name in headers.keys() {
        text.put(name.as_str().as_bytes());
        text.put(b",");
    }
    text.put(&[0]);
    push_net(&mut text, net);
    let mut value = String::with_capacity(PREFIX.len() + 16);
    value.push_str(PREFIX);
    for b in text.digest().iter().take(8) {
        value.push(char::from(HEX[usize::from(b >> 4)]));
        value.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    value
}

/// Bytes on their way into SHA-256, gathered in a buffer of fixed size
/// that is handed over whenever it is full: any length hashes as the same
/// bytes would at once.
struct Gathered {
    hash: Sha256,
    buf: [u8; 512],
    len: usize,
}

impl Default for Gathered {
    fn default() -> Gathered {
        Gathered {
            hash: Sha256::new(),
            buf: [0; 512],
            len: 0,
        }
    }
}

impl Gathered {
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > self.buf.len() {
            self.hash.update(&self.buf[..self.len]);
            self.len = 0;
            if bytes.len() > self.buf.len() {
                self.hash.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn digest(mut self) -> [u8; 32] {
        self.hash.update(&self.buf[..self.len]);
        self.hash.finalize().into()
    }
}

impl Write for Gathered {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.put(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests;
