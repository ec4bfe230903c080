//! Waiting instead of refusing: a request that a limit with `queue_ms`
//! would refuse waits in that key's line, in arrival order, for a token.
//!
//! One line per (limit, key) with requests waiting, made by the first and
//! gone with the last. The head of the line alone asks the limiter again,
//! when the refusal said a token would be there (its exact `Retry-After`,
//! from the lease: a reservation coming due, or the end of a local block),
//! so a waiting request costs no store call of its own: the ones behind
//! the head sleep on the line's turn, not on the store. A request that
//! would wait past `queue_ms`, or finds `queue_max` waiting, is refused
//! with the headers a refusal has without a queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::Recover as _;

/// Every line with someone in it.
#[derive(Default)]
pub struct Queues {
    lines: Mutex<HashMap<u64, Arc<Line>>>,
    hasher: std::collections::hash_map::RandomState,
}

/// One key's line: its turn (tokio's mutex serves waiters first come, first
/// served) and how many are in it.
#[derive(Default)]
pub struct Line {
    pub turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
}

/// A request's place in a line; leaving (drop) empties the line's slot.
pub struct Place<'q> {
    queues: &'q Queues,
    key: u64,
    pub line: Arc<Line>,
}

impl Queues {
    /// The line of limit `limit`'s store key `key`.
    pub fn line_of(&self, limit: usize, key: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((limit, key))
    }

    /// A place in the line of `key`, unless `max` are in it already.
    pub fn join(&self, key: u64, max: usize) -> Option<Place<'_>> {
        let mut lines = self.lines.lock().recover();
        let line = lines.entry(key).or_default().clone();
        if line.waiting.load(Ordering::Relaxed) >= max {
            return None;
        }
        line.waiting.fetch_add(1, Ordering::Relaxed);
        Some(Place {
            queues: self,
            key,
            line,
        })
    }

    /// Lines with someone in them.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lines.lock().recover().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut lines = self.queues.lines.lock().recover();
        if self.line.waiting.fetch_sub(1, Ordering::Relaxed) == 1 {
            lines.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_at_most_max_and_goes_with_its_last() {
        let q = Queues::default();
        let a = q.join(7, 2).unwrap();
        let b = q.join(7, 2).unwrap();
        assert!(q.join(7, 2).is_none(), "a third past queue_max");
        assert!(Arc::ptr_eq(&a.line, &b.line));
        let other = q.join(8, 2).unwrap();
        assert_eq!(q.len(), 2);
        drop((a, other));
        assert_eq!(q.len(), 1);
        let c = q.join(7, 2).unwrap();
        drop((b, c));
        assert!(q.is_empty(), "no line left behind");
    }

    #[tokio::test]
    async fn turns_are_taken_in_arrival_order() {
        let q = Arc::new(Queues::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = q.join(1, 10).unwrap();
        let head = first.line.turn.lock().await;
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (q, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let place = q.join(1, 10).unwrap();
                let _turn = place.line.turn.lock().await;
                order.lock().unwrap().push(i);
            }));
            // Each in line before the next arrives.
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(head);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        drop(first);
        assert!(q.is_empty());
    }
}
