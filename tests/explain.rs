//! `leasegate explain` through the real binary: the route, the identity
//! (and why higher tiers did not apply) and every applying limit with its
//! store key, in text and JSON; and the key is the one a running gateway
//! really writes to Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;

use serde_json::Value;
use support::redis::Redis;
use support::{binary, client, Gateway, TempDir};

const SECRET: &str = "explain-test-secret";

fn config(extra: &str) -> String {
    format!(
        r#"
[listeners]
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
{extra}
[identity]
trusted_proxies = ["10.0.0.0/8"]

[identity.jwt]
algorithms = ["HS256"]
secret = "{SECRET}"
plan_claim = "plan"

[[identity.api_keys]]
key = "test-key-1"
tenant = "acme"
plan = "enterprise"

[[routes]]
name = "api"
path_prefix = "/v1/"
response = {{ status = 200, body = "ok" }}
limits = ["per_client", "per_subnet", "users_only"]
on_store_failure = "deny"

[[routes]]
name = "admin"
path_prefix = "/"
host = "admin.example.com"
response = {{ status = 200, body = "admin" }}

[[limits]]
name = "per_client"
rate = "100/min"
burst = 150
plans = {{ enterprise = "50000/min" }}

[[limits]]
name = "per_subnet"
algorithm = "sliding_window"
rate = "1000/min"
by = ["subnet"]
shards = 4
mode = "shadow"

[[limits]]
name = "users_only"
rate = "10/s"
tiers = ["user"]
"#
    )
}

/// Runs `leasegate explain --config <config> ARGS`; (exit code, stdout, stderr).
fn explain_with(config_text: &str, args: &[&str]) -> (i32, String, String) {
    let dir = TempDir::new();
    let path = dir.write("gateway.toml", config_text);
    let out = Command::new(binary())
        .arg("explain")
        .arg("--config")
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn text(args: &[&str]) -> String {
    let (code, stdout, stderr) = explain_with(&config(""), args);
    assert_eq!(code, 0, "explain {args:?}: {stderr}");
    stdout
}

fn json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = text(&all);
    assert_eq!(out.lines().count(), 1, "one JSON object on one line: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn jwt(claims: Value, secret: &str) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

fn epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// (name, mode, algorithm, rate, capacity, key) of each limit in the JSON.
fn limits(j: &Value) -> Vec<(String, String, String, String, u64, String)> {
    j["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["mode"].as_str().unwrap().to_string(),
                l["algorithm"].as_str().unwrap().to_string(),
                l["rate"].as_str().unwrap().to_string(),
                l["capacity"].as_u64().unwrap(),
                l["key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn an_api_key_on_a_plan_gets_the_plans_rate_and_its_own_key() {
    let args = [
        "--header",
        "X-API-Key: test-key-1",
        "--ip",
        "198.51.100.7",
        "GET",
        "/v1/orders",
    ];
    let out = text(&args);
    assert!(
        out.contains("route     api (path_prefix /v1/; responds 200; on_store_failure deny)"),
        "{out}"
    );
    assert!(
        out.contains("identity  key:acme (tenant acme, plan enterprise, client 198.51.100.7)"),
        "{out}"
    );
    assert!(out.contains("not user: no Bearer JWT in Authorization"), "{out}");
    assert!(
        out.contains("limit     per_client enforce token_bucket 50000/min capacity 50000 (plan enterprise)"),
        "{out}"
    );
    assert!(out.contains("key rl:{per_client:key:acme}"), "{out}");
    assert!(
        out.contains("skipped   users_only: applies to tiers user only, not key"),
        "{out}"
    );

    let j = json(&args);
    assert_eq!(j["route"], "api");
    assert_eq!(j["identity"], "key:acme");
    assert_eq!(j["identity_detail"]["passed_over"][0]["tier"], "user");
    let l = limits(&j);
    assert_eq!(l.len(), 2, "{j}");
    assert_eq!(
        l[0],
        (
            "per_client".into(),
            "enforce".into(),
            "token_bucket".into(),
            "50000/min".into(),
            50_000,
            "rl:{per_client:key:acme}".into()
        )
    );
    // Sharded: a quarter of the quota, the sub-bucket inside the hash tag.
    let shard = j["limits"][1]["shard"].as_u64().unwrap();
    assert_eq!(j["limits"][1]["shards"], 4);
    assert_eq!(
        l[1],
        (
            "per_subnet".into(),
            "shadow".into(),
            "sliding_window".into(),
            "250/min".into(),
            250,
            format!("rl:{{per_subnet:198.51.100.0/24:s{shard:02}}}")
        )
    );
}

#[test]
fn a_verified_jwt_is_the_user_and_a_forged_or_expired_one_lends_nothing() {
    let good = jwt(
        serde_json::json!({"sub": "alice", "plan": "enterprise", "exp": epoch() + 600}),
        SECRET,
    );
    let auth = format!("Authorization: Bearer {good}");
    let j = json(&["--header", &auth, "--ip", "198.51.100.7", "POST", "/v1/orders"]);
    assert_eq!(j["identity"], "user:alice");
    assert_eq!(j["identity_detail"]["passed_over"], serde_json::json!([]));
    let names: Vec<String> = limits(&j).into_iter().map(|l| l.0).collect();
    assert_eq!(names, ["per_client", "per_subnet", "users_only"], "{j}");
    assert_eq!(j["limits"][0]["rate"], "50000/min");
    assert_eq!(j["limits"][0]["key"], "rl:{per_client:user:alice}");
    assert_eq!(j["limits"][2]["key"], "rl:{users_only:user:alice}");
    assert_eq!(j["limits"][2]["rate"], "10/s");

    for (token, why) in [
        (
            jwt(
                serde_json::json!({"sub": "mallory", "exp": epoch() + 600}),
                "wrong-secret",
            ),
            "InvalidSignature",
        ),
        (
            jwt(serde_json::json!({"sub": "alice", "exp": epoch() - 600}), SECRET),
            "xpired",
        ),
    ] {
        let auth = format!("Authorization: Bearer {token}");
        let out = text(&["--header", &auth, "--ip", "198.51.100.7", "GET", "/v1/orders"]);
        assert!(out.contains("identity  subnet:198.51.100.0/24"), "{out}");
        assert!(
            out.contains("not user: the Bearer JWT does not count: invalid token"),
            "{out}"
        );
        assert!(out.contains(why), "{why}: {out}");
        assert!(out.contains("not key: no X-API-Key"), "{out}");
        assert!(out.contains("not fingerprint: not a TLS connection"), "{out}");
    }
}

#[test]
fn the_subnet_tier_follows_trusted_proxies_and_ipv6_prefixes() {
    // From a trusted proxy, the right-most untrusted X-Forwarded-For hop.
    let j = json(&[
        "--ip",
        "10.1.2.3",
        "--header",
        "X-Forwarded-For: 203.0.113.9, 10.9.9.9",
        "GET",
        "/v1/x",
    ]);
    assert_eq!(j["identity"], "subnet:203.0.113.0/24");
    assert_eq!(j["identity_detail"]["client_ip"], "203.0.113.9");
    assert_eq!(j["limits"][0]["key"], "rl:{per_client:subnet:203.0.113.0/24}");
    assert_eq!(j["limits"][0]["rate"], "100/min");
    assert_eq!(j["limits"][0]["capacity"], 150);
    // From anyone else, the header is not believed.
    let j = json(&[
        "--ip",
        "198.51.100.7",
        "--header",
        "X-Forwarded-For: 203.0.113.9",
        "GET",
        "/v1/x",
    ]);
    assert_eq!(j["identity"], "subnet:198.51.100.0/24");
    let j = json(&["--ip", "2001:db8:1:2::7", "GET", "/v1/x"]);
    assert_eq!(j["identity"], "subnet:2001:db8:1:2::/64");
}

#[test]
fn routes_match_by_host_and_an_unmatched_path_says_so() {
    let out = text(&["--header", "Host: admin.example.com", "GET", "/anything"]);
    assert!(
        out.contains("route     admin (path_prefix /, host admin.example.com"),
        "{out}"
    );
    assert!(out.contains("limits    none on this route"), "{out}");

    let out = text(&["GET", "/anything"]);
    assert_eq!(
        out.trim(),
        "no route matches GET /anything: the gateway answers 404, and no limit applies"
    );
    let j = json(&["GET", "/anything"]);
    assert_eq!(j["route"], Value::Null);
    assert_eq!(j["identity"], Value::Null);
    assert_eq!(j["limits"], serde_json::json!([]));
}

#[test]
fn rejected_credentials_are_a_401_before_any_limit() {
    let c = config("").replace("[identity]\n", "[identity]\non_invalid_credentials = \"reject\"\n");
    let (code, out, err) = explain_with(&c, &["--header", "X-API-Key: nope", "GET", "/v1/x"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("identity  rejected: unknown API key"), "{out}");
    assert!(out.contains("401"), "{out}");
    assert!(!out.contains("limit     "), "{out}");
}

#[test]
fn bad_arguments_exit_1_with_a_reason() {
    let c = config("");
    for (args, needle) in [
        (
            &["--header", "no colon here", "GET", "/v1/x"][..],
            "bad --header \"no colon here\"",
        ),
        (&["--header", "Bad Name: x", "GET", "/v1/x"][..], "bad --header"),
        (&["--ip", "300.1.2.3", "GET", "/v1/x"][..], "bad --ip \"300.1.2.3\""),
        (&["GE T", "/v1/x"][..], "bad METHOD"),
        (&["GET", "v1/x"][..], "bad PATH \"v1/x\""),
        (&["GET"][..], "required arguments were not provided"),
        (&["--bogus", "GET", "/"][..], "unexpected argument '--bogus'"),
    ] {
        let (code, out, err) = explain_with(&c, args);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: want {needle:?} in {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    let (code, _, err) = explain_with("[listeners]\nhttp = 5\n", &["GET", "/"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid config"), "{err}");
}

/// The keys `explain` prints are the keys a running gateway writes: a
/// request through the gateway on a Redis store leaves exactly them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_prints_the_keys_the_gateway_writes_to_redis() {
    let redis = Redis::start();
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let text = config(&store);
    let gw = Gateway::start_connected(&text);
    let mut c = client::http1(gw.http()).await;
    let req = http::Request::get("/v1/orders")
        .header("host", "localhost")
        .header("x-api-key", "test-key-1")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 200, "{body}");

    let (code, out, err) = explain_with(
        &text,
        &[
            "--json",
            "--header",
            "X-API-Key: test-key-1",
            "--ip",
            "127.0.0.1",
            "GET",
            "/v1/orders",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    let mut explained: Vec<String> = limits(&j).into_iter().map(|l| l.5).collect();
    explained.sort();
    // A lease may be taken in the background: wait for the keys to land.
    let stored = || {
        let mut keys: Vec<String> = redis
            .cli(&["--scan", "--pattern", "rl:*"])
            .lines()
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stored() != explained && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(explained, stored(), "explain: {out}\n{}", gw.log());
}
