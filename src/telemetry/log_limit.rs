//! At most one log line per interval for a failure that would otherwise be
//! logged by every request it touches (a store that times out under load
//! would print thousands of WARN lines a second).
//!
//! Lock-free: one atomic for the time of the last line and one for the lines
//! held back since. Takes `now` (milliseconds on any clock that does not go
//! back) so it is tested on a clock the test moves. Never blocks and never
//! allocates.

use std::sync::atomic::{AtomicU64, Ordering};

/// A gate that opens at most once per `interval_ms`.
#[derive(Debug)]
pub struct LogLimit {
    interval_ms: u64,
    /// When the gate last opened, plus one (0: never).
    last: AtomicU64,
    /// Calls held back since the gate last opened.
    held: AtomicU64,
}

impl LogLimit {
    pub const fn new(interval_ms: u64) -> LogLimit {
        LogLimit {
            interval_ms,
            last: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// Whether to log at `now_ms`: `Some(n)` for the one caller per interval
    /// that should, with `n` the calls held back since the last line; `None`
    /// for the others. Of callers racing at the same moment exactly one wins.
    pub fn check(&self, now_ms: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let stamp = now_ms.saturating_add(1);
        let due = last == 0 || stamp >= last.saturating_add(self.interval_ms);
        if due
            && self
                .last
                .compare_exchange(last, stamp, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// How often a store failure of one reason is logged at most.
pub const STORE_FAILURE_INTERVAL_MS: u64 = 10_000;

/// The gates of the `quota store failed` WARN, one per reason, so that a
/// flood of timeouts does not hide the first error.
pub static STORE_TIMEOUT: LogLimit = LogLimit::new(STORE_FAILURE_INTERVAL_MS);
pub static STORE_ERROR: LogLimit = LogLimit::new(STORE_FAILURE_INTERVAL_MS);

/// The gate of the `accept failed` WARN: out of descriptors, an accept
/// loop fails every pause (50 a second), and one line per 10 s says as
/// much.
pub static ACCEPT_FAILED: LogLimit = LogLimit::new(STORE_FAILURE_INTERVAL_MS);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_once_per_interval_and_counts_what_it_held_back() {
        let gate = LogLimit::new(1_000);
        assert_eq!(gate.check(0), Some(0), "the first failure is logged at once");
        assert_eq!(gate.check(1), None);
        assert_eq!(gate.check(999), None);
        assert_eq!(
            gate.check(1_000),
            Some(2),
            "due again after the interval, naming the two held back"
        );
        assert_eq!(gate.check(1_500), None);
        // A long quiet spell: the next failure is logged at once.
        assert_eq!(gate.check(60_000), Some(1));
        assert_eq!(gate.check(60_000), None);
    }

    #[test]
    fn racing_threads_let_exactly_one_line_through() {
        let gate = std::sync::Arc::new(LogLimit::new(10_000));
        // (lines let through, held-back calls those lines reported)
        let (opened, reported) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let gate = gate.clone();
                    s.spawn(move || {
                        let lines: Vec<u64> = (0..1_000).filter_map(|_| gate.check(5)).collect();
                        (lines.len() as u64, lines.iter().sum::<u64>())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or((0, 0)))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        assert_eq!(opened, 1);
        // Every call held back is reported once: a loser that counted
        // itself before the winner's line is in that line, the rest in the
        // next.
        let next = gate.check(10_005).unwrap_or(0);
        assert_eq!(reported + next, 7_999);
    }
}
