//! The cost of a rate-limit decision with a leased token at hand, next to
//! the `governor` crate's keyed limiter on the same workloads:
//!
//! - one hot key, one thread;
//! - 100,000 distinct keys, one thread;
//! - one hot key, two threads at once;
//!
//! and, alone, the embedded store's grant that a lease's refill makes on
//! the same 100,000 keys (`embedded store, 100k keys`).
//!
//! Run: `cargo bench --bench decision`. Figures in docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use leasegate::clock::monotonic_clock;
use leasegate::quota::Rate;
use leasegate::store::memory::MemoryStore;

#[path = "support/cold_keys.rs"]
mod cold_keys;
use cold_keys::{setup, stride, KEYS};

/// The gateway's allocator (`src/main.rs`), for both limiters: where the
/// leases and governor's cells sit in memory is part of what a decision
/// on a cold key costs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn governor_keyed() -> governor::DefaultKeyedRateLimiter<String> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX))
}

fn bench(c: &mut Criterion) {
    let s = setup(monotonic_clock());
    // Background refills spawn onto this runtime from any thread.
    let handle = s.rt.handle().clone();
    let _guard = handle.enter();
    let g = governor_keyed();
    // Warm every key so each has a lease (and a governor cell).
    for id in &s.identities {
        for _ in 0..8 {
            s.decide(id);
        }
        let _ = g.check_key(id);
    }

    let mut group = c.benchmark_group("hot key");
    let hot = s.identities[0].clone();
    group.bench_function("leasegate", |b| b.iter(|| black_box(s.decide(black_box(&hot)))));
    group.bench_function("governor", |b| {
        b.iter(|| black_box(g.check_key(black_box(&hot)).is_ok()))
    });
    group.finish();
    interleaved(
        c,
        "hot key",
        || {
            black_box(s.decide(black_box(&hot)));
        },
        || {
            black_box(g.check_key(black_box(&hot)).is_ok());
        },
    );

    let mut group = c.benchmark_group("100k keys");
    let mut i = 0usize;
    group.bench_function("leasegate", |b| {
        b.iter(|| black_box(s.decide(&s.identities[stride(&mut i)])))
    });
    let mut j = 0usize;
    group.bench_function("governor", |b| {
        b.iter(|| black_box(g.check_key(&s.identities[stride(&mut j)]).is_ok()))
    });
    group.finish();
    // The same strides, taking turns (see `interleaved`).
    let (mut i, mut j) = (0usize, 0usize);
    interleaved(
        c,
        "100k keys",
        || {
            black_box(s.decide(&s.identities[stride(&mut i)]));
        },
        || {
            black_box(g.check_key(&s.identities[stride(&mut j)]).is_ok());
        },
    );

    let mut group = c.benchmark_group("hot key, 2 threads");
    let s = Arc::new(s);
    let g = Arc::new(g);
    group.bench_function("leasegate", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, {
                let s = s.clone();
                move || black_box(s.decide(&s.identities[0]))
            })
        })
    });
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, {
                let (g, s) = (g.clone(), s.clone());
                move || black_box(g.check_key(&s.identities[0]).is_ok())
            })
        })
    });
    group.finish();
}

/// `iters` runs of `f`, timed. Generic, not `dyn`: a call through a
/// pointer per iteration would add the same few nanoseconds to both
/// sides, and pull a ratio of 36 ns decisions towards 1.
fn time<F: FnMut()>(iters: u64, f: &mut F) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed()
}

/// Leasegate and governor taking turns on one workload: each criterion
/// sample times a slice of `ours`, then a slice of `theirs` as long (who
/// goes first alternating), so both see the same machine. Criterion alone
/// measures one after the other, seconds apart, and this guest drifts by
/// 20-30 % between them. Criterion reports leasegate's slices; this prints
/// both medians and the median ratio of the pairs with its spread. Under
/// criterion's filters and its test mode like any other benchmark.
fn interleaved(c: &mut Criterion, group: &str, mut ours: impl FnMut(), mut theirs: impl FnMut()) {
    let mut pairs: Vec<(f64, f64)> = Vec::new();
    let mut turn = false;
    let mut g = c.benchmark_group(group);
    g.bench_function("leasegate, interleaved with governor", |b| {
        b.iter_custom(|iters| {
            turn = !turn;
            let (a, b) = if turn {
                (time(iters, &mut ours), time(iters, &mut theirs))
            } else {
                let b = time(iters, &mut theirs);
                (time(iters, &mut ours), b)
            };
            // Criterion's warm-up starts from one iteration: too short a
            // slice to time.
            if iters >= 1_000 {
                let per = |d: Duration| d.as_nanos() as f64 / iters as f64;
                pairs.push((per(a), per(b)));
            }
            a
        })
    });
    g.finish();
    if pairs.is_empty() {
        return;
    }
    let quantile = |mut v: Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q) as usize]
    };
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
    println!(
        "{group}, interleaved: leasegate {:.1} ns, governor {:.1} ns; leasegate ÷ governor {:.2} \
         (p10 {:.2}, p90 {:.2}) over {} pairs",
        quantile(pairs.iter().map(|p| p.0).collect(), 0.5),
        quantile(pairs.iter().map(|p| p.1).collect(), 0.5),
        quantile(ratios.clone(), 0.5),
        quantile(ratios.clone(), 0.1),
        quantile(ratios, 0.9),
        pairs.len(),
    );
}

/// Wall time per decision with two threads deciding at once.
fn two_threads(iters: u64, f: impl Fn() -> bool + Send + Sync + Clone + 'static) -> Duration {
    let per = iters.div_ceil(2);
    let start = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let f = f.clone();
            let handle = tokio::runtime::Handle::current();
            std::thread::spawn(move || {
                let _guard = handle.enter();
                for _ in 0..per {
                    f();
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    // Two threads share the iterations: time per decision as a system.
    start.elapsed()
}

/// The embedded store's grant, as a lease's refill makes it, on the same
/// 100k keys' store keys (no governor: it has no store). `held`: a quota
/// the refills drain, so every key keeps its state; `churned`: a quota so
/// large that a bucket is whole again by its next refill, so its state is
/// swept and made anew each time (what most keys on a busy gateway do).
fn embedded_store(c: &mut Criterion) {
    use leasegate::quota::{Algorithm, Unspent};
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("rl:{{bench:subnet:10.{}.{}.0/24#{i}}}", i / 256 % 256, i % 256))
        .collect();
    let mut group = c.benchmark_group("embedded store, 100k keys");
    for (name, count) in [("held", 100), ("churned", 1_000_000_000)] {
        let store = MemoryStore::new(1_000_000);
        let rate = Rate {
            count,
            period: Duration::from_secs(1),
        };
        let spec = leasegate::quota::Spec::new(Algorithm::TokenBucket, rate, count);
        for k in &keys {
            store.acquire_now(k, &spec, 16, Unspent::default()).unwrap();
        }
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| black_box(store.acquire_now(&keys[stride(&mut i)], &spec, 16, Unspent::default())))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench, embedded_store
}
criterion_main!(benches);
