//! `leasegate simulate`: a fleet of real [`Limiter`](crate::limit::Limiter)s
//! on one paused tokio clock, against the memory store behind a latency
//! model ([`store`]), driven by seeded traffic ([`traffic`]).
//!
//! Every instance is what `run` builds from the config: its own lease
//! table, sweeper, heartbeat and background refills, its own guard
//! (deadline and breaker) around the shared store. Nothing of the decision
//! is reimplemented: the driver calls `try_check`, and `resume` for a
//! request that needs the store, exactly as the request path does. Time is
//! virtual (`tokio::time::pause`): the same arguments and seed print the
//! same bytes.

mod fleet;
pub mod plot;
pub mod report;
pub mod store;
pub mod traffic;

use std::sync::Arc;

use crate::config::Config;
use crate::limit::policy::Limit;
use crate::quota::Algorithm;

pub use fleet::run;
pub use report::Report;

/// How requests reach the instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Each request to an instance drawn uniformly.
    Even,
    /// Instance i drawn with weight 1/(i+1) (a few busy instances).
    Skewed,
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Options {
    pub instances: u64,
    pub seconds: u64,
    /// Requests per second offered to the whole fleet.
    pub offered: f64,
    pub clients: u64,
    pub keys: u64,
    pub zipf: f64,
    pub spread: Spread,
    pub store_rtt_ms: f64,
    /// `k` instances die at virtual second `t`.
    pub kill: Option<(u64, f64)>,
    /// The store answers nothing from `t1` to `t2` (seconds).
    pub store_down: Option<(f64, f64)>,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimError {
    #[error("no limit named `{name}` in the config (limits: {known})")]
    UnknownLimit { name: String, known: String },
    #[error("limit `{0}` is a concurrency limit (in-flight slots): the simulator models rate limits (token bucket, sliding and fixed window) only")]
    Concurrency(String),
    #[error("{flag}: {why}")]
    Argument { flag: &'static str, why: String },
}

fn bad(flag: &'static str, why: impl Into<String>) -> SimError {
    SimError::Argument { flag, why: why.into() }
}

/// `--kill K@T`.
pub fn parse_kill(s: &str) -> Result<(u64, f64), SimError> {
    let (k, t) = s.split_once('@').ok_or_else(|| {
        bad(
            "--kill",
            format!("`{s}`: want K@T, e.g. 3@20 (3 instances die at second 20)"),
        )
    })?;
    let k: u64 = k
        .trim()
        .parse()
        .map_err(|_| bad("--kill", format!("`{k}`: want a whole number of instances")))?;
    let t: f64 = t
        .trim()
        .parse()
        .map_err(|_| bad("--kill", format!("`{t}`: want a virtual second")))?;
    Ok((k, t))
}

/// `--instances N` or a sweep `N1,N2,...` (at most 32 sizes).
pub fn parse_instances(s: &str) -> Result<Vec<u64>, SimError> {
    let sizes = s
        .split(',')
        .map(|n| {
            n.trim().parse::<u64>().map_err(|_| {
                bad(
                    "--instances",
                    format!("`{n}`: want a whole number, or a list such as 10,50,100"),
                )
            })
        })
        .collect::<Result<Vec<u64>, SimError>>()?;
    if sizes.len() > 32 {
        return Err(bad("--instances", "want at most 32 fleet sizes in a sweep"));
    }
    Ok(sizes)
}

/// `--store-down T1-T2`.
pub fn parse_down(s: &str) -> Result<(f64, f64), SimError> {
    let (a, b) = s.split_once('-').ok_or_else(|| {
        bad(
            "--store-down",
            format!("`{s}`: want T1-T2 in virtual seconds, e.g. 10-25"),
        )
    })?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| bad("--store-down", format!("`{x}`: want a virtual second")))
    };
    Ok((num(a)?, num(b)?))
}

/// The limit named `name`, if the simulator can model it.
pub fn find_limit(config: &Config, name: &str) -> Result<(usize, Arc<Limit>), SimError> {
    let (i, limit) = config
        .limits
        .iter()
        .enumerate()
        .find(|(_, l)| l.name == name)
        .ok_or_else(|| SimError::UnknownLimit {
            name: name.to_string(),
            known: config
                .limits
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    if limit.spec().algorithm == Algorithm::Concurrency {
        return Err(SimError::Concurrency(name.to_string()));
    }
    Ok((i, limit.clone()))
}

impl Options {
    /// Checks every argument: nonsense is refused with the flag and why.
    pub fn check(&self) -> Result<(), SimError> {
        if !(1..=100_000).contains(&self.instances) {
            return Err(bad("--instances", "want 1 to 100000"));
        }
        if !(1..=86_400).contains(&self.seconds) {
            return Err(bad("--seconds", "want 1 to 86400 virtual seconds"));
        }
        if !(self.offered.is_finite() && self.offered > 0.0 && self.offered <= 10_000_000.0) {
            return Err(bad(
                "--offered",
                "want requests per second, above 0 and at most 10000000",
            ));
        }
        if !(1..=10_000_000).contains(&self.clients) {
            return Err(bad("--clients", "want 1 to 10000000"));
        }
        if !(1..=self.clients).contains(&self.keys) {
            return Err(bad("--keys", "want 1 to --clients (each key is at least one client's)"));
        }
        if !(self.zipf.is_finite() && (0.0..=10.0).contains(&self.zipf)) {
            return Err(bad("--zipf", "want an exponent from 0 (uniform) to 10"));
        }
        if !(self.store_rtt_ms.is_finite() && (0.0..=60_000.0).contains(&self.store_rtt_ms)) {
            return Err(bad("--store-rtt-ms", "want 0 to 60000 ms"));
        }
        if let Some((k, t)) = self.kill {
            if k == 0 || k >= self.instances {
                return Err(bad("--kill", "want 1 to --instances - 1 instances (one must live)"));
            }
            if !(t.is_finite() && t >= 0.0 && t < self.seconds as f64) {
                return Err(bad("--kill", "want a second within --seconds"));
            }
        }
        if let Some((a, b)) = self.store_down {
            if !(a.is_finite() && b.is_finite() && a >= 0.0 && a < b && b <= self.seconds as f64) {
                return Err(bad("--store-down", "want T1-T2 with 0 <= T1 < T2 <= --seconds"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
