//! The identity waterfall (`identity::Resolver::resolve`) on random headers:
//! an HS256 JWT verifier, one API key, trusted proxies 10.0.0.0/8.
//!
//! Input: 8 bytes of settings, then header lines `name: value` separated by
//! `\n` (lines that are not a valid header are skipped).
//! - byte 0: bit 0 the connection has a JA4; bits 1-2 the peer (0 a trusted
//!   proxy 10.x, 1 an IPv4 client, 2 an IPv6 client, 3 an IPv4-mapped
//!   trusted proxy); bit 3 `reject_invalid`; bit 4 `max_token_bytes` 64;
//!   bit 5 the order puts `cert` after `key`; bit 6 the client presented a
//!   certificate.
//! - bytes 1-4: the peer's address bytes; bytes 5-7: `now` (seconds).
//!
//! Properties: nothing panics; an identity's value is `<tier>:<something>`,
//! never empty after the colon; a refusal happens only where one is
//! allowed (`reject_invalid`, or an over-long credential); resolving again
//! (JWT cache warm) gives the same answer; the client address is the peer
//! unless the peer is a trusted proxy.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use leasegate::identity::{jwt, ApiKey, Connection, Rejection, Resolver, Tier};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// The HS256 secret the seeds' tokens are signed with (examples/make_seeds.rs).
pub const SECRET: &[u8] = b"fuzz-secret";
/// The one API key (tenant `acme`).
pub const API_KEY: &[u8] = b"fuzz-key-1";

fn resolver(reject_invalid: bool, max_token_bytes: usize, cert_tier: bool) -> Resolver {
    let order = if cert_tier {
        vec![Tier::User, Tier::Key, Tier::Cert, Tier::Fingerprint, Tier::Subnet]
    } else {
        Vec::new()
    };
    Resolver {
        order,
        trusted_proxies: vec!["10.0.0.0/8".parse().expect("a network")],
        ipv4_prefix: 24,
        ipv6_prefix: 64,
        api_keys: vec![ApiKey {
            sha256: Sha256::digest(API_KEY).into(),
            id: None,
            tenant: Some("acme".into()),
            plan: Some("enterprise".into()),
        }]
        .into(),
        max_token_bytes,
        reject_invalid,
        jwt: Some(Arc::new(jwt::Verifier::new(jwt::Settings {
            algorithms: vec![jsonwebtoken::Algorithm::HS256],
            keys: vec![jwt::Keys::Secret(SECRET.to_vec())],
            issuer: None,
            audience: None,
            tenant_claim: Some("tenant".into()),
            plan_claim: Some("plan".into()),
            rate_claims: vec!["rl_rate".into()],
            leeway_secs: 0,
        }))),
    }
}

fn trusted(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.octets()[0] == 10,
        IpAddr::V6(_) => false,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (settings, text) = data.split_at(8);
    let flags = settings[0];
    let a = [settings[1], settings[2], settings[3], settings[4]];
    let peer: IpAddr = match (flags >> 1) & 3 {
        0 => Ipv4Addr::new(10, a[1], a[2], a[3]).into(),
        1 => Ipv4Addr::from(a).into(),
        2 => Ipv6Addr::new(0x2001, 0xdb8, u16::from(a[0]), 0, 0, 0, u16::from(a[1]), u16::from_be_bytes([a[2], a[3]])).into(),
        _ => Ipv4Addr::new(10, a[1], a[2], a[3]).to_ipv6_mapped().into(),
    };
    let now = u64::from(u32::from_be_bytes([0, settings[5], settings[6], settings[7]])) * 300;
    let reject_invalid = flags & 8 != 0;
    let max_token_bytes = if flags & 16 != 0 { 64 } else { 0 };
    let ja4 = (flags & 1 != 0).then_some("t13d1516h2_8daaf6152771_d8a2da3f94cd");

    let mut headers = HeaderMap::new();
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }

    let cert_tier = flags & 32 != 0;
    let client_cert = (flags & 64 != 0).then_some("client.example");
    let r = resolver(reject_invalid, max_token_bytes, cert_tier);
    let conn = Connection { peer, ja4, client_cert };
    let first = r.resolve(&headers, conn, now);
    match &first {
        Ok(id) => {
            let prefix = format!("{}:", id.tier.name());
            assert!(id.value.starts_with(&prefix), "value {:?} of tier {:?}", id.value, id.tier);
            assert!(id.value.len() > prefix.len(), "empty identity {:?}", id.value);
            if id.tier == Tier::Fingerprint {
                assert!(ja4.is_some(), "a fingerprint identity without a JA4");
            }
            if id.tier == Tier::Key {
                assert_eq!(id.tenant.as_deref(), Some("acme"));
            }
            if id.tier == Tier::Cert {
                assert!(cert_tier && client_cert.is_some(), "a cert identity without the tier or a certificate");
            }
            if cert_tier && client_cert.is_some() {
                assert!(matches!(id.tier, Tier::User | Tier::Key | Tier::Cert), "{:?} under a cert", id.tier);
            }
            if !trusted(peer) {
                assert_eq!(id.client_ip, peer.to_canonical(), "an untrusted peer chose its address");
            }
            if trusted(peer) && !headers.contains_key("x-forwarded-for") {
                assert_eq!(id.client_ip, peer.to_canonical());
            }
        }
        Err(Rejection::TooLong { max }) => {
            assert_eq!(*max, r.max_token_bytes());
            let long = |name: &str| headers.get_all(name).iter().any(|v| v.len() > *max);
            assert!(long("authorization") || long("x-api-key"), "TooLong without a long credential");
        }
        Err(e) => assert!(reject_invalid, "refused ({e}) without reject_invalid"),
    }
    // Again, with the verifier's caches warm: the same answer.
    let second = r.resolve(&headers, conn, now);
    assert_eq!(first, second, "a second resolve differs");
    // `passed_over` asks the same questions: it never panics either.
    if let Ok(id) = &first {
        let _ = r.passed_over(&headers, conn, now, id.tier);
    }
});
