//! Instructions a decision on a cold key costs, leasegate's and governor's,
//! for callgrind: the decision bench's `100k keys` workload (the same
//! limiter settings, limit, identities and stride), on a virtual clock.
//!
//!   cargo build --profile bench --example cold_instructions
//!   valgrind --tool=callgrind --toggle-collect='cold_instructions::run' \
//!     target/release/examples/cold_instructions leasegate   # or governor
//!   callgrind_annotate --inclusive=yes callgrind.out.<pid>
//!
//! Then divide `cold_instructions::run`'s instructions by the decisions it
//! prints. Under callgrind a program runs some fifty times slower, so on
//! the bench's real clock every lease would expire between two visits of
//! its key: here the clock moves 400 ns a decision, the bench's pace, and
//! twenty rounds over the keys before the twenty counted ones bring each
//! lease's size to what steady visits make it.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use http::HeaderMap;
use leasegate::limit::key::Facts;
use leasegate::limit::lease::Sizing;
use leasegate::limit::policy::{Draft, Limit, StoreFailure};
use leasegate::limit::{Checked, LimitRef, LimitRuntime, Limiter, Settings, Verdict};
use leasegate::quota::Rate;
use leasegate::store::memory::MemoryStore;
use leasegate::telemetry::metrics::Metrics;

const KEYS: usize = 100_000;
/// Rounds over every key before counting.
const WARM_ROUNDS: usize = 20;
/// Decisions counted: twenty rounds, each key visited as often as a
/// steady lease of the embedded store refills about once (one in ~19).
const COUNTED: usize = 20 * KEYS;
/// Virtual nanoseconds a decision.
const PACE_NS: u64 = 400;

/// The gateway's allocator, as in the bench.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The virtual clock, ns.
static NOW_NS: AtomicU64 = AtomicU64::new(1_000_000_000_000);

type Governor = governor::DefaultKeyedRateLimiter<String>;

struct Ours {
    rt: tokio::runtime::Runtime,
    limiter: Arc<Limiter>,
    limits: Vec<Arc<LimitRuntime>>,
    headers: HeaderMap,
}

impl Ours {
    fn new() -> Ours {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // As the bench (and the gateway, for the memory store) sets it.
        let settings = Settings {
            sizing: Sizing::default().embedded(),
            max_block_ms: 5_000,
            reserve: true,
            max_keys: 1_000_000,
            fleet_size: None,
            deadline_ms: 1_000,
        };
        let clock = Arc::new(|| NOW_NS.load(Ordering::Relaxed) / 1_000_000);
        let limiter = Limiter::new(Arc::new(MemoryStore::new(1_000_000)), settings, clock);
        let rate = Rate {
            count: 1_000_000_000,
            period: Duration::from_secs(1),
        };
        let limit = Limit::try_new(Draft {
            burst: 1_000_000_000,
            ..Draft::new("bench", rate)
        })
        .unwrap();
        let limits = vec![Arc::new(LimitRuntime::new(Arc::new(limit), "bench", &Metrics::new()))];
        Ours {
            rt,
            limiter,
            limits,
            headers: HeaderMap::new(),
        }
    }

    /// As the bench decides: from memory when it can, else the wait.
    #[inline(never)]
    fn decide(&self, identity: &str) -> bool {
        let facts = Facts {
            identity,
            tenant: None,
            plan: None,
            rates: &[],
            route: "r",
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            headers: &self.headers,
        };
        let limits = [LimitRef::new(&self.limits[0])];
        let mut verdict = Verdict::default();
        if let Checked::NeedsStore(pending) = self.limiter.try_check(&limits, &[], &facts, &mut verdict) {
            let wait = self
                .limiter
                .resume(verdict, pending, &limits, &[], &facts, StoreFailure::Allow);
            verdict = self.rt.block_on(wait);
        }
        verdict.commit();
        verdict.refused_at().is_none()
    }
}

/// The bench's stride: every key once in `KEYS` steps.
fn stride(i: &mut usize) -> usize {
    *i = (*i + 7_919) % KEYS;
    *i
}

/// The counted decisions (callgrind's `--toggle-collect`). Admitted count.
#[inline(never)]
fn run(decide: &mut dyn FnMut(&String) -> bool, ids: &[String]) -> usize {
    let mut i = 0;
    let mut admitted = 0;
    for _ in 0..COUNTED {
        NOW_NS.fetch_add(PACE_NS, Ordering::Relaxed);
        admitted += usize::from(decide(&ids[stride(&mut i)]));
    }
    black_box(admitted)
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let ids: Vec<String> = (0..KEYS)
        .map(|i| format!("subnet:10.{}.{}.0/24", i / 256 % 256, i % 256) + &format!("#{i}"))
        .collect();
    let warm = |decide: &mut dyn FnMut(&String) -> bool| {
        let mut i = 0;
        for _ in 0..WARM_ROUNDS * KEYS {
            NOW_NS.fetch_add(PACE_NS, Ordering::Relaxed);
            decide(&ids[stride(&mut i)]);
        }
    };
    let admitted = match which.as_str() {
        "leasegate" => {
            let ours = Ours::new();
            let _guard = ours.rt.enter();
            let mut decide = |id: &String| ours.decide(id);
            warm(&mut decide);
            run(&mut decide, &ids)
        }
        "governor" => {
            let g: Governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
            // Keyed by `String`, as in the bench: no copy of the key a call.
            let mut decide = |id: &String| g.check_key(id).is_ok();
            warm(&mut decide);
            run(&mut decide, &ids)
        }
        _ => {
            eprintln!("usage: cold_instructions leasegate|governor");
            std::process::exit(2);
        }
    };
    println!("{which}: {admitted} of {COUNTED} decisions admitted");
}
