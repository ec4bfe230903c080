//! `leasegate fingerprint` and `x-leasegate-ja4` with real rustls
//! ClientHellos.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use rustls_pki_types::ServerName;
use support::{client, upstream, Gateway, TestCert};

/// The bytes a rustls client with `alpn` sends first: its ClientHello.
fn rustls_hello(cert: &TestCert, alpn: &[&[u8]]) -> Vec<u8> {
    let cfg = client::tls_config(&cert.cert_pem, alpn);
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), ServerName::try_from("localhost").unwrap()).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fingerprint(hex: &str) -> (i32, String, String) {
    let out = Command::new(support::binary())
        .args(["fingerprint", "--hex", hex])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn fingerprints_a_real_client_hello_as_record_or_handshake() {
    let cert = TestCert::new();
    let hello = rustls_hello(&cert, &[b"h2", b"http/1.1"]);
    let (code, stdout, stderr) = fingerprint(&hex(&hello));
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let ja4 = v["ja4"].as_str().unwrap();
    assert!(ja4.starts_with("t13d") && &ja4[8..10] == "h2", "{ja4}");
    assert_eq!(ja4.len(), 36, "{ja4}");
    assert!(v["ja4_r"].as_str().unwrap().starts_with(&ja4[..10]));
    assert!(v["ja3"].as_str().unwrap().starts_with("771,"));
    assert_eq!(v["ja3_hash"].as_str().unwrap().len(), 32);
    assert_eq!(v["sni"], "localhost");
    assert_eq!(v["alpn"][0], "h2");

    // The bare handshake message (without the record header) gives the same.
    let (code, bare, _) = fingerprint(&hex(&hello[5..]));
    assert_eq!(code, 0);
    let bare: serde_json::Value = serde_json::from_str(&bare).unwrap();
    assert_eq!(bare["ja4"], v["ja4"]);

    // rustls shuffles extension order: JA4 is stable across connections.
    let again = rustls_hello(&cert, &[b"h2", b"http/1.1"]);
    let (_, stdout, _) = fingerprint(&hex(&again));
    let again: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(again["ja4"], v["ja4"]);
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    for (input, reason) in [
        ("zz", "not hex"),
        ("160", "odd number"),
        ("160301", "incomplete"),
        ("474554202f", "not a ClientHello"),
        ("010000ff0303", "incomplete"),
        ("", "incomplete"),
    ] {
        let (code, stdout, stderr) = fingerprint(input);
        assert_eq!(code, 1, "{input}: {stdout}");
        assert!(
            stderr.to_lowercase().contains(&reason.to_lowercase()),
            "{input}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sees_the_connections_ja4_and_never_a_forged_one() {
    let up = upstream::start("a").await;
    let gw = Gateway::start(&format!(
        r#"
[listeners]
http = "127.0.0.1:0"
https = "127.0.0.1:0"

[tls]
cert = "{{cert}}"
key = "{{key}}"

[[upstreams]]
name = "backend"
targets = ["{}"]

[[routes]]
name = "all"
path_prefix = "/"
upstream = "backend"
"#,
        up.target()
    ));
    let cert = gw.cert.as_ref().unwrap();
    let (_, expected, _) = fingerprint(&hex(&rustls_hello(cert, &[b"h2", b"http/1.1"])));
    let expected: serde_json::Value = serde_json::from_str(&expected).unwrap();

    let (mut h2, _) = client::h2_tls(gw.https(), &cert.cert_pem).await;
    let uri = format!("https://localhost:{}/headers", gw.https().port());
    let req = Request::get(&uri)
        .header("x-leasegate-ja4", "forged")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, _, body) = client::text(h2.send_request(req).await.unwrap()).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["headers"]["x-leasegate-ja4"],
        serde_json::json!([expected["ja4"]]),
        "{v}"
    );

    // Plain HTTP has no ClientHello, so no JA4, and a forged one is dropped.
    let mut c = client::http1(gw.http()).await;
    let req = Request::get("/headers")
        .header("host", "x")
        .header("x-leasegate-ja4", "forged")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, _, body) = client::text(client::send(&mut c, req).await).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["headers"].get("x-leasegate-ja4").is_none(), "{v}");
}
