//! Envoy's RLS v3 (`ShouldRateLimit`) against the real binary, from a real
//! gRPC client (tonic, from `envoy-types`): envoyproxy/ratelimit's matching
//! rules case by case, its response fields, the `algorithm` extension,
//! store failures, reload, and two instances sharing one Redis.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::support::redis::Redis;
use crate::support::{self, sample, Gateway, Toml};

const YAML: &str = r#"
domain: edge
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: hour, requests_per_unit: 3, name: nested}
  - key: key2
    rate_limit: {unit: hour, requests_per_unit: 2, name: any_key2}
  - key: key2
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 4, name: gold}
  - key: path
    value: /api/*/users
    rate_limit: {unit: hour, requests_per_unit: 1, name: users_glob}
  - key: remote_address
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100, name: tenant_wide}
  - key: tenant
    value: acme
    rate_limit:
      unit: hour
      requests_per_unit: 1
      name: acme
      replaces: [{name: tenant_wide}]
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
  - key: weights
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// Envoy's rate limit service on the rules in `ratelimit.yaml` (plus
/// `extra_rls` lines of `[rls]`); `store`: a `[store]` section, or none.
fn gateway_toml(store: &str, extra_rls: &str) -> Toml {
    Toml::new()
        .gateway("workers = 1")
        .raw(store)
        .table("rls", "listen = \"127.0.0.1:0\"\nconfig = \"ratelimit.yaml\"")
        .with(extra_rls)
        .respond("all", "/", &[])
}

fn memory_gateway() -> Gateway {
    Gateway::start_with(&gateway_toml("", ""), &[("ratelimit.yaml", YAML)])
}

async fn client(gw: &Gateway) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", gw.addr("rls")))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
    c.should_rate_limit(request(domain, vec![descriptor(entries)]))
        .await
        .unwrap()
        .into_inner()
}

fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).unwrap()
}

/// The codes of `n` calls in a row for one descriptor.
/// Waits (10 s at most) until `edge`'s `key2=gold` answers with a limit
/// of `n` requests per unit: a rules edit applied.
async fn gold_becomes(c: &mut RateLimitServiceClient<Channel>, n: u32, what: impl FnOnce() -> String) {
    crate::support::eventually(
        Duration::from_secs(10),
        async || {
            let r = ask(c, "edge", &[("key2", "gold")]).await;
            let limit = r.statuses[0].current_limit.as_ref();
            limit.is_some_and(|l| l.requests_per_unit == n).then_some(())
        },
        what,
    )
    .await;
}

async fn codes(c: &mut RateLimitServiceClient<Channel>, entries: &[(&str, &str)], n: usize) -> Vec<Code> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(code(&ask(c, "edge", entries).await));
    }
    out
}

use Code::{Ok as OK, OverLimit as Over};

/// Waits while a window of `period` seconds is within `margin` seconds of
/// turning, so a test's windows do not reset under it.
fn clear_of(period: u64, margin: u64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let left = period - now % period;
    if left < margin {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

fn clear_of_the_minute() {
    clear_of(60, 5);
}

fn clear_of_the_hour() {
    clear_of(3_600, 15);
}

#[tokio::test]
async fn matches_like_envoyproxy_ratelimit_rule_by_rule() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    // Exact key and value beat the bare key.
    assert_eq!(codes(&mut c, &[("key2", "gold")], 5).await, [OK, OK, OK, OK, Over]);
    // The bare key: any other value, each value its own bucket.
    assert_eq!(codes(&mut c, &[("key2", "silver")], 3).await, [OK, OK, Over]);
    assert_eq!(codes(&mut c, &[("key2", "bronze")], 1).await, [OK]);
    // A wildcard with `*` inside the value.
    assert_eq!(codes(&mut c, &[("path", "/api/v1/users")], 2).await, [OK, Over]);
    let r = ask(&mut c, "edge", &[("path", "/api/v1/orders")]).await;
    assert_eq!(code(&r), OK);
    assert_eq!(r.statuses[0].current_limit, None, "no rule: no limit reported");
    // Nested: the limit applies at the depth of the last entry only.
    assert_eq!(
        codes(&mut c, &[("key1", "value1"), ("subkey1", "x")], 4).await,
        [OK, OK, OK, Over]
    );
    for entries in [
        &[("key1", "value1")][..],
        &[("key1", "value1"), ("subkey1", "x"), ("deeper", "y")][..],
        &[("key2", "gold"), ("extra", "x")][..],
        &[("nokey", "x")][..],
    ] {
        let r = ask(&mut c, "edge", entries).await;
        assert_eq!(code(&r), OK, "{entries:?}");
        assert_eq!(r.statuses[0].current_limit, None, "{entries:?}");
        assert_eq!(r.statuses[0].limit_remaining, 0, "{entries:?}");
    }
    // An unknown domain: OK, nothing counted.
    assert_eq!(code(&ask(&mut c, "elsewhere", &[("key2", "gold")]).await), OK);
    // unlimited: OK with the largest remaining.
    let r = ask(&mut c, "edge", &[("remote_address", "10.0.0.1")]).await;
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, u32::MAX));
    // shadow_mode: counted, never refused (over its limit of 1: nothing
    // remains, the rule is reported).
    assert_eq!(codes(&mut c, &[("shadow", "s")], 3).await, [OK, OK, OK]);
    let r = ask(&mut c, "edge", &[("shadow", "s")]).await;
    assert_eq!(code(&r), OK);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 1);
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn answers_with_envoys_fields_in_descriptor_order() {
    clear_of_the_hour();
    clear_of_the_minute();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    let r = c
        .should_rate_limit(request(
            "edge",
            vec![
                descriptor(&[("key2", "gold")]),
                descriptor(&[("nokey", "x")]),
                descriptor(&[("minute", "m")]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r), OK);
    assert_eq!(r.statuses.len(), 3);
    let gold = &r.statuses[0];
    assert_eq!(Code::try_from(gold.code).unwrap(), OK);
    let limit = gold.current_limit.as_ref().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("gold", 4));
    assert_eq!(Unit::try_from(limit.unit).unwrap(), Unit::Hour);
    assert_eq!(gold.limit_remaining, 3);
    assert_eq!(r.statuses[1].current_limit, None);
    // A minute window is epoch-aligned: it resets at the next whole minute.
    let minute = &r.statuses[2];
    let reset = minute.duration_until_reset.unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let expected = 60 - now.as_secs() % 60;
    assert!(
        (reset.seconds as u64).abs_diff(expected) <= 1,
        "reset in {reset:?}, the minute turns in {expected} s"
    );
    // The overall code is OVER_LIMIT when any descriptor is; never UNKNOWN.
    for _ in 0..5 {
        ask(&mut c, "edge", &[("minute", "full")]).await;
    }
    let r = c
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("minute", "full")]), descriptor(&[("key2", "other")])],
        ))
        .await
        .unwrap()
        .into_inner();
    let seen: Vec<Code> = r.statuses.iter().map(|s| Code::try_from(s.code).unwrap()).collect();
    assert_eq!((code(&r), seen), (Over, vec![Over, OK]));
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() {
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    let e = c
        .should_rate_limit(request("", vec![descriptor(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = c.should_rate_limit(request("edge", vec![])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
}

#[tokio::test]
async fn replaces_hits_addend_and_overrides() {
    clear_of_the_hour();
    let gw = Gateway::start_with(
        &gateway_toml("", "allow_overrides = true\nmax_hits_fraction = 1.0"),
        &[("ratelimit.yaml", YAML)],
    );
    let mut c = client(&gw).await;
    // acme's limit replaces the tenant-wide one when both match.
    let both = || {
        request(
            "edge",
            vec![descriptor(&[("tenant", "acme")]), descriptor(&[("tenant", "other")])],
        )
    };
    let r = c.should_rate_limit(both()).await.unwrap().into_inner();
    assert_eq!(r.statuses[1].current_limit, None, "replaced: {r:?}");
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "acme");
    // hits_addend: the request's, then a descriptor's own (which wins; 0
    // only looks).
    let mut req = request("edge", vec![descriptor(&[("weights", "w")])]);
    let mut own = req.clone();
    own.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    // Looking at a fresh key: OK, the whole limit left, nothing taken.
    let r = c.should_rate_limit(own.clone()).await.unwrap().into_inner();
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 10), "{r:?}");
    req.hits_addend = 6;
    let r = c.should_rate_limit(req.clone()).await.unwrap().into_inner();
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 4), "{r:?}");
    // A descriptor's own addend wins over the request's.
    let mut three = req.clone();
    three.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let r = c.should_rate_limit(three).await.unwrap().into_inner();
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 1), "{r:?}");
    // A cost that overruns what is left is refused and ends the budget,
    // as envoyproxy/ratelimit's INCRBY counts it.
    let r = c.should_rate_limit(req.clone()).await.unwrap().into_inner();
    assert_eq!(code(&r), Over, "6 more do not fit in 1: {r:?}");
    // Looking now: over, and looking took nothing.
    let r = c.should_rate_limit(own.clone()).await.unwrap().into_inner();
    assert_eq!(code(&r), Over, "{r:?}");
    assert_eq!(codes(&mut c, &[("weights", "w")], 1).await, [Over]);
    // A request's own limit replaces the rules (even where none matches).
    let mut d = descriptor(&[("unconfigured", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: Unit::Hour as i32,
    });
    let mut outs = Vec::new();
    for _ in 0..3 {
        let r = c
            .should_rate_limit(request("edge", vec![d.clone()]))
            .await
            .unwrap()
            .into_inner();
        outs.push(code(&r));
    }
    assert_eq!(outs, [OK, OK, Over]);
    // An override's unit is capped at the YAML's longest (an hour here): a
    // caller cannot make a year-long key.
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: Unit::Year as i32,
    });
    let r = ask_with(&mut c, d).await;
    assert_eq!(current_limit(&r), (7, Unit::Hour as i32), "{r:?}");
}

async fn ask_with(c: &mut RateLimitServiceClient<Channel>, d: RateLimitDescriptor) -> RateLimitResponse {
    c.should_rate_limit(request("edge", vec![d]))
        .await
        .unwrap()
        .into_inner()
}

/// The first status's `current_limit`: (requests per unit, unit).
fn current_limit(r: &RateLimitResponse) -> (u32, i32) {
    let current = r.statuses[0].current_limit.as_ref().unwrap();
    (current.requests_per_unit, current.unit)
}

/// Off by default (each distinct override is a fresh quota of its own).
#[tokio::test]
async fn with_allow_overrides_off_a_descriptor_s_own_limit_is_ignored() {
    clear_of_the_minute();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    let mut d = descriptor(&[("minute", "m")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1_000,
        unit: Unit::Second as i32,
    });
    let mut outs = Vec::new();
    for _ in 0..6 {
        let r = ask_with(&mut c, d.clone()).await;
        assert_eq!(current_limit(&r), (5, Unit::Minute as i32), "{r:?}");
        outs.push(code(&r));
    }
    // The YAML's 5 per minute, not the caller's 1000 per second.
    assert_eq!(outs, [OK, OK, OK, OK, OK, Over]);
}

#[tokio::test]
async fn token_bucket_and_sliding_window_extensions() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    assert_eq!(codes(&mut c, &[("bucket", "b")], 4).await, [OK, OK, OK, Over]);
    assert_eq!(codes(&mut c, &[("sliding", "s")], 4).await, [OK, OK, OK, Over]);
    // A sliding window's refusal says when the next request fits: over an
    // hour away here, unlike a fixed window's reset at the top of the hour.
    let r = ask(&mut c, "edge", &[("sliding", "s")]).await;
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds > 0);
}

#[tokio::test]
async fn counts_decisions_by_domain_and_code() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    codes(&mut c, &[("key2", "x")], 3).await;
    ask(&mut c, "somebody-elses", &[("k", "v")]).await;
    let m = gw.metrics().await;
    assert_eq!(
        sample(&m, r#"leasegate_rls_requests_total{domain="edge",code="OK"} "#),
        2.0
    );
    assert_eq!(
        sample(&m, r#"leasegate_rls_requests_total{domain="edge",code="OVER_LIMIT"} "#),
        1.0
    );
    // A domain not configured is counted under one label, so a client
    // cannot grow the series.
    assert_eq!(
        sample(&m, r#"leasegate_rls_requests_total{domain="unknown",code="OK"} "#),
        1.0
    );
}

#[tokio::test]
async fn the_yaml_reloads_and_a_bad_edit_keeps_the_rules_in_force() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    assert_eq!(codes(&mut c, &[("key2", "gold")], 1).await, [OK]);
    let yaml = gw.dir.path().join("ratelimit.yaml");
    // /config names each domain's YAML by its SHA-256, as sha256sum does,
    // so a rollout of an edit can be confirmed instance by instance.
    let sha256sum = |text: &str| -> String {
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let domains = async || {
        let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
        v["rls"]["domains"].clone()
    };
    assert_eq!(domains().await, serde_json::json!({ "edge": sha256sum(YAML) }));
    // A bad edit: refused, the rules in force stay.
    std::fs::write(
        &yaml,
        YAML.replace(
            "unit: hour, requests_per_unit: 4",
            "unit: fortnight, requests_per_unit: 4",
        ),
    )
    .unwrap();
    assert!(
        gw.wait_for_log(
            "ratelimit.yaml:13: descriptors[2].rate_limit.unit",
            Duration::from_secs(10)
        ),
        "the reload's problem names the YAML file, line and key:\n{}",
        gw.log()
    );
    assert!(gw.log().contains("config reload failed"), "{}", gw.log());
    let r = ask(&mut c, "edge", &[("key2", "gold")]).await;
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 4);
    // A good edit applies without a restart.
    std::fs::write(
        &yaml,
        YAML.replace("requests_per_unit: 4, name: gold", "requests_per_unit: 40, name: gold"),
    )
    .unwrap();
    gold_becomes(&mut c, 40, || format!("the edit never applied:\n{}", gw.log())).await;
    let edited = YAML.replace("requests_per_unit: 4, name: gold", "requests_per_unit: 40, name: gold");
    assert_eq!(domains().await, serde_json::json!({ "edge": sha256sum(&edited) }));
    assert!(
        gw.log().contains(&format!("rls=edge:{}", sha256sum(&edited))),
        "{}",
        gw.log()
    );
    // SIGHUP reloads it too.
    std::fs::write(
        &yaml,
        YAML.replace("requests_per_unit: 4, name: gold", "requests_per_unit: 7, name: gold"),
    )
    .unwrap();
    gw.signal("HUP");
    gold_becomes(&mut c, 7, || format!("SIGHUP never applied:\n{}", gw.log())).await;
    // gateway.toml moves the rules to a directory whose file is bad: the
    // reload is refused. Fixing that file, and only that, applies it: the
    // watcher follows the place the file on disk names.
    let rules = gw.dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: key2\n    colour: red\n",
    )
    .unwrap();
    let toml = gw.dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(&toml, text.replace("config = \"ratelimit.yaml\"", "config = \"rules\"")).unwrap();
    assert!(
        gw.wait_for_log("edge.yaml:4: descriptors[0].colour", Duration::from_secs(10)),
        "{}",
        gw.log()
    );
    std::fs::write(
        rules.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: key2\n    value: gold\n    rate_limit: {unit: hour, requests_per_unit: 99}\n",
    )
    .unwrap();
    gold_becomes(&mut c, 99, || {
        format!("the fixed file was never applied:\n{}", gw.log())
    })
    .await;
}

#[test]
fn check_validates_the_yaml_with_file_and_line() {
    let dir = support::TempDir::new();
    dir.write("ratelimit.yaml", "domain: edge\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n  - key: j\n    colour: red\n");
    let toml = dir.write("gateway.toml", &gateway_toml("", ""));
    let out = std::process::Command::new(support::binary())
        .args(["check", "--config"])
        .arg(&toml)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("ratelimit.yaml:8: descriptors[1].colour: unknown field `colour`"),
        "{err}"
    );
    assert!(err.contains("gateway.toml:") && err.contains("rls.config"), "{err}");
    // A good file: check says what it read.
    dir.write("ratelimit.yaml", YAML);
    let out = std::process::Command::new(support::binary())
        .args(["check", "--config"])
        .arg(&toml)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("rls       grpc 127.0.0.1:0: 1 domain(s), 12 rule(s) with a limit"),
        "{text}"
    );
}

/// Two instances on one Redis share each descriptor's quota: however the
/// calls are spread, the fleet admits the limit and no more.
#[tokio::test]
async fn two_instances_on_one_redis_share_one_quota() {
    clear_of_the_hour();
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 50\n",
        redis.url()
    );
    let a = Gateway::start_with(&gateway_toml(&store, ""), &[("ratelimit.yaml", YAML)]);
    let b = Gateway::start_with(&gateway_toml(&store, ""), &[("ratelimit.yaml", YAML)]);
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    let mut admitted = 0;
    for i in 0..200 {
        let c = if i % 3 == 0 { &mut ca } else { &mut cb };
        if code(&ask(c, "edge", &[("key2", "fleet")]).await) == OK {
            admitted += 1;
        }
    }
    // `key2` allows 2 per hour, fleet-wide.
    assert_eq!(admitted, 2);
    let mut admitted = 0;
    for i in 0..400 {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        if code(&ask(c, "edge", &[("weights", "fleet")]).await) == OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10, "10 per hour, fleet-wide");
}

#[tokio::test]
async fn a_dead_store_answers_unavailable_or_ok_as_configured_within_the_deadline() {
    clear_of_the_hour();
    let mut redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 50\n",
        redis.url()
    );
    let strict = Gateway::start_with(&gateway_toml(&store, ""), &[("ratelimit.yaml", YAML)]);
    let lenient = Gateway::start_with(
        &gateway_toml(&store, "on_store_failure = \"allow\""),
        &[("ratelimit.yaml", YAML)],
    );
    let (mut cs, mut cl) = (client(&strict).await, client(&lenient).await);
    assert_eq!(code(&ask(&mut cs, "edge", &[("key2", "a")]).await), OK);
    redis.kill();
    for i in 0..5 {
        let key = format!("cold{i}");
        let started = Instant::now();
        let e = cs
            .should_rate_limit(request("edge", vec![descriptor(&[("key2", &key)])]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let r = ask(&mut cl, "edge", &[("key2", &key)]).await;
        assert_eq!(code(&r), OK);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
}

/// `allow_overrides = true` obeys at most `max_override_values` distinct
/// overrides per domain; a descriptor carrying another is matched against
/// the YAML, so a caller cycling `requests_per_unit` cannot mint a fresh
/// quota per value.
#[tokio::test]
async fn overrides_are_bounded_in_distinct_values_per_domain() {
    clear_of_the_minute();
    let gw = Gateway::start_with(
        &gateway_toml("", "allow_overrides = true\nmax_override_values = 2"),
        &[("ratelimit.yaml", YAML)],
    );
    let mut c = client(&gw).await;
    let with = |rpu: u32| {
        let mut d = descriptor(&[("minute", "m")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: Unit::Minute as i32,
        });
        d
    };
    for rpu in [100, 200, 100] {
        let r = ask_with(&mut c, with(rpu)).await;
        assert_eq!(current_limit(&r), (rpu, Unit::Minute as i32), "{r:?}");
    }
    // A third distinct value: the YAML's 5 per minute, every time.
    let mut outs = Vec::new();
    for rpu in 300..306 {
        let r = ask_with(&mut c, with(rpu)).await;
        assert_eq!(current_limit(&r), (5, Unit::Minute as i32), "{r:?}");
        outs.push(code(&r));
    }
    assert_eq!(outs, [OK, OK, OK, OK, OK, Over]);
    // The two first ones are still obeyed.
    let r = ask_with(&mut c, with(200)).await;
    assert_eq!(current_limit(&r), (200, Unit::Minute as i32), "{r:?}");
}

/// A `hits_addend` above `max_hits_fraction` (default a tenth) of the
/// limit's capacity is INVALID_ARGUMENT, and the call takes nothing from
/// any of its descriptors: one call cannot drain a key.
#[tokio::test]
async fn an_addend_above_the_hits_fraction_is_refused_and_takes_nothing() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    // weights: 10 per hour, so at most 1 hit per call by default.
    let mut two = request(
        "edge",
        vec![descriptor(&[("weights", "a")]), descriptor(&[("weights", "b")])],
    );
    two.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    let e = c.should_rate_limit(two).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("max_hits_fraction"), "{e}");
    let r = ask(&mut c, "edge", &[("weights", "a")]).await;
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 9), "{r:?}");
    let mut equal = request("edge", vec![descriptor(&[("weights", "c")])]);
    equal.hits_addend = 10;
    let e = c.should_rate_limit(equal).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");

    let half = Gateway::start_with(
        &gateway_toml("", "max_hits_fraction = 0.5"),
        &[("ratelimit.yaml", YAML)],
    );
    let mut c = client(&half).await;
    let mut five = request("edge", vec![descriptor(&[("weights", "w")])]);
    five.hits_addend = 5;
    let r = c.should_rate_limit(five.clone()).await.unwrap().into_inner();
    assert_eq!((code(&r), r.statuses[0].limit_remaining), (OK, 5), "{r:?}");
    five.hits_addend = 6;
    let e = c.should_rate_limit(five).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
}

/// Bounded work per call: each cap answers INVALID_ARGUMENT (an oversized
/// message, OUT_OF_RANGE from the decoder) and the service goes on; a
/// `hits_addend` above the quota's `max_hits_fraction` is refused and
/// takes nothing, so it cannot drain a key for every later caller.
#[tokio::test]
async fn caps_refuse_what_is_too_big_and_an_absurd_addend_takes_nothing() {
    clear_of_the_hour();
    let gw = memory_gateway();
    let mut c = client(&gw).await;
    let many = vec![descriptor(&[("weights", "w")]); 65];
    let e = c.should_rate_limit(request("edge", many)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("at most 64"), "{e}");
    let wide: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".to_string())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let e = c
        .should_rate_limit(request("edge", vec![descriptor(&wide)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let long = "x".repeat(300);
    let e = c
        .should_rate_limit(request("edge", vec![descriptor(&[("weights", long.as_str())])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let huge = "y".repeat(70 * 1024);
    let mut d = descriptor(&[("weights", "w")]);
    d.entries[0].value = huge;
    let e = c.should_rate_limit(request("edge", vec![d])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
    // 2^32 - 1 hits on a 10/hour descriptor: refused, and nothing taken.
    let mut absurd = request("edge", vec![descriptor(&[("weights", "drain")])]);
    absurd.hits_addend = u32::MAX;
    let e = c.should_rate_limit(absurd).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let r = ask(&mut c, "edge", &[("weights", "drain")]).await;
    assert_eq!(
        (code(&r), r.statuses[0].limit_remaining),
        (OK, 9),
        "the quota is whole for the next caller: {r:?}"
    );
}
