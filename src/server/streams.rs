//! A stall clock per HTTP/2 response stream. hyper runs each stream as a
//! task of its own, given to the connection's executor: this executor
//! wraps each one with a [`StreamWatch`] that the stream's response body
//! ([`super::connection_cap::Tracked`]) stamps when it hands hyper a frame (its last
//! one too) and clears when asked for the next. A frame hyper holds is
//! waiting on the client's window for that stream; once one has waited
//! `idle_timeout_ms`, the stream's task is dropped, and h2 resets the
//! stream (`RST_STREAM` `CANCEL`): its body, the upstream's connection and
//! its place among `max_in_flight` go with it, whatever the stream's
//! siblings on the connection do.
//!
//! The watch reaches the body through a thread-local set while the task is
//! polled: the response is made inside the stream's task.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use crate::clock;

thread_local! {
    /// The watch of the stream task being polled on this thread, if any.
    static CURRENT: Cell<Option<Arc<StreamWatch>>> = const { Cell::new(None) };
}

/// When a stream's response body handed hyper the frame it waits to send.
#[derive(Debug, Default)]
pub struct StreamWatch {
    /// On the coarse clock (ms); 0: not waiting.
    waiting_since_ms: AtomicU64,
}

impl StreamWatch {
    /// A frame was handed over: the stream waits until asked again.
    pub fn handed(&self) {
        self.waiting_since_ms
            .store(clock::coarse_now_ms().max(1), Ordering::Relaxed);
    }

    /// Asked for the next frame: the last one was sent.
    pub fn taken(&self) {
        self.waiting_since_ms.store(0, Ordering::Relaxed);
    }

    fn waiting_since(&self) -> Option<u64> {
        match self.waiting_since_ms.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }
}

/// The watch of the stream whose task is being polled: `None` outside one
/// (an HTTP/1.1 exchange: its connection's clock covers it).
pub fn current() -> Option<Arc<StreamWatch>> {
    CURRENT.with(|c| {
        let w = c.take();
        let out = w.clone();
        c.set(w);
        out
    })
}

/// Spawns each task on tokio, each watched.
#[derive(Debug, Clone, Copy)]
pub struct Executor {
    pub idle: Duration,
}

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Watched {
            inner: Box::pin(fut),
            watch: Some(Arc::new(StreamWatch::default())),
            idle_ms: self.idle.as_millis().try_into().unwrap_or(u64::MAX),
            timer: None,
        });
    }
}

/// A stream's task and its watch.
struct Watched<F> {
    inner: Pin<Box<F>>,
    /// Lent to the thread-local while `inner` is polled.
    watch: Option<Arc<StreamWatch>>,
    idle_ms: u64,
    /// Armed once the stream waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<F: Future> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let outer = CURRENT.with(|c| c.replace(this.watch.take()));
        let polled = this.inner.as_mut().poll(cx);
        this.watch = CURRENT.with(|c| c.replace(outer));
        if polled.is_ready() {
            return Poll::Ready(());
        }
        let Some(since) = this.watch.as_ref().and_then(|w| w.waiting_since()) else {
            return Poll::Pending;
        };
        loop {
            let waited = clock::coarse_now_ms().saturating_sub(since);
            if waited >= this.idle_ms {
                tracing::debug!(waited_ms = waited, "a response stream waited on its window: reset");
                // Dropping the task drops the stream: h2 resets it (CANCEL).
                return Poll::Ready(());
            }
            let at = tokio::time::Instant::now() + Duration::from_millis(this.idle_ms - waited);
            match &mut this.timer {
                Some(t) => t.as_mut().reset(at),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            if let Some(t) = &mut this.timer {
                if t.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
    }
}
