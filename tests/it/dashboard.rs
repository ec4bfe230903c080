//! docs/grafana/leasegate.json against a real gateway: every metric name its
//! queries read is one that `/metrics` exports once a limited route has
//! served a request, and the panels the runbook relies on are there.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::promql::{exported_names, metric_names};
use crate::support::{self, client, Gateway, Toml};

fn dashboard() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana/leasegate.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Every PromQL expression in the dashboard: panel targets (rows' nested
/// panels too), annotations, and the metric of `label_values(metric, label)`
/// template queries.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("definition", Value::String(s)) => {
                        if let Some(args) = s.strip_prefix("label_values(") {
                            // Only the first argument is a selector.
                            let selector = args.rsplit_once(',').map_or(args, |(m, _)| m);
                            out.push(selector.trim_end_matches(')').to_string());
                        }
                    }
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

/// Panels (not rows), rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

/// The panel whose title starts with `title`.
fn panel<'a>(d: &'a Value, title: &str) -> &'a Value {
    panels(d)
        .into_iter()
        .find(|p| p["title"].as_str().is_some_and(|t| t.starts_with(title)))
        .unwrap_or_else(|| panic!("no panel titled {title:?}"))
}

/// The expressions of one panel's targets, joined.
fn exprs(p: &Value) -> String {
    p["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_reads_is_exported_by_a_running_gateway() {
    let gw = Gateway::start(
        &Toml::new()
            .respond("demo", "/", &["per_client"])
            .limit("per_client", "100/min"),
    );
    // One request through a limited route: the labelled request, decision
    // and store-call series now exist.
    let mut c = client::http1(gw.http()).await;
    let (status, _, _) = client::text(client::send(&mut c, client::get("/")).await).await;
    assert_eq!(status, 200);
    let scrape = gw.metrics().await;
    let exported = exported_names(&scrape);

    let mut all = Vec::new();
    queries(&dashboard(), &mut all);
    assert!(all.len() >= 10, "too few queries found: {all:?}");
    let mut used = BTreeSet::new();
    for q in &all {
        let names = metric_names(q);
        for name in &names {
            assert!(
                exported.contains(name),
                "the dashboard reads {name} ({q}), which /metrics does not export:\n{scrape}"
            );
        }
        used.extend(names);
    }
    // The panels issue 14 asks for read these.
    for name in [
        "leasegate_requests_total",
        "leasegate_decisions_total",
        "rate_limit_bypassed_total",
        "leasegate_store_call_seconds_bucket",
        "leasegate_circuit_open",
        "leasegate_lease_tokens_bucket",
        "leasegate_store_calls_total",
        "leasegate_config_reloads_total",
    ] {
        assert!(used.contains(name), "no query reads {name}: {used:?}");
    }
}

#[test]
fn the_dashboard_has_the_panels_an_operator_needs() {
    let d = dashboard();
    assert_eq!(d["uid"], "leasegate");
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "{}",
        d["schemaVersion"]
    );

    let by_route = exprs(panel(&d, "Request rate by route and status"));
    assert!(by_route.contains("sum by (route, status)"), "{by_route}");
    let decisions = exprs(panel(&d, "Decisions by outcome"));
    assert!(decisions.contains("outcome"), "{decisions}");

    // The bypass share, with the 0.5 % page line drawn on it.
    let bypass = panel(&d, "Bypass rate");
    let e = exprs(bypass);
    assert!(
        e.contains("rate_limit_bypassed_total") && e.contains("/ sum by (instance) (rate(leasegate_requests_total"),
        "{e}"
    );
    let steps = bypass["fieldConfig"]["defaults"]["thresholds"]["steps"]
        .as_array()
        .expect("threshold steps");
    assert!(steps.iter().any(|s| s["value"].as_f64() == Some(0.005)), "{steps:?}");
    assert_eq!(bypass["fieldConfig"]["defaults"]["unit"], "percentunit");

    assert!(exprs(panel(&d, "Store call latency")).contains("histogram_quantile(0.99"));
    assert!(exprs(panel(&d, "Circuit state")).contains("leasegate_circuit_open"));
    assert!(exprs(panel(&d, "Lease sizes")).contains("leasegate_lease_tokens_bucket"));
    let per_request = exprs(panel(&d, "Redis calls per request"));
    assert!(
        per_request.contains("leasegate_store_calls_total") && per_request.contains("leasegate_requests_total"),
        "{per_request}"
    );
    assert!(exprs(panel(&d, "Config reloads")).contains("leasegate_config_reloads_total"));

    // Grafana accepts it: unique ids, each panel has queries with refIds,
    // and fits the 24-column grid.
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate id in {p}");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "{p}");
    }
    for p in panels(&d) {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            assert!(t["refId"].as_str().is_some_and(|r| !r.is_empty()), "{t}");
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()), "{t}");
        }
    }
}

#[test]
fn metric_names_skip_functions_labels_ranges_and_variables() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (instance, le) (rate(leasegate_store_call_seconds_bucket{route=~"$route"}[$__rate_interval])))
           / on (instance) group_left sum without (status) (rate(leasegate_requests_total[5m] offset 1h)) > 0.005 * 1e3"#,
    );
    let expected: BTreeSet<String> = ["leasegate_requests_total", "leasegate_store_call_seconds_bucket"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(names, expected);
    assert!(metric_names("vector(0.005)").is_empty());
    assert_eq!(
        metric_names(r#"count by (version) (leasegate_build_info{instance=~"$instance"})"#),
        BTreeSet::from(["leasegate_build_info".to_string()])
    );
}

/// Every query parses as PromQL: promtool checks them as recording rules,
/// with Grafana's variables replaced by what Grafana would put there.
#[test]
fn every_dashboard_query_is_valid_promql() {
    support::require_tool("promtool", "apt-get install -y prometheus prometheus-alertmanager");
    let mut all = Vec::new();
    queries(&dashboard(), &mut all);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in all.iter().enumerate() {
        let q = q
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*")
            .replace('\'', "''")
            .replace('\n', " ");
        rules.push_str(&format!("      - record: dashboard:query{i}\n        expr: '{q}'\n"));
    }
    let dir = support::TempDir::new();
    let path = dir.write("dashboard-rules.yml", &rules);
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a dashboard query is not valid PromQL:\n{}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
