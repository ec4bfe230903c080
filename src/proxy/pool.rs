//! Per-thread HTTP/1.1 connection pools to upstream targets.
//!
//! Each worker thread runs its own single-threaded runtime, so its pool is a
//! plain thread-local: no lock, no cross-thread hand-off. A connection goes
//! back to its pool when the response body has been read to the end; a body
//! dropped early takes its connection with it (hyper closes it), so a half-
//! read response can never leak into the next request.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::body::RequestBody;
use super::idle::{BodyError, IdleTimer, Timed};
use crate::clock;
use crate::int_hash::IntMap;
use crate::proxy::upstream::{InFlight, Upstream};
use crate::telemetry::metrics::{Metrics, UpstreamErrorLabels};
use std::sync::Arc;

/// (upstream id, target index): one pool per target of each compiled upstream.
type Key = (u64, usize);
pub type Sender = SendRequest<Timed<RequestBody>>;

struct Idle {
    sender: Sender,
    /// When it was checked in, on the coarse clock (ms): an idle timeout
    /// needs no nanoseconds, and the coarse clock is a load, not a syscall.
    since_ms: u64,
}

thread_local! {
    static IDLE: RefCell<IntMap<Key, VecDeque<Idle>>> = RefCell::default();
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {0} ms")]
    Timeout(u128),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("HTTP/1.1 handshake: {0}")]
    Handshake(#[from] hyper::Error),
}

/// Where a checked-out connection returns to.
pub struct Slot {
    key: Key,
    max_idle: usize,
    idle_timeout_ms: u64,
}

impl Slot {
    pub fn new(upstream: &Upstream, target: usize) -> Slot {
        Slot {
            key: (upstream.id(), target),
            max_idle: upstream.pool_max_idle_per_host,
            idle_timeout_ms: upstream.pool_idle_timeout.as_millis().try_into().unwrap_or(u64::MAX),
        }
    }

    /// A pooled connection ready for a request, if one is idle and alive.
    pub async fn reuse(&self) -> Option<Sender> {
        loop {
            let mut sender = IDLE.with(|m| {
                let mut m = m.borrow_mut();
                let list = m.get_mut(&self.key)?;
                let now = clock::coarse_now_ms();
                while let Some(idle) = list.pop_back() {
                    if !idle.sender.is_closed() && now.saturating_sub(idle.since_ms) < self.idle_timeout_ms {
                        return Some(idle.sender);
                    }
                }
                None
            })?;
            // Put back at the end of a body, the connection may not have
            // been polled to idle yet: it will be, on this same thread.
            if sender.is_ready() || sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A new connection to `authority`.
    pub async fn connect(&self, authority: &Authority, timeout: Duration) -> Result<Sender, ConnectError> {
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ConnectError::Timeout(timeout.as_millis()))??;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::Builder::new().handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Returns a connection whose exchange is complete.
    fn check_in(self, sender: Sender) {
        if sender.is_closed() || self.max_idle == 0 {
            return;
        }
        IDLE.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.entry(self.key).or_default();
            let now = clock::coarse_now_ms();
            while list
                .front()
                .is_some_and(|i| now.saturating_sub(i.since_ms) >= self.idle_timeout_ms)
                || list.len() >= self.max_idle
            {
                list.pop_front();
            }
            list.push_back(Idle { sender, since_ms: now });
        });
    }
}

/// An upstream response body that returns its connection to the pool once
/// read to the end. It holds the request's place among the upstream's
/// `max_in_flight` until then, and ends with an error when it moves no
/// byte for the upstream's `idle_timeout_ms` (counted as an upstream
/// timeout).
pub struct UpstreamBody {
    inner: Incoming,
    check_in: Option<(Slot, Sender)>,
    timer: IdleTimer,
    place: InFlight,
    /// Where an idle timeout is counted (as the upstream's `timeout`).
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("inner", &self.inner)
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("key", &self.key).finish()
    }
}

impl UpstreamBody {
    pub fn new(inner: Incoming, slot: Slot, sender: Sender, place: InFlight, metrics: Arc<Metrics>) -> UpstreamBody {
        let timer = IdleTimer::new(place.upstream().idle_timeout);
        let mut body = UpstreamBody {
            inner,
            check_in: Some((slot, sender)),
            timer,
            place,
            metrics,
        };
        if http_body::Body::is_end_stream(&body.inner) {
            body.done();
        }
        body
    }

    fn done(&mut self) {
        if let Some((slot, sender)) = self.check_in.take() {
            slot.check_in(sender);
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.done(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.done(),
            // An error poisons the connection: never pool it.
            Poll::Ready(Some(Err(_))) => this.check_in = None,
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Pending => {
                return this.timer.poll_expired(cx).map(|e| {
                    // The connection is dropped with the body: never pooled.
                    this.check_in = None;
                    let upstream = this.place.upstream().name.clone();
                    this.metrics
                        .upstream_errors
                        .get_or_create(&UpstreamErrorLabels {
                            upstream,
                            kind: "timeout",
                        })
                        .inc();
                    tracing::debug!(upstream = %this.place.upstream().name, error = %e, "upstream body stalled");
                    Some(Err(e))
                });
            }
        }
        this.timer.progress();
        polled.map(|f| f.map(|f| f.map_err(BodyError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
