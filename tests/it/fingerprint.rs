//! `leasegate fingerprint` and `x-leasegate-ja4` with real rustls
//! ClientHellos.

use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use rustls_pki_types::ServerName;

use crate::support::{self, client, upstream, Gateway, TestCert};

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

/// Captures the ClientHello a real client sends to a listener that never
/// answers, and fingerprints it.
fn capture(client: impl FnOnce(u16) -> std::process::Child) -> serde_json::Value {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = client(port);
    let (mut stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match leasegate::fingerprint::record::client_hello_extent(&buf, 1 << 16) {
            Ok(leasegate::fingerprint::record::Extent::Complete(n)) => {
                buf.truncate(n);
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("not a ClientHello: {e}"),
        }
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "client closed before its hello was complete");
        buf.extend_from_slice(&chunk[..n]);
    }
    drop(stream);
    let _ = child.kill();
    let _ = child.wait();
    let (code, stdout, stderr) = fingerprint(&hex(&buf));
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn quiet(mut cmd: Command) -> std::process::Child {
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.spawn().unwrap()
}

#[test]
fn hellos_captured_from_openssl_and_curl_fingerprint_as_their_options_say() {
    support::require_tool("openssl", "apt-get install -y openssl");
    support::require_tool("curl", "apt-get install -y curl");
    let openssl = |args: &'static [&'static str]| {
        move |port: u16| {
            let mut cmd = Command::new("openssl");
            cmd.arg("s_client")
                .arg("-connect")
                .arg(format!("127.0.0.1:{port}"))
                .args(args);
            quiet(cmd)
        }
    };
    // TLS 1.3 with SNI and ALPN h2.
    let v = capture(openssl(&["-tls1_3", "-servername", "api.example.com", "-alpn", "h2"]));
    let ja4 = v["ja4"].as_str().unwrap();
    assert!(ja4.starts_with("t13d") && &ja4[8..10] == "h2", "{ja4}");
    assert_eq!(v["sni"], "api.example.com");
    // TLS 1.2 only, no SNI, no ALPN: the legacy version, "i" and "00".
    let v = capture(openssl(&["-tls1_2", "-noservername"]));
    let ja4 = v["ja4"].as_str().unwrap();
    assert!(ja4.starts_with("t12i") && &ja4[8..10] == "00", "{ja4}");
    assert!(v["ja3"].as_str().unwrap().starts_with("771,"));
    // curl over HTTP/2: TLS 1.3, SNI, h2 first.
    let v = capture(|port| {
        let mut cmd = Command::new("curl");
        cmd.args(["-sk", "--http2", "--max-time", "10"])
            .arg(format!("https://localhost:{port}/"));
        quiet(cmd)
    });
    let ja4 = v["ja4"].as_str().unwrap();
    assert!(ja4.starts_with("t13d") && &ja4[8..10] == "h2", "{ja4}");
    assert_eq!(v["sni"], "localhost");
}
