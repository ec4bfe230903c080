//! A log line for every request: a client gone before the head is a `499`
//! (logged and counted), one gone mid-body is `"aborted": true` with the
//! bytes sent; the client, tenant, key id, bytes, upstream target and
//! time, and the cost charged are in JSON and text lines, and
//! `[gateway] access_log_fields` leaves fields out.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{client, upstream, Gateway, Toml};

const KEY: &str = "sk-secret-never-logged";

fn config(upstream: &str, gateway: &str) -> Toml {
    Toml::new()
        .gateway(&format!("workers = 1\n{gateway}"))
        .upstream("backend", upstream)
        .forward("all", "/", "backend")
        .with("limits = [\"spend\"]")
        .limit("spend", "100000/min")
        .with("by = [\"identity\"]\ncost = { reserve = 7 }")
        .raw(&format!(
            "[[identity.api_keys]]\nkey = \"{KEY}\"\nid = \"beta\"\ntenant = \"acme\"\n"
        ))
}

/// Waits (5 s at most) for an access-log line that contains `needle`.
async fn line_with(gw: &Gateway, needle: &str) -> String {
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { gw.access_log().into_iter().find(|l| l.contains(needle)) },
        || {
            format!(
                "no access-log line with {needle:?}: {:#?}\n{}",
                gw.access_log(),
                gw.log()
            )
        },
    )
    .await
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// A raw request on its own connection.
async fn raw(gw: &Gateway, request: &str) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(gw.http()).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    tcp
}

fn counter(metrics: &str, route: &str, status: u16) -> f64 {
    let name = format!("leasegate_requests_total{{route=\"{route}\",status=\"{status}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_logged_with_who_what_and_where() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(&up.target(), ""));

    // Served: who, the bytes, the target, the cost.
    let mut c = client::http1(gw.http()).await;
    let mut req = client::get("/headers?first");
    req.headers_mut().insert("x-api-key", KEY.parse().unwrap());
    req.headers_mut().insert("x-request-id", "served-1".parse().unwrap());
    let (status, _, body) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 200, "{body}");
    let v = json(&line_with(&gw, "served-1").await);
    assert_eq!(v["status"], 200);
    assert_eq!(v["client"], "127.0.0.1");
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["key_id"], "beta");
    assert_eq!(v["bytes_in"], 0);
    assert_eq!(v["bytes_out"], body.len() as u64, "{v}");
    assert_eq!(v["upstream_target"], up.addr.to_string());
    assert!(v["upstream_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["cost"], serde_json::json!({"spend": 7}));
    assert_eq!(v["aborted"], false);

    // A body: its bytes in.
    let req = http::Request::post("/sha256")
        .header("host", "gw")
        .header("x-request-id", "body-1")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"hello world")))
        .unwrap();
    let (status, _, _) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 200);
    let v = json(&line_with(&gw, "body-1").await);
    assert_eq!(v["bytes_in"], 11, "{v}");
    assert_eq!(v["identity"], "subnet");
    assert_eq!(v["key_id"], "-");

    // Gone before the head: a 499, logged and counted.
    let before = counter(&gw.metrics().await, "all", 499);
    let tcp = raw(
        &gw,
        "GET /slow?ms=1500 HTTP/1.1\r\nhost: gw\r\nx-request-id: gone-early\r\n\r\n",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(tcp);
    let v = json(&line_with(&gw, "gone-early").await);
    assert_eq!(v["status"], 499, "{v}");
    assert_eq!(v["route"], "all");
    assert_eq!(v["bytes_out"], 0);
    assert_eq!(v["aborted"], true);
    assert_eq!(counter(&gw.metrics().await, "all", 499), before + 1.0);

    // Gone mid-body: the bytes sent, and aborted.
    let mut tcp = raw(
        &gw,
        "GET /big?mb=16 HTTP/1.1\r\nhost: gw\r\nx-request-id: gone-late\r\n\r\n",
    )
    .await;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < 256 * 1024 {
        got += tcp.read(&mut buf).await.unwrap();
    }
    drop(tcp);
    let v = json(&line_with(&gw, "gone-late").await);
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["aborted"], true, "{v}");
    let out = v["bytes_out"].as_u64().unwrap();
    assert!(out > 0 && out < 16 << 20, "{v}");

    // A refusal made here is logged with its size too; no secret anywhere.
    let lines = gw.access_log();
    assert!(lines.iter().all(|l| !l.contains(KEY)), "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_carry_the_fields_and_access_log_fields_drops_some() {
    let up = upstream::start("u").await;
    let gw = Gateway::start(&config(
        &up.target(),
        "access_log = \"text\"\naccess_log_fields = [\"-client\", \"-key_id\"]",
    ));
    let mut c = client::http1(gw.http()).await;
    let mut req = client::get("/headers");
    req.headers_mut().insert("x-api-key", KEY.parse().unwrap());
    req.headers_mut().insert("x-request-id", "text-1".parse().unwrap());
    let (status, _, _) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 200);
    let line = line_with(&gw, "text-1").await;
    for field in [
        "tenant=\"acme\"",
        "bytes_in=0",
        "bytes_out=",
        &format!("upstream_target=\"{}\"", up.addr),
        "upstream_ms=",
        "cost=spend:7",
        "aborted=false",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    for gone in ["client=", "key_id=", "beta", KEY] {
        assert!(!line.contains(gone), "{gone} in {line}");
    }
}

#[test]
fn an_unknown_field_name_is_refused_at_load() {
    let dir = crate::support::TempDir::new();
    let text = config("http://127.0.0.1:9", "access_log_fields = [\"status\", \"clinet\"]").to_string();
    let path = dir.write("gateway.toml", &text);
    let e = leasegate::config::parse(&path, &text).unwrap_err().to_string();
    assert!(
        e.contains("gateway.access_log_fields") && e.contains("unknown access-log field \"clinet\""),
        "{e}"
    );
    let text = config("http://127.0.0.1:9", "access_log_fields = [\"-client\", \"status\"]").to_string();
    let e = leasegate::config::parse(&path, &text).unwrap_err().to_string();
    assert!(e.contains("mixes fields to keep with fields to drop"), "{e}");
}
