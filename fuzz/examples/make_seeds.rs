//! Writes the generated part of the seed corpus under `fuzz/seeds/`:
//! ClientHellos (client_hello, ja), request headers with real tokens and
//! keys (identity) and transfer request bodies (region_wire). The other
//! seeds are files copied or written by hand.
//!
//!     cargo +nightly run --manifest-path fuzz/Cargo.toml --example make_seeds
//!
//! Deterministic: running it again rewrites the same bytes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use leasegate::quota::{Algorithm as QuotaAlgorithm, Rate, Share, Spec};
use leasegate::region::wire::TransferRequest;
use serde_json::json;

/// Must match fuzz_targets/identity.rs.
const SECRET: &[u8] = b"fuzz-secret";
const API_KEY: &str = "fuzz-key-1";
/// 2100-01-01: the tokens stay valid for the verifier (which reads the clock).
const FAR_EXP: u64 = 4_102_444_800;

fn dir(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    std::fs::create_dir_all(&d).expect("seed directory");
    d
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    std::fs::write(dir(target).join(name), bytes).expect("seed written");
}

// ---- ClientHellos ----

fn u16s(prefix_len: usize, values: &[u16]) -> Vec<u8> {
    let n = values.len() * 2;
    let mut out = if prefix_len == 1 {
        vec![n as u8]
    } else {
        (n as u16).to_be_bytes().to_vec()
    };
    for v in values {
        out.extend(v.to_be_bytes());
    }
    out
}

fn sni(host: &str) -> Vec<u8> {
    let mut entry = vec![0u8];
    entry.extend((host.len() as u16).to_be_bytes());
    entry.extend(host.as_bytes());
    let mut out = (entry.len() as u16).to_be_bytes().to_vec();
    out.extend(entry);
    out
}

fn alpn(protocols: &[&str]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in protocols {
        list.push(p.len() as u8);
        list.extend(p.as_bytes());
    }
    let mut out = (list.len() as u16).to_be_bytes().to_vec();
    out.extend(list);
    out
}

/// A ClientHello handshake message (version 0x0303, 32-byte session id).
fn hello(ciphers: &[u16], exts: Option<&[(u16, Vec<u8>)]>) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(32);
    body.extend([9u8; 32]);
    body.extend(u16s(2, ciphers));
    body.extend([1, 0]);
    if let Some(exts) = exts {
        let mut e = Vec::new();
        for (kind, data) in exts {
            e.extend(kind.to_be_bytes());
            e.extend((data.len() as u16).to_be_bytes());
            e.extend(data);
        }
        body.extend((e.len() as u16).to_be_bytes());
        body.extend(e);
    }
    let n = body.len();
    let mut m = vec![1, (n >> 16) as u8, (n >> 8) as u8, n as u8];
    m.extend(body);
    m
}

/// `hs` in TLS records of at most `chunk` bytes each.
fn records(hs: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in hs.chunks(chunk) {
        out.extend([0x16, 3, 1, (c.len() >> 8) as u8, c.len() as u8]);
        out.extend(c);
    }
    out
}

/// Chrome 143 as src/fingerprint/ja4.rs rebuilds it (JA4
/// t13d1516h2_8daaf6152771_d8a2da3f94cd).
fn chrome() -> Vec<u8> {
    let ciphers = [
        0x8a8a, 4865, 4866, 4867, 49195, 49199, 49196, 49200, 52393, 52392, 49171, 49172, 156, 157, 47, 53,
    ];
    let exts: Vec<(u16, Vec<u8>)> = vec![
        (0x3a3a, vec![]),
        (45, vec![1, 1]),
        (51, vec![0, 0]),
        (16, alpn(&["h2", "http/1.1"])),
        (65037, vec![0]),
        (23, vec![]),
        (17613, vec![0, 3, 2, b'h', b'2']),
        (0, sni("tls.browserleaks.com")),
        (11, vec![1, 0]),
        (10, u16s(2, &[0x9a9a, 4588, 29, 23, 24])),
        (43, u16s(1, &[0xdada, 0x0304, 0x0303])),
        (65281, vec![0]),
        (35, vec![]),
        (18, vec![]),
        (5, vec![1, 0, 0, 0, 0]),
        (13, u16s(2, &[0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601])),
        (27, vec![2, 0, 2]),
        (0x1a1a, vec![0]),
    ];
    hello(&ciphers, Some(&exts))
}

fn client_hellos() -> Vec<(&'static str, Vec<u8>)> {
    let chrome = chrome();
    let quic = hello(&[0x1301], Some(&[(0x0039, vec![]), (0x0010, alpn(&["h3"]))]));
    let tls12 = hello(&[0xc02f, 0x009c], None);
    let odd_alpn = hello(&[0x1301], Some(&[(0x0010, alpn(&["\u{1}x~"])), (0x000b, vec![1, 0])]));
    let many: Vec<u16> = (1..=120).collect();
    let many_exts: Vec<(u16, Vec<u8>)> = (0x0100..0x0100 + 110).map(|e| (e, vec![])).collect();
    let many = hello(&many, Some(&many_exts));
    vec![
        ("chrome-bare", chrome.clone()),
        ("chrome-record", records(&chrome, 16_384)),
        ("chrome-records-7", records(&chrome, 7)),
        ("chrome-records-100", records(&chrome, 100)),
        ("quic-bare", quic.clone()),
        ("quic-record", records(&quic, 16_384)),
        ("tls12-no-extensions", records(&tls12, 16_384)),
        ("alpn-not-alphanumeric", odd_alpn),
        ("over-99", records(&many, 16_384)),
    ]
}

// ---- identity: 8 settings bytes, then `name: value` lines ----

fn identity_input(flags: u8, addr: [u8; 4], now: [u8; 3], headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend(addr);
    out.extend(now);
    for (i, (k, v)) in headers.iter().enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend(format!("{k}: {v}").bytes());
    }
    out
}

fn token(alg: Algorithm, secret: &[u8], claims: serde_json::Value) -> String {
    encode(&Header::new(alg), &claims, &EncodingKey::from_secret(secret)).expect("a token")
}

fn identity() -> Vec<(&'static str, Vec<u8>)> {
    let good = token(
        Algorithm::HS256,
        SECRET,
        json!({"sub": "alice", "exp": FAR_EXP, "tenant": "t1", "plan": "pro"}),
    );
    let expired = token(Algorithm::HS256, SECRET, json!({"sub": "bob", "exp": 1_000_000}));
    let wrong_key = token(Algorithm::HS256, b"another", json!({"sub": "eve", "exp": FAR_EXP}));
    let hs384 = token(Algorithm::HS384, SECRET, json!({"sub": "carol", "exp": FAR_EXP}));
    let empty_sub = token(Algorithm::HS256, SECRET, json!({"sub": "", "exp": FAR_EXP}));
    // alg none: header {"alg":"none","typ":"JWT"}, no signature.
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJtYWxsb3J5IiwiZXhwIjo0MTAyNDQ0ODAwfQ.";
    let bearer = |t: &str| format!("Bearer {t}");
    vec![
        ("jwt-valid", identity_input(0, [198, 51, 100, 7], [0, 0, 1], &[("authorization", &bearer(&good))])),
        (
            "jwt-valid-and-key",
            identity_input(1, [198, 51, 100, 7], [0, 0, 1], &[("authorization", &bearer(&good)), ("x-api-key", API_KEY)]),
        ),
        ("jwt-expired-key", identity_input(0, [1, 2, 3, 4], [0, 1, 0], &[("authorization", &bearer(&expired)), ("x-api-key", API_KEY)])),
        ("jwt-expired-strict", identity_input(8, [1, 2, 3, 4], [0, 1, 0], &[("authorization", &bearer(&expired))])),
        ("jwt-wrong-key", identity_input(8, [1, 2, 3, 4], [0, 0, 0], &[("authorization", &bearer(&wrong_key))])),
        ("jwt-hs384", identity_input(8, [1, 2, 3, 4], [0, 0, 0], &[("authorization", &bearer(&hs384))])),
        ("jwt-empty-sub", identity_input(0, [1, 2, 3, 4], [0, 0, 0], &[("authorization", &bearer(&empty_sub))])),
        ("jwt-alg-none", identity_input(8, [1, 2, 3, 4], [0, 0, 0], &[("authorization", &bearer(none))])),
        ("key-header", identity_input(2, [203, 0, 113, 9], [0, 0, 0], &[("x-api-key", API_KEY)])),
        ("key-bearer", identity_input(2, [203, 0, 113, 9], [0, 0, 0], &[("authorization", &bearer(API_KEY))])),
        ("key-unknown-strict", identity_input(10, [203, 0, 113, 9], [0, 0, 0], &[("x-api-key", "nope")])),
        ("key-too-long", identity_input(16, [203, 0, 113, 9], [0, 0, 0], &[("x-api-key", &"k".repeat(100))])),
        (
            "xff-trusted",
            identity_input(0, [10, 1, 2, 3], [0, 0, 0], &[("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.9.9.9")]),
        ),
        (
            "xff-two-lines",
            identity_input(6, [10, 1, 2, 3], [0, 0, 0], &[("x-forwarded-for", "[2001:db8::1]:443"), ("x-forwarded-for", "198.51.100.1:80, 10.0.0.1")]),
        ),
        ("xff-garbage", identity_input(0, [10, 1, 2, 3], [0, 0, 0], &[("x-forwarded-for", "not-an-ip, 10.3.3.3")])),
        ("xff-untrusted", identity_input(2, [8, 8, 8, 8], [0, 0, 0], &[("x-forwarded-for", "203.0.113.9")])),
        (
            "fingerprint",
            identity_input(1, [198, 51, 100, 7], [0, 0, 0], &[("host", "api.example.com"), ("user-agent", "x"), ("accept", "*/*")]),
        ),
        ("ipv6-subnet", identity_input(4, [1, 2, 3, 4], [0, 0, 0], &[("accept", "*/*")])),
    ]
}

// ---- region_wire: transfer request bodies ----

fn region_wire() -> Vec<(&'static str, Vec<u8>)> {
    let spec = |algorithm, count, secs, capacity| {
        Spec::new(
            algorithm,
            Rate {
                count,
                period: Duration::from_secs(secs),
            },
            capacity,
        )
    };
    let eu = spec(QuotaAlgorithm::TokenBucket, 10_000, 60, 10_000).slice(Share::from_fraction(0.3).expect("share"));
    let body = |r: TransferRequest| serde_json::to_vec(&r).expect("json");
    vec![
        ("token-bucket-sliced", body(TransferRequest::new(7, "eu", "rl:{api:k}", &eu, eu.capacity, 20_000))),
        (
            "sliding-window",
            body(TransferRequest::new(3, "us-east", "rl:{global}", &spec(QuotaAlgorithm::SlidingWindow, 100, 60, 100), 10, 1_000)),
        ),
        (
            "fixed-window-rls",
            body(TransferRequest::new(
                u64::MAX,
                "ap",
                "rl:{rls:edge:remote_address=198.51.100.1}",
                &spec(QuotaAlgorithm::FixedWindow, 500, 1, 500),
                1,
                86_400_000,
            )),
        ),
        ("answer", serde_json::to_vec(&json!({"id": 7, "granted": 3000})).expect("json")),
        ("key-only", b"rl:{api:k:s03}".to_vec()),
    ]
}

fn main() {
    for (name, bytes) in client_hellos() {
        write("client_hello", name, &bytes);
        write("ja", name, &bytes);
    }
    for (name, bytes) in identity() {
        write("identity", name, &bytes);
    }
    for (name, bytes) in region_wire() {
        write("region_wire", name, &bytes);
    }
    // Sanity: the generated ClientHellos parse, and Chrome's JA4 is the one
    // published.
    let f = leasegate::fingerprint::fingerprint(&chrome()).expect("chrome parses");
    assert_eq!(f.ja4.ja4, "t13d1516h2_8daaf6152771_d8a2da3f94cd");
    for (name, bytes) in client_hellos() {
        assert!(leasegate::fingerprint::parse(&bytes).is_ok(), "{name}");
    }
    for (name, bytes) in region_wire().into_iter().take(3) {
        assert!(TransferRequest::parse(&bytes).is_ok(), "{name}");
    }
    println!("seeds written under {}", Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").display());
}
