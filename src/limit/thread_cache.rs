//! A per-thread front for the lease table: the leases this thread decided
//! on lately, so a hot key's decision takes no lock and probes no map (on
//! the table alone, a shard's read lock is two atomic writes to a line every
//! worker deciding in that shard shares).
//!
//! Each thread keeps [`SLOTS`] leases, one per slot, the slot picked by the
//! key's hash. A key earns a slot by missing in it twice with no other miss
//! or hit there in between, so a stream of distinct keys (a flood of new
//! identities, a scan) never churns the leases kept here, nor does a key
//! that shares its slot with a kept key still in use; a hot key gets in on
//! its second decision.
//!
//! An entry is believed only while its lease is not evicted: the table
//! marks every lease it lets go of ([`Lease::evict`]), and a decision on an
//! evicted lease goes to the table instead. Leases kept here are counted
//! ([`Lease::held_near`]) so that the table and the sweep still tell a lease
//! nobody uses from one a store call holds ([`is_held`]). What a thread
//! keeps here is bounded by [`SLOTS`], and goes when the thread ends.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};

use super::lease::SharedLease;

/// Leases kept per thread.
pub const SLOTS: usize = 32;

/// A lease table's id: entries of one table are never taken for another's
/// (tests and tools run several limiters in one thread).
pub fn new_table_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether anyone but the table holds `lease`: a store call in flight,
/// a refill, a release. Threads' fronts do not count.
pub fn is_held(lease: &SharedLease) -> bool {
    // Both counts move in the order that errs towards "held": a front takes
    // the Arc before counting it and stops counting before dropping it.
    SharedLease::count(lease) > 1 + lease.held_near()
}

/// A lease kept in a thread's front, counted while kept.
struct Kept(SharedLease);

impl Kept {
    fn new(lease: SharedLease) -> Kept {
        lease.near_count(1);
        Kept(lease)
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.0.near_count(-1);
    }
}

#[derive(Default)]
struct Slot {
    /// (table id, key hash) of `lease`.
    key: (u64, u64),
    lease: Option<Kept>,
    /// The last key that missed here: a second miss in a row keeps it. A
    /// hit clears it, so a kept key still in use is never replaced by one
    /// missing between its hits (two keys of one slot would otherwise take
    /// turns, each swap two shared counts and an Arc's).
    candidate: Cell<(u64, u64)>,
}

thread_local! {
    static FRONT: RefCell<[Slot; SLOTS]> = RefCell::new(Default::default());
}

fn index(h: u64) -> usize {
    // The table picks its shard from the top bits; the slot from the low.
    (h as usize) % SLOTS
}

/// Runs `f` on the lease of (`table`, `h`) if this thread keeps it and it
/// was not evicted; `None` (and `f` not run) otherwise.
pub fn with<T>(table: u64, h: u64, f: impl FnOnce(&SharedLease) -> T) -> Option<T> {
    FRONT
        .try_with(|front| {
            let front = front.try_borrow().ok()?;
            let slot = &front[index(h)];
            let Kept(lease) = slot.lease.as_ref()?;
            if slot.key != (table, h) || lease.is_evicted() {
                return None;
            }
            slot.candidate.set((0, 0));
            Some(f(lease))
        })
        .ok()
        .flatten()
}

/// Whether the table should hand this thread the lease of (`table`, `h`),
/// which just missed here: true on its second miss in a row in its slot.
pub fn wants(table: u64, h: u64) -> bool {
    FRONT
        .try_with(|front| {
            let Ok(mut front) = front.try_borrow_mut() else {
                return false;
            };
            let slot = &mut front[index(h)];
            if slot.candidate.get() == (table, h) {
                return true;
            }
            slot.candidate.set((table, h));
            false
        })
        .unwrap_or(false)
}

/// Keeps `lease` as (`table`, `h`)'s in this thread, in place of what its
/// slot kept (dropped after the slot is let go of).
pub fn keep(table: u64, h: u64, lease: SharedLease) {
    let kept = Kept::new(lease);
    let previous = FRONT
        .try_with(|front| {
            let mut front = front.try_borrow_mut().ok()?;
            let slot = &mut front[index(h)];
            slot.key = (table, h);
            slot.candidate.set((0, 0));
            slot.lease.replace(kept)
        })
        .ok()
        .flatten();
    drop(previous);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::lease::Lease;

    #[test]
    fn a_key_is_kept_on_its_second_miss_and_dropped_once_evicted() {
        let table = new_table_id();
        let lease = SharedLease::new(Lease::new("k", 0));
        assert!(with(table, 7, |_| ()).is_none());
        assert!(!wants(table, 7), "first miss");
        assert!(wants(table, 7), "second miss in a row");
        keep(table, 7, lease.clone());
        assert_eq!(lease.held_near(), 1);
        assert!(!is_held(&lease), "kept in a front is not held");
        let extra = lease.clone();
        assert!(is_held(&lease), "a store call's clone is");
        drop(extra);
        assert_eq!(with(table, 7, |l| l.key().to_string()), Some("k".into()));
        // Another table, or another key in the same slot, is not this one.
        assert!(with(new_table_id(), 7, |_| ()).is_none());
        assert!(with(table, 7 + SLOTS as u64, |_| ()).is_none());
        lease.evict();
        assert!(with(table, 7, |_| ()).is_none(), "evicted: ask the table");
        // Replaced: the front lets go of it, and stops counting it.
        keep(table, 7 + SLOTS as u64, SharedLease::new(Lease::new("j", 0)));
        assert_eq!(lease.held_near(), 0);
        assert_eq!(SharedLease::count(&lease), 1);
    }

    #[test]
    fn a_kept_key_in_use_is_not_replaced_by_its_slot_mate() {
        let table = new_table_id();
        let (a, b) = (3, 3 + SLOTS as u64);
        let lease = SharedLease::new(Lease::new("a", 0));
        assert!(!wants(table, a));
        assert!(wants(table, a));
        keep(table, a, lease.clone());
        // b misses between a's hits: never twice in a row.
        for _ in 0..10 {
            assert!(!wants(table, b), "b is not kept while a is in use");
            assert!(with(table, a, |_| ()).is_some());
        }
        // Once a stops, b gets in.
        assert!(!wants(table, b));
        assert!(wants(table, b));
    }

    #[test]
    fn a_stream_of_distinct_keys_is_never_kept() {
        let table = new_table_id();
        for h in 0..10_000u64 {
            assert!(!wants(table, h * 7_919), "key {h}");
        }
    }
}
