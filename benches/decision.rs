//! The cost of a rate-limit decision with a leased token at hand, next to
//! the `governor` crate's keyed limiter on the same workloads:
//!
//! - one hot key, one thread;
//! - 100,000 distinct keys, one thread;
//! - one hot key, two threads at once.
//!
//! Run: `cargo bench --bench decision`. Figures in docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::hint::black_box;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use http::HeaderMap;
use leasegate::clock::monotonic_clock;
use leasegate::config::Limit;
use leasegate::limit::key::Facts;
use leasegate::limit::lease::Sizing;
use leasegate::limit::{LimitRuntime, Limiter, Settings, Verdict};
use leasegate::metrics::Metrics;
use leasegate::quota::Rate;
use leasegate::store::memory::MemoryStore;

const KEYS: usize = 100_000;

/// Polls a future that is ready at once (a token at hand); falls back to
/// blocking only if it is not.
fn now<F: Future>(rt: &tokio::runtime::Runtime, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => rt.block_on(f),
    }
}

struct Setup {
    rt: tokio::runtime::Runtime,
    limiter: Arc<Limiter>,
    limits: Vec<Arc<LimitRuntime>>,
    identities: Vec<String>,
    headers: HeaderMap,
    ip: IpAddr,
}

fn setup() -> Setup {
    // A worker thread runs background refills, as in the gateway.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::new(1_000_000));
    let settings = Settings {
        sizing: Sizing::default(),
        max_block_ms: 5_000,
        max_keys: 1_000_000,
        fleet_size: 1,
        deadline_ms: 1_000,
    };
    let limiter = Limiter::new(store, settings, monotonic_clock());
    let rate = Rate {
        count: 1_000_000_000,
        period: Duration::from_secs(1),
    };
    let limit = Arc::new(Limit {
        burst: 1_000_000_000,
        ..Limit::new("bench", rate)
    });
    let limits = vec![Arc::new(LimitRuntime::new(limit, "bench", &Metrics::new()))];
    let identities = (0..KEYS)
        .map(|i| format!("subnet:10.{}.{}.0/24", i / 256 % 256, i % 256) + &format!("#{i}"))
        .collect();
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
    fn decide(&self, identity: &str) -> bool {
        let facts = Facts {
            identity,
            tenant: None,
            plan: None,
            route: "r",
            ip: self.ip,
            headers: &self.headers,
        };
        // As the gateway decides: from memory when it can, else the wait.
        let mut verdict = Verdict::default();
        if !self.limiter.try_check(&self.limits, &[0], &facts, &mut verdict) {
            verdict = now(&self.rt, self.limiter.check(&self.limits, &[0], &facts, true));
        }
        verdict.refused.is_none()
    }
}

fn governor_keyed() -> governor::DefaultKeyedRateLimiter<String> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX))
}

fn bench(c: &mut Criterion) {
    let s = setup();
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
    interleaved(&s, &g, &hot);

    let mut group = c.benchmark_group("100k keys");
    let mut i = 0usize;
    group.bench_function("leasegate", |b| {
        b.iter(|| {
            i = (i + 7_919) % KEYS; // a stride that visits every key
            black_box(s.decide(&s.identities[i]))
        })
    });
    let mut j = 0usize;
    group.bench_function("governor", |b| {
        b.iter(|| {
            j = (j + 7_919) % KEYS;
            black_box(g.check_key(&s.identities[j]).is_ok())
        })
    });
    group.finish();

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

/// The hot key again, leasegate and governor taking turns in short slices
/// (who goes first alternating), so both see the same machine: criterion
/// measures one after the other, seconds apart, and this guest drifts by
/// 20-30 % between them. Prints each one's median time per decision and the
/// median ratio with its spread. Runs unless a filter leaves it out; under
/// `cargo test` (`--test`), a few slices only.
fn interleaved(s: &Setup, g: &governor::DefaultKeyedRateLimiter<String>, hot: &String) {
    const NAME: &str = "hot key, interleaved";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if filter(&args).is_some_and(|f| !NAME.contains(f)) {
        return;
    }
    // As criterion: `cargo bench` passes `--bench`; without it (`cargo
    // test`) this is a smoke run.
    let (pairs, batch): (usize, u32) = if args.iter().any(|a| a == "--bench") {
        (301, 20_000)
    } else {
        (2, 10)
    };
    let ours = || {
        let t = Instant::now();
        for _ in 0..batch {
            black_box(s.decide(black_box(hot)));
        }
        t.elapsed().as_nanos() as f64 / f64::from(batch)
    };
    let theirs = || {
        let t = Instant::now();
        for _ in 0..batch {
            black_box(g.check_key(black_box(hot)).is_ok());
        }
        t.elapsed().as_nanos() as f64 / f64::from(batch)
    };
    let (mut l, mut r, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let (a, b) = if i % 2 == 0 {
            (ours(), theirs())
        } else {
            let b = theirs();
            (ours(), b)
        };
        l.push(a);
        r.push(b);
        ratio.push(a / b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (lm, rm, qm) = (median(&mut l), median(&mut r), median(&mut ratio));
    println!(
        "{NAME}: leasegate {lm:.1} ns, governor {rm:.1} ns; leasegate ÷ governor {qm:.2} \
         (p10 {:.2}, p90 {:.2}) over {pairs} slice pairs of {batch}",
        ratio[ratio.len() / 10],
        ratio[ratio.len() * 9 / 10],
    );
}

/// The benchmark filter among criterion's arguments: the first one that is
/// neither an option nor the value of one (`--sample-size 10`).
fn filter(args: &[String]) -> Option<&str> {
    const FLAGS: [&str; 13] = [
        "--bench",
        "--test",
        "--list",
        "--exact",
        "--verbose",
        "-v",
        "--quiet",
        "-n",
        "--noplot",
        "--discard-baseline",
        "--ignored",
        "--include-ignored",
        "--quick",
    ];
    let mut value_next = false;
    for a in args {
        if a.starts_with('-') {
            value_next = !FLAGS.contains(&a.as_str()) && !a.contains('=');
        } else if value_next {
            value_next = false;
        } else {
            return Some(a);
        }
    }
    None
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

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
