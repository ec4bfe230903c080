//! Identity resolution costs: JWT verification (HS256; RS256 cold and
//! cached), the waterfall with no credentials against a repeated forged
//! token, and ClientHello parsing with JA4.
//!
//! Run: `cargo bench --bench identity`. Figures in docs/benchmarks.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::{encode, Algorithm, DecodingKey, EncodingKey, Header};
use leasegate::identity::jwt::{Keys, Settings, Verifier};
use serde_json::json;

fn exp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3_600
}

fn verifier(alg: Algorithm, keys: Vec<Keys>) -> Verifier {
    Verifier::new(Settings {
        algorithms: vec![alg],
        keys,
        issuer: None,
        audience: None,
        tenant_claim: Some("tenant".into()),
        plan_claim: None,
        rate_claims: vec![],
        leeway_secs: 5,
    })
}

fn bench(c: &mut Criterion) {
    let claims = json!({"sub": "alice", "exp": exp(), "tenant": "acme"});
    let mut group = c.benchmark_group("jwt");

    let hs = verifier(Algorithm::HS256, vec![Keys::Secret(b"dev-only-secret".to_vec())]);
    let hs_token = encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(b"dev-only-secret"),
    )
    .unwrap();
    group.bench_function("HS256 verify", |b| {
        b.iter(|| hs.verify_uncached(black_box(&hs_token)).unwrap())
    });

    let rsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let rs = verifier(
        Algorithm::RS256,
        vec![Keys::Public(
            DecodingKey::from_rsa_pem(rsa.public_key_pem().as_bytes()).unwrap(),
        )],
    );
    let rs_token = encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &EncodingKey::from_rsa_pem(rsa.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    group.bench_function("RS256 verify, cold", |b| {
        b.iter(|| rs.verify_uncached(black_box(&rs_token)).unwrap())
    });
    let now = exp() - 3_600;
    rs.verify(&rs_token, now).unwrap();
    group.bench_function("RS256 verify, cached", |b| {
        b.iter(|| rs.verify(black_box(&rs_token), now).unwrap())
    });
    group.finish();

    // The waterfall itself: a request without credentials against one that
    // repeats a forged ES256 token (remembered as refused after its first
    // check), with a forged token's full check beside them.
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let es = Arc::new(verifier(
        Algorithm::ES256,
        vec![Keys::Public(
            DecodingKey::from_ec_pem(ec.public_key_pem().as_bytes()).unwrap(),
        )],
    ));
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let forged = encode(
        &Header::new(Algorithm::ES256),
        &claims,
        &EncodingKey::from_ec_pem(other.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    let resolver = leasegate::identity::Resolver {
        ipv4_prefix: 24,
        ipv6_prefix: 64,
        jwt: Some(es.clone()),
        ..Default::default()
    };
    let conn = leasegate::identity::Connection {
        peer: "198.51.100.7".parse().unwrap(),
        ja4: None,
        client_cert: None,
    };
    let mut plain = http::HeaderMap::new();
    plain.insert("user-agent", http::HeaderValue::from_static("bench/1.0"));
    plain.insert("accept", http::HeaderValue::from_static("*/*"));
    let mut with_forged = plain.clone();
    with_forged.insert(
        "authorization",
        http::HeaderValue::from_str(&format!("Bearer {forged}")).unwrap(),
    );
    let now = exp() - 3_600;
    let mut group = c.benchmark_group("waterfall");
    group.bench_function("no credentials", |b| {
        b.iter(|| resolver.resolve(black_box(&plain), conn, 0).unwrap())
    });
    group.bench_function("forged ES256, repeated", |b| {
        b.iter(|| resolver.resolve(black_box(&with_forged), conn, now).unwrap())
    });
    group.bench_function("forged ES256, full check", |b| {
        b.iter(|| es.verify_uncached(black_box(&forged)).unwrap_err())
    });
    group.finish();

    // A real ClientHello, as rustls sends it.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let server = rustls_pki_types::ServerName::try_from("api.example.com").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), server).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut group = c.benchmark_group("client hello");
    group.bench_function("parse + JA4", |b| {
        b.iter(|| {
            let h = leasegate::fingerprint::parse(black_box(&hello)).unwrap();
            leasegate::fingerprint::ja4::ja4(&h)
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
