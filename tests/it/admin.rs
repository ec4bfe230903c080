//! The admin listener's operator surface through the real binary: the
//! read-only key state (`/limits/state`, which `leasegate explain --admin`
//! reads), the status page (`/`, rendered by a real headless Chromium) and
//! the effective values in `/config`.

use std::process::Command;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::{self, client, Gateway, Toml};

/// Two limits by `x-user` on one route; the instance id holds markup.
fn config() -> Toml {
    Toml::new()
        .gateway("instance_id = \"gw-status-<1>\"\nworkers = 2")
        .respond("demo", "/", &["five", "hostile"])
        .limit("five", "5/min")
        .with("by = [\"header:x-user\"]")
        .limit("hostile", "100/min")
        .with("algorithm = \"sliding_window\"\nmode = \"shadow\"\nby = [\"header:x-user\"]\nplans = { gold = \"1000/min\" }")
}

/// The store key of limit `five` for an `x-user` value: header values
/// enter keys only as the first 128 bits of their SHA-256.
fn key(user: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(user.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("rl:{{five:#{hex}}}")
}

async fn get_as(c: &mut client::Sender1, user: &str) -> StatusCode {
    let req = Request::get("/")
        .header("host", "localhost")
        .header("x-user", user)
        .body(Full::new(Bytes::new()))
        .unwrap();
    client::send(c, req).await.status()
}

/// GET on the admin listener: (status, content type, body).
async fn admin(gw: &Gateway, path: &str) -> (StatusCode, String, String) {
    let mut c = client::http1(gw.admin()).await;
    let (status, headers, body) = client::text(client::send(&mut c, client::get(path)).await).await;
    let ct = headers
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, body)
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_state_reports_the_lease_block_and_untracked_keys() {
    let gw = Gateway::start(&config());
    let mut c = client::http1(gw.http()).await;
    for _ in 0..5 {
        assert_eq!(get_as(&mut c, "alice").await, 200);
    }
    assert_eq!(get_as(&mut c, "alice").await, 429);
    assert_eq!(get_as(&mut c, "bob").await, 200);

    let path = format!(
        "/limits/state?key={}&key={}&key={}",
        url_encode(&key("alice")),
        url_encode(&key("bob")),
        url_encode(&key("nobody"))
    );
    let (status, ct, body) = admin(&gw, &path).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ct, "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 3, "{v}");
    let fields = [
        "key",
        "tracked",
        "tokens_at_hand",
        "tokens_reserved",
        "blocked_for_ms",
        "retry_after_ms",
        "store_remaining",
        "reset_ms",
        "last_store_failure",
    ];
    for k in keys {
        let mut names: Vec<_> = k.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut want = fields.to_vec();
        want.sort_unstable();
        assert_eq!(names, want, "the contract's fields exactly: {k}");
    }

    let alice = &keys[0];
    assert_eq!(alice["key"], key("alice"));
    assert_eq!(alice["tracked"], true);
    assert_eq!(alice["tokens_at_hand"], 0);
    assert_eq!(alice["store_remaining"], 0);
    let blocked = alice["blocked_for_ms"].as_u64().unwrap();
    assert!(blocked > 0, "refused from memory for a while: {alice}");
    let retry = alice["retry_after_ms"].as_u64().unwrap();
    assert!((10_000..=12_000).contains(&retry), "one token per 12 s: {alice}");
    assert!(alice["reset_ms"].as_u64().unwrap() > 0, "{alice}");
    assert_eq!(alice["last_store_failure"], serde_json::Value::Null);

    // A 5/min limit is leased one token at a time: bob spent his.
    let bob = &keys[1];
    assert_eq!(
        (bob["tracked"].as_bool(), bob["blocked_for_ms"].as_u64()),
        (Some(true), Some(0))
    );
    assert_eq!(bob["store_remaining"], 4, "{bob}");

    let nobody = &keys[2];
    assert_eq!(nobody["key"], key("nobody"));
    assert_eq!(nobody["tracked"], false);
    for f in [
        "tokens_at_hand",
        "blocked_for_ms",
        "retry_after_ms",
        "store_remaining",
        "reset_ms",
    ] {
        assert_eq!(nobody[f], 0, "{f}: {nobody}");
    }

    // Bad requests say what to send.
    let (status, _, body) = admin(&gw, "/limits/state").await;
    assert_eq!(status, 400);
    assert!(body.contains("?key="), "{body}");
    let (status, _, _) = admin(&gw, "/limits/state?key=%FF").await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_state_names_the_last_store_failure() {
    let port = support::closed_port();
    let gw = Gateway::start(&config().redis(&format!("redis://127.0.0.1:{port}"), "timeout_ms = 50"));
    let mut c = client::http1(gw.http()).await;
    // Fail-open: the fallback bucket admits.
    assert_eq!(get_as(&mut c, "carol").await, 200);
    let path = format!("/limits/state?key={}", url_encode(&key("carol")));
    let (status, _, body) = admin(&gw, &path).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let carol = &v["keys"][0];
    assert_eq!(carol["tracked"], true, "{v}");
    let failure = carol["last_store_failure"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(failure.starts_with("store "), "the store error's text: {failure}");

    // The status page's bypass rate is /metrics' ratio, since start and
    // since the counts its refresh URL carried.
    let metrics = gw.metrics().await;
    let total = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let (requests, bypassed) = (total("leasegate_requests_total{"), total("rate_limit_bypassed_total{"));
    assert!(bypassed >= 1.0, "the fallback admitted carol:\n{metrics}");
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 5_000;
    let (status, ct, page) = admin(&gw, &format!("/?r=0&b=0&t={t}")).await;
    assert_eq!((status.as_u16(), ct.as_str()), (200, "text/html; charset=utf-8"));
    let want = format!("{:.3} %", bypassed * 100.0 / requests);
    assert!(
        page.contains(&format!("<span id=\"bypass\">{want}</span>")),
        "{want}:\n{page}"
    );
    assert!(
        page.contains(&format!("<span id=\"bypass-recent\">{want}</span> over the last 5 s")),
        "{page}"
    );
    assert!(page.contains("redis redis://127.0.0.1:"), "the store backend:\n{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_the_effective_values_of_every_route_and_limit() {
    let gw = Gateway::start(&config());
    let (status, ct, body) = admin(&gw, "/config").await;
    assert_eq!((status.as_u16(), ct.as_str()), (200, "application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The names stay where they were.
    assert_eq!(v["limits"], serde_json::json!(["five", "hostile"]));
    assert_eq!(v["routes"], serde_json::json!(["demo"]));
    assert_eq!(v["instance_id"], "gw-status-<1>");
    let five = &v["effective"]["limits"][0];
    assert_eq!(five["name"], "five");
    assert_eq!(five["rate"], "5/min");
    assert_eq!(five["burst"], 5, "burst defaults to the rate's count");
    assert_eq!(five["mode"], "enforce");
    assert_eq!(five["algorithm"], "token_bucket");
    assert_eq!(five["by"], serde_json::json!(["header:x-user"]));
    assert_eq!(five["fallback_rate"], serde_json::Value::Null);
    assert_eq!(five["shards"], 1);
    let hostile = &v["effective"]["limits"][1];
    assert_eq!(hostile["mode"], "shadow");
    assert_eq!(hostile["algorithm"], "sliding_window");
    assert_eq!(hostile["burst"], 100);
    assert_eq!(hostile["plans"], serde_json::json!({ "gold": "1000/min" }));
    let demo = &v["effective"]["routes"][0];
    assert_eq!(demo["limits"], serde_json::json!(["five", "hostile"]));
    assert_eq!(demo["on_store_failure"], "allow");
    assert_eq!(demo["path_prefix"], "/");
    assert_eq!(demo["respond"], 200);
}

/// Chromium's DOM of `url`, after layout (`--dump-dom`). Fails with what to
/// install when Chromium is missing: never skips.
fn chromium_dom(url: &str, extra: &[&str]) -> String {
    support::require_tool("chromium", "apt-get install -y chromium");
    let profile = support::TempDir::new();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text of the element that carries `attrs` (an attribute string as
/// the status page writes it) in Chromium's serialized DOM.
fn cell<'a>(dom: &'a str, attrs: &str) -> &'a str {
    let start = dom
        .find(attrs)
        .unwrap_or_else(|| panic!("no element with {attrs} in:\n{dom}"));
    let rest = &dom[start..];
    let open = rest.find('>').unwrap() + 1;
    let close = rest[open..].find('<').unwrap();
    &rest[open..open + close]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_in_chromium_shows_what_metrics_says_and_escapes_keys() {
    let gw = Gateway::start(&config());
    let mut c = client::http1(gw.http()).await;
    let hostile = "<script>document.title='pwned'</script>";
    let mut limited = 0;
    for i in 0..12 {
        let user = if i % 2 == 0 { hostile } else { "dave" };
        if get_as(&mut c, user).await == 429 {
            limited += 1;
        }
    }
    assert_eq!(limited, 2, "five each admitted, one each refused");

    let metrics = gw.metrics().await;
    let admin = gw.admin();
    let url = format!("http://{admin}/");
    let dom = tokio::task::spawn_blocking(move || chromium_dom(&url, &["--dump-dom"]))
        .await
        .unwrap();

    // The same numbers as /metrics.
    for outcome in ["admitted", "limited", "shadow_limited", "soft_limited"] {
        for limit in ["five", "hostile"] {
            let want = support::sample(
                &metrics,
                &format!("leasegate_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}} "),
            );
            let shown = cell(&dom, &format!("data-limit=\"{limit}\" data-outcome=\"{outcome}\""));
            assert_eq!(shown, format!("{want}"), "{limit} {outcome}:\n{dom}");
        }
    }
    assert_eq!(cell(&dom, "data-limit=\"five\" data-outcome=\"admitted\""), "10");
    assert_eq!(cell(&dom, "data-limit=\"five\" data-outcome=\"limited\""), "2");

    let config: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    // The instance id holds markup too: escaped, and shown as text.
    assert_eq!(cell(&dom, "id=\"instance\""), "gw-status-&lt;1&gt;");
    assert_eq!(cell(&dom, "id=\"config-sha256\""), config["sha256"].as_str().unwrap());
    assert_eq!(cell(&dom, "id=\"circuit\""), "closed");
    assert_eq!(cell(&dom, "id=\"bypass\""), "0.000 %");
    assert!(dom.contains("<title>leasegate gw-status-&lt;1&gt;</title>"), "{dom}");

    // The hostile header value is in the most-limited list only as its
    // digest: the page never shows a client's header bytes, so no script
    // ran and no element was made of them.
    assert!(
        dom.contains(&key(hostile)),
        "the hostile key, as a digest, among the most limited:\n{dom}"
    );
    assert!(!dom.contains("pwned"), "the raw value is nowhere:\n{dom}");
    assert!(!dom.contains("<script"), "no script element:\n{dom}");
    assert!(dom.contains(&key("dave")), "{dom}");

    // A phone-sized window renders it.
    let shot = support::TempDir::new();
    let png = shot.path().join("phone.png");
    let url = format!("http://{admin}/");
    let arg = format!("--screenshot={}", png.display());
    tokio::task::spawn_blocking(move || chromium_dom(&url, &["--window-size=390,844", &arg]))
        .await
        .unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.len() > 1_000 && bytes.starts_with(b"\x89PNG"),
        "a screenshot was taken"
    );
}

const TOKEN: &str = "3f8a1c0d9e7b6a5f4e3d2c1b0a998877";

/// GET `path` on the admin listener with `authorization` (if any): the
/// status, the `WWW-Authenticate` header and the body.
async fn admin_as(gw: &Gateway, path: &str, authorization: Option<&str>) -> (u16, Option<String>, String) {
    let mut c = client::http1(gw.admin()).await;
    let mut req = Request::get(path).header("host", "admin");
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let resp = client::send(&mut c, req.body(Full::new(Bytes::new())).unwrap()).await;
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let (status, _, body) = client::text(resp).await;
    (status.as_u16(), challenge, body)
}

/// `[admin] token_file`: every admin path but the health checks needs
/// the bearer token, compared whole; a reload reads the file again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_guards_every_path_but_the_health_checks() {
    let text = Toml::new()
        .respond("demo", "/", &[])
        .table("admin", "token_file = \"admin.token\"")
        .to_string();
    let gw = Gateway::start_with(&text, &[("admin.token", &format!("{TOKEN}\n"))]);
    let bearer = format!("Bearer {TOKEN}");
    for path in ["/metrics", "/config", "/", "/limits/state?key=k"] {
        let (status, challenge, body) = admin_as(&gw, path, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"leasegate admin\""), "{path}");
        assert!(!body.contains("leasegate_"), "{path}: {body}");
        for wrong in ["Bearer 3f8a1c0d9e7b6a5f4e3d2c1b0a998878", "Basic abc", TOKEN, "Bearer "] {
            assert_eq!(admin_as(&gw, path, Some(wrong)).await.0, 401, "{path} with {wrong:?}");
        }
        assert_eq!(admin_as(&gw, path, Some(&bearer)).await.0, 200, "{path} with the token");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(admin_as(&gw, path, None).await.0, 200, "{path} stays open");
    }
    // A new token on disk, and a reload: the old one no longer opens.
    let fresh = "a-brand-new-token-of-some-length";
    std::fs::write(gw.dir.path().join("admin.token"), fresh).unwrap();
    gw.signal("HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while admin_as(&gw, "/metrics", Some(&bearer)).await.0 != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never read the new token"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(admin_as(&gw, "/metrics", Some(&format!("Bearer {fresh}"))).await.0, 200);
}

/// Without `[admin]`, the admin listener may only listen on loopback:
/// `check` says why, and what to do.
#[test]
fn an_admin_listener_off_loopback_needs_a_token() {
    let open = "[listeners]\nhttp = \"127.0.0.1:0\"\nadmin = \"0.0.0.0:9901\"\n";
    let (code, _, stderr, _dir) = support::check(open);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("gateway.toml:3: listeners.admin: 0.0.0.0:9901 is not a loopback address")
            && stderr.contains("set [admin] token_file"),
        "{stderr}"
    );
    // With a token file, it may; a short token is refused, and says how
    // to make one.
    let dir = support::TempDir::new();
    dir.write("admin.token", TOKEN);
    dir.write("short.token", "1234");
    for (file, ok) in [("admin.token", true), ("short.token", false), ("missing.token", false)] {
        let text = format!("{open}[admin]\ntoken_file = \"{file}\"\n");
        let path = dir.write("gateway.toml", &text);
        let parsed = leasegate::config::parse(&path, &text);
        match (parsed, ok) {
            (Ok(c), true) => assert!(c.listeners.admin_token.is_some()),
            (Err(e), false) => assert!(e.to_string().contains("gateway.toml:5: admin.token_file:"), "{e}"),
            (Ok(_), false) => panic!("{file} should be refused"),
            (Err(e), true) => panic!("{file}: {e}"),
        }
    }
    let text = format!("{open}[admin]\ntoken_file = \"short.token\"\n");
    let path = dir.write("gateway.toml", &text);
    let err = leasegate::config::parse(&path, &text).unwrap_err().to_string();
    assert!(
        err.contains("at least 16 characters") && err.contains("openssl rand -hex 32"),
        "{err}"
    );
}
