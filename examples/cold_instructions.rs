//! Instructions a decision on a cold key costs, leasegate's and governor's,
//! for callgrind: the decision bench's `100k keys` workload
//! (`benches/support/cold_keys.rs`, the same code), on a virtual clock.
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
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use governor::{Quota, RateLimiter};

#[path = "../benches/support/cold_keys.rs"]
mod cold_keys;
use cold_keys::{identities, setup, stride, KEYS};

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

/// Rounds over the keys before counting, at the same pace.
fn warm(decide: &mut dyn FnMut(&String) -> bool, ids: &[String]) {
    let mut i = 0;
    for _ in 0..WARM_ROUNDS * KEYS {
        NOW_NS.fetch_add(PACE_NS, Ordering::Relaxed);
        decide(&ids[stride(&mut i)]);
    }
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    let admitted = match which.as_str() {
        "leasegate" => {
            let ours = setup(Arc::new(|| NOW_NS.load(Ordering::Relaxed) / 1_000_000));
            let _guard = ours.rt.enter();
            let mut decide = |id: &String| ours.decide(id);
            warm(&mut decide, &ours.identities);
            run(&mut decide, &ours.identities)
        }
        "governor" => {
            let ids = identities();
            let g: governor::DefaultKeyedRateLimiter<String> = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
            // Keyed by `String`, as in the bench: no copy of the key a call.
            let mut decide = |id: &String| g.check_key(id).is_ok();
            warm(&mut decide, &ids);
            run(&mut decide, &ids)
        }
        _ => {
            eprintln!("usage: cold_instructions leasegate|governor");
            std::process::exit(2);
        }
    };
    println!("{which}: {admitted} of {COUNTED} decisions admitted");
}
