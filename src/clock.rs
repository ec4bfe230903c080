//! The clocks the gateway reads, as shareable functions returning
//! milliseconds: [`monotonic_clock`] for leases, blocks and the breaker,
//! [`system_clock`] (Unix time) for the embedded store's windows.
//!
//! The monotonic clock is coarse. Reading the system clock costs ~36 ns on this class of machine (kvm
//! guests), more than the rest of a rate-limit decision. Leases and local
//! blocks need milliseconds, not nanoseconds, so one background thread
//! publishes the time every millisecond and a read is one atomic load.
//! Readings are at most a tick or two behind; nothing that needs exact time
//! (the quota math) uses this clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A clock: milliseconds on some timeline, cheap to call from any thread.
/// Code that takes one instead of reading time itself can be tested on a
/// clock the test moves.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Milliseconds since the Unix epoch; windows align to wall-clock minutes
/// and hours, as they do in Redis (which uses its own `TIME`).
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    })
}

/// Milliseconds on a monotonic clock (never 0), for leases, blocks and the
/// breaker: wall-clock jumps must not expire or extend them. Coarse: one
/// atomic load per read.
pub fn monotonic_clock() -> Clock {
    coarse()
}

struct Ticker {
    now_ms: AtomicU64,
    start: Instant,
    /// False if the thread could not start: reads then use the precise
    /// clock, slower but never frozen.
    live: std::sync::atomic::AtomicBool,
}

fn ticker() -> &'static Ticker {
    static TICKER: OnceLock<&'static Ticker> = OnceLock::new();
    TICKER.get_or_init(|| {
        let start = Instant::now();
        let ticker: &'static Ticker = Box::leak(Box::new(Ticker {
            now_ms: AtomicU64::new(1),
            start,
            live: std::sync::atomic::AtomicBool::new(true),
        }));
        let spawned = std::thread::Builder::new()
            .name("leasegate-clock".into())
            .spawn(move || loop {
                ticker
                    .now_ms
                    .store(start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            });
        if spawned.is_err() {
            ticker.live.store(false, Ordering::Relaxed);
            tracing::warn!("cannot start the clock thread; using the precise clock instead");
        }
        ticker
    })
}

/// Milliseconds since the clock started (never 0), at most a few ms stale.
pub fn coarse_now_ms() -> u64 {
    let t = ticker();
    if t.live.load(Ordering::Relaxed) {
        t.now_ms.load(Ordering::Relaxed)
    } else {
        t.start.elapsed().as_millis() as u64 + 1
    }
}

/// The coarse clock as a shareable function.
pub fn coarse() -> Clock {
    ticker();
    Arc::new(coarse_now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_in_milliseconds() {
        let a = coarse_now_ms();
        std::thread::sleep(Duration::from_millis(30));
        let b = coarse_now_ms();
        assert!(b >= a + 20, "{a} -> {b}");
        assert!(b <= a + 200, "{a} -> {b}");
    }
}
