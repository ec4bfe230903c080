//! Where shared quota lives: the [`QuotaStore`] contract and its stores.
//!
//! A store changes a key's state only through `acquire` and `release`, each
//! atomic per key, and runs the algorithms of [`crate::quota`]. The lease
//! core talks to a store only when it has no local token at hand, so store
//! calls are rare and may be boxed.

pub mod guard;
pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;

use crate::quota::{Grant, Spec};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0} ms")]
    Timeout(u64),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store error: {0}")]
    Failed(String),
    /// The guard's breaker is open: no call was made.
    #[error("store circuit open; next probe in {retry_after_ms} ms")]
    CircuitOpen { retry_after_ms: u64 },
}

/// Shared quota, keyed by `rl:{<limit>:<parts>}`.
pub trait QuotaStore: Send + Sync + 'static {
    /// Takes up to `want` tokens from `key`'s bucket: grants
    /// `min(want, available)`, and when it grants none says when one will be.
    fn acquire<'a>(&'a self, key: &'a str, spec: &'a Spec, want: u64) -> BoxFuture<'a, Result<Grant, StoreError>>;

    /// Gives back `unused` tokens (an unspent lease), clamped to capacity.
    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unused: u64) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Whether the store answers, at the cost of one round trip and no
    /// quota: the guard's background probe while its circuit is open. The
    /// embedded store always answers.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}
