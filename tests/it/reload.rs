//! Hot reload through the real binary: file changes apply, broken files
//! never do, SIGHUP always counts, /config tells the truth.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::support::{self, client, Gateway, Toml};

/// One route under one limit, `l`, at `rate`.
fn config(rate: &str) -> Toml {
    Toml::new().respond("demo", "/", &["l"]).limit("l", rate)
}

/// Writes the file the way editors do: a new file renamed over the old.
fn replace(gw: &Gateway, text: &str) {
    let tmp = gw.config.with_extension("toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &gw.config).unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn sha(gw: &Gateway) -> String {
    let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    v["sha256"].as_str().unwrap().to_string()
}

async fn status(c: &mut client::Sender1) -> u16 {
    client::send(c, client::get("/")).await.status().as_u16()
}

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    crate::support::eventually(
        Duration::from_secs(5),
        async || f().await.then_some(()),
        || format!("timed out waiting for {what}"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_limit_applies_and_broken_files_never_do() {
    let gw = Gateway::start(&config("2/min"));
    let mut c = client::http1(gw.http()).await;
    assert_eq!(status(&mut c).await, 200);
    assert_eq!(status(&mut c).await, 200);
    assert_eq!(status(&mut c).await, 429);
    let first = sha(&gw).await;

    // A syntax error, then a semantic error: neither is applied.
    replace(&gw, "[listeners\nhttp = ");
    wait_for("a failed reload", async || {
        gw.admin_get("/metrics")
            .await
            .contains(r#"leasegate_config_reloads_total{result="error"} 1"#)
    })
    .await;
    replace(&gw, &config("0/min"));
    wait_for("a second failed reload", async || {
        gw.admin_get("/metrics")
            .await
            .contains(r#"leasegate_config_reloads_total{result="error"} 2"#)
    })
    .await;
    assert_eq!(sha(&gw).await, first, "a broken file is never applied");
    assert_eq!(status(&mut c).await, 429, "the old limit still holds");
    // The refusal shows where the sha does: /config and the status page
    // say the last reload failed, when and why, until one succeeds.
    let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    let failure = &v["last_reload_failure"];
    assert!(failure["why"].as_str().unwrap().contains("limits[0].rate"), "{v}");
    assert!(failure["at"].as_str().unwrap().ends_with('Z'), "{v}");
    let page = gw.admin_get("/").await;
    assert!(
        page.contains("id=\"reload-failed\"") && page.contains("limits[0].rate"),
        "{page}"
    );
    assert!(
        gw.log().contains("limits[0].rate"),
        "the log names the key: {}",
        gw.log()
    );

    // A valid change applies within a second or two.
    replace(&gw, &config("1000/s"));
    wait_for("the new config", async || sha(&gw).await != first).await;
    wait_for("the new limit", async || status(&mut c).await == 200).await;
    let m = gw.admin_get("/metrics").await;
    assert!(m.contains(r#"leasegate_config_reloads_total{result="ok"} 1"#), "{m}");
    let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    assert!(v["last_reload_failure"].is_null(), "a good reload clears it: {v}");
    assert!(!gw.admin_get("/").await.contains("reload-failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_always_reloads_and_counts() {
    let gw = Gateway::start(&config("10/min"));
    let before = sha(&gw).await;
    gw.signal("HUP");
    wait_for("a counted reload", async || {
        gw.admin_get("/metrics")
            .await
            .contains(r#"leasegate_config_reloads_total{result="ok"} 1"#)
    })
    .await;
    assert_eq!(sha(&gw).await, before, "same file, same hash");
    let v: serde_json::Value = serde_json::from_str(&gw.admin_get("/config").await).unwrap();
    assert_eq!(v["limits"], serde_json::json!(["l"]));
    assert_eq!(gw.admin_get("/healthz").await, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_followed_by_sighup_is_reloaded_once() {
    let gw = Gateway::start(&config("10/min"));
    // Written in place (not renamed), then signalled at once, as a
    // deploy script might.
    std::fs::write(&gw.config, config("20/min")).unwrap();
    gw.signal("HUP");
    wait_for("the reload", async || {
        gw.admin_get("/metrics")
            .await
            .contains(r#"leasegate_config_reloads_total{result="ok"} 1"#)
    })
    .await;
    // The watcher polls every 500 ms: give it three chances to reload again.
    // (It may have seen the edit before the signal did; then the SIGHUP
    // reload comes last, as it should. What must not happen is the watcher
    // reloading a file SIGHUP already loaded.)
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let log = gw.log();
    let reloads: Vec<&str> = log.lines().filter(|l| l.contains("config reloaded")).collect();
    assert!(!reloads.is_empty(), "{log}");
    assert!(
        reloads.last().unwrap().contains("Sighup"),
        "the watcher reloaded what SIGHUP had loaded: {reloads:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_made_right_after_start_is_applied() {
    let gw = Gateway::start(&config("10/min"));
    // At once, before the watcher may have looked at the file: it must
    // compare with the config in force, not with what it first sees.
    replace(&gw, &config("20/min"));
    let edited = hex(&Sha256::digest(config("20/min").as_bytes()));
    wait_for("the edit", async || sha(&gw).await == edited).await;
    assert!(gw.log().contains("trigger=FileChanged"), "{}", gw.log());
}

/// Every restart-only setting, written out so that a test can change one at
/// a time: the WARN texts are checked against the docs on this file.
const RESTART_BASE: &str = r#"
[gateway]
workers = 1
max_connections = 100
max_header_bytes = 65536
header_read_timeout_ms = 1000
grace_period_ms = 1000
max_connections_per_ip = 256
idle_timeout_ms = 60000
access_log = "json"

[listeners]
http = "127.0.0.1:8080"
https = "127.0.0.1:8443"
admin = "127.0.0.1:9901"

[tls]
cert = "a.crt"
key = "a.key"
client_hello_timeout_ms = 5000

[store]
backend = "redis"
url = "redis://127.0.0.1:6379"
timeout_ms = 5
max_keys = 10000

[store.breaker]
failures = 3
open_ms = 2000

[rls]
listen = "127.0.0.1:8081"
config = "ratelimit.yaml"
[region]
name = "eu-central"
share = 0.3
link = "127.0.0.1:9911"
primary = "http://127.0.0.1:9921"
rebalance_at = 0.8
rebalance_window_ms = 20000

[[routes]]
name = "demo"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["l"]

[[limits]]
name = "l"
rate = "10/s"
"#;

/// The edit (lines replaced in [`RESTART_BASE`]) that changes one setting,
/// named as the docs name it: `[section]` and key.
fn restart_edit(section: &str, key: &str) -> Option<Vec<(&'static str, &'static str)>> {
    Some(match (section, key) {
        ("[listeners]", "http") => vec![("http = \"127.0.0.1:8080\"", "http = \"127.0.0.1:8081\"")],
        ("[listeners]", "https") => vec![("https = \"127.0.0.1:8443\"", "https = \"127.0.0.1:8444\"")],
        ("[listeners]", "admin") => vec![("admin = \"127.0.0.1:9901\"", "admin = \"127.0.0.1:9902\"")],
        ("[tls]", "cert") => vec![("cert = \"a.crt\"", "cert = \"b.crt\"")],
        ("[tls]", "key") => vec![("key = \"a.key\"", "key = \"b.key\"")],
        ("[tls]", "client_hello_timeout_ms") => {
            vec![("client_hello_timeout_ms = 5000", "client_hello_timeout_ms = 6000")]
        }
        ("[gateway]", "workers") => vec![("workers = 1", "workers = 2")],
        ("[gateway]", "max_connections") => vec![("max_connections = 100", "max_connections = 200")],
        ("[gateway]", "max_header_bytes") => vec![("max_header_bytes = 65536", "max_header_bytes = 32768")],
        ("[gateway]", "header_read_timeout_ms") => {
            vec![("header_read_timeout_ms = 1000", "header_read_timeout_ms = 2000")]
        }
        ("[gateway]", "grace_period_ms") => vec![("grace_period_ms = 1000", "grace_period_ms = 2000")],
        ("[gateway]", "max_connections_per_ip") => {
            vec![("max_connections_per_ip = 256", "max_connections_per_ip = 64")]
        }
        ("[gateway]", "idle_timeout_ms") => vec![("idle_timeout_ms = 60000", "idle_timeout_ms = 30000")],
        ("[identity]", "trusted_proxies") => vec![(
            "[store]\nbackend",
            "[identity]\ntrusted_proxies = [\"10.0.0.0/8\"]\n\n[store]\nbackend",
        )],
        ("[identity]", "ipv6_prefix") => vec![("[store]\nbackend", "[identity]\nipv6_prefix = 48\n\n[store]\nbackend")],
        ("[gateway]", "access_log") => vec![("access_log = \"json\"", "access_log = \"text\"")],
        ("[store]", "backend") => vec![
            ("backend = \"redis\"", "backend = \"memory\""),
            ("url = \"redis://127.0.0.1:6379\"", ""),
        ],
        ("[store]", "url") => vec![("url = \"redis://127.0.0.1:6379\"", "url = \"redis://127.0.0.1:6380\"")],
        ("[store]", "cluster") => vec![(
            "url = \"redis://127.0.0.1:6379\"",
            "cluster = [\"redis://127.0.0.1:7000\"]",
        )],
        ("[store]", "sentinel") => vec![(
            "url = \"redis://127.0.0.1:6379\"",
            "sentinel = [\"redis://127.0.0.1:26379\"]\nsentinel_master = \"mymaster\"",
        )],
        // sentinel_master needs sentinel: the edit sets both.
        ("[store]", "sentinel_master") => vec![(
            "url = \"redis://127.0.0.1:6379\"",
            "sentinel = [\"redis://127.0.0.1:26379\"]\nsentinel_master = \"other\"",
        )],
        ("[store]", "timeout_ms") => vec![("timeout_ms = 5\n", "timeout_ms = 6\n")],
        ("[store]", "max_keys") => vec![("max_keys = 10000", "max_keys = 20000")],
        ("[store.breaker]", "failures") => vec![("failures = 3", "failures = 4")],
        ("[store.breaker]", "open_ms") => vec![("open_ms = 2000", "open_ms = 3000")],
        ("[rls]", "listen") => vec![("listen = \"127.0.0.1:8081\"", "listen = \"127.0.0.1:8082\"")],
        ("[rls]", "workers") => vec![(
            "config = \"ratelimit.yaml\"",
            "config = \"ratelimit.yaml\"\nworkers = 2",
        )],
        ("[region]", "name") => vec![("name = \"eu-central\"", "name = \"eu-west\"")],
        ("[region]", "share") => vec![("share = 0.3", "share = 0.4")],
        ("[region]", "link") => vec![("link = \"127.0.0.1:9911\"", "link = \"127.0.0.1:9912\"")],
        ("[region]", "primary") => vec![("primary = \"http://127.0.0.1:9921\"\n", "")],
        ("[region]", "rebalance_at") => vec![("rebalance_at = 0.8", "rebalance_at = 0.9")],
        ("[region]", "rebalance_window_ms") => {
            vec![("rebalance_window_ms = 20000", "rebalance_window_ms = 30000")]
        }
        _ => return None,
    })
}

/// The rows of the restart-warning table in docs/operations.md: the WARN
/// text and the settings that give it, as (`[section]`, key) pairs.
fn documented_restart_warnings() -> Vec<(String, Vec<(String, String)>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let table = doc
        .split("| WARN | changed |\n|---|---|\n")
        .nth(1)
        .expect("docs/operations.md has the restart-warning table")
        .split("\n\n")
        .next()
        .unwrap();
    let ticked = |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    table
        .lines()
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 2, "{row}");
            let message = ticked(cells[0]).concat();
            // `[section]` then its keys; what follows a '(' is commentary.
            let named = cells[1].split('(').next().unwrap();
            let mut settings = Vec::new();
            let mut section = String::new();
            for t in ticked(named) {
                if t.starts_with('[') {
                    section = t;
                } else {
                    settings.push((section.clone(), t));
                }
            }
            assert!(!settings.is_empty(), "no settings in {row}");
            (message, settings)
        })
        .collect()
}

/// The WARN texts `restart_only_changes` can give, read from its source.
fn coded_restart_warnings() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(root.join("src/server/reload.rs")).unwrap();
    let body = src.split("pub fn restart_only_changes").nth(1).unwrap();
    body.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with("after a restart"))
        .map(str::to_string)
        .collect()
}

fn restart_dir() -> support::TempDir {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = support::TempDir::new();
    for (from, to) in [
        ("dev.crt", "a.crt"),
        ("dev.key", "a.key"),
        ("dev.crt", "b.crt"),
        ("dev.key", "b.key"),
    ] {
        std::fs::copy(root.join("certs").join(from), dir.path().join(to)).unwrap();
    }
    std::fs::write(dir.path().join("ratelimit.yaml"), "domain: d\n").unwrap();
    dir
}

/// Each WARN line docs/operations.md documents is the one, and the only
/// one, a reload gives when it changes each setting of its row; every WARN
/// line the code can give is documented there and in configuration.md.
#[test]
fn documented_restart_warnings_are_what_a_reload_says() {
    use leasegate::config::parse;
    use leasegate::server::reload::restart_only_changes;
    let dir = restart_dir();
    let path = dir.path().join("gateway.toml");
    let base = parse(&path, RESTART_BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(restart_only_changes(&base, &base), Vec::<String>::new());
    let reloadable = RESTART_BASE.replace("rate = \"10/s\"", "rate = \"20/s\"");
    assert_eq!(
        restart_only_changes(&base, &parse(&path, &reloadable).unwrap()),
        Vec::<String>::new()
    );

    let rows = documented_restart_warnings();
    assert!(rows.len() >= 8, "{rows:?}");
    for (message, settings) in &rows {
        for (section, key) in settings {
            let edit = restart_edit(section, key)
                .unwrap_or_else(|| panic!("docs name {section} {key}: add its edit to restart_edit"));
            let mut text = RESTART_BASE.to_string();
            for (from, to) in edit {
                assert!(text.contains(from), "{from}");
                text = text.replace(from, to);
            }
            let new = parse(&path, &text).unwrap_or_else(|e| panic!("{section} {key}: {e}"));
            assert_eq!(
                restart_only_changes(&base, &new),
                vec![message.clone()],
                "changing {section} {key}"
            );
        }
    }
    let documented: Vec<&String> = rows.iter().map(|(m, _)| m).collect();
    let configuration =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"))
            .unwrap();
    let coded = coded_restart_warnings();
    assert!(coded.len() >= 8, "{coded:?}");
    for message in &coded {
        assert!(documented.contains(&message), "not in docs/operations.md: {message}");
        assert!(
            configuration.contains(&format!("WARN `{message}`")),
            "not in docs/configuration.md: {message}"
        );
    }
}

/// A listener moved by a reload warns once; put back to the address
/// actually bound, it is no news. Without `[rls]` the `config reloaded`
/// line says `rls=none`, not an empty field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_put_back_to_the_bound_address_warns_nothing() {
    let text = config("10/s").to_string();
    let gw = Gateway::start(&text);
    let warned = |gw: &Gateway| gw.log().matches("listener addresses changed").count();
    let reloaded = |gw: &Gateway| gw.log().matches("config reloaded").count();
    let moved = text.replacen("http = \"127.0.0.1:0\"", "http = \"127.0.0.1:1\"", 1);
    assert_ne!(moved, text);
    for (n, (file, warnings)) in [(&moved, 1), (&text, 1), (&moved, 2)].into_iter().enumerate() {
        // The watcher's reload alone: one per edit.
        replace(&gw, file);
        crate::support::eventually(
            Duration::from_secs(5),
            async || (reloaded(&gw) > n).then_some(()),
            || format!("reload {n}:\n{}", gw.log()),
        )
        .await;
        assert_eq!(warned(&gw), warnings, "after reload {n}:\n{}", gw.log());
    }
    let line = gw
        .log()
        .lines()
        .find(|l| l.contains("config reloaded"))
        .unwrap()
        .to_string();
    assert!(line.trim_end().ends_with("rls=none"), "{line}");
}
