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

use http::Response;

use super::logged::Record;
use super::routed::{Routed, Served};
use super::Gateway;
use crate::limit::{Checked, LimitRef, Verdict};
use crate::proxy::body::Body;
use crate::runtime::facts;
use crate::sync::Recover as _;

/// Every line with someone in it.
#[derive(Default)]
pub struct Queues {
    /// By the key's hash as the limiter decided it.
    lines: Mutex<HashMap<u64, Arc<Line>>>,
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

/// The request path's side of the lines.
impl Gateway {
    /// Into the line: out of the way of every request that does not queue.
    #[cold]
    #[inline(never)]
    pub(super) fn queued<'a>(&'a self, r: Routed<'a>, verdict: Verdict<'a>, ticket: Ticket<'a>) -> Served<'a> {
        // Its tokens go back now: it takes them again in line.
        drop(verdict);
        Served::Later(Box::pin(self.wait_in_line(r, ticket)))
    }

    /// The queue of the limit that refused `verdict`, when it has one and
    /// the token comes within its `queue_ms`.
    pub(super) fn ticket<'a>(&self, verdict: &Verdict<'a>) -> Option<Ticket<'a>> {
        let refused = verdict.refused()?;
        let limit = &refused.limit.get().config;
        if limit.queue_ms == 0 || refused.retry_after_ms > limit.queue_ms {
            return None;
        }
        // The key's hash as the limiter decided it names the line: the
        // limit, the key's parts and its shard.
        Some(Ticket {
            line: refused.key_hash,
            limit: refused.limit,
            queue_ms: limit.queue_ms,
            queue_max: limit.queue_max as usize,
        })
    }

    /// Waits in the line of the ticket's key, in arrival order: the head asks
    /// the limiter again when its refusal said a token would come, until it
    /// is admitted or the token would come after `queue_ms`; then the
    /// request is decided on the last verdict (a refusal has its usual
    /// headers), never queued again.
    async fn wait_in_line<'a>(&'a self, r: Routed<'a>, t: Ticket<'a>) -> (Response<Body>, Record) {
        let started = std::time::Instant::now();
        let deadline = started + std::time::Duration::from_millis(t.queue_ms);
        let place = self.queues.join(t.line, t.queue_max);
        let turn = match &place {
            Some(p) => Some(p.line.turn.lock().await),
            None => None,
        };
        let verdict = loop {
            let mut v = Verdict::default();
            let v = match self.decide_now(&r, &mut v) {
                Checked::Decided => v,
                Checked::NeedsStore(pending) => self.decide_later(&r, v, pending).await,
            };
            let due = match v.refused() {
                Some(lv) if lv.limit == t.limit && place.is_some() => lv.retry_after_ms,
                _ => break v,
            };
            let at = std::time::Instant::now() + std::time::Duration::from_millis(due.max(1));
            if at > deadline {
                break v;
            }
            drop(v);
            let sleep = tokio::time::sleep_until(at.into());
            // A concurrency limit's slot may come back here before the
            // retry: the head takes it at once.
            if t.limit.spec.algorithm == crate::quota::Algorithm::Concurrency {
                let facts = facts(r.route, &r.identity, r.req.headers());
                let freed = self.runtime.limiter.slot_freed(&t.limit, &facts);
                tokio::select! {
                    _ = sleep => {}
                    _ = freed => {}
                }
            } else {
                sleep.await;
            }
        };
        self.runtime
            .metrics
            .queue_wait
            .get_or_create(&crate::telemetry::metrics::LimitLabels {
                limit: t.limit.config.name.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        // The next in line goes as soon as this one is decided.
        drop(turn);
        drop(place);
        match self.decided(r, verdict, false) {
            Served::Now(resp, record) => (resp, record),
            Served::Later(wait) => wait.await,
        }
    }
}

/// Where a refused request waits: its (limit, key)'s line.
pub(super) struct Ticket<'a> {
    line: u64,
    limit: LimitRef<'a>,
    queue_ms: u64,
    queue_max: usize,
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
