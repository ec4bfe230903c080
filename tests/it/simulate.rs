//! `leasegate simulate` through the real binary: a seeded fleet of 50 real
//! limiters stays within the documented bound, prints the same bytes twice
//! and other bytes for another seed; nonsense is refused with the flag and
//! why.

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
    assert_eq!(report["series"]["admitted"].as_array().map(Vec::len), Some(10));
    assert_eq!(run("7"), first, "same arguments and seed: the same bytes");
    assert_ne!(run("8"), first, "another seed: other bytes");
}

#[test]
fn simulate_refuses_what_it_cannot_model_and_nonsense() {
    let dir = TempDir::new();
    let cases: [(&[&str], &str); 8] = [
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
    ];
    for (args, why) in cases {
        let (code, out, err) = simulate(&dir, args);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}
