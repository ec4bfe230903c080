//! The command line's rough edges, through the real binary: `run --help`
//! says what an operator needs, a failed start says why once, and the
//! access log's `ms` is readable.

use std::process::Command;
use std::time::Duration;

use crate::support::{binary, client, Gateway, TempDir, Toml};

#[test]
fn run_help_explains_config_reload_logs_and_exit_codes() {
    let out = Command::new(binary()).args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--config <CONFIG>",
        "[default: gateway.toml]",
        "SIGHUP",
        "LEASEGATE_LOG",
        "SIGTERM",
        "Exit codes:",
        "0  stopped",
        "1  could not start",
    ] {
        assert!(help.contains(needle), "`run --help` lacks {needle:?}:\n{help}");
    }
}

#[test]
fn a_listener_that_cannot_bind_is_reported_once_and_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = TempDir::new();
    let path = dir.write(
        "gateway.toml",
        &format!("[listeners]\nhttp = \"{addr}\"\nadmin = \"127.0.0.1:0\"\n"),
    );
    let out = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let needle = format!("cannot listen on {addr} (http)");
    assert_eq!(stderr.matches(&needle).count(), 1, "{stderr}");
}

#[test]
fn usage_errors_exit_1() {
    for args in [&["run", "--bogus"][..], &["nonsense"][..], &["fingerprint"][..]] {
        let out = Command::new(binary()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    let out = Command::new(binary()).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_gives_milliseconds_to_the_microsecond() {
    let gw = Gateway::start(&Toml::new().respond("demo", "/", &[]));
    let mut c = client::http1(gw.http()).await;
    for _ in 0..5 {
        let (status, _, _) = client::text(client::send(&mut c, client::get("/")).await).await;
        assert_eq!(status, 200);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while gw.access_log().len() < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = gw.access_log();
    assert_eq!(lines.len(), 5, "{lines:?}");
    for line in lines {
        let raw = line
            .split("\"ms\":")
            .nth(1)
            .and_then(|rest| rest.split([',', '}']).next())
            .unwrap_or_else(|| panic!("no ms in {line}"));
        let decimals = raw.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(decimals <= 3, "ms {raw} in {line}");
        assert!(raw.parse::<f64>().unwrap() >= 0.0, "{line}");
    }
}
