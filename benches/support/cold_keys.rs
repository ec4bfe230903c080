//! The decision bench's 100k-key workload (`benches/decision.rs`), shared
//! with `examples/cold_instructions.rs` so that both count the same
//! decision: the limiter as the gateway sets it for the memory store,
//! one limit every request passes, 100 000 identities and the stride
//! that visits them. Included by `#[path]`: not a target of its own.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::HeaderMap;
use leasegate::clock::Clock;
use leasegate::limit::key::Facts;
use leasegate::limit::lease::{Lease, SharedLease, Sizing};
use leasegate::limit::policy::{Draft, Limit, StoreFailure};
use leasegate::limit::{Checked, LimitRef, LimitRuntime, Limiter, Settings, Verdict};
use leasegate::quota::Rate;
use leasegate::store::memory::MemoryStore;
use leasegate::telemetry::metrics::Metrics;

pub const KEYS: usize = 100_000;

/// Polls a future that is ready at once (a token at hand); falls back to
/// blocking only if it is not.
fn now<F: Future>(rt: &tokio::runtime::Runtime, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => rt.block_on(f),
    }
}

pub struct Setup {
    pub rt: tokio::runtime::Runtime,
    limiter: Arc<Limiter>,
    limits: Vec<Arc<LimitRuntime>>,
    pub identities: Vec<String>,
    headers: HeaderMap,
    ip: IpAddr,
}

/// The `KEYS` identities, as the subnet tier names clients.
pub fn identities() -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("subnet:10.{}.{}.0/24", i / 256 % 256, i % 256) + &format!("#{i}"))
        .collect()
}

/// What the bench measures holds: a lease and its count are one cache
/// line under the gateway's allocator (mimalloc aligns its 64-byte blocks
/// to 64; `Lease`'s docs). Under another, a lease may straddle two lines.
fn leases_are_one_line_each() {
    let leases: Vec<SharedLease> = (0..1_000).map(|i| SharedLease::new(Lease::new("k", i))).collect();
    for l in &leases {
        let at = triomphe::Arc::heap_ptr(l) as usize;
        assert_eq!(at % 64, 0, "a lease at {at:#x} straddles two cache lines");
    }
}

/// The limiter on the memory store, its clock `clock`, and the workload.
pub fn setup(clock: Clock) -> Setup {
    leases_are_one_line_each();
    // A worker thread runs background refills, as in the gateway.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::new(1_000_000));
    // As the gateway sets it for the memory store (`Config::limiter_settings`).
    let settings = Settings {
        sizing: Sizing::default().embedded(),
        max_block_ms: 5_000,
        reserve: true,
        max_keys: 1_000_000,
        fleet_size: None,
        deadline_ms: 1_000,
    };
    let limiter = Limiter::new(store, settings, clock);
    let rate = Rate {
        count: 1_000_000_000,
        period: Duration::from_secs(1),
    };
    let limit = Arc::new(
        Limit::try_new(Draft {
            burst: 1_000_000_000,
            ..Draft::new("bench", rate)
        })
        .unwrap(),
    );
    let limits = vec![Arc::new(LimitRuntime::new(limit, "bench", &Metrics::new()))];
    let identities = identities();
    Setup {
        rt,
        limiter,
        limits,
        identities,
        headers: HeaderMap::new(),
        ip: "10.0.0.1".parse().unwrap(),
    }
}

impl Setup {
    pub fn decide(&self, identity: &str) -> bool {
        let facts = Facts {
            identity,
            tenant: None,
            plan: None,
            rates: &[],
            route: "r",
            ip: self.ip,
            headers: &self.headers,
        };
        // As the gateway decides: from memory when it can, else the wait.
        let mut verdict = Verdict::default();
        let limits = [LimitRef::new(&self.limits[0])];
        if let Checked::NeedsStore(pending) = self.limiter.try_check(&limits, &[], &facts, &mut verdict) {
            verdict = now(
                &self.rt,
                self.limiter
                    .resume(verdict, pending, &limits, &[], &facts, StoreFailure::Allow),
            );
        }
        verdict.commit();
        verdict.refused_at().is_none()
    }
}

/// The next of the 100k keys: a stride prime to `KEYS` visits every key,
/// each once in `KEYS` steps, in an order no cache line predicts.
pub fn stride(i: &mut usize) -> usize {
    *i = (*i + 7_919) % KEYS;
    *i
}
