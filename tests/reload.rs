//! Hot reload through the real binary: file changes apply, broken files
//! never do, SIGHUP always counts, /config tells the truth.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::{client, Gateway};

fn config(rate: &str, extra: &str) -> String {
    format!(
        r#"
[listeners]
http = "127.0.0.1:0"
admin = "127.0.0.1:0"

[[routes]]
name = "demo"
path_prefix = "/"
response = {{ status = 200, body = "ok" }}
limits = ["l"]

[[limits]]
name = "l"
rate = "{rate}"
{extra}
"#
    )
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_limit_applies_and_broken_files_never_do() {
    let gw = Gateway::start(&config("2/min", ""));
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
    replace(&gw, &config("0/min", ""));
    wait_for("a second failed reload", async || {
        gw.admin_get("/metrics")
            .await
            .contains(r#"leasegate_config_reloads_total{result="error"} 2"#)
    })
    .await;
    assert_eq!(sha(&gw).await, first, "a broken file is never applied");
    assert_eq!(status(&mut c).await, 429, "the old limit still holds");
    assert!(
        gw.log().contains("limits[0].rate"),
        "the log names the key: {}",
        gw.log()
    );

    // A valid change applies within a second or two.
    replace(&gw, &config("1000/s", ""));
    wait_for("the new config", async || sha(&gw).await != first).await;
    wait_for("the new limit", async || status(&mut c).await == 200).await;
    let m = gw.admin_get("/metrics").await;
    assert!(m.contains(r#"leasegate_config_reloads_total{result="ok"} 1"#), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_always_reloads_and_counts() {
    let gw = Gateway::start(&config("10/min", ""));
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
    let gw = Gateway::start(&config("10/min", ""));
    // Written in place (not renamed), then signalled at once, as a
    // deploy script might.
    std::fs::write(&gw.config, config("20/min", "")).unwrap();
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
    let gw = Gateway::start(&config("10/min", ""));
    // At once, before the watcher may have looked at the file: it must
    // compare with the config in force, not with what it first sees.
    replace(&gw, &config("20/min", ""));
    let edited = hex(&Sha256::digest(config("20/min", "").as_bytes()));
    wait_for("the edit", async || sha(&gw).await == edited).await;
    assert!(gw.log().contains("trigger=FileChanged"), "{}", gw.log());
}
