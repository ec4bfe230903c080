//! Refused keys whose lease the sweeper forgot while their over-quota
//! window was still open: kept, in a small bounded table, so the status
//! page's most-limited keys stay for their window (one period of their
//! quota) as it promises, not only as long as their lease lives (a few
//! seconds after the last store call).
//!
//! Written by the sweeper only (never on a request's path), read by the
//! status page. At most [`KEPT`] keys: a new one displaces the one with
//! the fewest refusals.

use std::sync::{Arc, Mutex};

use crate::sync::Recover;

/// Keys kept at most: the status page's list is shorter.
pub const KEPT: usize = super::report::MAX_HOT_KEYS;

#[derive(Debug, Clone)]
struct Entry {
    key: Arc<str>,
    refusals: u64,
    /// When the key's over-quota window closes, ms.
    until_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct Forgotten {
    entries: Mutex<Vec<Entry>>,
}

impl Forgotten {
    /// Keeps `key`, refused `refusals` times in a window that closes at
    /// `until_ms`; forgets windows closed by `now_ms`.
    pub(super) fn keep(&self, key: Arc<str>, refusals: u64, until_ms: u64, now_ms: u64) {
        let mut entries = self.entries.lock().recover();
        entries.retain(|e| e.until_ms > now_ms && e.key != key);
        entries.push(Entry {
            key,
            refusals,
            until_ms,
        });
        if entries.len() > KEPT {
            if let Some(fewest) = (0..entries.len()).min_by_key(|&i| entries[i].refusals) {
                entries.swap_remove(fewest);
            }
        }
    }

    /// The keys whose window is still open at `now_ms`, with their
    /// refusals.
    pub(super) fn open(&self, now_ms: u64) -> Vec<(Arc<str>, u64)> {
        let entries = self.entries.lock().recover();
        entries
            .iter()
            .filter(|e| e.until_ms > now_ms)
            .map(|e| (e.key.clone(), e.refusals))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_for_their_window_and_the_fewest_refusals_go_first() {
        let f = Forgotten::default();
        f.keep("a".into(), 3, 1_000, 0);
        f.keep("b".into(), 1, 2_000, 0);
        assert_eq!(f.open(999).len(), 2);
        assert_eq!(f.open(1_000), vec![("b".into(), 1)]);
        for i in 0..KEPT as u64 {
            f.keep(format!("k{i}").into(), 10 + i, 5_000, 0);
        }
        let open = f.open(0);
        assert_eq!(open.len(), KEPT);
        assert!(open.iter().all(|(k, _)| &**k != "b"), "the fewest refusals went");
        // Kept again: one entry, the latest count.
        f.keep("k0".into(), 50, 5_000, 0);
        assert_eq!(f.open(0).iter().filter(|(k, _)| &**k == "k0").count(), 1);
    }
}
