//! `leasegate explain` through the real binary: the route, the identity
//! (and why higher tiers did not apply) and every applying limit with its
//! store key, in text and JSON; and the key is the one a running gateway
//! really writes to Redis.

use std::process::Command;

use serde_json::Value;

use crate::support::redis::Redis;
use crate::support::{self, binary, client, Gateway, TempDir};

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
    // A generous deadline: this test is about keys, and its route fails closed.
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
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

/// A stand-in for a gateway's admin listener: answers every connection with
/// `response` and keeps the request heads it read. The real
/// `GET /limits/state` is being built beside this client (issue 14); this
/// serves the JSON shape agreed for it.
struct FakeAdmin {
    addr: std::net::SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeAdmin {
    fn start(response: String) -> FakeAdmin {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                conn.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                seen.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                let _ = conn.write_all(response.as_bytes());
            }
        });
        FakeAdmin { addr, heads }
    }

    fn ok_json(body: &str) -> FakeAdmin {
        FakeAdmin::start(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ))
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[test]
fn admin_shows_the_live_state_of_the_printed_keys() {
    let admin = FakeAdmin::ok_json(
        r#"{"keys":[{"key":"rl:{per_client:key:acme}","tracked":true,"tokens_at_hand":4,"blocked_for_ms":0,"retry_after_ms":0,"store_remaining":95,"reset_ms":1200,"last_store_failure":null,"override":{"who":"tenant:acme","rate":"50/min","burst":50,"expires":null}}]}"#,
    );
    let args = [
        "--admin",
        &admin.url(),
        "--header",
        "X-API-Key: test-key-1",
        "GET",
        "/v1/orders",
    ];
    let out = text(&args);
    assert!(
        out.contains("key rl:{per_client:key:acme}\n          live 4 token(s) at hand; not blocked; store: 95 left, whole in 1200 ms; override for tenant:acme in force: 50/min burst 50, not the file's rate\n"),
        "{out}"
    );
    // The sub-bucket key the fake did not answer for says so.
    assert!(
        out.contains("live unknown: the gateway's answer did not name this key"),
        "{out}"
    );
    assert!(
        out.contains(&format!("live      from {}/limits/state", admin.url())),
        "{out}"
    );

    // One request per run, asking for every printed key, percent-encoded.
    let mut all = vec!["--json"];
    all.extend_from_slice(&args);
    let (code, stdout, stderr) = explain_with(&config(""), &all);
    assert_eq!(code, 0, "{stderr}");
    let j: Value = serde_json::from_str(&stdout).unwrap();
    let live = &j["limits"][0]["live"];
    assert_eq!(live["tracked"], true);
    assert_eq!(live["tokens_at_hand"], 4);
    assert_eq!(live["store_remaining"], 95);
    assert_eq!(live["reset_ms"], 1200);
    assert!(live["last_store_failure"].is_null());
    assert!(j["limits"][1]["live"].is_null(), "{j}");
    let heads = admin.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    let keys: Vec<String> = limits(&j).into_iter().map(|l| l.5).collect();
    let encoded = |k: &str| -> String {
        k.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    // And the caller, for the override in force: its identity and tenant.
    let want = format!(
        "GET /limits/state?key={}&key={}&who=key%3Aacme&who=tenant%3Aacme HTTP/1.1\r\n",
        encoded(&keys[0]),
        encoded(&keys[1])
    );
    for head in &heads {
        assert!(head.starts_with(&want), "{head:?}\nwant {want:?}");
        // Header names are case-insensitive (hyper writes them lowercase).
        let lowered = head.to_ascii_lowercase();
        assert!(lowered.contains(&format!("\r\nhost: {}\r\n", admin.addr)), "{head:?}");
    }

    // Without a limit to ask about, nothing is asked.
    let out = text(&[
        "--admin",
        &admin.url(),
        "--header",
        "Host: admin.example.com",
        "GET",
        "/",
    ]);
    assert!(out.contains("limits    none on this route"), "{out}");
    assert_eq!(admin.heads.lock().unwrap().len(), 2);
}

#[test]
fn admin_errors_exit_1_with_a_reason() {
    let not_found = FakeAdmin::start("HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\n\r\nnot found\n".into());
    let broken = FakeAdmin::ok_json(r#"{"keys": "#);
    let wrong_shape = FakeAdmin::ok_json(r#"{"state":[]}"#);
    let not_http = FakeAdmin::start("SSH-2.0-OpenSSH_9.6\r\n".into());
    let closed = format!("http://127.0.0.1:{}", support::closed_port());
    let cases: Vec<(String, &str)> =
        vec![
        (closed.clone(), "cannot reach the admin listener at http://127.0.0.1:"),
        (
            not_found.url(),
            "/limits/state answered 404 Not Found (is this a leasegate admin listener with /limits/state?): not found",
        ),
        (broken.url(), "answered JSON explain cannot read"),
        (wrong_shape.url(), "answered JSON explain cannot read (missing field `keys`"),
        (not_http.url(), "did not answer HTTP"),
        ("https://127.0.0.1:9901".into(), "the admin listener serves plain HTTP, not https"),
        ("http://127.0.0.1:nope".into(), "bad --admin \"http://127.0.0.1:nope\""),
    ];
    for (url, needle) in cases {
        for json in [false, true] {
            let mut args = vec!["--admin", url.as_str(), "GET", "/v1/orders"];
            if json {
                args.insert(0, "--json");
            }
            let (code, out, err) = explain_with(&config(""), &args);
            assert_eq!(code, 1, "{args:?}: {out}{err}");
            assert!(err.contains(needle), "{args:?}: want {needle:?} in {err}");
            assert!(err.starts_with("leasegate explain: "), "{err}");
            assert!(out.is_empty(), "{args:?}: {out}");
        }
    }
}

/// `--admin` against a real gateway's `GET /limits/state`: the key a
/// request just used is tracked there, with its tokens at hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reads_a_running_gateways_key_state() {
    let text = config("");
    let gw = Gateway::start(&text);
    let mut c = client::http1(gw.http()).await;
    let req = http::Request::get("/v1/orders")
        .header("host", "localhost")
        .header("x-api-key", "test-key-1")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, body) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(status, 200, "{body}");
    let admin = format!("http://{}", gw.admin());
    let (code, out, err) = explain_with(
        &text,
        &[
            "--json",
            "--admin",
            &admin,
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
    let live = &j["limits"][0]["live"];
    assert_eq!(live["tracked"], true, "{j}\n{}", gw.log());
    // A lease of at least the minimum (5), one token spent by the request.
    assert!(live["tokens_at_hand"].as_u64().unwrap() >= 4, "{live}");
    assert_eq!(live["blocked_for_ms"], 0);
    assert!(live["last_store_failure"].is_null());
}

/// A gateway whose admin listener wants a token: explain sends the one of
/// the `[admin] token_file` its `--config` names; without it, the refusal
/// says what the gateway wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_presents_the_configs_admin_token() {
    let secrets = TempDir::new();
    let token = secrets.write("admin.token", "0f1e2d3c4b5a69788796a5b4c3d2e1f0\n");
    let text = format!("{}\n[admin]\ntoken_file = \"{}\"\n", config(""), token.display());
    let gw = Gateway::start(&text);
    let admin = format!("http://{}", gw.admin());
    let args = [
        "--admin",
        admin.as_str(),
        "--header",
        "X-API-Key: test-key-1",
        "GET",
        "/v1/orders",
    ];
    let (code, out, err) = explain_with(&text, &args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("not tracked on this instance"), "{out}");
    // The same request from a config without the token: refused, and told why.
    let (code, _, err) = explain_with(&config(""), &args);
    assert_eq!(code, 1);
    assert!(err.contains("401") && err.contains("[admin] token_file"), "{err}");
}

#[test]
fn a_client_certificate_is_explained_where_the_order_puts_it() {
    let ca = crate::support::TestCa::new("explain CA");
    let server = ca.issue("gateway.test");
    let dir = TempDir::new();
    dir.write("srv.pem", &server.cert_pem);
    dir.write("srv.key", &server.key_pem);
    dir.write("ca.pem", &ca.cert_pem);
    let path = dir.write(
        "gateway.toml",
        "[listeners]\nhttps = \"127.0.0.1:0\"\n\n[tls]\ncert = \"srv.pem\"\nkey = \"srv.key\"\nclient_ca = \"ca.pem\"\n\n[identity]\norder = [\"key\", \"cert\", \"subnet\"]\n\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nresponse = { status = 200 }\nlimits = [\"per_client\"]\n\n[[limits]]\nname = \"per_client\"\nrate = \"10/s\"\n",
    );
    let run = |extra: &[&str]| {
        let out = Command::new(binary())
            .args(["explain", "--json", "--config"])
            .arg(&path)
            .args(extra)
            .args(["GET", "/"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let with = run(&["--client-cert", "alice.clients"]);
    assert_eq!(with["identity"], "cert:alice.clients", "{with}");
    assert_eq!(with["limits"][0]["key"], "rl:{per_client:cert:alice.clients}", "{with}");
    let without = run(&[]);
    assert_eq!(without["identity"], "subnet:127.0.0.0/24", "{without}");
    let passed: Vec<&str> = without["identity_detail"]["passed_over"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["tier"].as_str().unwrap())
        .collect();
    assert_eq!(passed, ["key", "cert"], "{without}");
}

#[test]
fn explain_prints_the_cost_rule_and_the_reserve_a_header_gives() {
    let config = "[listeners]\nhttp = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"u\"\ntargets = [\"http://127.0.0.1:9\"]\n\
        [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\nlimits = [\"tokens\"]\n\
        [[limits]]\nname = \"tokens\"\nrate = \"1000/min\"\ncost = { reserve = \"header:x-max-tokens\", settle = \"json:usage.total_tokens\" }\n";
    let run = |args: &[&str]| {
        let (code, stdout, stderr) = explain_with(config, args);
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let out = run(&["--header", "x-max-tokens: 40", "POST", "/v1/chat"]);
    assert!(
        out.contains("cost reserve header:x-max-tokens, settle json:usage.total_tokens (this request reserves 40)"),
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["--json", "POST", "/v1/chat"])).unwrap();
    assert_eq!(
        json["limits"][0]["cost"],
        "reserve header:x-max-tokens, settle json:usage.total_tokens (this request reserves 1)"
    );
}

/// `--identity` explains as a caller without its credentials: a hashed
/// key by its id (its tenant and plan from the config), a tenant by its
/// first key, a JWT's subject; a name the config does not know is an
/// error, not a silent fall to the subnet tier.
#[test]
fn identity_names_a_caller_without_its_secret() {
    // SHA-256 of "test": the secret is not in the config.
    let hashed = "[[identity.api_keys]]\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\nid = \"beta\"\ntenant = \"betacorp\"\nplan = \"enterprise\"\n";
    let text = config("").replacen("[[routes]]", &format!("{hashed}\n[[routes]]"), 1);
    let (code, out, err) = explain_with(&text, &["--identity", "key:beta", "GET", "/v1/orders"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("identity  key:beta (tenant betacorp, plan enterprise, client 127.0.0.1)"),
        "{out}"
    );
    assert!(
        out.contains("limit     per_client enforce token_bucket 50000/min capacity 50000 (plan enterprise)"),
        "{out}"
    );
    assert!(out.contains("key rl:{per_client:key:beta}"), "{out}");
    assert!(!out.contains("not user:"), "no tier was tried: {out}");
    // The same key as its secret would give.
    let (_, by_secret, _) = explain_with(&text, &["--header", "X-API-Key: test", "GET", "/v1/orders"]);
    assert!(by_secret.contains("key rl:{per_client:key:beta}"), "{by_secret}");

    let (code, out, err) = explain_with(&text, &["--identity", "tenant:acme", "GET", "/v1/orders"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("identity  key:acme (tenant acme, plan enterprise"),
        "{out}"
    );
    let (code, out, err) = explain_with(&text, &["--identity", "user:alice", "GET", "/v1/orders"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("identity  user:alice"), "{out}");
    assert!(out.contains("limit     users_only"), "{out}");

    for (spec, says) in [
        ("key:nobody", "no [[identity.api_keys]] entry has id"),
        ("tenant:nobody", "no [[identity.api_keys]] entry has tenant"),
        ("beta", "want key:ID, user:SUB or tenant:NAME"),
        ("subnet:10.0.0.0/8", "want key:ID, user:SUB or tenant:NAME"),
    ] {
        let (code, out, err) = explain_with(&text, &["--identity", spec, "GET", "/v1/orders"]);
        assert_eq!(code, 1, "{spec}: {out}");
        assert!(err.contains(says), "{spec}: {err}");
    }
}
