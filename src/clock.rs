//! The clocks the gateway reads, as shareable functions returning
//! milliseconds: [`monotonic_clock`] for leases, blocks and the breaker,
//! [`system_clock`] (Unix time) for the embedded store's windows,
//! [`coarse_wall`] (Unix time, a tick stale) for what the request path
//! compares with a date (an override's expiry, a calendar month's length).
//!
//! This is the one module that reads the wall clock: `clippy.toml` bans
//! `SystemTime::now` everywhere else, so the decision rooms (`quota`,
//! `limit`) take their time as an argument and a test can move it.
//!
//! The monotonic clock is coarse. Reading the system clock costs ~36 ns on this class of machine (kvm
//! guests), more than the rest of a rate-limit decision. Leases and local
//! blocks need milliseconds, not nanoseconds, so the time is published
//! and a read is one atomic load. Each request publishes the instant it
//! started (read anyway, for its duration); a background thread publishes
//! every millisecond while no request does, and every [`BUSY_TICK`] while
//! requests do, so a busy worker's core is not woken a thousand times a
//! second for nothing. Readings are at most a tick behind (a few ms; up to
//! [`BUSY_TICK`] just after traffic stops); nothing that needs exact time
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
    Arc::new(unix_ms)
}

/// The wall clock, now: the gateway's one reading of it.
#[allow(clippy::disallowed_methods)]
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn unix_ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds since the Unix epoch, now (a precise read, ~36 ns).
pub fn unix_ms() -> u64 {
    unix_ms_of(wall_now())
}

/// Unix milliseconds as of the clock thread's last tick (one atomic load;
/// at most a tick stale, and it follows the wall clock's steps).
pub fn coarse_unix_ms() -> u64 {
    let t = ticker();
    if t.live.load(Ordering::Relaxed) {
        t.unix_ms.load(Ordering::Relaxed)
    } else {
        unix_ms()
    }
}

/// [`coarse_unix_ms`] as a shareable function: the limiter's wall clock.
pub fn coarse_wall() -> Clock {
    ticker();
    Arc::new(coarse_unix_ms)
}

/// Milliseconds on a monotonic clock (never 0), for leases, blocks and the
/// breaker: wall-clock jumps must not expire or extend them. Coarse: one
/// atomic load per read.
pub fn monotonic_clock() -> Clock {
    coarse()
}

/// The clock thread's period while requests publish the time.
pub const BUSY_TICK: Duration = Duration::from_millis(10);

struct Ticker {
    now_ms: AtomicU64,
    /// Unix milliseconds at the last tick.
    unix_ms: AtomicU64,
    /// Set by [`publish`], cleared by each tick.
    published: std::sync::atomic::AtomicBool,
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
            unix_ms: AtomicU64::new(unix_ms()),
            published: std::sync::atomic::AtomicBool::new(false),
            start,
            live: std::sync::atomic::AtomicBool::new(true),
        }));
        let spawned = std::thread::Builder::new()
            .name("leasegate-clock".into())
            .spawn(move || loop {
                ticker
                    .now_ms
                    .fetch_max(start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                ticker.unix_ms.store(unix_ms(), Ordering::Relaxed);
                let busy = ticker.published.swap(false, Ordering::Relaxed);
                std::thread::sleep(if busy { BUSY_TICK } else { Duration::from_millis(1) });
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

/// Publishes `now` (an instant just read) to the coarse clock: a request
/// does at its start, so that under traffic the clock thread can sleep.
pub fn publish(now: Instant) {
    ticker().publish(now);
}

impl Ticker {
    fn publish(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.start).as_millis() as u64 + 1;
        if ms > self.now_ms.load(Ordering::Relaxed) {
            self.now_ms.fetch_max(ms, Ordering::Relaxed);
            self.published.store(true, Ordering::Relaxed);
        }
    }
}

/// The coarse clock as a shareable function.
pub fn coarse() -> Clock {
    ticker();
    Arc::new(coarse_now_ms)
}

// Civil dates of the UTC calendar (Howard Hinnant's algorithms), for the
// access log's timestamps and the calendar's quota windows.

/// (year, month 1-12, day 1-31) of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
pub fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a date on or after it (`days_from_civil`).
pub fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = y - u64::from(m <= 2);
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn the_coarse_wall_clock_follows_the_wall_clock() {
        let before = unix_ms();
        std::thread::sleep(Duration::from_millis(30));
        // A tick comes within milliseconds; a loaded machine may delay it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while coarse_unix_ms() <= before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let coarse = coarse_unix_ms();
        let after = unix_ms();
        assert!(coarse > before && coarse <= after, "{before} < {coarse} <= {after}");
    }

    #[test]
    fn published_instants_move_the_clock_and_never_back() {
        let start = Instant::now();
        let t = Ticker {
            now_ms: AtomicU64::new(1),
            unix_ms: AtomicU64::new(0),
            published: std::sync::atomic::AtomicBool::new(false),
            start,
            live: std::sync::atomic::AtomicBool::new(true),
        };
        t.publish(start + Duration::from_millis(500));
        assert_eq!(t.now_ms.load(Ordering::Relaxed), 501);
        assert!(t.published.swap(false, Ordering::Relaxed));
        // An older instant (another worker's) neither moves it back nor
        // counts as news.
        t.publish(start + Duration::from_millis(200));
        assert_eq!(t.now_ms.load(Ordering::Relaxed), 501);
        assert!(!t.published.load(Ordering::Relaxed));
    }
}
