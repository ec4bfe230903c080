//! Running a script on the I/O thread: a worker's call is a channel send
//! and a wake-up, and its answer a oneshot back.

use redis::Script;

use super::{call_phases, RedisStore, RELEASE};
use crate::quota::Grant;
use crate::store::{BoxFuture, StoreError};

impl RedisStore {
    /// Runs `script` on the I/O thread. `give_back`: for an acquire, the
    /// release arguments (without the tokens and their window) that return
    /// its grant if the caller stopped waiting (the deadline passed) before
    /// the answer came, so tokens taken for nobody go back, to the window
    /// they were taken in, instead of being lost.
    pub(super) fn call<'a>(
        &'a self,
        script: &'static Script,
        key: &str,
        args: Vec<u64>,
        give_back: Option<[u64; 4]>,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let Some(mut connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(super::not_connected())));
        };
        let key = key.to_owned();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let stamps = call_phases::Stamps::new();
        let mut watch = call_phases::PhaseWatch {
            stamps: stamps.clone(),
            metrics: self.metrics.clone(),
            result: None,
        };
        self.io.spawn(async move {
            stamps.sent();
            let result = connection.run(script, &key, &args).await;
            stamps.replied();
            if let Err(Ok([granted, _, _, _, window_ms, reserved, _])) = answer.send(result) {
                // Reserved tokens were taken as surely as granted ones.
                let taken = granted + reserved;
                if let (true, Some([algorithm, count, period, capacity])) = (taken > 0, give_back) {
                    let args = [algorithm, count, period, capacity, taken, window_ms];
                    if let Err(e) = connection.run(&RELEASE, &key, &args).await {
                        tracing::debug!(%key, error = %e.classify(), "returning a late grant failed");
                    }
                }
            }
        });
        Box::pin(async move {
            let answer = answered.await;
            watch.answered(matches!(answer, Ok(Ok(_))));
            match answer {
                Ok(Ok([granted, remaining, reset_ms, retry_after_ms, window_ms, reserved, owed])) => Ok(Grant {
                    granted,
                    remaining,
                    reset_ms,
                    retry_after_ms,
                    window_ms,
                    reserved,
                    owed,
                }),
                Ok(Err(e)) => Err(e.classify()),
                Err(_) => Err(StoreError::Failed("the Redis I/O thread stopped".into())),
            }
        })
    }
    /// Runs `script` over several keys on the I/O thread, with no give-back
    /// (the transfer scripts): the first integer of its reply and the
    /// rest.
    pub(super) fn call_keys(
        &self,
        script: &'static Script,
        keys: Vec<String>,
        args: Vec<u64>,
    ) -> BoxFuture<'_, Result<[u64; 6], StoreError>> {
        let Some(mut connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(super::not_connected())));
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.io.spawn(async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let _ = answer.send(connection.run_keys(script, &keys, &args).await);
        });
        Box::pin(async move {
            match answered.await {
                Ok(Ok([a, b, c, d, e, f, _])) => Ok([a, b, c, d, e, f]),
                Ok(Err(e)) => Err(e.classify()),
                Err(_) => Err(StoreError::Failed("the Redis I/O thread stopped".into())),
            }
        })
    }
}
