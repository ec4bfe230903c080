//! One shard of the memory store: its slots, the index that finds them by
//! their key's hash, the idle sweep and the cap's sampled-LRU eviction.
//! The caller holds the shard's lock and hashes the key once
//! ([`super::MemoryStore`]); nothing here hashes or allocates a key but
//! a new slot's.

use crate::int_hash::within_shard as spread;
use crate::quota::{self, Spec, State};

/// Candidates sampled for each eviction at a full shard.
const SAMPLE: usize = 16;

struct Slot {
    key: Box<str>,
    /// The key's hash, as [`super::MemoryStore`] made it: the index finds
    /// slots by it, and moves them without reading or hashing the key.
    hash: u64,
    spec: Spec,
    state: State,
    used_ms: u64,
}

#[derive(Default)]
pub(super) struct Shard {
    /// The slots' positions, by their key's hash.
    index: hashbrown::HashTable<u32>,
    slots: Vec<Slot>,
    rng: u64,
    /// The slot the sweep looks at next.
    cursor: usize,
}

impl Shard {
    /// An empty shard whose eviction sampling starts from `rng` (not 0).
    pub(super) fn seeded(rng: u64) -> Shard {
        Shard {
            rng,
            ..Shard::default()
        }
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    fn random(&mut self) -> usize {
        // xorshift: cheap, and only used to pick eviction candidates.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % self.slots.len().max(1) as u64) as usize
    }

    /// The position of `key`'s slot (`h` its hash), if it has one.
    pub(super) fn find(&self, key: &str, h: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(spread(h), |&i| {
                slots
                    .get(i as usize)
                    .is_some_and(|slot| slot.hash == h && &*slot.key == key)
            })
            .map(|&i| i as usize)
    }

    /// Drops slot `i`; the last slot takes its place. The index is
    /// updated by the slots' stored hashes and positions: no key is read.
    pub(super) fn remove(&mut self, i: usize) {
        let gone = self.slots.swap_remove(i);
        if let Ok(entry) = self.index.find_entry(spread(gone.hash), |&j| j as usize == i) {
            entry.remove();
        }
        if let Some(moved) = self.slots.get(i) {
            let from = self.slots.len() as u32;
            if let Some(at) = self.index.find_mut(spread(moved.hash), |&j| j == from) {
                *at = i as u32;
            }
        }
    }

    /// Drops the next slot in turn if it is idle: idle state leaves at the
    /// rate new state arrives, and every slot is looked at once in as
    /// many calls as the shard holds keys. In turn rather than at random,
    /// so the slots are read in the order they sit in memory.
    fn sweep(&mut self, now_ms: u64) {
        if self.slots.is_empty() {
            return;
        }
        if self.cursor >= self.slots.len() {
            self.cursor = 0;
        }
        let i = self.cursor;
        if quota::is_idle(&self.slots[i].state, &self.slots[i].spec, now_ms) {
            // The last slot moves here: the next sweep looks at it.
            self.remove(i);
        } else {
            self.cursor += 1;
        }
    }

    /// Makes room for one more key when at `cap`.
    fn make_room(&mut self, cap: usize) {
        while self.slots.len() >= cap && !self.slots.is_empty() {
            let mut victim = self.random();
            for _ in 1..SAMPLE {
                let i = self.random();
                if self.slots[i].used_ms < self.slots[victim].used_ms {
                    victim = i;
                }
            }
            self.remove(victim);
        }
    }

    /// Applies `f` to `key`'s state (`None` for a key without a slot) and
    /// keeps what it returns, making a slot unless the result is idle.
    /// `h` is the key's hash; each call first sweeps one slot.
    pub(super) fn update(
        &mut self,
        key: &str,
        h: u64,
        spec: &Spec,
        now_ms: u64,
        cap: usize,
        f: impl FnOnce(Option<State>) -> State,
    ) {
        self.sweep(now_ms);
        if let Some(i) = self.find(key, h) {
            self.apply(i, spec, now_ms, f);
            return;
        }
        let state = f(None);
        if quota::is_idle(&state, spec, now_ms) {
            return; // a full bucket needs no memory
        }
        self.make_room(cap);
        let Shard { index, slots, .. } = self;
        index.insert_unique(spread(h), slots.len() as u32, |&j| {
            slots.get(j as usize).map_or(0, |slot| spread(slot.hash))
        });
        slots.push(Slot {
            key: key.into(),
            hash: h,
            spec: *spec,
            state,
            used_ms: now_ms,
        });
    }

    /// [`Shard::update`] for a key that has a slot; nothing for one that
    /// has none (it was idle: a full bucket, an empty window). One
    /// lookup, after the sweep (which may move slots).
    pub(super) fn update_held(
        &mut self,
        key: &str,
        h: u64,
        spec: &Spec,
        now_ms: u64,
        f: impl FnOnce(Option<State>) -> State,
    ) {
        self.sweep(now_ms);
        if let Some(i) = self.find(key, h) {
            self.apply(i, spec, now_ms, f);
        }
    }

    fn apply(&mut self, i: usize, spec: &Spec, now_ms: u64, f: impl FnOnce(Option<State>) -> State) {
        let slot = &mut self.slots[i];
        // quota:: treats a state of another algorithm as absent.
        slot.state = f(Some(slot.state));
        slot.spec = *spec;
        slot.used_ms = now_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::spec;
    use super::*;

    #[test]
    fn the_sweep_looks_at_every_slot_once_in_as_many_calls() {
        let (kept, brief) = (spec(100, 3600), spec(1, 1));
        let h = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut shard = Shard::default();
        for i in 0..100u64 {
            let s = if i % 2 == 0 { kept } else { brief };
            shard.update(&format!("k{i}"), h(i), &s, 1_000, 1_000, |prior| {
                quota::acquire(prior, &s, 1_000, 1).0
            });
        }
        assert_eq!(shard.slots.len(), 100);
        // The brief keys are idle two seconds on: a hundred calls find
        // all fifty (a random pick per call would miss about a third).
        for _ in 0..100 {
            shard.sweep(3_000);
        }
        assert_eq!(shard.slots.len(), 50);
        for i in 0..100u64 {
            assert_eq!(shard.find(&format!("k{i}"), h(i)).is_some(), i % 2 == 0, "k{i}");
        }
        assert_eq!(shard.index.len(), 50, "one index entry a slot");
    }
}
