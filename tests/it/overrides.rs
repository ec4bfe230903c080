//! Overrides at run time: a caller's own rate under a limit, set through
//! one instance's admin API and enforced by the whole fleet within
//! seconds, kept in Redis across restarts.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::support::redis::Redis;
use crate::support::{client, Gateway, Toml};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn config(store: &str) -> String {
    Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .table("admin", "token_file = \"admin.token\"")
        .raw("[[identity.api_keys]]\nkey = \"k-acme\"\ntenant = \"acme\"")
        .raw("[[identity.api_keys]]\nkey = \"k-zed\"\ntenant = \"zed\"")
        .respond("api", "/", &["per_key"])
        .limit("per_key", "2/min")
        .to_string()
}

fn start(store: &str) -> Gateway {
    let text = config(store);
    let files = [("admin.token", TOKEN)];
    if store.contains("redis") {
        let gw = Gateway::start_with(&text, &files);
        assert!(
            gw.wait_for_log(": connected to Redis", Duration::from_secs(20)),
            "{}",
            gw.log()
        );
        gw
    } else {
        Gateway::start_with(&text, &files)
    }
}

/// An admin call: status and body.
async fn admin(gw: &Gateway, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let mut c = client::http1(gw.admin()).await;
    let mut req = Request::builder().method(method).uri(path).header("host", "admin");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let (status, _, text) = client::text(client::send(&mut c, req).await).await;
    (status.as_u16(), text)
}

/// Requests by key `k` until one is refused: how many were admitted (at
/// most `up_to`), and the last `RateLimit-Policy`.
async fn admitted(gw: &Gateway, k: &str, up_to: usize) -> (usize, String) {
    let mut c = client::http1(gw.http()).await;
    let mut policy = String::new();
    for n in 0..up_to {
        let req = Request::builder()
            .uri("/")
            .header("host", "gw")
            .header("x-api-key", k)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client::send(&mut c, req).await;
        if let Some(p) = resp.headers().get("ratelimit-policy") {
            policy = p.to_str().unwrap().to_string();
        }
        if resp.status() != 200 {
            return (n, policy);
        }
    }
    (up_to, policy)
}

/// Waits until `gw` shows `want` overrides of `per_key`, for at most 5 s:
/// how long it took.
async fn applied_within(gw: &Gateway, want: u64) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let (status, body) = admin(gw, "GET", "/overrides", "", Some(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["count"]["per_key"].as_u64().unwrap_or(0) == want {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_put_on_one_instance_is_enforced_by_both_and_delete_restores_the_file() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let (a, b) = (start(&store), start(&store));
    let path = "/overrides/per_key/key:acme";
    let body = r#"{"rate": "100/min", "burst": 100}"#;
    // Without the token, nothing changes.
    assert_eq!(admin(&a, "PUT", path, body, None).await.0, 401);
    assert_eq!(admin(&a, "PUT", path, body, Some("not-the-token")).await.0, 401);
    assert_eq!(admin(&a, "GET", "/overrides", "", None).await.0, 401);
    let (status, answer) = admin(&a, "PUT", path, body, Some(TOKEN)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("\"store\":\"redis\"") && answer.contains("\"rate\":\"100/min\""),
        "{answer}"
    );
    let took = applied_within(&b, 1).await;
    assert!(took.is_some(), "b never applied it:\n{}", b.log());
    // Both enforce 100/min for acme, and the file's 2/min for zed (one
    // quota for the fleet: b finds a's two spent).
    for (gw, zed) in [(&a, 2), (&b, 0)] {
        let (n, policy) = admitted(gw, "k-acme", 20).await;
        assert_eq!(n, 20, "{policy}");
        assert_eq!(policy, "\"per_key\";q=100;w=60");
        assert_eq!(admitted(gw, "k-zed", 5).await.0, zed);
    }
    // The fleet shares acme's 100: 40 spent, at most 60 more.
    let (n, _) = admitted(&b, "k-acme", 200).await;
    assert!((40..=60).contains(&n), "acme's override is one shared quota: {n} more");
    // `leasegate explain --admin` shows it in force for acme.
    let out = std::process::Command::new(crate::support::binary())
        .args(["explain", "--config"])
        .arg(b.dir.path().join("gateway.toml"))
        .args([
            "--admin",
            &format!("http://{}", b.admin()),
            "--header",
            "X-API-Key: k-acme",
            "GET",
            "/",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("override for key:acme in force: 100/min burst 100, not the file's rate"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Listed, with a count per limit, in /config too.
    let (_, cfg) = admin(&b, "GET", "/config", "", Some(TOKEN)).await;
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(cfg["overrides"]["count"]["per_key"], 1, "{cfg}");
    assert_eq!(cfg["overrides"]["overrides"][0]["who"], "key:acme", "{cfg}");
    // DELETE on b: a is back on the file's 2/min within 5 s.
    assert_eq!(admin(&b, "DELETE", path, "", None).await.0, 401);
    let (status, answer) = admin(&b, "DELETE", path, "", Some(TOKEN)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        applied_within(&a, 0).await.is_some(),
        "a kept the override:\n{}",
        a.log()
    );
    let (_, policy) = admitted(&a, "k-acme", 1).await;
    assert_eq!(policy, "\"per_key\";q=2;w=60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_outlive_a_restart_on_redis_and_bad_ones_are_refused_in_words() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let gw = start(&store);
    let cases = [
        ("/overrides/nope/key:acme", r#"{"rate": "1/s"}"#, 404, "no limit"),
        ("/overrides/per_key/acme", r#"{"rate": "1/s"}"#, 400, "tier:value"),
        (
            "/overrides/per_key/key:acme",
            r#"{"rate": "fast"}"#,
            400,
            "rate \"fast\"",
        ),
        (
            "/overrides/per_key/key:acme",
            r#"{"rate": "1/s", "burst": 0}"#,
            400,
            "burst",
        ),
        (
            "/overrides/per_key/key:acme",
            r#"{"rate": "1/s", "expires": "2001-01-01T00:00:00Z"}"#,
            400,
            "expires",
        ),
        ("/overrides/per_key/key:acme", "not json", 400, "JSON"),
    ];
    for (path, body, status, says) in cases {
        let (s, text) = admin(&gw, "PUT", path, body, Some(TOKEN)).await;
        assert_eq!((s, text.contains(says)), (status, true), "{path} {body}: {text}");
    }
    // A tenant-wide override, with an expiry.
    let (s, text) = admin(
        &gw,
        "PUT",
        "/overrides/per_key/subnet:127.0.0.0%2F24",
        r#"{"rate": "9/min", "expires": "2999-01-01T00:00:00Z"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{text}");
    assert!(
        text.contains("\"who\":\"subnet:127.0.0.0/24\"") && text.contains("2999-01-01T00:00:00Z"),
        "{text}"
    );
    drop(gw);
    // A new instance finds it in the store.
    let again = start(&store);
    assert!(applied_within(&again, 1).await.is_some(), "{}", again.log());
    let mut c = client::http1(again.http()).await;
    let resp = client::send(&mut c, client::get("/")).await;
    assert_eq!(resp.headers()["ratelimit-policy"], "\"per_key\";q=9;w=60");
}

/// A limit may be named `version`: its overrides' hash is not the
/// version's key (once, the two were one key and every load of the fleet
/// failed). An `expires_ms` planted in the store past any RFC 3339 time
/// is ignored, never a panic of the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_named_version_takes_overrides_and_a_planted_expiry_is_ignored() {
    let redis = Redis::start();
    let text = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
            redis.url()
        ))
        .table("admin", "token_file = \"admin.token\"")
        .raw("[[identity.api_keys]]\nkey = \"k-acme\"\ntenant = \"acme\"")
        .respond("api", "/", &["version"])
        .limit("version", "2/min")
        .to_string();
    let gw = Gateway::start_with(&text, &[("admin.token", TOKEN)]);
    assert!(
        gw.wait_for_log(": connected to Redis", Duration::from_secs(20)),
        "{}",
        gw.log()
    );
    let (s, body) = admin(
        &gw,
        "PUT",
        "/overrides/version/key:acme",
        r#"{"rate": "5/min"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = admin(
        &gw,
        "PUT",
        "/overrides/version/key:zed",
        r#"{"rate": "7/min"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let gw_ref = &gw;
    crate::support::eventually(
        Duration::from_secs(5),
        || async move {
            let (status, body) = admin(gw_ref, "GET", "/overrides", "", Some(TOKEN)).await;
            assert_eq!(status, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            (v["count"]["version"].as_u64() == Some(2)).then_some(())
        },
        || format!("never loaded:\n{}", gw.log()),
    )
    .await;
    let (n, policy) = admitted(&gw, "k-acme", 10).await;
    assert_eq!((n, policy.as_str()), (5, "\"version\";q=5;w=60"));
    // An expiry no admin request can set, planted beside them.
    let planted = r#"{"rate":"1/min","burst":1,"expires_ms":18446744073709551615}"#;
    redis.cli(&["HSET", "lg:{overrides}:version", "tenant:acme", planted]);
    redis.cli(&["INCR", "lg:{overrides}"]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, body) = admin(&gw, "GET", "/overrides", "", Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}\n{}", gw.log());
    assert!(!body.contains("tenant:acme"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_memory_store_overrides_apply_and_say_they_are_this_instances_alone() {
    let gw = start("");
    let (s, text) = admin(
        &gw,
        "PUT",
        "/overrides/per_key/key:acme",
        r#"{"rate": "5/min"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{text}");
    assert!(
        text.contains("\"store\":\"memory\"") && text.contains("not shared"),
        "{text}"
    );
    assert_eq!(admitted(&gw, "k-acme", 10).await.0, 5);
    let (_, list) = admin(&gw, "GET", "/overrides", "", Some(TOKEN)).await;
    assert!(list.contains("\"shared\":false"), "{list}");
    // A reload keeps them.
    gw.signal("HUP");
    assert!(
        gw.wait_for_log("config reloaded", Duration::from_secs(5)),
        "{}",
        gw.log()
    );
    assert_eq!(applied_within(&gw, 1).await.map(|_| ()), Some(()), "{}", gw.log());
    // No token configured: reads work on loopback, changes are refused.
    let open = Gateway::start(&Toml::new().respond("api", "/", &["per_key"]).limit("per_key", "2/min"));
    assert_eq!(admin(&open, "GET", "/overrides", "", None).await.0, 200);
    let (s, text) = admin(
        &open,
        "PUT",
        "/overrides/per_key/key:acme",
        r#"{"rate": "5/min"}"#,
        None,
    )
    .await;
    assert_eq!(s, 403, "{text}");
}

/// An override of an `[rls]` domain names a descriptor's entries: Envoy's
/// calls for it get the override's quota, others the YAML's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_applies_to_an_envoy_descriptor() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let yaml = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let text = Toml::new()
        .gateway("workers = 1")
        .table("rls", "listen = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"")
        .table("admin", "token_file = \"admin.token\"")
        .respond("all", "/", &[])
        .to_string();
    let gw = Gateway::start_with(&text, &[("ratelimit.yaml", yaml), ("admin.token", TOKEN)]);
    let c = RateLimitServiceClient::connect(format!("http://{}", gw.addr("rls")))
        .await
        .unwrap();
    let allowed = |tenant: &'static str, n: usize| {
        let mut c = c.clone();
        async move {
            let mut ok = 0;
            for _ in 0..n {
                let req = RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "tenant".into(),
                            value: tenant.into(),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 0,
                };
                let r = c.should_rate_limit(req).await.unwrap().into_inner();
                ok += usize::from(r.overall_code == Code::Ok as i32);
            }
            ok
        }
    };
    let (s, text) = admin(
        &gw,
        "PUT",
        "/overrides/rls:edge/tenant=acme",
        r#"{"rate": "6/h"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/overrides/rls:nope/tenant=acme",
            r#"{"rate": "6/h"}"#,
            Some(TOKEN)
        )
        .await
        .0,
        404
    );
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/overrides/rls:edge/acme",
            r#"{"rate": "6/h"}"#,
            Some(TOKEN)
        )
        .await
        .0,
        400
    );
    assert_eq!(allowed("acme", 8).await, 6, "the override's quota");
    assert_eq!(allowed("zed", 4).await, 2, "the YAML's");
}

/// A change is announced (Redis pub/sub): the other instance applies it
/// well within its one-second poll. With the notices cut (the pub/sub
/// connections killed), the poll still brings it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_bring_a_change_at_once_and_the_poll_covers_a_lost_one() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let (a, b) = (start(&store), start(&store));
    tokio::time::sleep(Duration::from_millis(1_500)).await; // both subscribed
    let mut took = Vec::new();
    for n in 0..3u64 {
        let body = format!(r#"{{"rate": "{}/min"}}"#, 50 + n);
        let (status, text) = admin(&a, "PUT", "/overrides/per_key/key:acme", &body, Some(TOKEN)).await;
        assert_eq!(status, 200, "{text}");
        let start = Instant::now();
        loop {
            let (_, list) = admin(&b, "GET", "/overrides", "", Some(TOKEN)).await;
            if list.contains(&format!("\"{}/min\"", 50 + n)) {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "{list}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        took.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(333)).await;
    }
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(300)),
        "{took:?}: not by the notices"
    );
    // Cut the notices: the change still arrives, by the poll.
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let (status, _) = admin(&a, "DELETE", "/overrides/per_key/key:acme", "", Some(TOKEN)).await;
    assert_eq!(status, 200);
    assert!(applied_within(&b, 0).await.is_some(), "{}", b.log());
}

/// The store itself caps a limit's overrides (no instance's count can be
/// raced past), and a delete that removes nothing makes no new version
/// for the fleet to load.
#[test]
fn the_script_caps_a_limits_overrides_and_a_delete_of_nothing_is_no_change() {
    let redis = Redis::start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/overrides.lua");
    let run = |args: &[&str]| {
        let mut all = vec!["--eval", script, "lg:{overrides}", "lg:{overrides}:l", ","];
        all.extend_from_slice(args);
        redis.cli(&all).trim().to_string()
    };
    assert_eq!(run(&["set", "key:a", "{}", "2"]), "1");
    assert_eq!(run(&["set", "key:b", "{}", "2"]), "2");
    assert_eq!(run(&["set", "key:c", "{}", "2"]), "full");
    assert_eq!(run(&["set", "key:a", "{}", "2"]), "3", "replacing one fits");
    assert_eq!(run(&["del", "key:zz"]), "3", "nothing deleted: the same version");
    assert_eq!(run(&["del", "key:a"]), "4");
}

/// INFO and WARN lines after `leasegate ready`, without their timestamps.
fn loud_lines_after_ready(log: &str) -> Vec<String> {
    log.lines()
        .skip_while(|l| !l.contains("leasegate ready"))
        .skip(1)
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN "))
        .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest).trim().to_string())
        .collect()
}

/// An idle instance is quiet: the overrides follower, which polls every
/// second, logs a load only when it changed something, and no INFO or
/// WARN line repeats on a timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_logs_no_line_twice_and_overrides_only_when_they_change() {
    let gw = start("");
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let idle = loud_lines_after_ready(&gw.log());
    assert!(
        !idle.iter().any(|l| l.contains("overrides loaded")),
        "no override was ever set:\n{}",
        gw.log()
    );
    for line in &idle {
        assert_eq!(
            idle.iter().filter(|l| *l == line).count(),
            1,
            "repeated while idle: {line}\n{}",
            gw.log()
        );
    }
    let (s, text) = admin(
        &gw,
        "PUT",
        "/overrides/per_key/key:acme",
        r#"{"rate": "5/min"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{text}");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let loads = loud_lines_after_ready(&gw.log())
        .into_iter()
        .filter(|l| l.contains("overrides loaded"))
        .count();
    assert_eq!(loads, 1, "one change, one line:\n{}", gw.log());
}

/// The status page in the words of each limit: a concurrency limit as so
/// many in flight, a per-minute key's admitted rate per minute, and the
/// overrides in force listed; `/config` gives a concurrency limit its
/// `max`, not a rate and a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_limits_in_their_own_units_and_the_overrides() {
    let text = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .table("admin", "token_file = \"admin.token\"")
        .raw("[[identity.api_keys]]\nkey = \"k-acme\"\ntenant = \"acme\"")
        .respond("api", "/", &["per_key", "gpu"])
        .limit("per_key", "10/min")
        .raw("[[limits]]\nname = \"gpu\"\nalgorithm = \"concurrency\"\nmax = 3")
        .to_string();
    let gw = Gateway::start_with(&text, &[("admin.token", TOKEN)]);
    assert_eq!(admitted(&gw, "k-acme", 5).await.0, 5);
    let (s, body) = admin(
        &gw,
        "PUT",
        "/overrides/per_key/key:acme",
        r#"{"rate": "50/min"}"#,
        Some(TOKEN),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let start = Instant::now();
    let page = loop {
        let (s, page) = admin(&gw, "GET", "/", "", Some(TOKEN)).await;
        assert_eq!(s, 200, "{page}");
        if page.contains("<code>rl:{per_key:") || start.elapsed() > Duration::from_secs(5) {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(page.contains("<td>3 in flight</td>"), "{page}");
    assert!(!page.contains("<td>3/s</td>"), "{page}");
    let hottest = page.split("<table id=\"hottest\">").nth(1).expect("a hot key");
    let hottest = hottest.split("</table>").next().unwrap();
    let row = hottest
        .split("</tr>")
        .find(|r| r.contains("per_key:"))
        .unwrap_or_else(|| panic!("no per_key row: {hottest}"));
    assert!(row.contains("/min</td>"), "a 10/min key per minute: {row}");
    let overrides = page.split("<table id=\"overrides\">").nth(1).expect("the overrides");
    let overrides = overrides.split("</table>").next().unwrap();
    assert!(
        overrides.contains("<td>per_key</td><td><code>key:acme</code></td><td>50/min</td>"),
        "{overrides}"
    );
    let (_, cfg) = admin(&gw, "GET", "/config", "", Some(TOKEN)).await;
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    let gpu = cfg["effective"]["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "gpu")
        .unwrap();
    assert_eq!(gpu["max"], 3, "{gpu}");
    assert!(gpu.get("rate").is_none() && gpu.get("burst").is_none(), "{gpu}");
}
