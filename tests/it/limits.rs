//! Rate limits through the real binary: 429s and their headers, identities,
//! rollout stages, sliding windows.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;

use crate::support::{client, Gateway, Toml};

/// One route, `demo`, answered by the gateway itself under `limits`; each
/// client address is an identity of its own.
fn config(limits: &[&str]) -> Toml {
    Toml::new()
        .gateway("instance_id = \"gw-test\"\nworkers = 2")
        .table("identity", "ipv4_prefix = 32")
        .respond("demo", "/", limits)
}

async fn get(c: &mut client::Sender1) -> (StatusCode, HeaderMap, String) {
    client::text(client::send(c, client::get("/")).await).await
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("missing {name} in {h:?}"))
        .to_str()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_per_minute_admits_five_then_429s_with_every_header() {
    let gw = Gateway::start(&config(&["five"]).limit("five", "5/min"));
    let mut c = client::http1(gw.http()).await;
    for i in 0..5u64 {
        let (status, h, _) = get(&mut c).await;
        assert_eq!(status, 200, "request {i}");
        assert_eq!(header(&h, "ratelimit-policy"), r#""five";q=5;w=60"#);
        assert_eq!(header(&h, "ratelimit-remaining"), (4 - i).to_string());
        assert_eq!(header(&h, "ratelimit-limit"), "5");
        assert!(header(&h, "ratelimit").starts_with(&format!("\"five\";r={};t=", 4 - i)));
    }
    let (status, h, body) = get(&mut c).await;
    assert_eq!(status, 429);
    let retry: u64 = header(&h, "retry-after").parse().unwrap();
    assert!((11..=12).contains(&retry), "one token per 12 s: {retry}");
    assert_eq!(header(&h, "cache-control"), "no-store");
    assert_eq!(header(&h, "content-type"), "application/problem+json");
    assert_eq!(header(&h, "ratelimit-policy"), r#""five";q=5;w=60"#);
    assert_eq!(header(&h, "ratelimit-remaining"), "0");
    let t: u64 = header(&h, "ratelimit").rsplit("t=").next().unwrap().parse().unwrap();
    assert!(retry >= t, "Retry-After {retry} must not be earlier than t={t}");
    assert_eq!(header(&h, "ratelimit-reset"), t.to_string());
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["status"].as_u64(), v["limit"].as_str()), (Some(429), Some("five")));
    // Still refused, from the local block.
    assert_eq!(get(&mut c).await.0, 429);
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"leasegate_decisions_total{limit="five",outcome="admitted"} 5"#),
        "{m}"
    );
    assert!(
        m.contains(r#"leasegate_decisions_total{limit="five",outcome="limited"} 2"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_identities_have_two_buckets() {
    let gw = Gateway::start(&config(&["two"]).limit("two", "2/min"));
    let mut a = client::http1_from("127.0.0.1", gw.http()).await;
    let mut b = client::http1_from("127.0.0.2", gw.http()).await;
    for _ in 0..2 {
        assert_eq!(get(&mut a).await.0, 200);
    }
    assert_eq!(get(&mut a).await.0, 429);
    for _ in 0..2 {
        assert_eq!(get(&mut b).await.0, 200);
    }
    assert_eq!(get(&mut b).await.0, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_counts_and_logs_but_the_client_sees_nothing() {
    let gw = Gateway::start(&config(&["watch"]).limit("watch", "3/min").with("mode = \"shadow\""));
    let mut c = client::http1(gw.http()).await;
    for _ in 0..5 {
        let (status, h, _) = get(&mut c).await;
        assert_eq!(status, 200);
        assert!(
            h.keys().all(|k| !k.as_str().starts_with("ratelimit")),
            "shadow must be invisible: {h:?}"
        );
    }
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"leasegate_decisions_total{limit="watch",outcome="shadow_limited"} 2"#),
        "{m}"
    );
    assert!(
        gw.wait_for_log("rate_limit_shadow_block", Duration::from_secs(5)),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("limit=watch"), "{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_warns_only_when_over() {
    let gw = Gateway::start(
        &config(&["gentle"])
            .limit("gentle", "2/min")
            .with("mode = \"soft\"\nenforce_after = \"2027-03-01\""),
    );
    let mut c = client::http1(gw.http()).await;
    for _ in 0..2 {
        let (status, h, _) = get(&mut c).await;
        assert_eq!(status, 200);
        assert!(h.get("ratelimit-warning").is_none());
    }
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 200);
    assert_eq!(
        header(&h, "ratelimit-warning"),
        "50% over quota; enforcement begins 2027-03-01"
    );
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"leasegate_decisions_total{limit="gentle",outcome="soft_limited"} 1"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_enforces_on_its_share_of_instances() {
    let gw = Gateway::start(
        &config(&["all"])
            .respond("other", "/other", &["none"])
            .limit("all", "1/min")
            .with("mode = \"canary\"\ncanary_percent = 100")
            .limit("none", "1/min")
            .with("mode = \"canary\"\ncanary_percent = 0"),
    );
    let mut c = client::http1(gw.http()).await;
    assert_eq!(get(&mut c).await.0, 200);
    assert_eq!(get(&mut c).await.0, 429, "canary_percent = 100 enforces everywhere");
    let other = || {
        Request::get("/other")
            .header("host", "x")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(client::send(&mut c, other()).await.status(), 200);
    let resp = client::send(&mut c, other()).await;
    assert_eq!(resp.status(), 200, "canary_percent = 0 only warns");
    assert!(resp.headers().get("ratelimit-warning").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_admits_again_once_the_window_moves() {
    let gw = Gateway::start(
        &config(&["win"])
            .limit("win", "2/1s")
            .with("algorithm = \"sliding_window\""),
    );
    let mut c = client::http1(gw.http()).await;
    // Start just after a window boundary so the test does not straddle one.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(1_000 - now % 1_000 + 20)).await;
    assert_eq!(get(&mut c).await.0, 200);
    assert_eq!(get(&mut c).await.0, 200);
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 429);
    assert!(["1", "2"].contains(&header(&h, "retry-after")));
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(get(&mut c).await.0, 200, "the window has moved on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_styles_are_the_operators_choice() {
    let cfg = config(&["one"])
        .gateway("rate_limit_headers = \"none\"")
        .limit("one", "1/min");
    let gw = Gateway::start(&cfg);
    let mut c = client::http1(gw.http()).await;
    let (_, h, _) = get(&mut c).await;
    assert!(h.keys().all(|k| !k.as_str().starts_with("ratelimit")), "{h:?}");
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 429);
    assert!(h.get("retry-after").is_some(), "a 429 always says when to retry");
    assert!(h.keys().all(|k| !k.as_str().starts_with("ratelimit")), "{h:?}");
}

/// The access log of a gateway (`[gateway]` lines `extra` added) with a
/// limit of 1/min after two requests: one admitted, one refused with
/// `x-request-id: abc`.
async fn two_logged_requests(extra: &str) -> Vec<String> {
    let toml = config(&["one"]).gateway(extra).limit("one", "1/min");
    let gw = Gateway::start(&toml);
    let mut c = client::http1(gw.http()).await;
    assert_eq!(get(&mut c).await.0, 200);
    let req = Request::get("/x?q=1")
        .header("host", "x")
        .header("x-request-id", "abc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(client::send(&mut c, req).await.status(), 429);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while gw.access_log().len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lines = gw.access_log();
    assert_eq!(lines.len(), 2, "{lines:?}");
    // Access lines go to stdout only, never among the diagnostics, which
    // still have theirs.
    let diagnostics = gw.log();
    assert!(
        !diagnostics.contains("outcome=") && !diagnostics.contains("\"outcome\""),
        "{diagnostics}"
    );
    assert!(diagnostics.contains("leasegate ready"), "{diagnostics}");
    // The last line: what `explain --json` says of the same request.
    let out = std::process::Command::new(crate::support::binary())
        .args(["explain", "--json", "--ip", "127.0.0.1", "--config"])
        .arg(&gw.config)
        .args(["GET", "/x"])
        .output()
        .unwrap();
    lines.push(String::from_utf8_lossy(&out.stdout).into_owned());
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_structured_access_log_line() {
    let lines = two_logged_requests("").await;
    let v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(v["request_id"], "abc");
    assert_eq!(v["route"], "demo");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["path"], "/x");
    assert_eq!(v["status"], 429);
    assert_eq!(v["identity"], "subnet");
    assert_eq!(v["outcome"], "limited");
    // The refusing limit by name, and its key as `explain --json` names it.
    assert_eq!(v["limit"], "one", "{v}");
    let explained: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
    assert_eq!(v["key"], explained["limits"][0]["key_hash"], "{explained}");
    let key = v["key"].as_str().unwrap();
    assert!(key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{v}");
    assert!(v["ms"].as_f64().unwrap() >= 0.0);
    assert!(v["timestamp"].is_string(), "{v}");
    let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        (
            first["status"].as_u64(),
            first["outcome"].as_str(),
            first["limit"].as_str(),
            first["key"].as_str()
        ),
        (Some(200), Some("admitted"), Some("-"), Some("-"))
    );

    let mut quiet = Gateway::start(&config(&[]).gateway("access_log = \"off\""));
    let mut c = client::http1(quiet.http()).await;
    assert_eq!(get(&mut c).await.0, 200);
    drop(c);
    // Stopped gracefully (which writes out every access-log line still
    // batched) and its stdout read to the end: a line for that request,
    // however late, would be here by now.
    let exit = quiet.stop(Duration::from_secs(10));
    assert!(exit.success(), "{exit}:\n{}", quiet.log());
    assert!(quiet.access_log().is_empty(), "{:?}", quiet.access_log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_access_log_writes_the_same_fields_as_key_value_pairs() {
    let lines = two_logged_requests("access_log = \"text\"\n").await;
    let line = &lines[1];
    assert!(line.contains("  INFO "), "{line}");
    let fields = line.split_once("  INFO ").map(|(_, f)| f).unwrap();
    let fields = fields.split_once(" ms=").map(|(f, _)| f).unwrap();
    let explained: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
    let key = explained["limits"][0]["key_hash"].as_str().unwrap();
    assert_eq!(
        fields,
        format!(
            r#"request_id="abc" route="demo" method="GET" path=/x status=429 identity="subnet" outcome="limited" limit="one" key="{key}" upstream="-""#
        )
    );
}
