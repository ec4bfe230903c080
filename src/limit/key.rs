//! Store keys, derived from a limit's `by` parts: `rl:{<limit>:<parts>}`.
//!
//! The braces are a Redis Cluster hash tag around the whole key, so one
//! bucket lives on one slot and different keys spread over the cluster. Part
//! values never contain braces, and header values (the client's bytes) and
//! long values are replaced by a 128-bit SHA-256 prefix, stable across
//! instances, so every instance of a fleet derives the same key.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::HeaderMap;

use super::policy::{KeyPart, ShardBy};

/// What a request offers for key derivation.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// `tier:value`, e.g. `subnet:198.51.100.0/24`.
    pub identity: &'a str,
    pub tenant: Option<&'a str>,
    pub plan: Option<&'a str>,
    /// A verified JWT's rate claims, for limits with `rate_from` (empty
    /// otherwise).
    pub rates: &'a [Option<std::sync::Arc<str>>],
    pub route: &'a str,
    pub ip: IpAddr,
    pub headers: &'a HeaderMap,
}

/// Longest part value kept verbatim; longer ones are hashed.
const MAX_PART: usize = 64;

/// Writes the key of `limit` for `facts` into `out` (cleared first).
pub fn derive(out: &mut String, limit: &str, by: &[KeyPart], facts: &Facts<'_>) {
    out.clear();
    out.push_str("rl:{");
    out.push_str(limit);
    for part in by {
        out.push(':');
        match part {
            KeyPart::Identity => push_value(out, facts.identity.as_bytes()),
            KeyPart::Tenant => push_value(out, facts.tenant.unwrap_or("-").as_bytes()),
            KeyPart::Route => push_value(out, facts.route.as_bytes()),
            KeyPart::Ip => {
                let _ = write!(out, "{}", facts.ip.to_canonical());
            }
            KeyPart::Subnet { v4, v6 } => {
                let (net, prefix) = subnet_of(facts.ip, *v4, *v6);
                let _ = write!(out, "{net}/{prefix}");
            }
            // Header values are the client's (API keys, if an operator keys
            // on one): they reach store keys, `explain` and the status page
            // only as a digest, never raw, whatever their length. Any value,
            // the empty one included, is told apart from none (`-`).
            KeyPart::Header(name) => match facts.headers.get(name) {
                Some(v) => push_hashed(out, v.as_bytes()),
                None => out.push('-'),
            },
        }
    }
    out.push('}');
}

/// Feeds the key of `limit` for `facts` to `hasher` without building it:
/// the same parts as [`derive`], each but the last length-prefixed so no
/// two part lists of one limit hash alike. Used to find a lease; the string is built only when the
/// store must be asked.
pub fn hash_into(hasher: &mut impl std::hash::Hasher, limit: &str, by: &[KeyPart], facts: &Facts<'_>) {
    hasher.write_usize(limit.len());
    hasher.write(limit.as_bytes());
    hash_parts(hasher, by, facts);
}

/// The parts of [`hash_into`] after the limit's name: for a caller that
/// puts the name in the hasher's seed ([`name_id`]) instead.
pub fn hash_parts(hasher: &mut impl std::hash::Hasher, by: &[KeyPart], facts: &Facts<'_>) {
    // A limit's parts are fixed, so the last one ends where the input does:
    // its length is left out (a key of one part then costs the hasher a
    // single write, and no final fold of a length).
    let Some((last, rest)) = by.split_last() else {
        return;
    };
    for p in rest {
        hash_part(hasher, p, facts, true);
    }
    hash_part(hasher, last, facts, false);
}

/// One part of [`hash_parts`]; `framed`: preceded by its length.
#[inline(always)]
fn hash_part(hasher: &mut impl std::hash::Hasher, p: &KeyPart, facts: &Facts<'_>, framed: bool) {
    let part = |hasher: &mut _, bytes: &[u8]| {
        if framed {
            std::hash::Hasher::write_usize(hasher, bytes.len());
        }
        std::hash::Hasher::write(hasher, bytes);
    };
    match p {
        KeyPart::Identity => part(hasher, as_keyed(facts.identity.as_bytes())),
        KeyPart::Tenant => part(hasher, as_keyed(facts.tenant.unwrap_or("-").as_bytes())),
        KeyPart::Route => part(hasher, as_keyed(facts.route.as_bytes())),
        KeyPart::Ip => address(hasher, facts.ip),
        KeyPart::Subnet { v4, v6 } => network(hasher, facts.ip, *v4, *v6),
        // A missing header gets a length no value can have.
        KeyPart::Header(name) => match facts.headers.get(name) {
            Some(v) => part(hasher, v.as_bytes()),
            None => hasher.write_usize(usize::MAX),
        },
    }
}

// The address parts out of line (and always with their length): inline,
// the compiler worked out the canonical address and subnet ahead of the
// parts loop for every key, a hundred-odd instructions that a key of other
// parts never used.
#[inline(never)]
fn address(hasher: &mut impl std::hash::Hasher, ip: IpAddr) {
    match ip.to_canonical() {
        IpAddr::V4(a) => prefixed(hasher, None, &a.octets()),
        IpAddr::V6(a) => prefixed(hasher, None, &a.octets()),
    }
}

// Prefixed so a subnet never hashes like an address.
#[inline(never)]
fn network(hasher: &mut impl std::hash::Hasher, ip: IpAddr, v4: u8, v6: u8) {
    match subnet_of(ip, v4, v6) {
        (IpAddr::V4(a), p) => prefixed(hasher, Some(p), &a.octets()),
        (IpAddr::V6(a), p) => prefixed(hasher, Some(p), &a.octets()),
    }
}

/// The network of `ip` at the prefix of its family, and that prefix.
pub fn subnet_of(ip: IpAddr, v4: u8, v6: u8) -> (IpAddr, u8) {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let p = v4.min(32);
            let mask = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
            (IpAddr::V4(std::net::Ipv4Addr::from(u32::from(a) & mask)), p)
        }
        IpAddr::V6(a) => {
            let p = v6.min(128);
            let mask = u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0);
            (IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & mask)), p)
        }
    }
}

/// A part of `[prefix] + bytes` with its length, without building that slice.
fn prefixed(hasher: &mut impl std::hash::Hasher, prefix: Option<u8>, bytes: &[u8]) {
    hasher.write_usize(usize::from(prefix.is_some()) + bytes.len());
    if let Some(p) = prefix {
        hasher.write_u8(p);
    }
    hasher.write(bytes);
}

/// A limit's name as 64 bits, folded into the seed of its keys' hashes in
/// place of the name's bytes (the names are the operator's: a fixed seed
/// serves here). Two names share it with odds of 2^-64.
pub fn name_id(name: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x6c65_6173_6567_6174).hash_one(name)
}

/// The sub-bucket of a sharded limit that a request goes to: a stable hash
/// of the client (its IP, or its identity), the same on every instance.
pub fn shard(by: ShardBy, shards: u32, facts: &Facts<'_>) -> u32 {
    let h = match by {
        ShardBy::Ip => match facts.ip.to_canonical() {
            IpAddr::V4(v4) => fnv1a(&v4.octets()),
            IpAddr::V6(v6) => fnv1a(&v6.octets()),
        },
        ShardBy::Identity => fnv1a(facts.identity.as_bytes()),
    };
    (h % u64::from(shards.max(1))) as u32
}

/// Puts the sub-bucket inside the hash tag: `rl:{a:b}` → `rl:{a:b:s07}`,
/// so each sub-bucket has its own slot in a cluster.
pub fn push_shard(out: &mut String, shard: u32) {
    if out.ends_with('}') {
        out.pop();
    }
    let _ = write!(out, ":s{shard:02}}}");
}

/// A value as its key part stands for it: the empty value is `-`, as
/// none is, in the store key ([`push_value`]) and so in the lease hash.
#[inline(always)]
fn as_keyed(v: &[u8]) -> &[u8] {
    if v.is_empty() {
        b"-"
    } else {
        v
    }
}

fn push_value(out: &mut String, v: &[u8]) {
    if v.is_empty() {
        out.push('-');
        return;
    }
    // '#' starts hashed values only, so no verbatim value can pose as one.
    if v.len() <= MAX_PART && v[0] != b'#' && v.iter().all(|b| b.is_ascii_graphic() && *b != b'{' && *b != b'}') {
        if let Ok(s) = std::str::from_utf8(v) {
            out.push_str(s);
            return;
        }
    }
    push_hashed(out, v);
}

/// `#` and the first 128 bits of the value's SHA-256, in hex: no value
/// can be read back from it, and no two are made to share it.
fn push_hashed(out: &mut String, v: &[u8]) {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(v);
    out.push('#');
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
}

/// FNV-1a, 64 bit: stable across processes and versions, unlike the
/// std hashers.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn facts<'a>(headers: &'a HeaderMap) -> Facts<'a> {
        Facts {
            identity: "subnet:198.51.100.0/24",
            tenant: None,
            plan: None,
            rates: &[],
            route: "api",
            ip: "::ffff:198.51.100.7".parse().unwrap(),
            headers,
        }
    }

    #[test]
    fn keys_have_the_cluster_tag_and_every_part() {
        let mut h = HeaderMap::new();
        h.insert("x-tenant", HeaderValue::from_static("acme"));
        let mut k = String::new();
        let by = [
            KeyPart::Identity,
            KeyPart::Tenant,
            KeyPart::Route,
            KeyPart::Ip,
            KeyPart::Header(HeaderName::from_static("x-tenant")),
        ];
        derive(&mut k, "per_client", &by, &facts(&h));
        assert_eq!(
            k,
            "rl:{per_client:subnet:198.51.100.0/24:-:api:198.51.100.7:#822b33ad87c148a0a20a5ba7cd5ebcaa}"
        );
        assert!(!k.contains("acme"), "header values never appear raw");
        derive(
            &mut k,
            "x",
            &[KeyPart::Header(HeaderName::from_static("x-missing"))],
            &facts(&h),
        );
        assert_eq!(k, "rl:{x:-}");
    }

    #[test]
    fn the_subnet_part_is_the_clients_network_whatever_its_identity() {
        let h = HeaderMap::new();
        let mut k = String::new();
        let at = |ip: &str, identity: &'static str| Facts {
            identity,
            ip: ip.parse().unwrap(),
            ..facts(&h)
        };
        derive(
            &mut k,
            "ceiling",
            &[KeyPart::Subnet { v4: 24, v6: 64 }],
            &at("::ffff:198.51.100.7", "fingerprint:1"),
        );
        assert_eq!(k, "rl:{ceiling:198.51.100.0/24}");
        let mut other = String::new();
        derive(
            &mut other,
            "ceiling",
            &[KeyPart::Subnet { v4: 24, v6: 64 }],
            &at("198.51.100.250", "fingerprint:2"),
        );
        assert_eq!(k, other, "fresh identities share their network's bucket");
        derive(
            &mut k,
            "ceiling",
            &[KeyPart::Subnet { v4: 24, v6: 64 }],
            &at("2001:db8:1:2:aaaa::1", "user:x"),
        );
        assert_eq!(k, "rl:{ceiling:2001:db8:1:2::/64}");
        use std::hash::{BuildHasher, Hasher};
        let rs = foldhash::fast::FixedState::default();
        let hash = |f: &Facts<'_>, by: &[KeyPart]| {
            let mut hasher = rs.build_hasher();
            hash_into(&mut hasher, "ceiling", by, f);
            hasher.finish()
        };
        let (a, b) = (at("198.51.100.7", "a"), at("198.51.100.9", "b"));
        assert_eq!(
            hash(&a, &[KeyPart::Subnet { v4: 24, v6: 64 }]),
            hash(&b, &[KeyPart::Subnet { v4: 24, v6: 64 }])
        );
        assert_ne!(
            hash(&a, &[KeyPart::Subnet { v4: 24, v6: 64 }]),
            hash(&at("198.51.101.7", "a"), &[KeyPart::Subnet { v4: 24, v6: 64 }])
        );
        assert_ne!(
            hash(&at("198.51.100.0", "a"), &[KeyPart::Ip]),
            hash(&a, &[KeyPart::Subnet { v4: 24, v6: 64 }])
        );
    }

    #[test]
    fn the_subnet_part_takes_a_prefix() {
        let h = HeaderMap::new();
        let mut k = String::new();
        let at = |ip: &str| Facts {
            ip: ip.parse().unwrap(),
            ..facts(&h)
        };
        let by = [KeyPart::Subnet { v4: 16, v6: 48 }];
        derive(&mut k, "c", &by, &at("2001:db8:1:2::1"));
        assert_eq!(k, "rl:{c:2001:db8:1::/48}");
        let mut other = String::new();
        derive(&mut other, "c", &by, &at("2001:db8:1:ffff:1::9"));
        assert_eq!(k, other, "one /48, one bucket");
        derive(&mut k, "c", &by, &at("::ffff:198.51.100.7"));
        assert_eq!(k, "rl:{c:198.51.0.0/16}");
        assert_eq!(subnet_of("10.1.2.3".parse().unwrap(), 32, 128).1, 32);
        assert_eq!(
            subnet_of("::1".parse().unwrap(), 24, 1).0,
            "::".parse::<IpAddr>().unwrap()
        );
    }

    /// Equal store keys, equal lease hashes; different store keys,
    /// different hashes: for a missing header, an empty one and `-`.
    #[test]
    fn store_keys_and_lease_hashes_agree_on_absent_empty_and_dash() {
        use std::hash::{BuildHasher, Hasher};
        let by = [KeyPart::Header(HeaderName::from_static("x-k"))];
        let state = foldhash::fast::FixedState::with_seed(7);
        let both = |v: Option<&[u8]>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert("x-k", HeaderValue::from_bytes(v).unwrap());
            }
            let mut k = String::new();
            derive(&mut k, "l", &by, &facts(&h));
            let mut hasher = state.build_hasher();
            hash_into(&mut hasher, "l", &by, &facts(&h));
            (k, hasher.finish())
        };
        let cases = [both(None), both(Some(b"")), both(Some(b"-")), both(Some(b"a"))];
        for (i, a) in cases.iter().enumerate() {
            for (j, b) in cases.iter().enumerate() {
                assert_eq!(a.0 == b.0, a.1 == b.1, "{i} {j}: {a:?} {b:?}");
                assert_eq!(i == j, a.0 == b.0, "{i} {j}");
            }
        }
    }

    /// The same for a tenant, an identity and a route: none, the empty
    /// value and `-` are one key, `-`, and must be one lease.
    #[test]
    fn store_keys_and_lease_hashes_agree_on_empty_values() {
        use std::hash::{BuildHasher, Hasher};
        let state = foldhash::fast::FixedState::with_seed(7);
        let h = HeaderMap::new();
        for by in [KeyPart::Tenant, KeyPart::Identity, KeyPart::Route] {
            let both = |v: Option<&str>| {
                let mut f = facts(&h);
                match by {
                    KeyPart::Tenant => f.tenant = v,
                    KeyPart::Identity => f.identity = v.unwrap_or(""),
                    _ => f.route = v.unwrap_or(""),
                }
                let by = [by.clone()];
                let mut k = String::new();
                derive(&mut k, "l", &by, &f);
                let mut hasher = state.build_hasher();
                hash_into(&mut hasher, "l", &by, &f);
                (k, hasher.finish())
            };
            let cases = [both(None), both(Some("")), both(Some("-")), both(Some("a"))];
            for (i, a) in cases.iter().enumerate() {
                for (j, b) in cases.iter().enumerate() {
                    assert_eq!(a.0 == b.0, a.1 == b.1, "{by:?} {i} {j}: {a:?} {b:?}");
                    assert_eq!((i < 3) == (j < 3), a.0 == b.0, "{by:?} {i} {j}");
                }
            }
        }
    }

    #[test]
    fn hostile_values_cannot_break_the_tag() {
        let mut h = HeaderMap::new();
        h.insert("x-k", HeaderValue::from_static("a}{b"));
        let mut k = String::new();
        derive(
            &mut k,
            "l",
            &[KeyPart::Header(HeaderName::from_static("x-k"))],
            &facts(&h),
        );
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.starts_with("rl:{l:#"));
        h.insert("x-k", HeaderValue::from_str(&"z".repeat(500)).unwrap());
        derive(
            &mut k,
            "l",
            &[KeyPart::Header(HeaderName::from_static("x-k"))],
            &facts(&h),
        );
        assert_eq!(k.len(), "rl:{l:#}".len() + 32);
    }

    #[test]
    fn no_verbatim_value_can_pose_as_a_hashed_one() {
        let mut h = HeaderMap::new();
        let by = [KeyPart::Header(HeaderName::from_static("x-k"))];
        let long = "z".repeat(500);
        h.insert("x-k", HeaderValue::from_str(&long).unwrap());
        let mut hashed = String::new();
        derive(&mut hashed, "l", &by, &facts(&h));
        let forged = hashed.trim_start_matches("rl:{l:").trim_end_matches('}').to_string();
        h.insert("x-k", HeaderValue::from_str(&forged).unwrap());
        let mut k = String::new();
        derive(&mut k, "l", &by, &facts(&h));
        assert_ne!(k, hashed);
    }

    /// A hasher that keeps the byte stream it is fed: the encoding itself
    /// must tell keys apart, whatever hasher reads it.
    #[derive(Default)]
    struct Stream(Vec<u8>);

    impl std::hash::Hasher for Stream {
        fn write(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn finish(&self) -> u64 {
            0
        }
    }

    #[test]
    fn parts_are_told_apart_wherever_their_boundary_falls() {
        let (a, b) = (HeaderName::from_static("x-a"), HeaderName::from_static("x-b"));
        let by = [
            KeyPart::Identity,
            KeyPart::Header(a.clone()),
            KeyPart::Header(b.clone()),
        ];
        let stream = |identity: &str, x: &str, y: &str| {
            let mut h = HeaderMap::new();
            h.insert(a.clone(), HeaderValue::from_str(x).unwrap());
            h.insert(b.clone(), HeaderValue::from_str(y).unwrap());
            let mut s = Stream::default();
            hash_parts(&mut s, &by, &Facts { identity, ..facts(&h) });
            s.0
        };
        let mut seen = std::collections::HashSet::new();
        // Every way to cut "abcd" in three, the empty pieces included.
        for i in 0..=4 {
            for j in i..=4 {
                let s = "abcd";
                assert!(seen.insert(stream(&s[..i], &s[i..j], &s[j..])), "{i} {j}");
            }
        }
        // The last part goes without its length: the input ends where it does.
        let mut s = Stream::default();
        hash_parts(
            &mut s,
            &[KeyPart::Identity],
            &Facts {
                identity: "abc",
                ..facts(&HeaderMap::new())
            },
        );
        assert_eq!(s.0, b"abc");
    }

    #[test]
    fn a_missing_header_hashes_apart_from_any_value() {
        use std::hash::{BuildHasher, Hasher};
        let state = foldhash::fast::FixedState::with_seed(7);
        let hash = |h: &HeaderMap| {
            let mut hasher = state.build_hasher();
            hash_into(
                &mut hasher,
                "l",
                &[KeyPart::Header(HeaderName::from_static("x-k"))],
                &facts(h),
            );
            hasher.finish()
        };
        let missing = hash(&HeaderMap::new());
        let mut h = HeaderMap::new();
        for v in [&b"-"[..], b"", b"\xff-"] {
            h.insert("x-k", HeaderValue::from_bytes(v).unwrap());
            assert_ne!(hash(&h), missing, "{v:?}");
        }
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
