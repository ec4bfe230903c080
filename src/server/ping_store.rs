//! `leasegate check --ping-store`: dial the store as `run` would, time
//! five `PING`s over the connection calls use (the I/O thread's hand-over
//! included), and set the round trip beside `[store] timeout_ms`, so an
//! operator whose Redis is a zone away learns before production does that
//! the deadline leaves no room for the script.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::store::redis::RedisStore;
use crate::store::QuotaStore;

/// How many `PING`s are timed.
const PINGS: usize = 5;

/// The round trips of a store, as `check --ping-store` prints them.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinged {
    /// Each `PING`'s round trip, sorted.
    pub round_trips: Vec<Duration>,
    pub deadline: Duration,
}

impl Pinged {
    pub fn median(&self) -> Duration {
        self.round_trips
            .get(self.round_trips.len() / 2)
            .copied()
            .unwrap_or_default()
    }

    /// The report: the figures, and a warning when the median round trip
    /// takes more than half the deadline (the script, Redis's queue and a
    /// busy worker share the rest).
    pub fn report(&self, store: &str) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1_000.0;
        let (min, max) = (
            self.round_trips.first().copied().unwrap_or_default(),
            self.round_trips.last().copied().unwrap_or_default(),
        );
        let mut s = String::new();
        let _ = writeln!(
            s,
            "store ping {store}: round trip {:.2} ms median of {} PINGs ({:.2}-{:.2} ms), against [store] timeout_ms = {}",
            ms(self.median()),
            self.round_trips.len(),
            ms(min),
            ms(max),
            self.deadline.as_millis()
        );
        if self.median() * 2 > self.deadline {
            let advised = (ms(max) * 3.0).ceil().max(ms(self.deadline) + 1.0) as u64;
            let _ = writeln!(
                s,
                "warning: the store's round trip takes more than half of [store] timeout_ms: calls will time out under load and the breaker open; raise timeout_ms (to {advised} or more)"
            );
        }
        s
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PingError {
    #[error("{0}")]
    Setup(#[from] crate::store::redis::RedisSetupError),
    #[error("cannot start a runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the store did not answer within [store] connect_timeout_ms ({timeout_ms} ms): {why}")]
    NoAnswer { timeout_ms: u64, why: String },
    #[error("PING failed: {0}")]
    Ping(crate::store::StoreError),
}

/// Dials `config`'s store and times [`PINGS`] `PING`s; `None` for the
/// memory store (no round trip).
pub fn ping_store(config: &Config) -> Result<Option<Pinged>, PingError> {
    let Some(target) = super::stores::redis_target(config) else {
        return Ok(None);
    };
    let store = RedisStore::start_with_ca(&target, config.store.ca.as_ref().map(|c| c.pem.clone()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PingError::Runtime)?;
    let connect_timeout = config.store.connect_timeout.max(Duration::from_secs(1));
    runtime.block_on(async {
        let link = store.link();
        if !link.wait_up(connect_timeout).await {
            return Err(PingError::NoAnswer {
                timeout_ms: connect_timeout.as_millis() as u64,
                why: link.describe(),
            });
        }
        let mut round_trips = Vec::with_capacity(PINGS);
        for _ in 0..PINGS {
            let started = Instant::now();
            store.ping().await.map_err(PingError::Ping)?;
            round_trips.push(started.elapsed());
        }
        round_trips.sort();
        Ok(Some(Pinged {
            round_trips,
            deadline: config.store.timeout,
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinged(ms: &[u64], deadline_ms: u64) -> Pinged {
        Pinged {
            round_trips: ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            deadline: Duration::from_millis(deadline_ms),
        }
    }

    #[test]
    fn a_round_trip_well_inside_the_deadline_is_only_reported() {
        let r = pinged(&[1, 1, 1, 2, 2], 5).report("redis");
        assert!(r.starts_with("store ping redis: round trip 1.00 ms median of 5 PINGs (1.00-2.00 ms), against [store] timeout_ms = 5\n"), "{r}");
        assert!(!r.contains("warning"), "{r}");
    }

    #[test]
    fn a_round_trip_past_half_the_deadline_is_warned_of_with_a_deadline_that_fits() {
        let r = pinged(&[3, 3, 3, 4, 4], 5).report("redis");
        assert!(
            r.contains("warning: the store's round trip takes more than half of [store] timeout_ms"),
            "{r}"
        );
        assert!(r.contains("raise timeout_ms (to 12 or more)"), "{r}");
    }
}
