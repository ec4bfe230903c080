//! The planes that talk to machines, against the real binary: `[rls]` and
//! the region link over mutual TLS, with certificates from a CA made here
//! (rcgen). A peer with a certificate the CA signed is served; one with
//! none, one from another CA, or one speaking cleartext is refused during
//! the handshake, and counted.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::support::client::mtls_config as client_config;
use crate::support::redis::Redis;
use crate::support::{sample, Gateway, TestCa, TestCert, Toml};

const YAML: &str = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Connects tonic over our own TLS (tonic's own TLS is a feature this
/// crate does not build).
#[derive(Clone)]
struct TlsConnector {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

type Connecting =
    Pin<Box<dyn Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Connecting {
        let (addr, config) = (self.addr, self.config.clone());
        Box::pin(async move {
            let tcp = TcpStream::connect(addr).await?;
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

async fn rls_client(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://rls.test")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(TlsConnector { addr, config })
        .await
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Whether one ShouldRateLimit over a channel made with `config` is
/// answered (the channel, the call, or both may fail).
async fn rls_answers(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Code, String> {
    let channel = rls_client(addr, config).await.map_err(|e| format!("connect: {e}"))?;
    let mut c = RateLimitServiceClient::new(channel);
    let call = tokio::time::timeout(Duration::from_secs(10), c.should_rate_limit(request()))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?;
    match call {
        Ok(r) => Ok(Code::try_from(r.into_inner().overall_code).unwrap()),
        Err(status) => Err(format!("call: {status}")),
    }
}

/// The nice value in a `/proc/.../stat` text.
fn stat_nice(stat: &str) -> i64 {
    // After the ")" closing the name: state is field 3, nice field 19.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    fields[16].parse().unwrap()
}

/// The nice value of each thread of `pid` named `name`.
fn thread_nice(pid: u32, name: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        out.push(stat_nice(
            &std::fs::read_to_string(task.path().join("stat")).unwrap_or_default(),
        ));
    }
    out
}

/// The process's own niceness (its main thread's, which it never
/// changes): what it was started at.
fn process_nice(pid: u32) -> i64 {
    stat_nice(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap())
}

/// Waits (5 s at most: each RLS thread lowers its own priority as it
/// starts) until `gw`'s RLS threads, `threads` or more, run 10 below the
/// process (capped at 19), and checks its worker runs at the process's
/// own niceness.
async fn rls_threads_below_the_workers(gw: &Gateway, threads: usize) {
    let own = process_nice(gw.pid());
    let want = (own + 10).min(19);
    crate::support::eventually(
        Duration::from_secs(5),
        || async move {
            let nice = thread_nice(gw.pid(), "leasegate-rls");
            (nice.len() >= threads && nice.iter().all(|n| *n == want)).then_some(())
        },
        || {
            let nice = thread_nice(gw.pid(), "leasegate-rls");
            format!("RLS threads at {nice:?}, not all at nice {want} (the process at {own})")
        },
    )
    .await;
    // On a loaded machine the listing may catch no worker thread at all
    // (CI saw `[]` twice): wait until it is seen, then it must be at the
    // process's own niceness.
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (thread_nice(gw.pid(), "leasegate-worke") == [own]).then_some(()) },
        || {
            let nice = thread_nice(gw.pid(), "leasegate-worke");
            format!("the worker at {nice:?}, not at the process's own {own}")
        },
    )
    .await;
}

/// Started under `nice` (as `nice ./scripts/test.sh` does), the RLS
/// threads stay below the workers: a step down from the process, not an
/// absolute 10 that a parent niced past 10 would put above them.
#[tokio::test]
async fn under_nice_the_rls_threads_stay_below_the_workers() {
    let toml = Toml::new()
        .gateway("workers = 1")
        .table(
            "rls",
            "listen = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"\nworkers = 2",
        )
        .respond("all", "/", &[]);
    let gw = Gateway::start_niced(&toml, &[("ratelimit.yaml", YAML)], 12);
    assert!(process_nice(gw.pid()) >= 12, "not started under nice");
    rls_threads_below_the_workers(&gw, 2).await;
}

#[tokio::test]
async fn rls_over_mutual_tls_answers_only_peers_its_ca_signed() {
    let ca = TestCa::new("leasegate test CA");
    let server = ca.issue("rls.leasegate.test");
    let envoy = ca.issue("envoy-1");
    let stranger = TestCa::new("another CA").issue("envoy-x");
    let toml = Toml::new()
        .gateway("workers = 1")
        .table(
            "rls",
            "listen = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"\ntls_cert = \"rls.pem\"\ntls_key = \"rls.key\"\nclient_ca = \"ca.pem\"\nworkers = 2",
        )
        .respond("all", "/", &[]);
    let gw = Gateway::start_with(
        &toml,
        &[
            ("ratelimit.yaml", YAML),
            ("rls.pem", &server.cert_pem),
            ("rls.key", &server.key_pem),
            ("ca.pem", &ca.cert_pem),
        ],
    );
    let addr = gw.addr("rls");
    // Its own threads (two workers, and any blocking thread of its own),
    // at a lower priority than the workers'.
    rls_threads_below_the_workers(&gw, 2).await;

    assert_eq!(
        rls_answers(addr, client_config(&ca, Some(&envoy), b"h2")).await,
        Ok(Code::Ok)
    );
    let none = rls_answers(addr, client_config(&ca, None, b"h2")).await;
    assert!(none.is_err(), "a peer without a certificate was answered: {none:?}");
    let other = rls_answers(addr, client_config(&ca, Some(&stranger), b"h2")).await;
    assert!(other.is_err(), "a certificate from another CA was answered: {other:?}");
    // Cleartext h2c on the TLS port: never a gRPC answer.
    let plain = RateLimitServiceClient::connect(format!("http://{addr}")).await;
    if let Ok(mut c) = plain {
        let r = tokio::time::timeout(Duration::from_secs(10), c.should_rate_limit(request())).await;
        assert!(!matches!(r, Ok(Ok(_))), "cleartext was answered: {r:?}");
    }
    // Each refusal is counted (as the server's side of the handshake
    // ends, which may be after the client has given up), and the plane
    // still serves its peers.
    counted(&gw, "rls", 3.0).await;
    assert_eq!(
        rls_answers(addr, client_config(&ca, Some(&envoy), b"h2")).await,
        Ok(Code::Ok)
    );

    // A new CA and certificate for the plane, written over the files in
    // place: the next handshake uses them, without a restart.
    let ca2 = TestCa::new("leasegate test CA, rotated");
    let server2 = ca2.issue("rls.leasegate.test");
    let envoy2 = ca2.issue("envoy-1");
    for (name, body) in [
        ("rls.key", &server2.key_pem),
        ("rls.pem", &server2.cert_pem),
        ("ca.pem", &ca2.cert_pem),
    ] {
        gw.dir.write(name, body);
    }
    let (ca2_ref, envoy2_ref) = (&ca2, &envoy2);
    crate::support::eventually(
        Duration::from_secs(10),
        || async move {
            rls_answers(addr, client_config(ca2_ref, Some(envoy2_ref), b"h2"))
                .await
                .ok()
        },
        || format!("the rotated certificate was never served:\n{}", gw.log()),
    )
    .await;
    let old = rls_answers(addr, client_config(&ca, Some(&envoy), b"h2")).await;
    assert!(old.is_err(), "a peer of the old CA still answered: {old:?}");
}

/// A `[region]` with the link over mutual TLS.
fn region_toml(redis: &Redis, name: &str, share: f64, primary: Option<SocketAddr>) -> Toml {
    region_toml_with(redis, name, share, primary, "")
}

/// [`region_toml`] with `extra` lines in `[region]`.
fn region_toml_with(redis: &Redis, name: &str, share: f64, primary: Option<SocketAddr>, extra: &str) -> Toml {
    let mut region = format!(
        "name = \"{name}\"\nshare = {share}\nlink = \"127.0.0.1:0\"\nrebalance_window_ms = 20000\ntls_cert = \"gw.pem\"\ntls_key = \"gw.key\"\nclient_ca = \"ca.pem\"\nid_secret_file = \"id.secret\"{extra}"
    );
    if let Some(p) = primary {
        region.push_str(&format!("\nprimary = \"https://{p}\""));
    }
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 1000")
        .table("region", &region)
        .respond("api", "/", &["global"])
        .limit("global", "100/h")
        .with("by = [\"route\"]")
}

/// POSTs a transfer to the link at `addr` over TLS made with `config`:
/// the status line, or why there was none.
async fn post_transfer(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<String, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let body = r#"{"id":1,"region":"eu-central","key":"rl:{global:api}","algorithm":"token_bucket","count":100,"period_ms":3600000,"capacity":100,"want":50,"window_ms":86400000}"#;
    let req = format!(
        "POST /v1/transfer HTTP/1.1\r\nhost: primary\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut out)).await {
        Ok(Ok(_)) | Ok(Err(_)) if !out.is_empty() => {}
        Ok(Err(e)) => return Err(format!("read: {e}")),
        Ok(Ok(_)) => return Err("closed without an answer".into()),
        Err(_) => return Err("no answer in 5 s".into()),
    }
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

#[tokio::test]
async fn the_region_link_over_mutual_tls_serves_only_the_fleet() {
    let redis = [Redis::start(), Redis::start()];
    let ca = TestCa::new("leasegate regions CA");
    let (us_cert, eu_cert) = (ca.issue("us-east.link"), ca.issue("eu-central.link"));
    let secret = "0123456789abcdef0123456789abcdef";
    let files = |c: &TestCert| {
        vec![
            ("gw.pem", c.cert_pem.clone()),
            ("gw.key", c.key_pem.clone()),
            ("ca.pem", ca.cert_pem.clone()),
            ("id.secret", secret.to_string()),
        ]
    };
    let start = |toml: Toml, c: &TestCert| {
        let files = files(c);
        let refs: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
        Gateway::start_with(&toml, &refs)
    };
    let primary = start(region_toml(&redis[0], "us-east", 0.5, None), &us_cert);
    let link = primary.addr("link");
    let eu = start(region_toml(&redis[1], "eu-central", 0.5, Some(link)), &eu_cert);

    // The region's own gateway reaches the primary over TLS, presenting
    // its certificate: its probe finds the link up.
    let eu_ref = &eu;
    crate::support::eventually(
        Duration::from_secs(15),
        || async move {
            let m = eu_ref.metrics().await;
            (sample(&m, "leasegate_region_link_up{region=\"eu-central\"}") == 1.0).then_some(())
        },
        || format!("eu never reached the primary over TLS:\n{}", eu.log()),
    )
    .await;

    // A peer of the fleet is answered.
    let member = post_transfer(link, client_config(&ca, Some(&eu_cert), b"http/1.1")).await;
    assert!(
        member.as_deref().is_ok_and(|l| l.starts_with("HTTP/1.1 ")),
        "{member:?}\n{}",
        primary.log()
    );
    // The record of the id lives two of the primary's windows (20 s), not
    // two of the day the request asked for.
    let ttl: i64 = redis[0]
        .cli(&["PTTL", "rl:{global:api}:xfer:0000000000000001"])
        .trim()
        .parse()
        .unwrap();
    assert!((1..=40_000).contains(&ttl), "the transfer record lives {ttl} ms");
    // Without a certificate, or with another CA's, no transfer.
    let none = post_transfer(link, client_config(&ca, None, b"http/1.1")).await;
    assert!(none.is_err(), "a peer without a certificate got {none:?}");
    let stranger = TestCa::new("another CA").issue("mallory");
    let other = post_transfer(link, client_config(&ca, Some(&stranger), b"http/1.1")).await;
    assert!(other.is_err(), "another CA's certificate got {other:?}");
    // Plain HTTP on the TLS port is never answered with HTTP.
    let mut plain = TcpStream::connect(link).await.unwrap();
    plain
        .write_all(b"POST /v1/transfer HTTP/1.1\r\nhost: p\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
    assert!(!String::from_utf8_lossy(&out).contains("HTTP/1.1"), "{out:?}");
    counted(&primary, "region_link", 3.0).await;
}

/// Waits (5 s at most) until `gw` counted `want` or more handshake
/// failures of `reason`.
async fn counted(gw: &Gateway, reason: &str, want: f64) {
    let series = format!("leasegate_tls_handshake_failures_total{{reason=\"{reason}\"}}");
    let series = series.as_str();
    crate::support::eventually(
        Duration::from_secs(5),
        || async move { (sample(&gw.metrics().await, series) >= want).then_some(()) },
        || format!("{series} below {want}:\n{}", gw.log()),
    )
    .await;
}

/// `allow_subjects`: of the certificates the plane's CA signed, only those
/// whose common name (or a SAN DNS name) is listed use the plane; another
/// is refused before its first request, logged and counted.
#[tokio::test]
async fn rls_refuses_a_signed_certificate_whose_subject_is_not_listed() {
    let ca = TestCa::new("leasegate test CA");
    let server = ca.issue("rls.leasegate.test");
    let (listed, unlisted) = (ca.issue("envoy-1"), ca.issue("region-eu.link"));
    let toml = Toml::new()
        .gateway("workers = 1")
        .table(
            "rls",
            "listen = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"\ntls_cert = \"rls.pem\"\ntls_key = \"rls.key\"\nclient_ca = \"ca.pem\"\nallow_subjects = [\"ENVOY-1\", \"envoy-2\"]",
        )
        .respond("all", "/", &[]);
    let gw = Gateway::start_with(
        &toml,
        &[
            ("ratelimit.yaml", YAML),
            ("rls.pem", &server.cert_pem),
            ("rls.key", &server.key_pem),
            ("ca.pem", &ca.cert_pem),
        ],
    );
    let addr = gw.addr("rls");
    assert_eq!(
        rls_answers(addr, client_config(&ca, Some(&listed), b"h2")).await,
        Ok(Code::Ok)
    );
    let refused = rls_answers(addr, client_config(&ca, Some(&unlisted), b"h2")).await;
    assert!(refused.is_err(), "an unlisted subject was answered: {refused:?}");
    counted(&gw, "rls_subject", 1.0).await;
    assert!(
        gw.wait_for_log("certificate not in allow_subjects", Duration::from_secs(5)),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("region-eu.link"), "{}", gw.log());
    assert_eq!(
        rls_answers(addr, client_config(&ca, Some(&listed), b"h2")).await,
        Ok(Code::Ok)
    );
}

#[tokio::test]
async fn the_region_link_refuses_a_signed_certificate_whose_subject_is_not_listed() {
    let redis = Redis::start();
    let ca = TestCa::new("leasegate regions CA");
    let (us_cert, eu_cert, rls_cert) = (
        ca.issue("us-east.link"),
        ca.issue("eu-central.link"),
        ca.issue("envoy-1"),
    );
    let files = [
        ("gw.pem", us_cert.cert_pem.as_str()),
        ("gw.key", us_cert.key_pem.as_str()),
        ("ca.pem", ca.cert_pem.as_str()),
        ("id.secret", "0123456789abcdef0123456789abcdef"),
    ];
    let toml = region_toml_with(
        &redis,
        "us-east",
        0.5,
        None,
        "\nallow_subjects = [\"us-east.link\", \"eu-central.link\"]",
    );
    let primary = Gateway::start_with(&toml, &files);
    let link = primary.addr("link");
    let member = post_transfer(link, client_config(&ca, Some(&eu_cert), b"http/1.1")).await;
    assert!(
        member.as_deref().is_ok_and(|l| l.starts_with("HTTP/1.1 ")),
        "{member:?}\n{}",
        primary.log()
    );
    // A transfer is logged at DEBUG, never at INFO: the peer's strings
    // cannot fill the log.
    assert!(
        primary.wait_for_log("region transfer answered", Duration::from_secs(5)),
        "{}",
        primary.log()
    );
    let log = primary.log();
    let info: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("INFO") && l.contains("transfer"))
        .collect();
    assert!(info.is_empty(), "{info:?}");
    // Signed by the fleet's CA, but an Envoy's: not a region.
    let envoy = post_transfer(link, client_config(&ca, Some(&rls_cert), b"http/1.1")).await;
    assert!(envoy.is_err(), "an unlisted subject got {envoy:?}");
    counted(&primary, "region_link_subject", 1.0).await;
    assert!(
        primary.log().contains("certificate not in allow_subjects"),
        "{}",
        primary.log()
    );
}

/// GETs `path` on the gateway's http listener; the status.
async fn status_of(gw: &Gateway, path: &str) -> u16 {
    let mut c = crate::support::client::http1(gw.http()).await;
    let resp = crate::support::client::send(&mut c, crate::support::client::get(path)).await;
    resp.status().as_u16()
}

#[tokio::test]
async fn a_gateway_on_rediss_with_an_acl_user_leases_and_falls_back_like_on_plain_redis() {
    let ca = TestCa::new("leasegate redis CA");
    let mut redis = Redis::start_tls(&ca);
    let acl = [
        "ACL",
        "SETUSER",
        "leasegate",
        "on",
        ">a-long-redis-password",
        "~*",
        "&*",
        "+@all",
    ];
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let tls_port = redis.tls_port.unwrap();
    let toml = |password: &str| {
        Toml::new()
            .gateway("workers = 1\naccess_log = \"off\"")
            .redis(
                &format!("rediss://leasegate:{password}@127.0.0.1:{tls_port}"),
                "timeout_ms = 1000\nca = \"ca.pem\"",
            )
            .table("leasing", "min = 1\nmax = 2")
            .respond("api", "/api", &["five"])
            .with("on_store_failure = \"allow\"")
            .respond("other", "/other", &["five"])
            .with("on_store_failure = \"allow\"")
            .limit("five", "5/min")
            .with("by = [\"route\"]")
    };
    let gw = Gateway::start_with(&toml("a-long-redis-password"), &[("ca.pem", &ca.cert_pem)]);
    assert!(
        gw.wait_for_log(": connected to Redis", Duration::from_secs(20)),
        "{}",
        gw.log()
    );

    // Leases from the store, over TLS, as the ACL user.
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(status_of(&gw, "/api").await);
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 429]);
    let keys = redis.cli(&["--scan", "--pattern", "rl:*"]);
    assert!(keys.contains("five"), "no bucket in the store: {keys:?}");
    let clients = redis.cli(&["CLIENT", "LIST"]);
    assert!(clients.contains("user=leasegate"), "{clients}");

    // Redis dies: the fail-open route goes on by its fallback bucket.
    redis.kill();
    let before = sample(&gw.metrics().await, "rate_limit_bypassed_total{reason=\"store_error\"}")
        + sample(
            &gw.metrics().await,
            "rate_limit_bypassed_total{reason=\"store_timeout\"}",
        );
    assert_eq!(status_of(&gw, "/other").await, 200);
    let m = gw.metrics().await;
    let after = sample(&m, "rate_limit_bypassed_total{reason=\"store_error\"}")
        + sample(&m, "rate_limit_bypassed_total{reason=\"store_timeout\"}")
        + sample(&m, "rate_limit_bypassed_total{reason=\"store_circuit_open\"}");
    assert!(after > before, "{m}");

    // Back (empty, so the user is made again): the gateway reconnects over
    // TLS and leases from the store again.
    redis.restart();
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let (gw_ref, redis_ref) = (&gw, &redis);
    crate::support::eventually(
        Duration::from_secs(20),
        || async move {
            let _ = status_of(gw_ref, "/other").await;
            redis_ref
                .cli(&["--scan", "--pattern", "rl:*"])
                .contains("other")
                .then_some(())
        },
        || format!("never leased again:\n{}", gw.log()),
    )
    .await;

    // A wrong password is refused by Redis, and said so.
    let wrong = Gateway::start_with(&toml("not-the-password"), &[("ca.pem", &ca.cert_pem)]);
    assert!(!wrong.wait_for_log(": connected to Redis", Duration::from_secs(3)));
    assert!(
        wrong.log().contains("Password authentication failed"),
        "{}",
        wrong.log()
    );
}
