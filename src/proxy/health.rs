//! Passive health: a target that fails `eject_after` times in a row
//! (refused or timed-out connects, failed TLS handshakes, a broken
//! exchange, `502`/`503`/`504`) leaves the rotation for a backoff that
//! doubles with each ejection in a row, up to a cap; once it is over, one
//! trial request decides whether it is back. The last target in the
//! rotation is never ejected: with every target failing, refusing them
//! all would only turn the upstream's errors into the gateway's.
//!
//! State is a few atomics per target, shared by every worker thread:
//! a success on a healthy target costs one load.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// `health = { ... }` of an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActiveCheck {
    /// Path (and query) asked for, `GET`.
    pub path: http::uri::PathAndQuery,
    pub interval: Duration,
    /// For the whole check: connect, request and response head.
    pub timeout: Duration,
    /// Failed checks in a row that take a target out.
    pub unhealthy: u32,
    /// Passed checks in a row that bring it back.
    pub healthy: u32,
}

/// `eject_after` and `eject_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ejection {
    /// Failures in a row that eject a target; 0: never.
    pub after: u32,
    /// The first ejection's length; each one in a row doubles it.
    pub first: Duration,
}

impl Default for Ejection {
    fn default() -> Self {
        Ejection {
            after: 5,
            first: Duration::from_secs(10),
        }
    }
}

impl Ejection {
    /// The longest ejection: Envoy's `max_ejection_time` default, or the
    /// first one if that is longer.
    pub fn cap_ms(&self) -> u64 {
        (self.first.as_millis() as u64).max(300_000)
    }

    /// The `n`th ejection in a row's length (n ≥ 1).
    fn backoff_ms(&self, n: u32) -> u64 {
        let first = self.first.as_millis() as u64;
        first
            .saturating_mul(1u64 << n.saturating_sub(1).min(32))
            .min(self.cap_ms())
    }
}

/// One target's health.
#[derive(Debug, Default)]
pub struct Health {
    /// Failures in a row while in the rotation.
    failures: AtomicU32,
    /// 0: in the rotation; else out until then (coarse ms), and then due
    /// a trial.
    out_until_ms: AtomicU64,
    /// Ejections in a row, for the doubling.
    ejections: AtomicU32,
    /// When the trial request now out was sent (0: none).
    trial_ms: AtomicU64,
    /// When it last came back into the rotation: a target that stayed
    /// healthy for a whole cap starts its doubling again.
    back_ms: AtomicU64,
    /// Out by its active health checks (`health = { ... }`).
    active_down: AtomicBool,
}

/// How a request to a target went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

/// A change of a target's place in the rotation, for its gauge and log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Ejected { for_ms: u64 },
    Restored,
}

/// Whether a request may go to a target now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Yes, as the one trial after an ejection.
    Trial,
    No,
}

impl Health {
    /// Whether a request may go to the target at `now`; takes the trial
    /// when one is due. A trial not reported within `stale_ms` (the
    /// request was dropped) is given to the next request.
    pub fn admit(&self, now: u64, stale_ms: u64) -> Admit {
        let until = self.out_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return Admit::Yes;
        }
        if now < until {
            return Admit::No;
        }
        let trial = self.trial_ms.load(Ordering::Relaxed);
        if trial != 0 && now.saturating_sub(trial) < stale_ms {
            return Admit::No;
        }
        match self
            .trial_ms
            .compare_exchange(trial, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Admit::Trial,
            Err(_) => Admit::No,
        }
    }

    pub fn in_rotation(&self) -> bool {
        self.out_until_ms.load(Ordering::Relaxed) == 0
    }

    /// Out by its active health checks.
    pub fn actively_down(&self) -> bool {
        self.active_down.load(Ordering::Relaxed)
    }

    /// Sets the active checks' verdict; whether it changed.
    pub fn set_actively_down(&self, down: bool) -> bool {
        self.active_down.swap(down, Ordering::Relaxed) != down
    }

    /// Records how a request went. `out`: the upstream's count of targets
    /// out of the rotation, `targets` its number of targets: a target is
    /// ejected only if another stays in.
    pub fn report(
        &self,
        outcome: Outcome,
        now: u64,
        policy: &Ejection,
        out: &AtomicUsize,
        targets: usize,
    ) -> Option<Change> {
        let until = self.out_until_ms.load(Ordering::Relaxed);
        if until != 0 {
            // Out of the rotation: only the trial's outcome counts (a
            // request picked before the ejection may still report).
            if self.trial_ms.load(Ordering::Relaxed) == 0 {
                return None;
            }
            self.trial_ms.store(0, Ordering::Relaxed);
            return match outcome {
                Outcome::Success => {
                    self.failures.store(0, Ordering::Relaxed);
                    self.back_ms.store(now, Ordering::Relaxed);
                    self.out_until_ms.store(0, Ordering::Relaxed);
                    out.fetch_sub(1, Ordering::AcqRel);
                    Some(Change::Restored)
                }
                Outcome::Failure => {
                    let n = self.ejections.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                    let for_ms = policy.backoff_ms(n);
                    self.out_until_ms
                        .store(now.saturating_add(for_ms).max(1), Ordering::Relaxed);
                    Some(Change::Ejected { for_ms })
                }
            };
        }
        match outcome {
            Outcome::Success => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
                None
            }
            Outcome::Failure => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                if policy.after == 0 || failures < policy.after {
                    return None;
                }
                // Never the last target in the rotation.
                let taken = out.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |o| {
                    (o.saturating_add(1) < targets).then_some(o + 1)
                });
                if taken.is_err() {
                    return None;
                }
                if now.saturating_sub(self.back_ms.load(Ordering::Relaxed)) >= policy.cap_ms() {
                    self.ejections.store(0, Ordering::Relaxed);
                }
                let n = self.ejections.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                let for_ms = policy.backoff_ms(n);
                self.failures.store(0, Ordering::Relaxed);
                self.trial_ms.store(0, Ordering::Relaxed);
                self.out_until_ms
                    .store(now.saturating_add(for_ms).max(1), Ordering::Relaxed);
                Some(Change::Ejected { for_ms })
            }
        }
    }

    /// Takes over `old`'s state (a reload that keeps the target).
    pub fn inherit(&self, old: &Health) {
        for (new, old) in [
            (&self.out_until_ms, &old.out_until_ms),
            (&self.trial_ms, &old.trial_ms),
            (&self.back_ms, &old.back_ms),
        ] {
            new.store(old.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.failures
            .store(old.failures.load(Ordering::Relaxed), Ordering::Relaxed);
        self.ejections
            .store(old.ejections.load(Ordering::Relaxed), Ordering::Relaxed);
        self.active_down
            .store(old.active_down.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Ejection = Ejection {
        after: 3,
        first: Duration::from_millis(1_000),
    };

    fn fail(h: &Health, now: u64, out: &AtomicUsize, n: usize) -> Option<Change> {
        h.report(Outcome::Failure, now, &POLICY, out, n)
    }

    #[test]
    fn ejected_after_failures_in_a_row_then_one_trial() {
        let (h, out) = (Health::default(), AtomicUsize::new(0));
        assert_eq!(fail(&h, 10, &out, 2), None);
        assert_eq!(fail(&h, 10, &out, 2), None);
        // A success in between starts the count again.
        assert_eq!(h.report(Outcome::Success, 10, &POLICY, &out, 2), None);
        assert_eq!(fail(&h, 10, &out, 2), None);
        assert_eq!(fail(&h, 10, &out, 2), None);
        assert_eq!(fail(&h, 10, &out, 2), Some(Change::Ejected { for_ms: 1_000 }));
        assert_eq!(out.load(Ordering::Relaxed), 1);
        assert_eq!(h.admit(500, 100), Admit::No);
        assert_eq!(h.admit(1_010, 100), Admit::Trial);
        // One trial at a time, until it is stale.
        assert_eq!(h.admit(1_020, 100), Admit::No);
        // It failed: out again, twice as long.
        assert_eq!(fail(&h, 1_030, &out, 2), Some(Change::Ejected { for_ms: 2_000 }));
        assert_eq!(h.admit(2_000, 100), Admit::No);
        assert_eq!(h.admit(3_030, 100), Admit::Trial);
        assert_eq!(h.admit(3_200, 100), Admit::Trial, "a stale trial is taken again");
        assert_eq!(
            h.report(Outcome::Success, 3_210, &POLICY, &out, 2),
            Some(Change::Restored)
        );
        assert_eq!(out.load(Ordering::Relaxed), 0);
        assert_eq!(h.admit(3_220, 100), Admit::Yes);
        // Failing again soon after: the doubling goes on.
        for _ in 0..2 {
            fail(&h, 3_300, &out, 2);
        }
        assert_eq!(fail(&h, 3_300, &out, 2), Some(Change::Ejected { for_ms: 4_000 }));
    }

    #[test]
    fn the_last_target_in_the_rotation_is_never_ejected() {
        let out = AtomicUsize::new(0);
        let (a, b) = (Health::default(), Health::default());
        for _ in 0..3 {
            fail(&a, 10, &out, 2);
        }
        assert!(!a.in_rotation());
        for _ in 0..10 {
            assert_eq!(fail(&b, 10, &out, 2), None);
        }
        assert!(b.in_rotation());
        let single = Health::default();
        for _ in 0..10 {
            assert_eq!(fail(&single, 10, &AtomicUsize::new(0), 1), None);
        }
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_zero_never_ejects() {
        assert_eq!(POLICY.backoff_ms(1), 1_000);
        assert_eq!(POLICY.backoff_ms(4), 8_000);
        assert_eq!(POLICY.backoff_ms(60), 300_000);
        let never = Ejection {
            after: 0,
            ..Ejection::default()
        };
        let (h, out) = (Health::default(), AtomicUsize::new(0));
        for _ in 0..100 {
            assert_eq!(h.report(Outcome::Failure, 1, &never, &out, 3), None);
        }
    }
}
