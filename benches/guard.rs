//! What the store guard (deadline, breaker, store metrics) costs on the
//! happy path: a store call that answers at once, with and without the
//! guard, and a whole decision that must call the store (leases of one
//! token, so every request is a store call), with and without it. With
//! leased tokens at hand the store is not called at all, so the guard
//! costs nothing there by construction.
//!
//! Run: `cargo bench --bench guard`. Figures in docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use leasegate::clock::monotonic_clock;
use leasegate::limit::key::Facts;
use leasegate::limit::lease::Sizing;
use leasegate::limit::policy::{Limit, StoreFailure};
use leasegate::limit::{LimitRef, LimitRuntime, Limiter, Settings};
use leasegate::quota::Unspent;
use leasegate::quota::{Algorithm, Rate, Spec};
use leasegate::store::guard::{BreakerSettings, Guarded};
use leasegate::store::memory::MemoryStore;
use leasegate::store::{Acquire as _, FleetStore};
use leasegate::telemetry::metrics::Metrics;

/// Polls a future that must be ready at once.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store answers at once"),
    }
}

fn guarded(store: Arc<dyn FleetStore>) -> Arc<dyn FleetStore> {
    Arc::new(Guarded::new(
        store,
        Duration::from_millis(5),
        BreakerSettings {
            failures: 3,
            open_ms: 2_000,
        },
        monotonic_clock(),
        Arc::new(Metrics::new()),
    ))
}

fn limiter(store: Arc<dyn FleetStore>) -> Arc<Limiter> {
    let settings = Settings {
        sizing: Sizing {
            min: 1,
            max: 1,
            ..Sizing::default()
        },
        max_block_ms: 5_000,
        reserve: true,
        max_keys: 1_000_000,
        fleet_size: None,
        deadline_ms: 1_000,
    };
    Limiter::new(store, settings, monotonic_clock())
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let rate = Rate {
        count: 1_000_000_000,
        period: Duration::from_secs(1),
    };
    let spec = Spec::new(Algorithm::TokenBucket, rate, 1_000_000_000);

    let mut group = c.benchmark_group("store acquire");
    let plain: Arc<dyn FleetStore> = Arc::new(MemoryStore::new(1_000));
    let wrapped = guarded(Arc::new(MemoryStore::new(1_000)));
    group.bench_function("memory", |b| {
        b.iter(|| black_box(now(plain.acquire("rl:{k}", &spec, 1, Unspent::default()))))
    });
    group.bench_function("memory behind the guard", |b| {
        b.iter(|| black_box(now(wrapped.acquire("rl:{k}", &spec, 1, Unspent::default()))))
    });
    group.finish();

    let limit = Arc::new(Limit::try_new(leasegate::limit::policy::Draft::new("big", rate)).unwrap());
    let limit = Arc::new(LimitRuntime::new(limit, "bench", &Metrics::new()));
    let headers = HeaderMap::new();
    let facts = Facts {
        identity: "subnet:198.51.100.0/24",
        tenant: None,
        plan: None,
        rates: &[],
        route: "r",
        ip: "198.51.100.7".parse().unwrap(),
        headers: &headers,
    };
    let mut group = c.benchmark_group("decision, every request a store call");
    for (name, store) in [
        ("memory", Arc::new(MemoryStore::new(1_000)) as Arc<dyn FleetStore>),
        ("memory behind the guard", guarded(Arc::new(MemoryStore::new(1_000)))),
    ] {
        let l = limiter(store);
        group.bench_function(name, |b| {
            b.iter(|| {
                black_box(
                    now(l.check(&[LimitRef::new(&limit)], &[], &facts, StoreFailure::Allow))
                        .committed()
                        .refused_at()
                        .is_none(),
                )
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
