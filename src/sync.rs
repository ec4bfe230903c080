//! One way to treat a poisoned lock, everywhere: take the data and go on.
//!
//! A lock is poisoned when a thread panicked while holding it. Nothing on
//! the request path panics by design; if something did, the data behind
//! every lock here (caches, tables of leases, counters of connections) is
//! still the best there is, and a gateway that stopped using it (skipping
//! a cache, losing its lease table) would serve worse for the rest of its
//! life. So every lock is taken with [`Recover::recover`].

use std::sync::{LockResult, PoisonError};

/// `lock()`, `read()` and `write()` that shrug off poisoning.
pub trait Recover<G> {
    fn recover(self) -> G;
}

impl<G> Recover<G> for LockResult<G> {
    #[inline]
    fn recover(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let m = Arc::new(Mutex::new(5));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().recover();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock().recover(), 5);
    }
}
