//! The store deadline: [`within`], the one place a deadline becomes
//! [`StoreError::Timeout`], and [`Deadlined`], a region store's calls under
//! it. The breaker and the metrics around a quota store are
//! [`Guarded`](super::guard::Guarded)'s.

use std::sync::Arc;
use std::time::Duration;

use super::{BoxFuture, Credit, RegionStore, StoreError};
use crate::quota::Spec;

/// `call`, or [`StoreError::Timeout`] once `deadline` has passed: the one
/// place a deadline becomes an error.
pub async fn within<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout(deadline.as_millis() as u64)),
    }
}

/// A region store's calls under the store deadline. Transfers between
/// regions run in the background, never for a request: the deadline bounds
/// them, the breaker leaves them alone.
pub struct Deadlined {
    inner: Arc<dyn RegionStore>,
    deadline: Duration,
}

impl Deadlined {
    pub fn new(inner: Arc<dyn RegionStore>, deadline: Duration) -> Deadlined {
        Deadlined { inner, deadline }
    }
}

impl RegionStore for Deadlined {
    fn transfer_out<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        id: u64,
        want: u64,
        keep: u64,
        remember_ms: u64,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(within(
            self.deadline,
            self.inner.transfer_out(key, spec, id, want, keep, remember_ms),
        ))
    }

    fn credit<'a>(&'a self, key: &'a str, id: u64, tokens: u64, ttl_ms: u64) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(within(self.deadline, self.inner.credit(key, id, tokens, ttl_ms)))
    }

    fn spend_credit<'a>(
        &'a self,
        key: &'a str,
        want: u64,
        period_ms: u64,
    ) -> BoxFuture<'a, Result<Credit, StoreError>> {
        Box::pin(within(self.deadline, self.inner.spend_credit(key, want, period_ms)))
    }

    fn claim<'a>(&'a self, key: &'a str, window: u64, ttl_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(within(self.deadline, self.inner.claim(key, window, ttl_ms)))
    }

    fn unclaim<'a>(&'a self, key: &'a str, window: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(within(self.deadline, self.inner.unclaim(key, window)))
    }
}
