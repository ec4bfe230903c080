//! The one store call per key: the slot a request or a background refill
//! claims to make it ([`RefillSlot`], a drop guard that frees the slot and
//! wakes the requests waiting for its answer, also when the call's future
//! is dropped midway), the count of requests in line behind it
//! ([`Waiting`]), and how the last call failed, which those requests
//! answer instead of calling again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::store::StoreError;
use crate::sync::Recover;

/// The store-call state of one lease.
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Refill {
    /// Requests waiting for this key's store call: the call asks for them.
    waiting: AtomicU64,
    /// One store call for this key at a time (a request's or a refill).
    refilling: AtomicBool,
    /// Wakes the requests waiting for that call's answer.
    arrived: tokio::sync::Notify,
    /// How the last store call for this key failed, if it did: what the
    /// requests that waited for it answer, instead of calling again.
    last_failure: Mutex<Option<StoreError>>,
}

impl Refill {
    /// A request starts waiting for the store call; it stops when the
    /// returned guard drops.
    pub(super) fn wait_in_line(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(self)
    }

    /// Requests waiting for the store call now.
    pub(super) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Claims the single store-call slot; released when the returned guard
    /// drops, which wakes the requests waiting for it.
    pub(super) fn start(&self) -> Option<RefillSlot<'_>> {
        self.refilling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            // Lazily: a slot made for a failed claim would free the flag on drop.
            .then(|| RefillSlot {
                refill: self,
                recorded: AtomicBool::new(false),
            })
    }

    /// Whether a store call is in flight.
    #[inline]
    pub(super) fn in_flight(&self) -> bool {
        self.refilling.load(Ordering::Acquire)
    }

    fn set_last_failure(&self, failure: Option<&StoreError>) {
        *self.last_failure.lock().recover() = failure.cloned();
    }

    /// How the last store call failed, if it did.
    pub(super) fn last_failure(&self) -> Option<StoreError> {
        self.last_failure.lock().recover().clone()
    }

    /// Waits until the store call in flight ends, or claims the slot if
    /// none is (then the caller makes the call).
    pub(super) async fn wait(&self) -> Option<RefillSlot<'_>> {
        let arrived = self.arrived.notified();
        tokio::pin!(arrived);
        // Registered before the check: an end between the two still wakes us.
        arrived.as_mut().enable();
        if let Some(slot) = self.start() {
            return Some(slot);
        }
        arrived.await;
        None
    }
}

/// A request waiting in line for a key's store call.
#[derive(Debug)]
pub struct Waiting<'a>(&'a Refill);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The store-call slot of a lease, held while its call is in flight.
#[derive(Debug)]
pub struct RefillSlot<'a> {
    refill: &'a Refill,
    recorded: AtomicBool,
}

impl RefillSlot<'_> {
    /// Records how this slot's call ended (`None`: it answered), for the
    /// requests waiting for it. Only the slot's call speaks for the key.
    pub fn record(&self, failure: Option<&StoreError>) {
        self.refill.set_last_failure(failure);
        self.recorded.store(true, Ordering::Relaxed);
    }
}

impl Drop for RefillSlot<'_> {
    fn drop(&mut self) {
        if !self.recorded.load(Ordering::Relaxed) {
            // Dropped mid-call: nothing is known, so no older failure may
            // stand for it; the waiters make their own calls.
            self.refill.set_last_failure(None);
        }
        self.refill.refilling.store(false, Ordering::Release);
        self.refill.arrived.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_refill_at_a_time() {
        let refill = Refill::default();
        let slot = refill.start();
        assert!(slot.is_some());
        assert!(refill.start().is_none());
        drop(slot);
        assert!(refill.start().is_some());
    }
}
