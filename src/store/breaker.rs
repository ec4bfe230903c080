//! The circuit breaker of the store guard: a pure, lock-free state
//! machine (time comes in as arguments). Closed → (`failures` in a row) →
//! open → (`open_ms` later) half-open, one probe → closed on success, open
//! again on failure. [`Breaker::claim_prober`] and [`Breaker::watch`] drive
//! the background probe that runs while the circuit is open.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// `[store.breaker]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// How long it stays open before one probe may pass.
    pub open_ms: u64,
}

/// What the breaker lets a caller do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: call the store.
    Call,
    /// Half-open: this caller is the one probe; its result decides.
    Probe,
    /// Open: no store call; the breaker may close in this many ms.
    Open { retry_after_ms: u64 },
}

/// What the background prober does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Probe the store now: this prober holds the half-open slot.
    Probe,
    /// Open, and not yet time to probe: look again in this many ms.
    Wait { ms: u64 },
    /// Another caller (a request) holds the probe slot; its answer comes
    /// within a deadline.
    Busy,
    /// Closed: the prober ends.
    Stop,
}

/// Closed → (failures in a row) → open → (open_ms later) half-open, one
/// probe → closed on success, open again on failure. Lock-free: callers on
/// every worker share one.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    failures: AtomicU32,
    /// When the breaker may half-open, in monotonic ms; 0 while closed.
    open_until: AtomicU64,
    probing: AtomicBool,
    /// When the last failure that counted was recorded, in monotonic ms.
    last_counted: AtomicU64,
    /// A background prober runs (see [`Breaker::claim_prober`]).
    pub(super) prober: AtomicBool,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings: BreakerSettings {
                failures: settings.failures.max(1),
                open_ms: settings.open_ms.max(1),
            },
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            last_counted: AtomicU64::new(0),
            prober: AtomicBool::new(false),
        }
    }

    pub fn admit(&self, now_ms: u64) -> Admission {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admission::Call;
        }
        if now_ms < until {
            return Admission::Open {
                retry_after_ms: until - now_ms,
            };
        }
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Admission::Probe
        } else {
            // Another caller is probing; its answer comes within a deadline.
            Admission::Open { retry_after_ms: 0 }
        }
    }

    /// Records a call's success; `probe`: the call was the half-open probe.
    /// Returns true when this closed the breaker.
    ///
    /// Only the probe closes an open breaker. Any other success while open
    /// is a call made before the breaker opened, answering late (calls in
    /// flight when it opened): it says nothing of the store now, and
    /// closing on it would undo the opening milliseconds later, with no
    /// `open_ms` and no probe.
    pub fn succeeded(&self, probe: bool) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        if !probe && self.open_until.load(Ordering::Acquire) != 0 {
            return false;
        }
        let was_open = self.open_until.swap(0, Ordering::AcqRel) != 0;
        self.probing.store(false, Ordering::Release);
        was_open
    }

    /// Records the failure of a call made at `started_ms`. Returns true
    /// when this opened the breaker.
    ///
    /// Only failures one after another count: a call that was already in
    /// flight when another failure was recorded shared that failure's cause
    /// (one stall of the store, the network or this host times out every
    /// call in flight at once), so it does not add to the count. Opening
    /// takes `failures` calls failing in turn, each made after the last
    /// failure was seen, which a store that is really down gives at once.
    pub fn failed(&self, started_ms: u64, now_ms: u64, probe: bool) -> bool {
        let until = now_ms.saturating_add(self.settings.open_ms).max(1);
        if probe {
            self.open_until.store(until, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return false; // it was open already
        }
        // Moved only by failures that count: under steady load a hung store
        // fails some call every millisecond, and calls made after a counted
        // failure must still count, or the circuit would never open.
        let mut counted = self.last_counted.load(Ordering::Acquire);
        loop {
            if started_ms < counted {
                return false; // in flight with a failure already counted
            }
            match self
                .last_counted
                .compare_exchange(counted, counted.max(now_ms), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(moved) => counted = moved,
            }
        }
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.settings.failures && self.open_until.load(Ordering::Acquire) == 0 {
            return self
                .open_until
                .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        }
        false
    }

    /// A fresh connection to the store has answered: an open breaker may
    /// half-open now rather than after the rest of `open_ms`, so the first
    /// call on the new connection is the probe.
    pub fn expect_answer(&self, now_ms: u64) {
        let _ = self
            .open_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |until| {
                (until > now_ms).then_some(now_ms.max(1))
            });
    }

    /// A probe that ended without an answer (its caller went away): the
    /// next caller may probe instead.
    pub fn probe_abandoned(&self) {
        self.probing.store(false, Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// True when the caller should start the background prober: the
    /// breaker is open and no prober runs. True once per prober; the
    /// prober gives the claim back when it stops (see [`Breaker::watch`]).
    pub fn claim_prober(&self) -> bool {
        self.is_open()
            && !self.prober.load(Ordering::Acquire)
            && self
                .prober
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The prober's next step at `now_ms`. It probes through the same
    /// half-open slot as requests ([`Breaker::admit`]), so the two never
    /// probe at once; it stops once the breaker is closed, unless the
    /// breaker opened again in between, when it carries on (no second
    /// prober is started for that opening, as its claim was still held).
    pub fn watch(&self, now_ms: u64) -> Watch {
        match self.admit(now_ms) {
            Admission::Probe => Watch::Probe,
            Admission::Open { retry_after_ms: 0 } => Watch::Busy,
            Admission::Open { retry_after_ms } => Watch::Wait { ms: retry_after_ms },
            Admission::Call => {
                self.prober.store(false, Ordering::Release);
                if self.claim_prober() {
                    // Opened again after the admit above: still ours.
                    match self.admit(now_ms) {
                        Admission::Probe => Watch::Probe,
                        Admission::Open { retry_after_ms: 0 } | Admission::Call => Watch::Busy,
                        Admission::Open { retry_after_ms } => Watch::Wait { ms: retry_after_ms },
                    }
                } else {
                    Watch::Stop
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerSettings {
            failures: 3,
            open_ms: 2_000,
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker();
        assert!(!b.failed(10, 10, false));
        assert!(!b.failed(11, 11, false));
        assert!(!b.succeeded(false)); // a success resets the count
        assert!(!b.failed(12, 12, false));
        assert!(!b.failed(13, 13, false));
        assert_eq!(b.admit(14), Admission::Call);
        assert!(b.failed(14, 14, false)); // the third in a row
        assert!(b.is_open());
        assert_eq!(b.admit(15), Admission::Open { retry_after_ms: 1_999 });
        assert!(!b.failed(16, 16, false)); // late failures do not re-open
    }

    #[test]
    fn failures_of_calls_in_flight_together_count_once() {
        let b = breaker();
        // One stall times out three calls made at 10, 11 and 12 ms together.
        assert!(!b.failed(10, 20, false));
        assert!(!b.failed(11, 20, false));
        assert!(!b.failed(12, 21, false));
        assert_eq!(b.admit(22), Admission::Call, "one stall is one failure");
        // Calls made after that, failing in turn: a store that is down.
        assert!(!b.failed(22, 27, false));
        assert!(b.failed(28, 33, false));
        assert!(b.is_open());
    }

    #[test]
    fn a_store_hung_under_steady_load_opens_the_circuit() {
        // Deadline 5 ms, a call made every millisecond, each timing out.
        let b = breaker();
        let mut opened_at = None;
        for started in 0..100u64 {
            if b.failed(started, started + 5, false) {
                opened_at = Some(started + 5);
                break;
            }
        }
        // Counted at 5 (made at 0), 10 (made at 5), 15 (made at 10).
        assert_eq!(opened_at, Some(15));
    }

    #[test]
    fn lets_exactly_one_probe_through_after_the_cool_down() {
        let b = breaker();
        for t in 0..3 {
            b.failed(t, t, false);
        }
        assert_eq!(b.admit(2_001), Admission::Open { retry_after_ms: 1 });
        assert_eq!(b.admit(2_002), Admission::Probe);
        assert_eq!(b.admit(2_002), Admission::Open { retry_after_ms: 0 });
        assert_eq!(b.admit(2_500), Admission::Open { retry_after_ms: 0 });
        // The probe fails: open for another full period.
        assert!(!b.failed(2_600, 2_600, true));
        assert_eq!(b.admit(2_601), Admission::Open { retry_after_ms: 1_999 });
        assert_eq!(b.admit(4_600), Admission::Probe);
        // The probe succeeds: closed, and the count starts over.
        assert!(b.succeeded(true));
        assert!(!b.is_open());
        assert_eq!(b.admit(4_601), Admission::Call);
        assert!(!b.failed(4_602, 4_602, false));
        assert_eq!(b.admit(4_603), Admission::Call);
    }

    /// Calls in flight when the breaker opened answer late: they leave it
    /// open for `open_ms`, and only the probe closes it.
    #[test]
    fn a_late_success_from_before_the_opening_leaves_it_open() {
        let b = breaker();
        opened(&b);
        assert!(!b.succeeded(false), "a straggler does not close it");
        assert!(b.is_open());
        assert_eq!(b.admit(10), Admission::Open { retry_after_ms: 1_992 });
        assert_eq!(b.admit(2_002), Admission::Probe);
        assert!(b.succeeded(true));
        assert!(!b.is_open());
    }

    #[test]
    fn a_fresh_connection_half_opens_an_open_breaker_at_once() {
        let b = breaker();
        opened(&b);
        assert!(matches!(b.admit(1_100), Admission::Open { .. }));
        b.expect_answer(1_100);
        assert_eq!(b.admit(1_100), Admission::Probe);
        // Closed, it stays closed.
        assert!(b.succeeded(true));
        b.expect_answer(1_200);
        assert_eq!(b.admit(1_200), Admission::Call);
    }

    #[test]
    fn a_single_failure_setting_opens_at_once() {
        let b = Breaker::new(BreakerSettings {
            failures: 0, // treated as 1
            open_ms: 0,  // treated as 1
        });
        assert!(b.failed(100, 100, false));
        assert_eq!(b.admit(100), Admission::Open { retry_after_ms: 1 });
        assert_eq!(b.admit(101), Admission::Probe);
    }

    fn opened(b: &Breaker) {
        for t in 0..3 {
            b.failed(t, t, false);
        }
        assert!(b.is_open());
    }

    #[test]
    fn a_prober_is_claimed_once_per_opening_and_never_while_closed() {
        let b = breaker();
        assert!(!b.claim_prober(), "closed: no prober");
        opened(&b);
        assert!(b.claim_prober());
        assert!(!b.claim_prober(), "one prober at a time");
        // The prober finds the breaker closed and ends; the next opening
        // may start one again.
        assert!(b.succeeded(true));
        assert_eq!(b.watch(10), Watch::Stop);
        assert!(!b.claim_prober(), "closed: no prober");
        for t in 20..23 {
            b.failed(t, t, false);
        }
        assert!(b.claim_prober());
    }

    #[test]
    fn the_prober_waits_out_open_ms_and_then_probes_through_the_half_open_slot() {
        let b = breaker();
        opened(&b); // open until 2_002
        assert!(b.claim_prober());
        assert_eq!(b.watch(2), Watch::Wait { ms: 2_000 });
        assert_eq!(b.watch(2_002), Watch::Probe);
        // While the prober probes, a request finds the circuit open.
        assert_eq!(b.admit(2_003), Admission::Open { retry_after_ms: 0 });
        // The probe fails: another full period.
        assert!(!b.failed(2_004, 2_005, true));
        assert_eq!(b.watch(2_005), Watch::Wait { ms: 2_000 });
        // A request takes the slot first: the prober waits for its answer.
        assert_eq!(b.admit(4_005), Admission::Probe);
        assert_eq!(b.watch(4_005), Watch::Busy);
        assert!(b.succeeded(true));
        assert_eq!(b.watch(4_006), Watch::Stop);
    }

    #[test]
    fn a_prober_that_finds_the_circuit_opened_again_carries_on() {
        let b = breaker();
        opened(&b);
        assert!(b.claim_prober());
        // A request's probe closes the circuit, and failures open it again
        // before the prober looks: its claim still stands, so no second
        // prober starts, and this one must not stop.
        assert!(b.succeeded(true));
        for t in 10..13 {
            b.failed(t, t, false);
        }
        assert!(!b.claim_prober());
        assert_eq!(b.watch(13), Watch::Wait { ms: 1_999 });
    }
}
