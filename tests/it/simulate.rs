//! `leasegate simulate` through the real binary: a seeded fleet of 50 real
//! limiters stays within the documented bound, prints the same bytes twice
//! and other bytes for another seed; nonsense is refused with the flag and
//! why.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{binary, TempDir};

const CONFIG: &str = r#"
[listeners]
http = "127.0.0.1:0"

[store]
timeout_ms = 5

[leasing]
min = 5
max = 20

[[routes]]
name = "api"
path_prefix = "/"
response = { status = 200 }
limits = ["tier"]

[[limits]]
name = "tier"
rate = "50000/min"
by = ["identity"]

[[limits]]
name = "gpu"
algorithm = "concurrency"
max = 10
"#;

fn simulate(dir: &TempDir, args: &[&str]) -> (i32, String, String) {
    let config = dir.write("gateway.toml", CONFIG);
    let out = Command::new(binary())
        .arg("simulate")
        .arg("--config")
        .arg(&config)
        .args(args)
        .output()
        .expect("runs leasegate simulate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FLEET: [&str; 10] = [
    "--limit",
    "tier",
    "--instances",
    "50",
    "--seconds",
    "10",
    "--offered",
    "10000",
    "--json",
    "--seed",
];

#[test]
fn a_seeded_fleet_of_50_stays_within_the_bound_and_repeats_itself() {
    let dir = TempDir::new();
    let run = |seed: &str| {
        let started = Instant::now();
        let mut args = FLEET.to_vec();
        args.push(seed);
        let (code, out, err) = simulate(&dir, &args);
        assert_eq!(code, 0, "{err}");
        // A debug build; a release build takes a fraction of this.
        assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
        out
    };
    let first = run("7");
    let report: Value = serde_json::from_str(&first).expect("JSON");
    let n = |k: &str| report[k].as_u64().unwrap_or_else(|| panic!("{k} in {report}"));
    assert_eq!(n("offered"), 100_000);
    // Drained: 12x the rate, past its burst.
    assert!(n("refused") > 0, "{report}");
    assert_eq!(n("allowance"), 50_000 + 8_333);
    assert_eq!(n("largest_lease"), 20);
    assert_eq!(n("bound"), n("allowance") + 50 * 20);
    assert!(n("admitted") <= n("bound"), "{report}");
    assert!(n("admitted") >= n("allowance") * 95 / 100, "{report}");
    assert!(n("store_calls") > 0);
    assert_eq!(report["per_second"]["admitted"].as_array().map(Vec::len), Some(10));
    assert_eq!(run("7"), first, "same arguments and seed: the same bytes");
    assert_ne!(run("8"), first, "another seed: other bytes");
}

#[test]
fn simulate_refuses_what_it_cannot_model_and_nonsense() {
    let dir = TempDir::new();
    let cases: [(&[&str], &str); 10] = [
        (
            &["--limit", "nope"],
            "no limit named `nope` in the config (limits: tier, gpu)",
        ),
        (&["--limit", "gpu"], "concurrency limit"),
        (
            &["--limit", "tier", "--instances", "0"],
            "--instances: want 1 to 100000",
        ),
        (&["--limit", "tier", "--kill", "3"], "--kill: `3`: want K@T"),
        (
            &["--limit", "tier", "--kill", "10@5"],
            "--kill: want 1 to --instances - 1",
        ),
        (
            &["--limit", "tier", "--store-down", "20-10"],
            "--store-down: want T1-T2 with 0 <= T1 < T2",
        ),
        (
            &["--limit", "tier", "--offered", "0"],
            "--offered: want requests per second",
        ),
        (&["--limit", "tier", "--spread", "sideways"], "sideways"),
        (
            &["--limit", "tier", "--instances", "10,x"],
            "--instances: `x`: want a whole number",
        ),
        // A sweep is checked whole before its first run.
        (
            &["--limit", "tier", "--instances", "20,5", "--kill", "10@1"],
            "--kill: want 1 to --instances - 1",
        ),
    ];
    for (args, why) in cases {
        let (code, out, err) = simulate(&dir, args);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

/// Every store call a gateway counted (`leasegate_store_calls_total`, any
/// op and result).
fn store_calls(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("leasegate_store_calls_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Three real gateways on one Redis, a hot key drained at 3x its rate by a
/// paced client, against `leasegate simulate` on the same file: admitted
/// and store calls per second agree within 15 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_real_gateways_and_their_simulation_agree_within_15_percent() {
    use crate::support::redis::Redis;
    use crate::support::{client, Gateway, Toml};

    const SECS: u64 = 5;
    const PER_GATEWAY: u64 = 100; // requests/s; the key's rate is 100/s
    let redis = Redis::start();
    let text = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 50")
        .table("leasing", "min = 5\nmax = 10")
        .respond("hot", "/", &["hot"])
        .with("on_store_failure = \"allow\"")
        .raw("[[limits]]\nname = \"hot\"\nrate = \"100/s\"\nby = [\"route\"]");
    let fleet: Vec<Gateway> = (0..3).map(|_| Gateway::start_connected(&text)).collect();
    let mut before = 0.0;
    for g in &fleet {
        before += store_calls(&g.metrics().await);
    }
    let mut tasks = Vec::new();
    for g in &fleet {
        let addr = g.http();
        tasks.push(tokio::spawn(async move {
            let mut c = client::http1(addr).await;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / PER_GATEWAY));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut ok = 0u64;
            for _ in 0..PER_GATEWAY * SECS {
                tick.tick().await;
                let (status, _, _) = client::text(client::send(&mut c, client::get("/")).await).await;
                ok += u64::from(status == http::StatusCode::OK);
            }
            ok
        }));
    }
    let mut admitted = 0u64;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let mut after = 0.0;
    for g in &fleet {
        after += store_calls(&g.metrics().await);
    }
    let real_calls_per_s = (after - before) / SECS as f64;

    let dir = TempDir::new();
    let config = dir.write("fleet.toml", &text);
    let out = Command::new(binary())
        .args(["simulate", "--config"])
        .arg(&config)
        .args([
            "--limit",
            "hot",
            "--instances",
            "3",
            "--seconds",
            "5",
            "--offered",
            "300",
        ])
        .args(["--store-rtt-ms", "0.3", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sim_admitted = sim["admitted"].as_u64().unwrap() as f64;
    let sim_calls_per_s = sim["store_calls_per_s"].as_f64().unwrap();
    println!(
        "real: admitted {admitted}, store calls/s {real_calls_per_s:.1}; simulated: admitted {sim_admitted}, store calls/s {sim_calls_per_s:.1}"
    );
    let near = |a: f64, b: f64| (a - b).abs() <= 0.15 * a.max(b);
    assert!(
        near(admitted as f64, sim_admitted),
        "admitted: real {admitted}, simulated {sim_admitted}"
    );
    assert!(
        near(real_calls_per_s, sim_calls_per_s),
        "store calls/s: real {real_calls_per_s:.1}, simulated {sim_calls_per_s:.1}"
    );
}

/// A PNG's width and height, after checking its signature and that its
/// image data inflates to one filtered row per line.
fn png_size(path: &Path) -> (u32, u32) {
    let png = std::fs::read(path).expect("the plot was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&png[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    let (w, h) = (be(16), be(20));
    let (mut at, mut idat) = (8, Vec::new());
    while at + 12 <= png.len() {
        let len = be(at) as usize;
        if &png[at + 4..at + 8] == b"IDAT" {
            idat.extend_from_slice(&png[at + 8..at + 8 + len]);
        }
        at += 12 + len;
    }
    let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&idat).expect("IDAT inflates");
    assert_eq!(raw.len(), (w as usize + 1) * h as usize);
    // Not a blank page: the lines and labels use several colours.
    let colours: std::collections::HashSet<u8> = raw.iter().copied().collect();
    assert!(colours.len() >= 4, "{colours:?}");
    (w, h)
}

#[test]
fn a_sweep_prints_a_row_per_fleet_size_and_plots_them() {
    let dir = TempDir::new();
    let sweep_png = dir.path().join("sweep.png");
    let series_png = dir.path().join("series.png");
    let args = ["--limit", "tier", "--seconds", "5", "--offered", "3000", "--seed", "3"];
    let sweep = |extra: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--instances", "5,20,40"]);
        all.extend_from_slice(extra);
        let (code, out, err) = simulate(&dir, &all);
        assert_eq!(code, 0, "{err}");
        out
    };
    let json = sweep(&["--json", "--plot", sweep_png.to_str().unwrap()]);
    let reports: Value = serde_json::from_str(&json).expect("a JSON array");
    let sizes: Vec<u64> = reports
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["instances"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [5, 20, 40]);
    for r in reports.as_array().unwrap() {
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!(n("bound"), n("allowance") + n("instances") * 20, "{r}");
        assert!(n("admitted") <= n("bound"), "{r}");
        assert!(r["lease"]["p50"].as_u64().is_some(), "{r}");
    }
    assert_eq!(png_size(&sweep_png), (960, 40 + 2 * 380));
    // Each size's run is the run it would be alone.
    let mut alone = args.to_vec();
    alone.extend_from_slice(&["--instances", "20", "--json"]);
    let (code, one, err) = simulate(&dir, &alone);
    assert_eq!(code, 0, "{err}");
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one, reports[1]);
    // The table: a header and a row per size.
    let table = sweep(&[]);
    assert_eq!(table.lines().count(), 2 + 3, "{table}");
    assert!(table.lines().nth(3).unwrap().trim_start().starts_with("20 "), "{table}");
    // One run's plot: its series.
    alone.extend_from_slice(&["--plot", series_png.to_str().unwrap()]);
    let (code, _, err) = simulate(&dir, &alone);
    assert_eq!(code, 0, "{err}");
    assert_eq!(png_size(&series_png), (960, 40 + 2 * 380));
}
