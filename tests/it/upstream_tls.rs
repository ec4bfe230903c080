//! HTTPS upstreams: TLS to a real upstream made here (a private CA, a
//! client certificate when the upstream asks), in HTTP/1.1 and h2.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::support::{self, client, tls_upstream, Gateway, TestCa, Toml};

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", "gw.example")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn answer(gw: &Gateway, path: &str) -> (http::StatusCode, serde_json::Value, String) {
    let mut c = client::http1(gw.http()).await;
    let (status, _, body) = client::text(client::send(&mut c, get(path)).await).await;
    let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    (status, json, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_of_a_private_ca_is_proxied_in_http1_and_h2() {
    let ca = TestCa::new("upstream ca");
    let up = tls_upstream::start(&ca.issue("upstream"), None).await;
    let plain = tls_upstream::start_h2c().await;
    let toml = Toml::new()
        .gateway("workers = 1")
        .upstream("one", &up.target())
        .with("ca = \"ca.pem\"")
        .upstream("two", &up.target())
        .with("ca = \"ca.pem\"\nprotocol = \"h2\"\nserver_name = \"localhost\"")
        .upstream("clear", &plain.target())
        .with("protocol = \"h2\"")
        .forward("one", "/one", "one")
        .forward("two", "/two", "two")
        .forward("clear", "/clear", "clear");
    let gw = Gateway::start_with(&toml, &[("ca.pem", &ca.cert_pem)]);
    let port = up.addr.port();

    for _ in 0..3 {
        let (status, one, body) = answer(&gw, "/one/x?q=1").await;
        assert_eq!(status, 200, "{body}\n{}", gw.log());
        assert_eq!(one["version"], "HTTP/1.1");
        assert_eq!(one["alpn"], "http/1.1");
        // The target's own name, not the gateway's.
        assert_eq!(one["host"], format!("127.0.0.1:{port}"));
        assert_eq!(one["path"], "/one/x?q=1");

        let (status, two, body) = answer(&gw, "/two/x?q=2").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(two["version"], "HTTP/2.0");
        assert_eq!(two["alpn"], "h2");
        assert_eq!(two["authority"], format!("localhost:{port}"));
        assert_eq!(two["path"], "/two/x?q=2");

        let (status, clear, body) = answer(&gw, "/clear/y").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(clear["version"], "HTTP/2.0");
        // In the clear the client's Host passes, as :authority.
        assert_eq!(clear["authority"], "gw.example");
    }
    // Pooled: one HTTP/1.1 connection kept alive, one h2 connection shared.
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
    assert_eq!(plain.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_and_a_wrong_name_are_refused_and_counted() {
    let ca = TestCa::new("upstream ca");
    let other = TestCa::new("another ca");
    let up = tls_upstream::start(&ca.issue("upstream"), None).await;
    let toml = Toml::new()
        .upstream("wrong-ca", &up.target())
        .with("ca = \"other.pem\"")
        .upstream("wrong-name", &up.target())
        .with("ca = \"ca.pem\"\nserver_name = \"elsewhere.example\"")
        .forward("a", "/a", "wrong-ca")
        .forward("b", "/b", "wrong-name");
    let gw = Gateway::start_with(&toml, &[("ca.pem", &ca.cert_pem), ("other.pem", &other.cert_pem)]);

    let (status, _, body) = answer(&gw, "/a").await;
    assert_eq!(status, 502, "{body}");
    let (status, _, body) = answer(&gw, "/b").await;
    assert_eq!(status, 502, "{body}");

    let m = gw.metrics().await;
    let failures = |upstream: &str, reason: &str| {
        support::sample(
            &m,
            &format!("leasegate_upstream_tls_handshake_failures_total{{upstream=\"{upstream}\",reason=\"{reason}\"}} "),
        )
    };
    assert_eq!(failures("wrong-ca", "unknown_ca"), 1.0, "{m}");
    assert_eq!(failures("wrong-name", "bad_name"), 1.0, "{m}");
    let line = format!("target {} is unreachable: TLS handshake", up.addr);
    assert!(
        gw.wait_for_log(&line, Duration::from_secs(2)),
        "the log names the target:\n{}",
        gw.log()
    );
    assert_eq!(up.client_certs.lock().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_to_the_upstream_presents_the_gateways_certificate() {
    let server_ca = TestCa::new("upstream ca");
    let client_ca = TestCa::new("gateways");
    let gateway_cert = client_ca.issue("gateway");
    let up = tls_upstream::start(&server_ca.issue("upstream"), Some(&client_ca)).await;
    let toml = Toml::new()
        .upstream("mtls", &up.target())
        .with("ca = \"certs/ca.pem\"\ntls_cert = \"certs/gw.crt\"\ntls_key = \"certs/gw.key\"")
        .upstream("anonymous", &up.target())
        .with("ca = \"certs/ca.pem\"")
        .forward("m", "/m", "mtls")
        .forward("n", "/n", "anonymous");
    let gw = Gateway::start_with(
        &toml,
        &[
            ("certs/ca.pem", &server_ca.cert_pem),
            ("certs/gw.crt", &gateway_cert.cert_pem),
            ("certs/gw.key", &gateway_cert.key_pem),
        ],
    );

    let (status, _, body) = answer(&gw, "/m").await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    assert_eq!(
        up.client_certs.lock().unwrap().as_slice(),
        &[tls_upstream::der(&gateway_cert)]
    );
    // Without a certificate the upstream refuses the gateway.
    let (status, _, body) = answer(&gw, "/n").await;
    assert_eq!(status, 502, "{body}");
}

#[test]
fn https_keys_are_checked() {
    let base =
        "[listeners]\nhttp = \"127.0.0.1:0\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n\n";
    let (code, _, stderr, _dir) = support::check(&format!(
        "{base}[[upstreams]]\nname = \"u\"\ntargets = [\"http://127.0.0.1:9\"]\nca = \"ca.pem\"\nprotocol = \"h3\"\n"
    ));
    assert_ne!(code, 0);
    assert!(
        stderr.contains("upstreams[0].ca") && stderr.contains("https:// targets only"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown protocol \"h3\""), "{stderr}");
    let (code, _, stderr, _dir) = support::check(&format!(
        "{base}[[upstreams]]\nname = \"u\"\ntargets = [\"https://127.0.0.1:9\", \"http://127.0.0.1:10\"]\ntls_cert = \"c.pem\"\n"
    ));
    assert_ne!(code, 0);
    assert!(stderr.contains("mixes http:// and https://"), "{stderr}");
    assert!(stderr.contains("set tls_cert and tls_key together"), "{stderr}");
}
