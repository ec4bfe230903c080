//! The identity waterfall through the real binary: API keys, trusted
//! proxies, TLS fingerprints, tier-restricted limits.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::{self, client, upstream, Gateway};

fn config(target: &str, identity: &str, limits: &str) -> String {
    format!(
        r#"
[listeners]
http = "127.0.0.1:0"
https = "127.0.0.1:0"

[tls]
cert = "{{cert}}"
key = "{{key}}"

[identity]
{identity}

[[identity.api_keys]]
key = "secret-acme"
tenant = "acme"
plan = "gold"

[[upstreams]]
name = "backend"
targets = ["{target}"]

[[routes]]
name = "all"
path_prefix = "/"
upstream = "backend"
limits = ["per_identity"]

[[limits]]
name = "per_identity"
rate = "2/min"
{limits}
"#
    )
}

async fn get(c: &mut client::Sender1, headers: &[(&str, &str)]) -> (StatusCode, serde_json::Value) {
    let mut req = Request::get("/headers").header("host", "x");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, _, body) = client::text(client::send(c, req.body(Full::new(Bytes::new())).unwrap()).await).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
    )
}

fn seen_identity(v: &serde_json::Value) -> String {
    v["headers"]["x-leasegate-identity"][0]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_get_their_own_bucket_and_unknown_keys_fall_through() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&up.target(), "", ""));
    let mut c = client::http1(gw.http()).await;
    let key = [("x-api-key", "secret-acme"), ("x-leasegate-identity", "user:forged")];
    let (status, v) = get(&mut c, &key).await;
    assert_eq!(status, 200);
    assert_eq!(seen_identity(&v), "key:acme");
    assert_eq!(get(&mut c, &[("authorization", "Bearer secret-acme")]).await.0, 200);
    assert_eq!(get(&mut c, &key).await.0, 429, "the key's own bucket is spent");
    // Anonymous traffic from the same address has its own bucket.
    let (status, v) = get(&mut c, &[("x-api-key", "wrong")]).await;
    assert_eq!(status, 200);
    assert_eq!(seen_identity(&v), "subnet:127.0.0.0/24");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_401_when_configured_so() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&up.target(), "on_invalid_credentials = \"reject\"", ""));
    let mut c = client::http1(gw.http()).await;
    let req = Request::get("/headers")
        .header("host", "x")
        .header("x-api-key", "guess")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, h, body) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 401);
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(h["www-authenticate"], "Bearer");
    assert!(body.contains("unknown API key"), "{body}");
    assert_eq!(up.requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(get(&mut c, &[("x-api-key", "secret-acme")]).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    let up = upstream::start("a").await;
    let trusted = Gateway::start(&config(&up.target(), "trusted_proxies = [\"127.0.0.1/32\"]", ""));
    let mut c = client::http1(trusted.http()).await;
    let (_, v) = get(&mut c, &[("x-forwarded-for", "203.0.113.5")]).await;
    assert_eq!(seen_identity(&v), "subnet:203.0.113.0/24");
    assert_eq!(v["headers"]["x-forwarded-for"][0], "203.0.113.5, 127.0.0.1");

    let untrusted = Gateway::start(&config(&up.target(), "", ""));
    let mut c = client::http1(untrusted.http()).await;
    let (_, v) = get(&mut c, &[("x-forwarded-for", "203.0.113.5")]).await;
    assert_eq!(
        seen_identity(&v),
        "subnet:127.0.0.0/24",
        "a client may not choose its bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_for_anonymous_tiers_leaves_key_holders_alone() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&up.target(), "", "tiers = [\"subnet\"]"));
    let mut c = client::http1(gw.http()).await;
    for _ in 0..5 {
        assert_eq!(get(&mut c, &[("x-api-key", "secret-acme")]).await.0, 200);
    }
    assert_eq!(get(&mut c, &[]).await.0, 200);
    assert_eq!(get(&mut c, &[]).await.0, 200);
    assert_eq!(get(&mut c, &[]).await.0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_without_keys_are_told_apart_by_fingerprint() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&config(&up.target(), "", ""));
    let cert = gw.cert.as_ref().unwrap().cert_pem.clone();
    let (mut h2, _) = client::h2_tls(gw.https(), &cert).await;
    let uri = format!("https://localhost:{}/headers", gw.https().port());
    let (_, _, body) = client::text(
        h2.send_request(Request::get(&uri).body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap(),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = seen_identity(&v);
    assert!(
        id.starts_with("fingerprint:") && id.len() == "fingerprint:".len() + 16,
        "{id}"
    );
}

#[test]
fn api_keys_can_live_in_their_own_file() {
    let dir = support::TempDir::new();
    dir.write("keys.toml", "[[api_keys]]\nsha256 = \"nothex\"\ntenant = \"t\"\n");
    let text = "[listeners]\nhttp = \"127.0.0.1:0\"\n[identity]\napi_keys_file = \"keys.toml\"\n";
    let path = dir.write("gateway.toml", text);
    let (code, _, stderr) = support::check_path(&path);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("keys.toml:2: api_keys[0].sha256: must be 64 hex digits"),
        "{stderr}"
    );

    let digest = "e6b5d6f1ba6a0ba3c1b0cbe1b1fc0ef9c2dad6d8e9d0e1b88c3cbd5b51d4e4e8";
    dir.write(
        "keys.toml",
        &format!("[[api_keys]]\nsha256 = \"{digest}\"\nid = \"ci\"\n"),
    );
    let (code, _, stderr) = support::check_path(&path);
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_names_the_refusing_limit_when_a_tier_skips_another() {
    let up = upstream::start("a").await;
    let cfg = config(&up.target(), "", "").replace(
        "limits = [\"per_identity\"]",
        "limits = [\"keys_only\", \"per_identity\"]\n\n[[limits]]\nname = \"keys_only\"\nrate = \"100/min\"\ntiers = [\"key\"]",
    );
    let gw = Gateway::start(&cfg);
    let mut c = client::http1(gw.http()).await;
    for _ in 0..2 {
        assert_eq!(get(&mut c, &[]).await.0, 200);
    }
    let req = Request::get("/headers")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, h, body) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 429);
    assert!(body.contains("\"limit\":\"per_identity\""), "{body}");
    assert_eq!(h["ratelimit-policy"], r#""per_identity";q=2;w=60"#);
}

fn jwt(claims: serde_json::Value) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(b"dev-only-secret");
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

/// The test config with HS256 JWTs signed by `dev-only-secret`, plus `extra`
/// `[identity.jwt]` keys.
fn with_jwt(target: &str, extra: &str) -> String {
    let jwt = format!("[identity.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"dev-only-secret\"\n{extra}\n\n");
    config(target, "", "").replace("[[identity.api_keys]]", &format!("{jwt}[[identity.api_keys]]"))
}

/// `token`'s claims under an unsigned `{"alg":"none","typ":"JWT"}` header.
fn none_token(token: &str) -> String {
    let claims = token.split('.').nth(1).unwrap();
    format!("Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims}.")
}

fn epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_jwts_lend_their_sub_and_forged_ones_lend_nothing() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&with_jwt(&up.target(), "audience = \"api\"\ntenant_claim = \"tenant\""));
    let mut c = client::http1(gw.http()).await;
    let good = jwt(serde_json::json!({"sub": "alice", "aud": "api", "exp": epoch() + 600, "tenant": "acme"}));
    let (status, v) = get(&mut c, &[("authorization", &format!("Bearer {good}"))]).await;
    assert_eq!(status, 200);
    assert_eq!(seen_identity(&v), "user:alice");
    let expired = jwt(serde_json::json!({"sub": "alice", "aud": "api", "exp": epoch() - 600}));
    let (_, v) = get(&mut c, &[("authorization", &format!("Bearer {expired}"))]).await;
    assert_eq!(seen_identity(&v), "subnet:127.0.0.0/24");
    let forged = format!("{}x", &good[..good.len() - 1]);
    let (_, v) = get(&mut c, &[("authorization", &format!("Bearer {forged}"))]).await;
    assert_eq!(seen_identity(&v), "subnet:127.0.0.0/24");
}

#[test]
fn jwt_config_problems_are_named() {
    let base = "[listeners]\nhttp = \"127.0.0.1:0\"\n[identity.jwt]\n";
    for (extra, needle) in [
        (
            "algorithms = [\"HS256\"]\nsecret_env = \"LEASEGATE_TEST_UNSET_VAR\"\n",
            "identity.jwt.secret_env: environment variable \"LEASEGATE_TEST_UNSET_VAR\" is not set",
        ),
        (
            "algorithms = [\"RS256\"]\npublic_key = \"missing.pem\"\n",
            "identity.jwt.public_key:",
        ),
        (
            "algorithms = [\"none\"]\nsecret = \"x\"\n",
            "identity.jwt.algorithms: unknown algorithm \"none\"",
        ),
        ("algorithms = [\"ES256\"]\n", "need public_key"),
    ] {
        let (code, _, stderr, _dir) = support::check(&format!("{base}{extra}"));
        assert_eq!(code, 1, "{extra}");
        assert!(stderr.contains(needle), "{extra}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_is_limited_bob_is_not_and_none_tokens_are_nobody() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&with_jwt(&up.target(), ""));
    let mut c = client::http1(gw.http()).await;
    let bearer = |sub: &str| format!("Bearer {}", jwt(serde_json::json!({"sub": sub, "exp": epoch() + 600})));
    let (alice, bob) = (bearer("alice"), bearer("bob"));
    for _ in 0..2 {
        assert_eq!(get(&mut c, &[("authorization", &alice)]).await.0, 200);
    }
    assert_eq!(
        get(&mut c, &[("authorization", &alice)]).await.0,
        429,
        "alice spent her 2/min"
    );
    let (status, v) = get(&mut c, &[("authorization", &bob)]).await;
    assert_eq!((status, seen_identity(&v).as_str()), (StatusCode::OK, "user:bob"));
    // alg none claiming to be bob gets nobody's bucket but the subnet's.
    let none = none_token(&bob["Bearer ".len()..]);
    let (_, v) = get(&mut c, &[("authorization", &none)]).await;
    assert_eq!(seen_identity(&v), "subnet:127.0.0.0/24");
}

/// The identity the upstream saw for one GET over TLS presenting `cert`
/// (signed by `ca`) or none.
async fn identity_over_mtls(
    gw: &Gateway,
    ca: &support::TestCa,
    cert: Option<&support::TestCert>,
) -> (StatusCode, String) {
    let config = client::mtls_config(ca, cert, b"http/1.1");
    let tcp = tokio::net::TcpStream::connect(gw.https()).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut c, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (status, v) = get(&mut c, &[]).await;
    (status, seen_identity(&v))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_the_identity_where_identity_order_puts_it() {
    let up = upstream::start("a").await;
    let ca = support::TestCa::new("clients CA");
    let server = ca.issue("gateway.test");
    let (alice, bob) = (ca.issue("alice.clients"), ca.issue("bob.clients"));
    let text = config(
        &up.target(),
        "order = [\"user\", \"key\", \"cert\", \"fingerprint\", \"subnet\"]",
        "",
    )
    .replace("cert = \"{cert}\"", "cert = \"srv.pem\"")
    .replace("key = \"{key}\"", "key = \"srv.key\"\nclient_ca = \"ca.pem\"");
    let gw = Gateway::start_with(
        &text,
        &[
            ("srv.pem", &server.cert_pem),
            ("srv.key", &server.key_pem),
            ("ca.pem", &ca.cert_pem),
        ],
    );
    assert_eq!(
        identity_over_mtls(&gw, &ca, Some(&alice)).await,
        (StatusCode::OK, "cert:alice.clients".to_string())
    );
    // Alice's own bucket (2/min): her third request is refused, Bob's is not.
    assert_eq!(identity_over_mtls(&gw, &ca, Some(&alice)).await.0, StatusCode::OK);
    assert_eq!(
        identity_over_mtls(&gw, &ca, Some(&alice)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        identity_over_mtls(&gw, &ca, Some(&bob)).await,
        (StatusCode::OK, "cert:bob.clients".to_string())
    );
    // No certificate: asked, not required; the waterfall goes on.
    let (status, id) = identity_over_mtls(&gw, &ca, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(id.starts_with("fingerprint:"), "{id}");
    // `check` refuses "cert" without [tls] client_ca.
    let without = text.replace("\nclient_ca = \"ca.pem\"", "");
    let dir = support::TempDir::new();
    for (name, body) in [("srv.pem", &server.cert_pem), ("srv.key", &server.key_pem)] {
        dir.write(name, body);
    }
    let path = dir.write("gateway.toml", &without);
    let (code, _, err) = support::check_path(&path);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("identity.order") && err.contains("needs [tls] client_ca"),
        "{err}"
    );
}

/// `rate_from = "claim:NAME"`: a verified token's own rate, clamped by
/// `max_rate`; the limit's rate for a token without it, or a forged one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_takes_its_rate_from_a_verified_claim_clamped_by_max_rate() {
    let up = upstream::start("a").await;
    let jwt_section = "[identity.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"dev-only-secret\"\n\n";
    let text = config(&up.target(), "", "rate_from = \"claim:rl_rate\"\nmax_rate = \"10/min\"")
        .replace("[[identity.api_keys]]", &format!("{jwt_section}[[identity.api_keys]]"));
    let gw = Gateway::start(&text);
    let admitted = |claims: serde_json::Value| {
        let addr = gw.http();
        async move {
            let bearer = format!("Bearer {}", jwt(claims));
            let mut c = client::http1(addr).await;
            let mut n = 0;
            let mut policy = String::new();
            for _ in 0..15 {
                let req = Request::get("/headers")
                    .header("host", "x")
                    .header("authorization", &bearer);
                let resp = client::send(&mut c, req.body(Full::new(Bytes::new())).unwrap()).await;
                if let Some(p) = resp.headers().get("ratelimit-policy") {
                    policy = p.to_str().unwrap().to_string();
                }
                if resp.status() != 200 {
                    break;
                }
                n += 1;
            }
            (n, policy)
        }
    };
    let exp = epoch() + 600;
    let own = admitted(serde_json::json!({"sub": "a", "exp": exp, "rl_rate": "5/min"})).await;
    assert_eq!(own, (5, r#""per_identity";q=5;w=60"#.to_string()));
    let greedy = admitted(serde_json::json!({"sub": "b", "exp": exp, "rl_rate": "1000/s"})).await;
    assert_eq!(
        greedy,
        (10, r#""per_identity";q=10;w=60"#.to_string()),
        "clamped by max_rate"
    );
    let none = admitted(serde_json::json!({"sub": "c", "exp": exp})).await;
    assert_eq!(none.0, 2, "no claim: the limit's own rate");
    let junk = admitted(serde_json::json!({"sub": "d", "exp": exp, "rl_rate": "lots"})).await;
    assert_eq!(junk.0, 2, "a claim that is not a rate: the limit's own");
    // check names what rate_from needs.
    let (code, _, err, _dir) = support::check(
        "[listeners]\nhttp = \"127.0.0.1:0\"\n[[limits]]\nname = \"l\"\nrate = \"1/s\"\nrate_from = \"claim:r\"\n",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("limits[0].rate_from") && err.contains("[identity.jwt]"),
        "{err}"
    );
    let (code, _, err, _dir) = support::check(&format!(
        "[listeners]\nhttp = \"127.0.0.1:0\"\n{jwt_section}[[limits]]\nname = \"l\"\nrate = \"1/s\"\nrate_from = \"claim:r\"\n"
    ));
    assert_ne!(code, 0);
    assert!(err.contains("limits[0].max_rate"), "{err}");
    let (code, _, err, _dir) = support::check(&format!(
        "[listeners]\nhttp = \"127.0.0.1:0\"\n{jwt_section}[[limits]]\nname = \"l\"\nrate = \"1/s\"\nrate_from = \"header:r\"\nmax_rate = \"5/s\"\n"
    ));
    assert_ne!(code, 0);
    assert!(err.contains("claim:NAME"), "{err}");
}
