//! What a simulation found: the totals against the allowance and the
//! documented bound, the store's load, and per-second series.

use serde::Serialize;

use super::store::StoreCounts;
use super::Options;
use crate::limit::policy::Limit;
use crate::limit::{Decision, Settings};
use crate::quota::Algorithm;

/// Decisions as they were made.
#[derive(Debug, Clone)]
pub struct Outcomes {
    admitted: Vec<u64>,
    refused: Vec<u64>,
    fallback: u64,
    unavailable: u64,
    touched: Vec<bool>,
    /// The last admission, ms on the virtual clock from 0.
    last_admit_ms: u64,
}

impl Outcomes {
    pub fn new(seconds: u64, keys: u64) -> Outcomes {
        Outcomes {
            admitted: vec![0; seconds as usize],
            refused: vec![0; seconds as usize],
            fallback: 0,
            unavailable: 0,
            touched: vec![false; keys as usize],
            last_admit_ms: 0,
        }
    }

    /// One request decided at virtual second `sec` (a request decided after
    /// the end counts in the last second).
    pub fn record(&mut self, now_ms: u64, key: usize, decision: Decision) {
        let sec = (now_ms / 1000) as usize;
        let sec = sec.min(self.admitted.len().saturating_sub(1));
        if let Some(t) = self.touched.get_mut(key) {
            *t = true;
        }
        let series = match decision {
            Decision::Admit => {
                self.last_admit_ms = self.last_admit_ms.max(now_ms);
                &mut self.admitted
            }
            Decision::Bypass { .. } => {
                self.last_admit_ms = self.last_admit_ms.max(now_ms);
                self.fallback += 1;
                &mut self.admitted
            }
            Decision::Refuse { .. } => &mut self.refused,
            Decision::Unavailable { .. } => {
                self.unavailable += 1;
                &mut self.refused
            }
        };
        if let Some(n) = series.get_mut(sec) {
            *n += 1;
        }
    }
}

/// Lease sizes granted by the store.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LeaseSizes {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

/// The stretch of whole seconds where the fleet admitted most beyond what
/// the quota allows in it: where the drift of leases shows (over a whole
/// run from a full bucket, a fleet admits at most what the store granted).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Worst {
    pub from_s: u64,
    pub to_s: u64,
    pub admitted: u64,
    /// Token bucket: burst + rate × its length; windows: count per window
    /// (whole windows only; none when a window is not whole seconds).
    pub allowance: u64,
    /// `allowance + instances × largest lease` per key (and sub-bucket).
    pub bound: u64,
    pub over: i64,
}

/// Token bucket: the stretch maximising admitted − rate × length (Kadane).
fn worst_stretch(admitted: &[u64], per_sec: f64) -> (usize, usize) {
    let (mut best, mut best_at) = (f64::MIN, (0, 1));
    let (mut run, mut from) = (0.0, 0);
    for (i, &a) in admitted.iter().enumerate() {
        if run <= 0.0 {
            run = 0.0;
            from = i;
        }
        run += a as f64 - per_sec;
        if run > best {
            best = run;
            best_at = (from, i + 1);
        }
    }
    best_at
}

/// Per virtual second.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    pub admitted: Vec<u64>,
    pub refused: Vec<u64>,
    pub store_calls: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub limit: String,
    pub algorithm: &'static str,
    pub instances: u64,
    pub seconds: u64,
    pub seed: u64,
    pub offered: u64,
    pub admitted: u64,
    pub refused: u64,
    /// Refused with 503: the store failed and the route fails closed.
    pub unavailable: u64,
    pub keys_touched: u64,
    /// Burst + rate × seconds (windows: count × windows begun in the
    /// run), summed over the keys touched. A token bucket's time runs to
    /// the last admission (a request waiting for the store at the end is
    /// admitted a few ms later, and the bucket refilled meanwhile).
    pub allowance: u64,
    /// The largest lease one instance can hold of one (sub-)bucket.
    pub largest_lease: u64,
    /// `allowance + instances × largest lease` per key (and sub-bucket).
    pub bound: u64,
    /// `admitted − allowance` (negative: under it).
    pub over_admitted: i64,
    pub over_admitted_fraction: f64,
    /// Where admissions ran furthest ahead of the quota.
    pub worst_interval: Option<Worst>,
    pub store_calls: u64,
    pub store_calls_per_s: f64,
    pub store_calls_per_request: f64,
    #[serde(rename = "lease")]
    pub lease_size: LeaseSizes,
    /// Most tokens held at once by instances killed with `--kill`.
    pub stranded_max: u64,
    /// Admitted by the local fallback while the store failed.
    pub fallback_admitted: u64,
    #[serde(rename = "per_second")]
    pub series: Series,
}

/// Rounded to 6 decimals, so the JSON prints the same everywhere.
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl Report {
    pub fn new(
        o: &Options,
        limit: &Limit,
        settings: &Settings,
        outcomes: Outcomes,
        store: StoreCounts,
        stranded_max: u64,
    ) -> Report {
        let spec = limit.spec().slice(limit.share());
        let shards = limit.shards.max(1);
        let keys_touched = outcomes.touched.iter().filter(|t| **t).count() as u64;
        let period = spec.period_ms().max(1) as f64;
        // A request that waited for the store past the end was admitted
        // then: the allowance runs to the last admission (not to a refusal
        // after the end, which would begin a window nothing was taken in).
        let span = (o.seconds * 1000).max(outcomes.last_admit_ms + 1) as f64;
        let per_key = match spec.algorithm {
            Algorithm::TokenBucket => spec.capacity + (spec.count as f64 * span / period).floor() as u64,
            // A straggler admitted just past the end does not begin a
            // window's worth of allowance.
            _ => spec.count * ((o.seconds * 1000) as f64 / period).ceil() as u64,
        };
        let largest: u64 = (0..shards)
            .map(|s| settings.sizing.lease_size(1e15, spec.share(s, shards).capacity))
            .max()
            .unwrap_or(1);
        let leases_per_key: u64 = (0..shards)
            .map(|s| settings.sizing.lease_size(1e15, spec.share(s, shards).capacity))
            .sum();
        let allowance = per_key * keys_touched;
        let bound = allowance + keys_touched * o.instances * leases_per_key;
        let admitted: u64 = outcomes.admitted.iter().sum();
        let refused: u64 = outcomes.refused.iter().sum();
        let offered = admitted + refused;
        let mut calls_per_sec = store.calls_per_sec;
        // Calls in the moment after the end (releases, late refills) count
        // in the last second.
        if calls_per_sec.len() > o.seconds as usize {
            let extra = calls_per_sec.pop().unwrap_or(0);
            if let Some(last) = calls_per_sec.last_mut() {
                *last += extra;
            }
        }
        let store_calls: u64 = calls_per_sec.iter().sum();
        let mut grants = store.grants;
        grants.sort_unstable();
        let pct = |p: f64| {
            if grants.is_empty() {
                0
            } else {
                grants[((grants.len() - 1) as f64 * p).round() as usize]
            }
        };
        let over = admitted as i64 - allowance as i64;
        let drift = keys_touched * o.instances * leases_per_key;
        let worst = if spec.algorithm == Algorithm::TokenBucket {
            let per_sec = keys_touched as f64 * spec.count as f64 * 1000.0 / period;
            let (a, b) = worst_stretch(&outcomes.admitted, per_sec);
            let allowance = keys_touched * spec.capacity + (per_sec * (b - a) as f64).floor() as u64;
            Some((a, b, allowance))
        } else if spec.period_ms().is_multiple_of(1000) {
            let p = (spec.period_ms() / 1000) as usize;
            outcomes
                .admitted
                .chunks(p)
                .enumerate()
                .max_by_key(|(i, c)| (c.iter().sum::<u64>(), std::cmp::Reverse(*i)))
                .map(|(i, _)| {
                    (
                        i * p,
                        ((i + 1) * p).min(outcomes.admitted.len()),
                        keys_touched * spec.count,
                    )
                })
        } else {
            None
        };
        let worst_interval = worst.map(|(a, b, allowance)| {
            let admitted: u64 = outcomes.admitted[a..b].iter().sum();
            Worst {
                from_s: a as u64,
                to_s: b as u64,
                admitted,
                allowance,
                bound: allowance + drift,
                over: admitted as i64 - allowance as i64,
            }
        });
        Report {
            worst_interval,
            limit: limit.name.clone(),
            algorithm: spec.algorithm.as_str(),
            instances: o.instances,
            seconds: o.seconds,
            seed: o.seed,
            offered,
            admitted,
            refused,
            unavailable: outcomes.unavailable,
            keys_touched,
            allowance,
            largest_lease: largest,
            bound,
            over_admitted: over,
            over_admitted_fraction: round6(if allowance == 0 {
                0.0
            } else {
                over as f64 / allowance as f64
            }),
            store_calls,
            store_calls_per_s: round6(store_calls as f64 / o.seconds as f64),
            store_calls_per_request: round6(if offered == 0 {
                0.0
            } else {
                store_calls as f64 / offered as f64
            }),
            lease_size: LeaseSizes {
                p50: pct(0.5),
                p99: pct(0.99),
                max: grants.last().copied().unwrap_or(0),
            },
            stranded_max,
            fallback_admitted: outcomes.fallback,
            series: Series {
                admitted: outcomes.admitted,
                refused: outcomes.refused,
                store_calls: calls_per_sec,
            },
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "limit {} ({}), {} instances, {} virtual s, seed {}",
            self.limit, self.algorithm, self.instances, self.seconds, self.seed
        );
        let worst = self.worst_interval.as_ref().map_or_else(
            || "- (windows shorter than a second)".to_string(),
            |w| {
                format!(
                    "s {}-{}: admitted {} allowance {} bound {} over {}",
                    w.from_s, w.to_s, w.admitted, w.allowance, w.bound, w.over
                )
            },
        );
        let rows: [(&str, String); 15] = [
            ("offered", self.offered.to_string()),
            ("admitted", self.admitted.to_string()),
            (
                "refused",
                format!("{} ({} unavailable)", self.refused, self.unavailable),
            ),
            ("allowance", format!("{} ({} keys)", self.allowance, self.keys_touched)),
            ("largest lease", self.largest_lease.to_string()),
            ("bound", self.bound.to_string()),
            (
                "over_admitted",
                format!("{} ({:.4} %)", self.over_admitted, self.over_admitted_fraction * 100.0),
            ),
            ("worst interval", worst),
            ("store_calls", self.store_calls.to_string()),
            ("store_calls/s", format!("{:.1}", self.store_calls_per_s)),
            ("store_calls/request", format!("{:.6}", self.store_calls_per_request)),
            (
                "lease size",
                format!(
                    "p50 {} p99 {} max {}",
                    self.lease_size.p50, self.lease_size.p99, self.lease_size.max
                ),
            ),
            ("stranded_max", self.stranded_max.to_string()),
            ("fallback_admitted", self.fallback_admitted.to_string()),
            ("within bound", (self.admitted <= self.bound).to_string()),
        ];
        for (k, v) in rows {
            let _ = writeln!(s, "  {k:<20} {v}");
        }
        let _ = writeln!(
            s,
            "  {:>6} {:>10} {:>10} {:>11}",
            "second", "admitted", "refused", "store_calls"
        );
        for (i, a) in self.series.admitted.iter().enumerate() {
            let r = self.series.refused.get(i).copied().unwrap_or(0);
            let c = self.series.store_calls.get(i).copied().unwrap_or(0);
            let _ = writeln!(s, "  {i:>6} {a:>10} {r:>10} {c:>11}");
        }
        s
    }

    /// A sweep over fleet sizes, one row per run.
    pub fn sweep_text(reports: &[Report]) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if let Some(r) = reports.first() {
            let _ = writeln!(
                s,
                "limit {} ({}), {} virtual s, seed {}",
                r.limit, r.algorithm, r.seconds, r.seed
            );
        }
        let _ = writeln!(
            s,
            "  {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>13} {:>11}",
            "instances", "offered", "admitted", "allowance", "bound", "over", "worst", "store_calls/s", "lease p50/max"
        );
        for r in reports {
            let worst = r
                .worst_interval
                .as_ref()
                .map_or_else(|| "-".to_string(), |w| w.over.to_string());
            let _ = writeln!(
                s,
                "  {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>13.1} {:>11}",
                r.instances,
                r.offered,
                r.admitted,
                r.allowance,
                r.bound,
                r.over_admitted,
                worst,
                r.store_calls_per_s,
                format!("{}/{}", r.lease_size.p50, r.lease_size.max)
            );
        }
        s
    }
}
