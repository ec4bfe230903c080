//! The one test double of a store, for every unit test that needs a store
//! to be slow, down, hung or watched: [`Scripted`]. It keeps the real
//! math (a [`MemoryStore`] on the clock it is given), answers each kind of
//! call as the test scripts it ([`Answer`], and a delay, on tokio's clock:
//! paused in tests, so a delay costs no real time), and counts what went
//! through. Its region calls keep claims, credit and transfers in memory.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::memory::MemoryStore;
use super::{BoxFuture, Credit, FleetTables, QuotaStore, RegionStore, StoreError, Unspent};
use crate::clock::Clock;
use crate::quota::{Grant, Spec};
use crate::sync::Recover;

/// A kind of store call, as a test scripts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Acquire,
    Release,
    Ping,
    TransferOut,
    Credit,
    SpendCredit,
    Claim,
    Unclaim,
    /// The fleet's tables: fair shares, slots, overrides (the heartbeat
    /// answers as a ping).
    Fleet,
}

/// How a kind of call answers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Answer {
    /// As a store would: the memory store's math, the region records.
    #[default]
    Real,
    /// This error (after the call's delay).
    Fail(StoreError),
    /// Never.
    Hang,
}

/// A delay before a kind of call answers: for its first `calls` calls only
/// (`u64::MAX`: every call).
#[derive(Debug, Clone, Copy)]
struct Delay {
    ms: u64,
    calls: u64,
}

/// See the module documentation.
pub struct Scripted {
    memory: MemoryStore,
    answers: Mutex<HashMap<Call, Answer>>,
    delays: Mutex<HashMap<Call, Delay>>,
    /// Every acquire grants this instead of the memory store's answer.
    fixed_grant: Mutex<Option<Grant>>,
    pub acquires: AtomicU64,
    pub releases: AtomicU64,
    pub pings: AtomicU64,
    /// Heartbeats, and the live count they answer.
    pub heartbeats: AtomicU64,
    pub fleet: AtomicU64,
    /// Tokens granted, and tokens given back (by release or with an acquire).
    pub granted: AtomicU64,
    pub returned: AtomicU64,
    /// Tokens reserved (granted for later).
    pub reserved: AtomicU64,
    /// What each acquire asked for.
    pub wants: Mutex<Vec<u64>>,
    /// Every give-back (with an acquire or a release), in order.
    pub unspent: Mutex<Vec<Unspent>>,
    /// The primary's side: tokens a transfer may take, and what each
    /// transfer id was granted (a repeated id is answered the same and
    /// takes nothing).
    pub transferable: AtomicU64,
    pub transfers: Mutex<HashMap<u64, u64>>,
    /// Transfers that took tokens (first calls of an id).
    pub takes: AtomicU64,
    /// The requesting region's side: `key:window` claims held, claims
    /// dropped, and every credit (id, tokens, ttl_ms).
    pub claimed: Mutex<HashSet<String>>,
    pub unclaimed: Mutex<Vec<String>>,
    pub credits: Mutex<Vec<(u64, u64, u64)>>,
    /// Unexpired credit left to spend (credited tokens add to it).
    pub credit: AtomicU64,
    /// What `spend_credit` says of a pending transfer.
    pub pending: std::sync::atomic::AtomicBool,
}

impl Default for Scripted {
    fn default() -> Self {
        Scripted::with_memory(MemoryStore::new(10_000))
    }
}

impl Scripted {
    /// A store that answers at once, with the memory store's math on the
    /// wall clock.
    pub fn new() -> Scripted {
        Scripted::default()
    }

    /// The same, with the memory store on `clock` (a test's manual clock).
    pub fn with_clock(clock: Clock) -> Scripted {
        Scripted::with_memory(MemoryStore::with_clock(10_000, clock))
    }

    pub fn with_memory(memory: MemoryStore) -> Scripted {
        Scripted {
            memory,
            answers: Mutex::default(),
            delays: Mutex::default(),
            fixed_grant: Mutex::default(),
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            pings: AtomicU64::new(0),
            heartbeats: AtomicU64::new(0),
            fleet: AtomicU64::new(1),
            granted: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            wants: Mutex::default(),
            unspent: Mutex::default(),
            transferable: AtomicU64::new(0),
            transfers: Mutex::default(),
            takes: AtomicU64::new(0),
            claimed: Mutex::default(),
            unclaimed: Mutex::default(),
            credits: Mutex::default(),
            credit: AtomicU64::new(0),
            pending: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The memory store behind the real answers.
    pub fn memory(&self) -> &MemoryStore {
        &self.memory
    }

    /// From now on, `call`s answer `answer`.
    pub fn answer(&self, call: Call, answer: Answer) -> &Self {
        self.answers.lock().recover().insert(call, answer);
        self
    }

    /// Every kind of call answers `answer`: a store that is down
    /// ([`Answer::Fail`]), hung, or back ([`Answer::Real`]).
    pub fn all(&self, answer: Answer) -> &Self {
        for call in [
            Call::Acquire,
            Call::Release,
            Call::Ping,
            Call::TransferOut,
            Call::Credit,
            Call::SpendCredit,
            Call::Claim,
            Call::Unclaim,
        ] {
            self.answer(call, answer.clone());
        }
        self
    }

    /// `call`s answer `ms` late, like a store across a network.
    pub fn delay(&self, call: Call, ms: u64) -> &Self {
        self.delay_first(call, u64::MAX, ms)
    }

    /// Only the next `calls` of `call` answer `ms` late.
    pub fn delay_first(&self, call: Call, calls: u64, ms: u64) -> &Self {
        self.delays.lock().recover().insert(call, Delay { ms, calls });
        self
    }

    /// Every acquire grants `grant`, whatever was asked.
    pub fn grant_always(&self, grant: Grant) -> &Self {
        *self.fixed_grant.lock().recover() = Some(grant);
        self
    }

    /// What a call answers, and after how long; a first-`n` delay counts
    /// this call.
    fn script(&self, call: Call) -> (Answer, Duration) {
        let answer = self.answers.lock().recover().get(&call).cloned().unwrap_or_default();
        let mut delays = self.delays.lock().recover();
        let ms = match delays.get_mut(&call) {
            Some(d) if d.calls > 0 => {
                d.calls = d.calls.saturating_sub(u64::from(d.calls != u64::MAX));
                d.ms
            }
            _ => 0,
        };
        (answer, Duration::from_millis(ms))
    }

    /// The call's answer after its delay: `real` (run then) unless the
    /// script says to fail or hang.
    fn respond<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        real: impl FnOnce() -> Result<T, StoreError> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        let (answer, delay) = self.script(call);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match answer {
                Answer::Real => real(),
                Answer::Fail(e) => Err(e),
                Answer::Hang => std::future::pending().await,
            }
        })
    }

    /// Gives `unspent` back and grants, counting both.
    fn acquire_real(
        &self,
        key: &str,
        spec: &Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> Result<Grant, StoreError> {
        self.returned.fetch_add(unspent.tokens, Ordering::SeqCst);
        if unspent.tokens > 0 {
            self.unspent.lock().recover().push(unspent);
        }
        let fixed = *self.fixed_grant.lock().recover();
        let answer = match fixed {
            Some(g) => Ok(g),
            None if reserve => self.memory.reserve_now(key, spec, want, unspent),
            None => self.memory.acquire_now(key, spec, want, unspent),
        };
        if let Ok(g) = &answer {
            self.granted.fetch_add(g.granted, Ordering::SeqCst);
            self.reserved.fetch_add(g.reserved, Ordering::SeqCst);
        }
        answer
    }
}

impl QuotaStore for Scripted {
    /// Counted when asked, answered (and granted) after the delay;
    /// reserving or not, the same `Call`, counted alike.
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.wants.lock().recover().push(want);
        self.respond(Call::Acquire, move || {
            self.acquire_real(key, spec, want, unspent, reserve)
        })
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.respond(Call::Release, move || {
            self.returned.fetch_add(unspent.tokens, Ordering::SeqCst);
            self.unspent.lock().recover().push(unspent);
            self.memory.release_now(key, spec, unspent)
        })
    }

    fn name(&self) -> &'static str {
        "scripted"
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.pings.fetch_add(1, Ordering::SeqCst);
        self.respond(Call::Ping, || Ok(()))
    }
}

impl FleetTables for Scripted {
    /// Answers `fleet` live instances (1 unless a test set it), as a ping
    /// is answered.
    fn heartbeat(&self, _member: u64, _ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        let live = self.fleet.load(Ordering::SeqCst).max(1);
        self.respond(Call::Ping, move || Ok(live))
    }

    /// The memory store's tables, answered as scripted.
    fn fair_share<'a>(&'a self, d: super::Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.respond(Call::Fleet, move || Ok(self.memory.fair_share_now(d)))
    }

    fn hold_slots<'a>(&'a self, h: super::Hold<'a>) -> BoxFuture<'a, Result<super::Slots, StoreError>> {
        self.respond(Call::Fleet, move || Ok(self.memory.hold_slots_now(h)))
    }

    fn overrides<'a>(&'a self, op: super::OverrideOp<'a>) -> BoxFuture<'a, Result<super::Overridden, StoreError>> {
        self.respond(Call::Fleet, move || Ok(self.memory.overrides_now(op)))
    }

    /// One instance's fake: nobody else changes an override.
    fn watch_overrides(&self, _wake: std::sync::Arc<tokio::sync::Notify>) {}
}

impl RegionStore for Scripted {
    /// Takes the tokens at once (as a script that ran), answers after the
    /// delay.
    fn transfer_out<'a>(
        &'a self,
        _key: &'a str,
        _spec: &'a Spec,
        id: u64,
        want: u64,
        keep: u64,
        _remember_ms: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let granted = {
            let mut transfers = self.transfers.lock().recover();
            *transfers.entry(id).or_insert_with(|| {
                self.takes.fetch_add(1, Ordering::SeqCst);
                let have = self.transferable.load(Ordering::SeqCst);
                let g = have.saturating_sub(keep).min(want);
                self.transferable.fetch_sub(g, Ordering::SeqCst);
                g
            })
        };
        self.respond(Call::TransferOut, move || Ok(granted))
    }

    fn credit<'a>(
        &'a self,
        _key: &'a str,
        id: u64,
        tokens: u64,
        ttl_ms: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.respond(Call::Credit, move || {
            self.credits.lock().recover().push((id, tokens, ttl_ms));
            self.credit.fetch_add(tokens, Ordering::SeqCst);
            Ok(tokens)
        })
    }

    fn spend_credit<'a>(
        &'a self,
        _key: &'a str,
        want: u64,
        _period_ms: u64,
    ) -> BoxFuture<'a, Result<Credit, StoreError>> {
        self.respond(Call::SpendCredit, move || {
            let mut spent = 0;
            let _ = self.credit.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |have| {
                spent = have.min(want);
                Some(have - spent)
            });
            Ok(Credit {
                spent,
                left: self.credit.load(Ordering::SeqCst),
                pending: self.pending.load(Ordering::SeqCst),
                short: want - spent,
            })
        })
    }

    fn claim<'a>(&'a self, key: &'a str, window: u64, _ttl_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.respond(Call::Claim, move || {
            Ok(self.claimed.lock().recover().insert(format!("{key}:{window}")))
        })
    }

    fn unclaim<'a>(&'a self, key: &'a str, window: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        self.respond(Call::Unclaim, move || {
            let claim = format!("{key}:{window}");
            self.claimed.lock().recover().remove(&claim);
            self.unclaimed.lock().recover().push(claim);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::quota::{Algorithm, Rate};
    use crate::store::Acquire as _;

    fn spec() -> Spec {
        Spec::new(Algorithm::TokenBucket, "10/s".parse::<Rate>().unwrap(), 10)
    }

    #[tokio::test(start_paused = true)]
    async fn it_answers_as_scripted_and_counts_what_went_through() {
        let s = Scripted::new();
        let g = s.acquire("k", &spec(), 4, Unspent::default()).await.unwrap();
        assert_eq!(g.granted, 4);
        s.answer(Call::Acquire, Answer::Fail(StoreError::Unavailable("down".into())));
        assert!(s.acquire("k", &spec(), 1, Unspent::default()).await.is_err());
        s.answer(Call::Acquire, Answer::Real).delay_first(Call::Acquire, 1, 30);
        let started = tokio::time::Instant::now();
        s.acquire("k", &spec(), 1, Unspent::default()).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(30));
        let started = tokio::time::Instant::now();
        s.acquire("k", &spec(), 1, Unspent::default()).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO, "only the first call was late");
        s.answer(Call::Release, Answer::Hang);
        let hung = tokio::time::timeout(Duration::from_secs(60), s.release("k", &spec(), Unspent::default())).await;
        assert!(hung.is_err());
        assert_eq!(s.acquires.load(Ordering::SeqCst), 4);
        assert_eq!(s.granted.load(Ordering::SeqCst), 6);
        assert_eq!(*s.wants.lock().unwrap(), [4, 1, 1, 1]);
    }

    #[tokio::test]
    async fn its_region_calls_keep_claims_credit_and_transfers() {
        let s = Scripted::new();
        s.transferable.store(10, Ordering::SeqCst);
        assert_eq!(s.transfer_out("k", &spec(), 1, 6, 0, 0).await, Ok(6));
        assert_eq!(
            s.transfer_out("k", &spec(), 1, 6, 0, 0).await,
            Ok(6),
            "same id, same answer"
        );
        assert_eq!(s.transfer_out("k", &spec(), 2, 6, 0, 0).await, Ok(4));
        assert_eq!(s.takes.load(Ordering::SeqCst), 2);
        assert_eq!(s.claim("k", 7, 100).await, Ok(true));
        assert_eq!(s.claim("k", 7, 100).await, Ok(false));
        s.unclaim("k", 7).await.unwrap();
        assert_eq!(s.claim("k", 7, 100).await, Ok(true));
        assert_eq!(s.credit("k", 1, 5, 1_000).await, Ok(5));
        assert_eq!(
            s.spend_credit("k", 3, 1).await,
            Ok(Credit {
                spent: 3,
                left: 2,
                pending: false,
                short: 0
            })
        );
        assert_eq!(
            s.spend_credit("k", 3, 1).await,
            Ok(Credit {
                spent: 2,
                left: 0,
                pending: false,
                short: 1
            })
        );
    }
}
