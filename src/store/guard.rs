//! The guard around a quota store: a deadline on every call and a circuit
//! breaker, so a dead or hung store costs a request at most the deadline,
//! and after a few failures nothing at all.
//!
//! [`Breaker`] (in `breaker.rs`) is the pure state machine (time comes in
//! as arguments);
//! [`Guarded`] is the thin shell that applies it, the deadline and the
//! store metrics to any [`QuotaStore`]. A call the store answers at once
//! (the embedded store) is never given a timer.
//!
//! While the circuit is open, and only then, one background task probes
//! the store every `open_ms` with [`QuotaStore::ping`] (no quota taken),
//! so an instance that gets no requests still sees its store come back:
//! the circuit closes and `leasegate_circuit_open` reads 0 again. The task
//! takes its turn through the same half-open slot as a request's probe, so
//! there is never more than one probe at a time; it ends when the circuit
//! closes, and holds the guard only weakly, so dropping the guard ends it.
//!
//! A call the store could not even send ([`StoreError::NotConnected`]: its
//! connection is being dialled in the background) fails the request as a
//! store failure but is no failed call for the breaker: [`Guarded::follow`]
//! counts each failed dial once instead, and when a fresh connection has
//! answered it half-opens an open breaker at once and probes on it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

pub use super::breaker::{Admission, Breaker, BreakerSettings, Watch};
use super::deadline::within;
use super::link::StoreLink;
use super::{Acquire as _, BoxFuture, FleetStore, FleetTables, QuotaStore, StoreError, Unspent};
use crate::clock::Clock;
use crate::quota::{Grant, Spec};
use crate::telemetry::metrics::{Metrics, StoreCallLabels};
use prometheus_client::metrics::counter::Counter;

/// Any store, behind a deadline and a breaker, with its calls counted.
pub struct Guarded {
    core: Arc<Core>,
}

/// What a guarded call and the background prober share. The prober holds
/// it weakly.
struct Core {
    inner: Arc<dyn FleetStore>,
    deadline: Duration,
    breaker: Breaker,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// `leasegate_store_calls_total` by [op][result], resolved once.
    calls: [[Counter; 3]; 2],
}

/// A store call a request (or a lease) makes, as the guard counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Acquire,
    Release,
}

impl Op {
    const ALL: [Op; 2] = [Op::Acquire, Op::Release];

    /// The `op` label of `leasegate_store_calls_total`.
    fn label(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Release => "release",
        }
    }
}

const RESULTS: [&str; 3] = ["ok", "timeout", "error"];

impl Guarded {
    pub fn new(
        inner: Arc<dyn FleetStore>,
        deadline: Duration,
        breaker: BreakerSettings,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Guarded {
        let calls = Op::ALL.map(|op| {
            RESULTS.map(|result| {
                metrics
                    .store_calls
                    .get_or_create(&StoreCallLabels { op: op.label(), result })
                    .clone()
            })
        });
        Guarded {
            core: Arc::new(Core {
                inner,
                deadline,
                breaker: Breaker::new(breaker),
                clock,
                metrics,
                calls,
            }),
        }
    }

    pub fn breaker(&self) -> &Breaker {
        &self.core.breaker
    }

    /// Follows the inner store's `link` while the guard lives: each failed
    /// dial is one failure for the breaker (however many calls found no
    /// connection meanwhile), and a connection that has answered ends an
    /// open breaker's wait with a probe on it at once. Spawned by the
    /// composition root.
    pub fn follow(&self, link: Arc<StoreLink>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let core = Arc::downgrade(&self.core);
        async move {
            let mut changes = link.subscribe();
            let mut counted = 0;
            loop {
                {
                    let Some(core) = core.upgrade() else { return };
                    let failed = link.failed_dials();
                    let now = (core.clock)();
                    for _ in counted..failed {
                        if core.breaker.failed(now, now, false) {
                            tracing::warn!(store = core.inner.name(), link = %link.describe(), "store unreachable; circuit open");
                        }
                    }
                    counted = failed;
                    if link.is_up() && core.breaker.is_open() {
                        core.breaker.expect_answer(now);
                        if core.breaker.admit(now) == Admission::Probe {
                            core.probe().await;
                        }
                    } else if core.breaker.is_open() {
                        core.start_prober();
                    }
                    core.metrics.circuit_open.set(i64::from(core.breaker.is_open()));
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

impl Core {
    async fn guard<'a, T>(
        self: &'a Arc<Self>,
        op: Op,
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
            Poll::Pending => within(self.deadline, call).await,
        };
        self.metrics.store_call_seconds.observe(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => 0,
            Err(StoreError::Timeout(_)) => 1,
            Err(_) => 2,
        };
        self.calls[op as usize][outcome].inc();
        abandoned.breaker = None; // answered: the result below decides
        match &result {
            Ok(_) => {
                if self.breaker.succeeded(probe) {
                    tracing::info!(store = self.inner.name(), "store answered again; circuit closed");
                }
            }
            // Never sent: the link's failed dials are the breaker's
            // events (`follow`). A probe that found no connection leaves
            // the breaker open.
            Err(StoreError::NotConnected(_)) if !probe => {}
            Err(e) => {
                if self.breaker.failed(started_ms, (self.clock)(), probe) {
                    tracing::warn!(store = self.inner.name(), error = %e, "store failing; circuit open");
                }
                self.start_prober();
            }
        }
        // From the state, not the transition: racing opens and closes
        // cannot leave the gauge saying the opposite of the breaker.
        self.metrics.circuit_open.set(i64::from(self.breaker.is_open()));
        result
    }

    /// Starts the background prober if the circuit is open and none runs.
    /// Called after every failure, so an opening is never missed; costs an
    /// atomic load when a prober already runs or the circuit is closed.
    fn start_prober(self: &Arc<Self>) {
        if !self.breaker.claim_prober() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(probe_while_open(Arc::downgrade(self)));
            }
            Err(_) => {
                // No runtime to run it on (never in the gateway): requests'
                // own probes still close the circuit.
                self.breaker.prober.store(false, Ordering::Release);
            }
        }
    }

    /// One background probe: [`QuotaStore::ping`] under the deadline. Not
    /// counted as a store call (it is not one a request made); its outcome
    /// moves the breaker and the gauge like a request's probe.
    async fn probe(&self) {
        let mut abandoned = ProbeWatch {
            breaker: Some(&self.breaker),
        };
        let started_ms = (self.clock)();
        let result = within(self.deadline, self.inner.ping()).await;
        abandoned.breaker = None;
        match result {
            Ok(()) => {
                if self.breaker.succeeded(true) {
                    tracing::info!(store = self.inner.name(), "store answered again; circuit closed");
                }
            }
            Err(e) => {
                tracing::debug!(store = self.inner.name(), error = %e, "store probe failed; circuit stays open");
                self.breaker.failed(started_ms, (self.clock)(), true);
            }
        }
        self.metrics.circuit_open.set(i64::from(self.breaker.is_open()));
    }
}

/// The background prober: while the circuit is open, probes the store
/// every `open_ms`; ends when the circuit closes or the guard is gone.
async fn probe_while_open(core: Weak<Core>) {
    loop {
        let wait = {
            let Some(core) = core.upgrade() else { return };
            match core.breaker.watch((core.clock)()) {
                Watch::Stop => return,
                Watch::Probe => {
                    core.probe().await;
                    continue;
                }
                Watch::Wait { ms } => Duration::from_millis(ms),
                // A request's probe answers within the deadline.
                Watch::Busy => core.deadline.max(Duration::from_millis(1)),
            }
        };
        tokio::time::sleep(wait).await;
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

impl Guarded {
    /// An acquire (or, with `reserve`, an acquire that may reserve) under
    /// the guard; the tokens leased, reserved ones included, go to the
    /// lease-size histogram.
    fn acquire_guarded<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let core = &self.core;
        Box::pin(async move {
            let grant = core
                .guard(Op::Acquire, move || match reserve {
                    true => core.inner.acquire_or_reserve(key, spec, want, unspent),
                    false => core.inner.acquire(key, spec, want, unspent),
                })
                .await?;
            let leased = grant.granted + grant.reserved;
            if leased > 0 {
                core.metrics.lease_tokens.observe(leased as f64);
            }
            Ok(grant)
        })
    }
}

impl QuotaStore for Guarded {
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        self.acquire_guarded(key, spec, want, unspent, reserve)
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        let core = &self.core;
        Box::pin(core.guard(Op::Release, move || core.inner.release(key, spec, unspent)))
    }

    fn name(&self) -> &'static str {
        self.core.inner.name()
    }

    /// The inner store's ping under the deadline; the breaker is left alone.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let core = &self.core;
        Box::pin(within(core.deadline, core.inner.ping()))
    }
}

impl FleetTables for Guarded {
    /// The inner store's heartbeat under the deadline, as a ping: the
    /// breaker is left alone, and it is not a store call of the metrics.
    fn heartbeat(&self, member: u64, ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(within(self.core.deadline, self.core.inner.heartbeat(member, ttl_ms)))
    }

    /// The inner store's slots under the guard (deadline and breaker): a
    /// call that takes slots counts as an acquire, one that only renews or
    /// gives them back as a release.
    fn hold_slots<'a>(&'a self, h: super::Hold<'a>) -> BoxFuture<'a, Result<super::Slots, StoreError>> {
        let core = &self.core;
        let op = if h.want > 0 { Op::Acquire } else { Op::Release };
        Box::pin(core.guard(op, move || core.inner.hold_slots(h)))
    }

    fn watch_overrides(&self, wake: std::sync::Arc<tokio::sync::Notify>) {
        self.core.inner.watch_overrides(wake)
    }

    /// The inner store's overrides call, under a second's deadline (an
    /// operator's change, or the poll in the background: never a request's
    /// wait); the breaker is left alone.
    fn overrides<'a>(&'a self, op: super::OverrideOp<'a>) -> BoxFuture<'a, Result<super::Overridden, StoreError>> {
        Box::pin(within(Duration::from_secs(1), self.core.inner.overrides(op)))
    }

    /// The inner store's fair share under the deadline, as a heartbeat is.
    fn fair_share<'a>(&'a self, d: super::Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(within(self.core.deadline, self.core.inner.fair_share(d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{Answer, Call, Scripted};
    use std::sync::atomic::AtomicU64;

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

    /// A guarded store that never answers, on a clock the test moves.
    fn hung(failures: u32, open_ms: u64, metrics: Arc<Metrics>) -> (Guarded, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000));
        let clock_now = now.clone();
        let guarded = Guarded::new(
            {
                let store = Arc::new(Scripted::new());
                store.all(Answer::Hang);
                store
            },
            Duration::from_millis(5),
            BreakerSettings { failures, open_ms },
            Arc::new(move || clock_now.load(Ordering::Relaxed)),
            metrics,
        );
        (guarded, now)
    }

    /// Milliseconds of tokio's (paused) time, plus a jump the test may add.
    fn tokio_clock(jump: Arc<AtomicU64>) -> Clock {
        let start = tokio::time::Instant::now();
        Arc::new(move || 1_000 + jump.load(Ordering::Relaxed) + start.elapsed().as_millis() as u64)
    }

    fn scripted(store: &Arc<Scripted>, deadline_ms: u64, failures: u32) -> (Guarded, Arc<Metrics>, Arc<AtomicU64>) {
        let metrics = Arc::new(Metrics::new());
        let jump = Arc::new(AtomicU64::new(0));
        let guarded = Guarded::new(
            store.clone(),
            Duration::from_millis(deadline_ms),
            BreakerSettings { failures, open_ms: 100 },
            tokio_clock(jump.clone()),
            metrics.clone(),
        );
        (guarded, metrics, jump)
    }

    fn spec() -> Spec {
        Spec::new(crate::quota::Algorithm::TokenBucket, "10/s".parse().unwrap(), 10)
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_found_no_connection_never_open_the_breaker() {
        let store = Arc::new(Scripted::new());
        store.answer(
            Call::Acquire,
            Answer::Fail(StoreError::NotConnected("connecting".into())),
        );
        let (guarded, metrics, _) = scripted(&store, 5, 1);
        for _ in 0..10 {
            assert_eq!(
                guarded.acquire("k", &spec(), 1, Unspent::default()).await,
                Err(StoreError::NotConnected("connecting".into()))
            );
        }
        assert!(!guarded.breaker().is_open());
        assert_eq!(metrics.circuit_open.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn each_failed_dial_counts_once_and_a_fresh_connection_is_probed_at_once() {
        let store = Arc::new(Scripted::new());
        let metrics = Arc::new(Metrics::new());
        // open_ms long enough that only the fresh connection can close it.
        let guarded = Arc::new(Guarded::new(
            store.clone(),
            Duration::from_millis(5),
            BreakerSettings {
                failures: 3,
                open_ms: 60_000,
            },
            tokio_clock(Arc::new(AtomicU64::new(0))),
            metrics.clone(),
        ));
        let link = Arc::new(StoreLink::connecting());
        tokio::spawn(guarded.follow(link.clone()));
        let settle = || tokio::time::sleep(Duration::from_millis(1));
        link.dial_failed("refused".into());
        link.dial_failed("refused".into());
        settle().await;
        assert!(!guarded.breaker().is_open(), "two failed dials of three");
        link.dial_failed("refused".into());
        settle().await;
        assert!(guarded.breaker().is_open());
        assert_eq!(metrics.circuit_open.get(), 1);
        let pings = store.pings.load(Ordering::Relaxed);
        // The store answers on a new connection: the probe goes at once,
        // a minute before open_ms would have let it.
        link.answered();
        settle().await;
        assert_eq!(store.pings.load(Ordering::Relaxed), pings + 1);
        assert!(!guarded.breaker().is_open());
        assert_eq!(metrics.circuit_open.get(), 0);
        assert_eq!(
            guarded
                .acquire("k", &spec(), 1, Unspent::default())
                .await
                .map(|g| g.granted),
            Ok(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_instance_closes_its_circuit_once_the_store_answers_again() {
        let store = Arc::new(Scripted::new());
        store.all(Answer::Fail(StoreError::Unavailable("refused".into())));
        let (guarded, metrics, _) = scripted(&store, 5, 3);
        for _ in 0..3 {
            assert!(guarded.acquire("k", &spec(), 1, Unspent::default()).await.is_err());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(metrics.circuit_open.get(), 1);
        // The store comes back; no request arrives.
        store.all(Answer::Real);
        tokio::time::sleep(Duration::from_millis(110)).await;
        assert_eq!(metrics.circuit_open.get(), 0, "closed without a request");
        assert!(!guarded.breaker().is_open());
        assert_eq!(store.pings.load(Ordering::Relaxed), 1, "one probe");
        assert_eq!(store.acquires.load(Ordering::Relaxed), 3, "the probe takes no quota");
        // Closed: the prober is gone, nothing probes any more.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_background_probe_keeps_the_circuit_open_and_probes_again_every_open_ms() {
        let store = Arc::new(Scripted::new());
        store.all(Answer::Fail(StoreError::Unavailable("refused".into())));
        let (guarded, metrics, _) = scripted(&store, 5, 1);
        assert!(guarded.acquire("k", &spec(), 1, Unspent::default()).await.is_err());
        assert_eq!(metrics.circuit_open.get(), 1);
        tokio::time::sleep(Duration::from_millis(105)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.circuit_open.get(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 2);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 5);
        assert_eq!(metrics.circuit_open.get(), 1);
        assert!(guarded.breaker().is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_probe_that_hangs_fails_by_the_deadline() {
        let store = Arc::new(Scripted::new());
        store.all(Answer::Fail(StoreError::Unavailable("refused".into())));
        let (guarded, metrics, _) = scripted(&store, 5, 1);
        assert!(guarded.acquire("k", &spec(), 1, Unspent::default()).await.is_err());
        store.all(Answer::Hang);
        tokio::time::sleep(Duration::from_millis(103)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 1);
        // The hung probe failed at its deadline, and the next one comes.
        store.all(Answer::Fail(StoreError::Unavailable("refused".into())));
        store.all(Answer::Real);
        tokio::time::sleep(Duration::from_millis(110)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.circuit_open.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_prober_ends_with_the_guard() {
        let store = Arc::new(Scripted::new());
        store.all(Answer::Fail(StoreError::Unavailable("refused".into())));
        let (guarded, _, _) = scripted(&store, 5, 1);
        assert!(guarded.acquire("k", &spec(), 1, Unspent::default()).await.is_err());
        drop(guarded);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 0);
        assert_eq!(Arc::strong_count(&store), 1, "nothing holds the store");
    }

    #[tokio::test(start_paused = true)]
    async fn the_prober_never_probes_while_a_requests_probe_is_in_flight() {
        let store = Arc::new(Scripted::new());
        store.all(Answer::Hang);
        // Deadline 1 s, open 100 ms: a request's probe outlasts a period.
        let (guarded, metrics, jump) = scripted(&store, 1_000, 1);
        let guarded = Arc::new(guarded);
        assert_eq!(
            guarded.acquire("k", &spec(), 1, Unspent::default()).await,
            Err(StoreError::Timeout(1_000))
        );
        // Let the prober go to sleep. Then the breaker's clock passes
        // open_ms before the prober wakes: a request takes the half-open
        // slot, and its call hangs.
        tokio::time::sleep(Duration::from_millis(1)).await;
        jump.store(100, Ordering::Relaxed);
        let g = guarded.clone();
        let request = tokio::spawn(async move { g.acquire("k", &spec(), 1, Unspent::default()).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(store.acquires.load(Ordering::Relaxed), 2, "the request probes");
        assert_eq!(store.pings.load(Ordering::Relaxed), 0, "the prober waits for it");
        // The request's probe fails at its deadline; the prober's turn comes
        // one period later.
        store.all(Answer::Real);
        assert_eq!(request.await.unwrap(), Err(StoreError::Timeout(1_000)));
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert_eq!(store.pings.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.circuit_open.get(), 0);
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
            ..Unspent::default()
        };
        assert_eq!(guarded.acquire("k", &spec, 3, two).await.map(|g| g.granted), Ok(2));
        guarded
            .release(
                "k",
                &spec,
                Unspent {
                    tokens: 1,
                    window_ms: 0,
                    ..Unspent::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(guarded.acquire("k", &spec, 3, none).await.map(|g| g.granted), Ok(1));
    }
}
