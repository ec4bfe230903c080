//! Bodies that may not stall: a request or response body that moves no
//! byte for the upstream's `idle_timeout_ms` ends the exchange with an
//! error, so neither a stalled upstream nor a stalled client can hold a
//! connection (and its place among `max_in_flight`) forever; and a request
//! body must come at `[gateway] min_body_rate` while the upstream waits.
//!
//! WebSocket tunnels get the gateway's `idle_timeout_ms` the same way.
//!
//! Cheap on the common path: progress is stamped on the coarse clock (one
//! atomic load per frame), and a timer exists only once a body has had to
//! wait; it is re-armed when it fires, not on every frame.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::clock;

/// Why a forwarded body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    #[error("the body moved no byte for {} ms", .0.as_millis())]
    Idle(Duration),
    /// A request body came slower than `[gateway] min_body_rate` while the
    /// upstream waited for it.
    #[error("the request body arrived slower than {0} bytes/s")]
    TooSlow(u64),
}

/// The window a request body's minimum rate is averaged over.
pub const RATE_WINDOW_MS: u64 = 5_000;

/// A request body's minimum rate, counted over the time spent waiting on
/// the client only (time the upstream did not ask for more is not the
/// client's): each [`RATE_WINDOW_MS`] of waiting must bring `rate` bytes a
/// second, or all that is left when the body's length says less is.
/// Checked as frames come; a body that sends nothing at all is the idle
/// timer's.
#[derive(Debug)]
struct RateClock {
    rate: u64,
    /// When the body began to wait on the client (coarse ms).
    waiting_since: Option<u64>,
    waited_ms: u64,
    bytes: u64,
    /// Bytes still to come when the window began, if known.
    remaining: Option<u64>,
}

impl RateClock {
    /// A frame of `len` bytes came at `now_ms`: whether the window, if
    /// over, was fast enough.
    fn frame(&mut self, len: u64, now_ms: u64) -> bool {
        if let Some(since) = self.waiting_since.take() {
            self.waited_ms += now_ms.saturating_sub(since);
        }
        self.bytes += len;
        if self.waited_ms < RATE_WINDOW_MS {
            return true;
        }
        let need = self.rate.saturating_mul(self.waited_ms) / 1_000;
        let need = self.remaining.map_or(need, |r| r.min(need));
        let ok = self.bytes >= need;
        self.remaining = self.remaining.map(|r| r.saturating_sub(self.bytes));
        self.bytes = 0;
        self.waited_ms = 0;
        ok
    }
}

/// The idle bound of one body.
#[derive(Debug)]
pub struct IdleTimer {
    timeout_ms: u64,
    /// Last progress, on the coarse clock (ms).
    last_ms: u64,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl IdleTimer {
    pub fn new(timeout: Duration) -> IdleTimer {
        IdleTimer {
            timeout_ms: timeout.as_millis().try_into().unwrap_or(u64::MAX),
            last_ms: clock::coarse_now_ms(),
            sleep: None,
        }
    }

    /// The body moved.
    pub fn progress(&mut self) {
        self.last_ms = clock::coarse_now_ms();
    }

    /// The body is waiting: `Ready` once it has waited too long.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<BodyError> {
        loop {
            let idle = clock::coarse_now_ms().saturating_sub(self.last_ms);
            if idle >= self.timeout_ms {
                return Poll::Ready(BodyError::Idle(Duration::from_millis(self.timeout_ms)));
            }
            let left = Duration::from_millis(self.timeout_ms - idle);
            match &mut self.sleep {
                None => self.sleep = Some(Box::pin(tokio::time::sleep(left))),
                Some(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Fired: progress may have come since it was armed.
                    sleep.as_mut().reset(Instant::now() + left);
                }
            }
            if let Some(sleep) = &mut self.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
    }
}

/// A body with an idle bound: a request body on its way upstream; with a
/// minimum rate when given one.
#[derive(Debug)]
pub struct Timed<B> {
    inner: B,
    timer: IdleTimer,
    rate: Option<RateClock>,
}

impl<B: http_body::Body> Timed<B> {
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    pub fn new(inner: B, timeout: Duration) -> Timed<B> {
        Timed {
            inner,
            timer: IdleTimer::new(timeout),
            rate: None,
        }
    }

    /// ... that must come at `rate` bytes a second (0: any) while the
    /// upstream waits for it.
    pub fn with_min_rate(mut self, rate: u64) -> Timed<B> {
        if rate > 0 && !self.inner.is_end_stream() {
            self.rate = Some(RateClock {
                rate,
                waiting_since: None,
                waited_ms: 0,
                bytes: 0,
                remaining: self.inner.size_hint().exact(),
            });
        }
        self
    }
}

impl<B> http_body::Body for Timed<B>
where
    B: http_body::Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer.progress();
                if let (Some(rate), Some(Ok(f))) = (&mut this.rate, &frame) {
                    let len = f.data_ref().map_or(0, |d| d.len() as u64);
                    if !rate.frame(len, clock::coarse_now_ms()) {
                        return Poll::Ready(Some(Err(BodyError::TooSlow(rate.rate))));
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(BodyError::from)))
            }
            Poll::Pending => {
                if let Some(rate) = &mut this.rate {
                    rate.waiting_since.get_or_insert_with(clock::coarse_now_ms);
                }
                this.timer.poll_expired(cx).map(|e| Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Copies both ways between an upgraded client and upstream until either
/// side closes, or until no byte has moved either way for `idle` (counted
/// in `idle_closed`).
pub async fn tunnel<A, B>(mut a: A, mut b: B, idle: Duration, idle_closed: prometheus_client::metrics::counter::Counter)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = AtomicU64::new(clock::coarse_now_ms());
    let idle_ms: u64 = idle.as_millis().try_into().unwrap_or(u64::MAX);
    let copy = async {
        let mut a = Stamped {
            inner: &mut a,
            last: &last,
        };
        let mut b = Stamped {
            inner: &mut b,
            last: &last,
        };
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
    };
    let watch = async {
        loop {
            let quiet = clock::coarse_now_ms().saturating_sub(last.load(Ordering::Relaxed));
            if quiet >= idle_ms {
                return;
            }
            tokio::time::sleep(Duration::from_millis(idle_ms - quiet)).await;
        }
    };
    tokio::select! {
        _ = copy => {}
        _ = watch => {
            idle_closed.inc();
            tracing::debug!(idle_ms, "tunnel idle: closed");
        }
    }
}

/// An I/O stream that stamps the coarse clock whenever it moves bytes.
struct Stamped<'a, S> {
    inner: &'a mut S,
    last: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Stamped<'_, S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut *this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.last.store(clock::coarse_now_ms(), Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stamped<'_, S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut *this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &polled {
            if *n > 0 {
                this.last.store(clock::coarse_now_ms(), Ordering::Relaxed);
            }
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body that never yields a frame.
    struct Stalled;

    impl http_body::Body for Stalled {
        type Data = Bytes;
        type Error = hyper::Error;
        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
            Poll::Pending
        }
    }

    #[test]
    fn a_rate_counts_the_time_spent_waiting_on_the_client() {
        let mut r = RateClock {
            rate: 500,
            waiting_since: None,
            waited_ms: 0,
            bytes: 0,
            remaining: Some(10_000),
        };
        // Frames that came at once (the upstream was the one waiting).
        for _ in 0..100 {
            assert!(r.frame(1, 1_000_000));
        }
        // A byte every 2 s of waiting: the window ends at 6 s, 103 bytes.
        let mut now = 1_000_000;
        let mut ok = true;
        for _ in 0..3 {
            r.waiting_since = Some(now);
            now += 2_000;
            ok = r.frame(1, now);
        }
        assert!(!ok, "103 bytes in 6 s of waiting is under 500/s");
        // 2 500 bytes over 5 s of waiting is enough.
        let mut r = RateClock {
            rate: 500,
            waiting_since: Some(0),
            waited_ms: 0,
            bytes: 0,
            remaining: None,
        };
        assert!(r.frame(2_500, 5_000));
    }

    #[tokio::test]
    async fn a_stalled_body_ends_after_its_timeout_and_not_before() {
        let started = std::time::Instant::now();
        let mut body = Timed::new(Stalled, Duration::from_millis(150));
        let frame = body.frame().await;
        let waited = started.elapsed();
        assert!(matches!(frame, Some(Err(BodyError::Idle(_)))), "{frame:?}");
        // The coarse clock runs a few ms behind: never early by more than that.
        assert!(waited >= Duration::from_millis(140), "{waited:?}");
    }
}
