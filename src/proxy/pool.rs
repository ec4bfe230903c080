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

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2, TrySendError};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::idle::{BodyError, IdleTimer, Timed};
use super::request_body::RequestBody;
use crate::clock;
use crate::int_hash::IntMap;
use crate::proxy::upstream::{InFlight, Protocol, Target, Upstream};
use crate::telemetry::metrics::{Metrics, UpstreamErrorLabels};
use std::sync::Arc;

/// (upstream id, target index): one pool per target of each compiled upstream.
type Key = (u64, usize);
type Req = Request<Timed<RequestBody>>;

/// A connection to a target, ready for a request: HTTP/1.1 carries one
/// request at a time and is checked out of its pool; h2 carries many, and
/// its one connection per target and thread is shared.
pub enum Sender {
    H1(http1::SendRequest<Timed<RequestBody>>),
    H2(http2::SendRequest<Timed<RequestBody>>),
}

impl Sender {
    pub fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_ready(),
            Sender::H2(s) => s.is_ready(),
        }
    }

    async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        }
    }

    /// Sends `req`; a request the connection could not take (closed before
    /// it was written) comes back in the error.
    pub async fn try_send_request(&mut self, req: Req) -> Result<Response<Incoming>, TrySendError<Req>> {
        match self {
            Sender::H1(s) => s.try_send_request(req).await,
            Sender::H2(s) => s.try_send_request(req).await,
        }
    }
}

struct Idle {
    sender: http1::SendRequest<Timed<RequestBody>>,
    /// When it was checked in, on the coarse clock (ms): an idle timeout
    /// needs no nanoseconds, and the coarse clock is a load, not a syscall.
    since_ms: u64,
}

thread_local! {
    static IDLE: RefCell<IntMap<Key, VecDeque<Idle>>> = RefCell::default();
    /// The h2 connection of each target on this thread, shared by every
    /// request to it until it closes.
    static SHARED: RefCell<IntMap<Key, http2::SendRequest<Timed<RequestBody>>>> = RefCell::default();
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {0} ms")]
    Timeout(u128),
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The TLS handshake failed; `reason` is the metric's label
    /// (`timeout`: within `timeout_ms`, the connect timeout).
    #[error("TLS handshake: {error}")]
    Tls {
        reason: &'static str,
        error: String,
        timeout_ms: u128,
    },
    #[error("HTTP handshake: {0}")]
    Handshake(#[from] hyper::Error),
}

impl ConnectError {
    /// `leasegate_upstream_tls_handshake_failures`'s `reason`, if the TLS
    /// handshake is what failed.
    pub fn tls_reason(&self) -> Option<&'static str> {
        match self {
            ConnectError::Tls { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// Where a checked-out connection returns to.
pub struct Slot {
    key: Key,
    max_idle: usize,
    idle_timeout_ms: u64,
    shared: bool,
}

impl Slot {
    pub fn new(upstream: &Upstream, target: usize) -> Slot {
        Slot {
            key: (upstream.id(), target),
            max_idle: upstream.pool_max_idle_per_host,
            idle_timeout_ms: upstream.pool_idle_timeout.as_millis().try_into().unwrap_or(u64::MAX),
            shared: upstream.protocol == Protocol::H2,
        }
    }

    /// A pooled connection ready for a request, if one is idle and alive.
    pub async fn reuse(&self) -> Option<Sender> {
        if self.shared {
            let mut sender = SHARED.with(|m| {
                let mut m = m.borrow_mut();
                match m.get(&self.key) {
                    Some(s) if !s.is_closed() => Some(s.clone()),
                    Some(_) => {
                        m.remove(&self.key);
                        None
                    }
                    None => None,
                }
            })?;
            return sender.ready().await.is_ok().then_some(Sender::H2(sender));
        }
        loop {
            let mut sender = IDLE.with(|m| {
                let mut m = m.borrow_mut();
                let list = m.get_mut(&self.key)?;
                let now = clock::coarse_now_ms();
                while let Some(idle) = list.pop_back() {
                    if !idle.sender.is_closed() && now.saturating_sub(idle.since_ms) < self.idle_timeout_ms {
                        return Some(Sender::H1(idle.sender));
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

    /// A new connection to `target`: TCP, then TLS if the upstream has
    /// it, all within `connect_timeout`; then the HTTP handshake.
    pub async fn connect(&self, upstream: &Upstream, target: &Target) -> Result<Sender, ConnectError> {
        let timeout = upstream.connect_timeout;
        let deadline = Instant::now() + timeout;
        let authority = &target.authority;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let stream = timeout_at(deadline, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ConnectError::Timeout(timeout.as_millis()))??;
        stream.set_nodelay(true)?;
        let sender = match (&upstream.tls, &target.tls_name) {
            (Some(tls), Some(name)) => {
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = timeout_at(deadline, connector.connect(name.clone(), stream))
                    .await
                    .map_err(|_| ConnectError::Tls {
                        reason: "timeout",
                        error: format!("no answer within {} ms", timeout.as_millis()),
                        timeout_ms: timeout.as_millis(),
                    })?
                    .map_err(|e| ConnectError::Tls {
                        reason: tls_reason(&e),
                        error: e.to_string(),
                        timeout_ms: timeout.as_millis(),
                    })?;
                if upstream.protocol == Protocol::H2 && stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                    // Its first bytes would be an HTTP/2 preface to a
                    // server that did not agree to HTTP/2.
                    return Err(ConnectError::Tls {
                        reason: "alpn",
                        error: "the target did not agree to h2 (ALPN)".into(),
                        timeout_ms: timeout.as_millis(),
                    });
                }
                handshake(stream, upstream.protocol).await?
            }
            _ => handshake(stream, upstream.protocol).await?,
        };
        if let Sender::H2(s) = &sender {
            SHARED.with(|m| m.borrow_mut().insert(self.key, s.clone()));
        }
        Ok(sender)
    }

    /// Returns a connection whose exchange is complete.
    fn check_in(self, sender: Sender) {
        // An h2 connection never left the pool.
        let Sender::H1(sender) = sender else { return };
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

/// The HTTP handshake on a connected (and maybe encrypted) stream; the
/// connection is driven by a task of its own.
async fn handshake<I>(io: I, protocol: Protocol) -> Result<Sender, ConnectError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match protocol {
        Protocol::Http1 => {
            let (sender, conn) = http1::Builder::new().handshake(TokioIo::new(io)).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
            });
            Ok(Sender::H1(sender))
        }
        Protocol::H2 => {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(io))
                .await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2 connection ended with an error");
                }
            });
            Ok(Sender::H2(sender))
        }
    }
}

/// A bounded label for why a TLS handshake with an upstream failed.
fn tls_reason(e: &io::Error) -> &'static str {
    use rustls::CertificateError as C;
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return "closed";
    };
    match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => "unknown_ca",
            C::NotValidForName | C::NotValidForNameContext { .. } => "bad_name",
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => "expired",
            C::Revoked => "revoked",
            _ => "bad_certificate",
        },
        rustls::Error::AlertReceived(_) => "alert",
        rustls::Error::NoApplicationProtocol => "alpn",
        _ => "protocol",
    }
}

/// An upstream response body that returns its connection to the pool once
/// read to the end. It holds the request's place among the upstream's
/// `max_in_flight` until then (not until it is dropped: a last frame that
/// waits on a slow client's window holds no place), and ends with an error when it moves no
/// byte for the upstream's `idle_timeout_ms` (counted as an upstream
/// timeout).
pub struct UpstreamBody {
    inner: Incoming,
    check_in: Option<(Slot, Sender)>,
    timer: IdleTimer,
    /// Given back when the body has ended.
    place: Option<InFlight>,
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
    pub fn new(
        inner: Incoming,
        (slot, sender): (Slot, Sender),
        idle_timeout: std::time::Duration,
        place: Option<InFlight>,
        metrics: Arc<Metrics>,
    ) -> UpstreamBody {
        let timer = IdleTimer::new(idle_timeout);
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
        self.place = None;
        if let Some((slot, sender)) = self.check_in.take() {
            slot.check_in(sender);
        }
    }

    /// The upstream's name, for the log (while the body holds its place).
    fn upstream(&self) -> &str {
        self.place.as_ref().map_or("-", |p| p.upstream().name.as_str())
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
                    let upstream = this.upstream().to_string();
                    this.metrics
                        .upstream_errors
                        .get_or_create(&UpstreamErrorLabels {
                            upstream,
                            kind: "timeout",
                        })
                        .inc();
                    tracing::debug!(upstream = %this.upstream(), error = %e, "upstream body stalled");
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
