//! Property: whatever the fleet and `[leasing]`, a simulated fleet of real
//! limiters admits no more than the documented bound (allowance +
//! instances × largest lease), for each algorithm that leases tokens.

use std::path::Path;

use proptest::prelude::*;

use super::{run, Options, Spread};

fn config(algorithm: &str, rate: &str, min: u64, max: u64, ttl_ms: u64) -> crate::config::Config {
    let text = format!(
        r#"
[listeners]
http = "127.0.0.1:0"
[store]
timeout_ms = 5
[leasing]
min = {min}
max = {max}
ttl_ms = {ttl_ms}
[[routes]]
name = "api"
path_prefix = "/"
response = {{ status = 200 }}
limits = ["l"]
[[limits]]
name = "l"
algorithm = "{algorithm}"
rate = "{rate}"
by = ["identity"]
"#
    );
    crate::config::parse(Path::new("sim.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn options(instances: u64, offered: f64, keys: u64, seed: u64) -> Options {
    Options {
        instances,
        seconds: 3,
        offered,
        clients: keys,
        keys,
        zipf: 1.0,
        spread: Spread::Even,
        store_rtt_ms: 0.5,
        kill: None,
        store_down: None,
        seed,
    }
}

fn within_bound(algorithm: &str, rate: &str, p: (u64, u64, u64, u64, f64, u64, u64)) -> Result<(), TestCaseError> {
    let (instances, min, extra, ttl_ms, offered, keys, seed) = p;
    let c = config(algorithm, rate, min, min + extra, ttl_ms);
    let r = run(&c, "l", &options(instances, offered, keys, seed)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(r.admitted <= r.bound, "{}", r.to_text());
    if let Some(w) = &r.worst_interval {
        prop_assert!(w.admitted <= w.bound, "{}", r.to_text());
    }
    prop_assert_eq!(r.admitted + r.refused, r.offered);
    Ok(())
}

fn settings() -> impl Strategy<Value = (u64, u64, u64, u64, f64, u64, u64)> {
    (
        1u64..12,
        1u64..20,
        0u64..60,
        100u64..3_000,
        50.0f64..3_000.0,
        1u64..4,
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn a_token_bucket_fleet_stays_within_the_bound(p in settings()) {
        within_bound("token_bucket", "200/s", p)?;
    }

    #[test]
    fn a_sliding_window_fleet_stays_within_the_bound(p in settings()) {
        within_bound("sliding_window", "200/s", p)?;
    }

    #[test]
    fn a_fixed_window_fleet_stays_within_the_bound(p in settings()) {
        within_bound("fixed_window", "200/s", p)?;
    }
}

#[test]
fn the_same_seed_repeats_and_a_kill_strands_tokens() {
    let c = config("token_bucket", "1000/s", 5, 50, 1_000);
    let mut o = options(20, 3_000.0, 1, 3);
    o.kill = Some((5, 1.5));
    let a = run(&c, "l", &o).map(|r| r.to_json());
    assert_eq!(a, run(&c, "l", &o).map(|r| r.to_json()));
    let r = run(&c, "l", &o).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.stranded_max > 0, "{}", r.to_text());
    assert!(r.admitted <= r.bound, "{}", r.to_text());
}
