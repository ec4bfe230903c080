//! The alerting rules and their routing, checked by the tools that will run
//! them: `promtool check rules` and `promtool test rules` on
//! docs/alerts.yml and its unit tests, `amtool check-config` and `amtool
//! config routes test` on docs/alertmanager.yml, and a real gateway's
//! `/metrics` for every metric name the rules read. A missing tool fails
//! the test with what to install; nothing is skipped.

use std::path::PathBuf;
use std::process::Command;

use crate::support::promql::{exported_names, metric_names};
use crate::support::{self, require_tool, Gateway, Toml};

const INSTALL: &str = "apt-get install -y prometheus prometheus-alertmanager";

fn docs(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs").join(name)
}

/// Runs a tool; panics with its output unless it exits 0.
fn run_ok(tool: &str, args: &[&str]) -> String {
    require_tool(tool, INSTALL);
    let out = Command::new(tool)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "`{tool} {}` failed:\n{text}", args.join(" "));
    text
}

/// (alert name, severity, expr) of every rule in docs/alerts.yml, read
/// line by line: the file keeps one `- alert:` per rule, its `expr` before
/// its labels.
fn alerts() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(docs("alerts.yml")).unwrap();
    let mut out: Vec<(String, String, String)> = Vec::new();
    // The indentation of the `expr:` key whose block scalar is being read.
    let mut in_expr: Option<usize> = None;
    for line in text.lines() {
        let t = line.trim();
        let indent = line.len() - line.trim_start().len();
        if let Some(name) = t.strip_prefix("- alert:") {
            out.push((name.trim().to_string(), String::new(), String::new()));
            in_expr = None;
        } else if let Some(expr) = t.strip_prefix("expr:") {
            let last = out.last_mut().expect("expr before any alert");
            last.2 = expr.trim().trim_start_matches('|').to_string();
            in_expr = Some(indent);
        } else if in_expr.is_some_and(|i| indent > i) && !t.is_empty() {
            let last = out.last_mut().unwrap();
            last.2.push(' ');
            last.2.push_str(t);
        } else {
            in_expr = None;
            if let Some(severity) = t.strip_prefix("severity:") {
                out.last_mut().expect("severity before any alert").1 = severity.trim().to_string();
            }
        }
    }
    assert!(out.len() >= 6, "read too few alerts from docs/alerts.yml: {out:?}");
    for (name, severity, expr) in &out {
        assert!(!expr.trim().is_empty(), "{name}: no expr read");
        assert!(
            severity == "page" || severity == "ticket",
            "{name}: severity {severity:?}, want page or ticket"
        );
    }
    out
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let alerts = docs("alerts.yml");
    let out = run_ok("promtool", &["check", "rules", alerts.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
    let tests = docs("alerts.test.yml");
    let out = run_ok("promtool", &["test", "rules", tests.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_has_unit_tests_that_see_it_fire() {
    let tests = std::fs::read_to_string(docs("alerts.test.yml")).unwrap();
    for (name, severity, _) in alerts() {
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "docs/alerts.test.yml has no test of {name}"
        );
        // At least one evaluation expects it firing (not only silence).
        let fires = tests.split("- eval_time:").any(|case| {
            case.contains(&format!("alertname: {name}\n")) && case.contains(&format!("severity: {severity}"))
        });
        assert!(fires, "docs/alerts.test.yml never expects {name} to fire");
    }
}

#[test]
fn alertmanager_config_passes_amtool_and_pages_only_page_alerts() {
    let config = docs("alertmanager.yml");
    let config = config.to_str().unwrap();
    let out = run_ok("amtool", &["check-config", config]);
    assert!(out.contains("SUCCESS"), "{out}");

    let alerts = alerts();
    assert!(
        alerts
            .iter()
            .any(|(n, s, _)| n == "LeasegateRateLimitBypassed" && s == "page"),
        "the bypass alert must page: {alerts:?}"
    );
    for (name, severity, _) in &alerts {
        let receiver = if severity == "page" { "pagerduty" } else { "tickets" };
        let config_flag = format!("--config.file={config}");
        let verify = format!("--verify.receivers={receiver}");
        let alertname = format!("alertname={name}");
        let severity = format!("severity={severity}");
        let out = run_ok(
            "amtool",
            &["config", "routes", "test", &config_flag, &verify, &severity, &alertname],
        );
        assert_eq!(out.lines().next(), Some(receiver), "{name}: {out}");
    }

    // The pager is PagerDuty's Events API v2 (a routing key, never the v1
    // service key), and the key is read from a file, not written here.
    let text: String = std::fs::read_to_string(docs("alertmanager.yml"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(text.contains("pagerduty_configs:"), "{text}");
    assert!(text.contains("routing_key_file:"), "{text}");
    assert!(text.contains("https://events.pagerduty.com/v2/enqueue"), "{text}");
    assert!(!text.contains("service_key"), "{text}");
    assert!(!text.contains("routing_key:"), "a key in the file: {text}");
}

/// A fresh gateway with two routes exports a small scrape: labelled
/// series appear at their first event, except those the alerts need at 0
/// (the bypass reasons and the reload results), and a route's request
/// series come one (route, status) at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_gateway_scrape_is_small_and_grows_with_traffic_only() {
    let gw = Gateway::start(
        &Toml::new()
            .respond("api", "/api/", &["per_client"])
            .respond("demo", "/", &["per_client"])
            .limit("per_client", "100/min"),
    );
    let samples = |scrape: &str| -> Vec<String> {
        scrape
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let fresh = gw.metrics().await;
    let fresh_samples = samples(&fresh);
    assert!(fresh.len() < 8_000, "{} bytes:\n{fresh}", fresh.len());
    assert!(fresh_samples.len() <= 50, "{} samples:\n{fresh}", fresh_samples.len());
    assert!(
        !fresh.contains("leasegate_requests_total{") && !fresh.contains("leasegate_request_duration_seconds_bucket{"),
        "{fresh}"
    );
    for series in [
        r#"rate_limit_bypassed_total{reason="store_circuit_open"} 0"#,
        r#"rate_limit_bypassed_total{reason="store_timeout"} 0"#,
        r#"rate_limit_bypassed_total{reason="store_error"} 0"#,
        r#"leasegate_config_reloads_total{result="ok"} 0"#,
        r#"leasegate_config_reloads_total{result="error"} 0"#,
    ] {
        assert!(fresh.contains(series), "{series} missing:\n{fresh}");
    }

    let mut c = support::client::http1(gw.http()).await;
    for _ in 0..3 {
        let (status, _, _) =
            support::client::text(support::client::send(&mut c, support::client::get("/api/x")).await).await;
        assert_eq!(status, 200);
    }
    let scrape = gw.metrics().await;
    let requests: Vec<String> = samples(&scrape)
        .into_iter()
        .filter(|l| l.starts_with("leasegate_requests_total{"))
        .collect();
    assert_eq!(
        requests,
        [r#"leasegate_requests_total{route="api",status="200"} 3"#],
        "{scrape}"
    );
    let buckets = samples(&scrape)
        .into_iter()
        .filter(|l| l.starts_with("leasegate_request_duration_seconds_bucket{"))
        .count();
    assert!(
        (8..=14).contains(&buckets),
        "{buckets} request duration buckets:\n{scrape}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_read_only_metrics_a_fresh_gateway_exports() {
    // A region with a primary, so the link's series exist too (a gateway
    // without `[region]` has no link to report on).
    let primary = format!("http://127.0.0.1:{}", support::closed_port());
    let gw = Gateway::start(
        &Toml::new()
            .table(
                "region",
                &format!("name = \"eu-central\"\nshare = 0.5\nlink = \"127.0.0.1:0\"\nprimary = \"{primary}\""),
            )
            .respond("demo", "/", &[]),
    );
    let mut c = support::client::http1(gw.http()).await;
    let (status, _, _) = support::client::text(support::client::send(&mut c, support::client::get("/")).await).await;
    assert_eq!(status, 200);
    let scrape = gw.metrics().await;
    let exported = exported_names(&scrape);
    for (name, _, expr) in alerts() {
        for metric in metric_names(&expr) {
            assert!(
                exported.contains(&metric),
                "{name} reads {metric}, which /metrics does not export:\n{scrape}"
            );
        }
    }
    // Series the alerts take a rate or an increase of exist before their
    // first event, or that first event would be invisible to the alert.
    for series in [
        r#"rate_limit_bypassed_total{reason="store_circuit_open"} 0"#,
        r#"rate_limit_bypassed_total{reason="store_timeout"} 0"#,
        r#"rate_limit_bypassed_total{reason="store_error"} 0"#,
        r#"leasegate_config_reloads_total{result="error"} 0"#,
        "leasegate_circuit_open 0",
        r#"leasegate_region_transfers_total{result="error"} 0"#,
    ] {
        assert!(
            scrape.lines().any(|l| l == series),
            "a fresh gateway lacks `{series}`:\n{scrape}"
        );
    }
    // The link's gauge exists from the start: 1 before the start probe
    // answers, 0 once it found the primary's (closed) port.
    assert!(
        scrape.lines().any(|l| {
            l == r#"leasegate_region_link_up{region="eu-central"} 1"#
                || l == r#"leasegate_region_link_up{region="eu-central"} 0"#
        }),
        "a fresh gateway lacks leasegate_region_link_up:\n{scrape}"
    );
}
