//! The guard around a quota store: a deadline on every call and a circuit
//! breaker, so a dead or hung store costs a request at most the deadline,
//! and after a few failures nothing at all.
//!
//! [`Breaker`] is the pure state machine (time comes in as arguments);
//! [`Guarded`] is the thin shell that applies it, the deadline and the
//! store metrics to any [`QuotaStore`]. A call the store answers at once
//! (the embedded store) is never given a timer.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::{BoxFuture, QuotaStore, StoreError, Unspent};
use crate::limit::Clock;
use crate::metrics::{Metrics, StoreCallLabels};
use crate::quota::{Grant, Spec};
use prometheus_client::metrics::counter::Counter;

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

    /// Records a call's success. Returns true when this closed the breaker.
    pub fn succeeded(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
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

    /// A probe that ended without an answer (its caller went away): the
    /// next caller may probe instead.
    pub fn probe_abandoned(&self) {
        self.probing.store(false, Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

/// Any store, behind a deadline and a breaker, with its calls counted.
pub struct Guarded {
    inner: Arc<dyn QuotaStore>,
    deadline: Duration,
    breaker: Breaker,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// `leasegate_store_calls_total` by [op][result], resolved once.
    calls: [[Counter; 3]; 2],
}

const OPS: [&str; 2] = ["acquire", "release"];
const RESULTS: [&str; 3] = ["ok", "timeout", "error"];

impl Guarded {
    pub fn new(
        inner: Arc<dyn QuotaStore>,
        deadline: Duration,
        breaker: BreakerSettings,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Guarded {
        let calls = OPS.map(|op| {
            RESULTS.map(|result| {
                metrics
                    .store_calls
                    .get_or_create(&StoreCallLabels { op, result })
                    .clone()
            })
        });
        Guarded {
            inner,
            deadline,
            breaker: Breaker::new(breaker),
            clock,
            metrics,
            calls,
        }
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// `op`: 0 acquire, 1 release (an index into [`OPS`]).
    async fn guard<'a, T>(
        &'a self,
        op: usize,
        call: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let probe = match self.breaker.admit((self.clock)()) {
            Admission::Call => false,
            Admission::Probe => true,
            Admission::Open { retry_after_ms } => return Err(StoreError::CircuitOpen { retry_after_ms }),
        };
        // A probe whose caller is dropped mid-call must not leave the
        // breaker waiting for an answer that never comes.
        let mut abandoned = ProbeWatch {
            breaker: probe.then_some(&self.breaker),
        };
        let started = Instant::now();
        let started_ms = (self.clock)();
        let mut call = call();
        // An answer at hand needs no timer.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(r) => r,
            Poll::Pending => match tokio::time::timeout(self.deadline, call).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout(self.deadline.as_millis() as u64)),
            },
        };
        self.metrics.store_call_seconds.observe(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => 0,
            Err(StoreError::Timeout(_)) => 1,
            Err(_) => 2,
        };
        self.calls[op % 2][outcome].inc();
        abandoned.breaker = None; // answered: the result below decides
        match &result {
            Ok(_) => {
                if self.breaker.succeeded() {
                    tracing::info!(store = self.inner.name(), "store answered again; circuit closed");
                }
            }
            Err(e) => {
                if self.breaker.failed(started_ms, (self.clock)(), probe) {
                    tracing::warn!(store = self.inner.name(), error = %e, "store failing; circuit open");
                }
            }
        }
        // From the state, not the transition: racing opens and closes
        // cannot leave the gauge saying the opposite of the breaker.
        self.metrics.circuit_open.set(i64::from(self.breaker.is_open()));
        result
    }
}

/// Frees the probe slot if the probing call is dropped before its answer.
struct ProbeWatch<'a> {
    breaker: Option<&'a Breaker>,
}

impl Drop for ProbeWatch<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.breaker {
            b.probe_abandoned();
        }
    }
}

impl QuotaStore for Guarded {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        Box::pin(async move {
            let grant = self
                .guard(0, move || self.inner.acquire(key, spec, want, unspent))
                .await?;
            if grant.granted > 0 {
                self.metrics.lease_tokens.observe(grant.granted as f64);
            }
            Ok(grant)
        })
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.guard(1, move || self.inner.release(key, spec, unspent)))
    }

    fn name(&self) -> &'static str {
        self.inner.name()
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
        assert!(!b.succeeded()); // a success resets the count
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
        assert!(b.succeeded());
        assert!(!b.is_open());
        assert_eq!(b.admit(4_601), Admission::Call);
        assert!(!b.failed(4_602, 4_602, false));
        assert_eq!(b.admit(4_603), Admission::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_whose_caller_goes_away_frees_the_probe_slot() {
        let (guarded, now) = hung(1, 100, Arc::new(Metrics::new()));
        let spec = Spec::new(crate::quota::Algorithm::TokenBucket, "10/s".parse().unwrap(), 10);
        assert_eq!(
            guarded.acquire("k", &spec, 1, Unspent::default()).await,
            Err(StoreError::Timeout(5))
        );
        now.store(1_200, Ordering::Relaxed);
        // The probe starts, and its request is dropped before the deadline.
        {
            let probe = guarded.acquire("k", &spec, 1, Unspent::default());
            let _ = tokio::time::timeout(Duration::from_millis(1), probe).await;
        }
        // The next caller probes; it is not told "open" forever.
        assert_eq!(
            guarded.acquire("k", &spec, 1, Unspent::default()).await,
            Err(StoreError::Timeout(5))
        );
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

    /// A guarded store that never answers, on a clock the test moves.
    fn hung(failures: u32, open_ms: u64, metrics: Arc<Metrics>) -> (Guarded, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000));
        let clock_now = now.clone();
        let guarded = Guarded::new(
            Arc::new(Hung),
            Duration::from_millis(5),
            BreakerSettings { failures, open_ms },
            Arc::new(move || clock_now.load(Ordering::Relaxed)),
            metrics,
        );
        (guarded, now)
    }

    /// A store that never answers.
    struct Hung;
    impl QuotaStore for Hung {
        fn acquire<'a>(
            &'a self,
            _: &'a str,
            _: &'a Spec,
            _: u64,
            _: Unspent,
        ) -> BoxFuture<'a, Result<Grant, StoreError>> {
            Box::pin(std::future::pending())
        }
        fn release<'a>(&'a self, _: &'a str, _: &'a Spec, _: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
            Box::pin(std::future::pending())
        }
        fn name(&self) -> &'static str {
            "hung"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_store_costs_the_deadline_then_nothing() {
        let metrics = Arc::new(Metrics::new());
        let (guarded, _now) = hung(3, 2_000, metrics.clone());
        let spec = Spec::new(crate::quota::Algorithm::TokenBucket, "10/s".parse().unwrap(), 10);
        for _ in 0..3 {
            let started = tokio::time::Instant::now();
            assert_eq!(
                guarded.acquire("k", &spec, 1, Unspent::default()).await,
                Err(StoreError::Timeout(5))
            );
            assert_eq!(started.elapsed(), Duration::from_millis(5));
        }
        assert_eq!(metrics.circuit_open.get(), 1);
        let started = tokio::time::Instant::now();
        assert_eq!(
            guarded.acquire("k", &spec, 1, Unspent::default()).await,
            Err(StoreError::CircuitOpen { retry_after_ms: 2_000 })
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
        let text = metrics.encode();
        assert!(
            text.contains(r#"leasegate_store_calls_total{op="acquire",result="timeout"} 3"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn give_backs_pass_through_to_the_store() {
        let guarded = Guarded::new(
            Arc::new(crate::store::memory::MemoryStore::new(100)),
            Duration::from_millis(5),
            BreakerSettings {
                failures: 3,
                open_ms: 1_000,
            },
            Arc::new(|| 0),
            Arc::new(Metrics::new()),
        );
        let spec = Spec::new(crate::quota::Algorithm::TokenBucket, "5/h".parse().unwrap(), 5);
        let none = Unspent::default();
        assert_eq!(guarded.acquire("k", &spec, 5, none).await.map(|g| g.granted), Ok(5));
        let two = Unspent {
            tokens: 2,
            window_ms: 0,
        };
        assert_eq!(guarded.acquire("k", &spec, 3, two).await.map(|g| g.granted), Ok(2));
        guarded
            .release(
                "k",
                &spec,
                Unspent {
                    tokens: 1,
                    window_ms: 0,
                },
            )
            .await
            .unwrap();
        assert_eq!(guarded.acquire("k", &spec, 3, none).await.map(|g| g.granted), Ok(1));
    }
}
