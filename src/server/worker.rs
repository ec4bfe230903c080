//! The workers: one thread each, with a single-threaded tokio runtime and
//! its own copy of the HTTP and HTTPS listeners. Each accepts (within
//! `max_connections` and the per-address cap), captures a TLS client's
//! ClientHello, serves the connection with hyper (HTTP/1.1 or HTTP/2), its
//! idle timer beside it, and on stop drains its connections within the
//! grace period. A request stays on one thread from accept to response.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::streams::Executor;
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::opening_deadline::Opening;
use super::{connection_cap, tls};
use crate::config::Config;
use crate::connection::{ConnInfo, Guard};
use crate::gateway::Gateway;
use crate::runtime::Runtime;
use crate::telemetry::metrics::{ListenerLabels, Metrics, ReasonLabels};

/// What every worker shares.
pub(super) struct Shared {
    /// What every front holds: admin, RLS, reload and the request path.
    pub(super) runtime: Arc<Runtime>,
    /// The HTTP request path the workers serve.
    pub(super) gateway: Arc<Gateway>,
    pub(super) connections: Arc<Semaphore>,
    /// `max_connections_per_ip`, bound at start like `max_connections`.
    pub(super) per_ip: Arc<crate::connection::PerIp>,
    /// `[tls]` as started (the ClientHello deadline is bound at start);
    /// each handshake takes the certificate of the config in force.
    pub(super) tls: Option<crate::config::Tls>,
}

pub(super) struct Listeners {
    pub(super) http: Option<std::net::TcpListener>,
    pub(super) https: Option<std::net::TcpListener>,
}

pub(super) fn worker(listeners: Listeners, shared: Arc<Shared>, stop: watch::Receiver<bool>, grace: Duration) {
    // Access-log lines gather in this thread's batch, handed to the writer
    // when the runtime goes idle (or the batch is full or old).
    crate::telemetry::access_log::batch_this_thread();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(crate::telemetry::access_log::flush_thread)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "worker runtime failed to start");
            return;
        }
    };
    rt.block_on(async move {
        if let Err(e) = accept_loop(listeners, shared, stop, grace).await {
            tracing::error!(error = %e, "worker stopped");
        }
    });
    crate::telemetry::access_log::flush_thread();
}

/// Resolves once shutdown has been asked for (at once if it already was).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn accept(listener: &Option<TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_loop(
    listeners: Listeners,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) -> io::Result<()> {
    let http = listeners.http.map(TcpListener::from_std).transpose()?;
    let https = listeners.https.map(TcpListener::from_std).transpose()?;
    let builders = Arc::new(Builders::new(&shared.runtime.config()));
    // Every connection task holds a sender; when all are dropped, drained.
    let (drain_tx, mut drained) = mpsc::channel::<()>(1);

    loop {
        let permit = tokio::select! {
            p = shared.connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let (accepted, tls) = tokio::select! {
            a = accept(&http) => (a, false),
            a = accept(&https) => (a, true),
            _ = stopped(&mut stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                let gate = &crate::telemetry::log_limit::ACCEPT_FAILED;
                if let Some(held_back) = gate.check(crate::clock::coarse_now_ms()) {
                    tracing::warn!(error = %e, held_back, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let place = match shared.per_ip.admit(peer.ip()) {
            Ok(place) => place,
            Err(()) => {
                // Closed at once: its permit goes back with it.
                shared
                    .runtime
                    .metrics
                    .connections_refused
                    .get_or_create(&ReasonLabels { reason: "per_ip" })
                    .inc();
                tracing::debug!(%peer, "too many connections from this address: closed");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let listener = if tls { "https" } else { "http" };
        shared
            .runtime
            .metrics
            .connections_accepted
            .get_or_create(&ListenerLabels { listener })
            .inc();
        shared.runtime.metrics.connections_open.inc();
        let held: Guard = Arc::new(Held {
            metrics: shared.runtime.metrics.clone(),
            _permit: permit,
            _place: place,
            _drain: drain_tx.clone(),
        });
        let task = Connection {
            shared: shared.clone(),
            builders: builders.clone(),
            stop: stop.clone(),
            held,
        };
        tokio::spawn(task.serve(stream, peer, tls));
    }
    drop((http, https, drain_tx));
    if tokio::time::timeout(grace, drained.recv()).await.is_err() {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "grace period over: closing connections still open"
        );
    }
    Ok(())
}

fn connection_builder(config: &Config) -> auto::Builder<Executor> {
    let g = &config.gateway;
    // HTTP/2 streams run as tasks of their own, each with its stall clock.
    let mut builder = auto::Builder::new(Executor { idle: g.idle_timeout });
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(g.header_read_timeout)
        .max_buf_size(g.max_header_bytes)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(g.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256)
        // Pings find dead peers; an idle but live HTTP/2 client may stay.
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}

/// The connection builders of one worker: the plain listener sniffs the
/// protocol (HTTP/1.1 or h2c prior knowledge); TLS connections have already
/// agreed one by ALPN, and a client without ALPN speaks HTTP/1.1.
struct Builders {
    sniff: auto::Builder<Executor>,
    http1: auto::Builder<Executor>,
    http2: auto::Builder<Executor>,
    /// A client must send its opening bytes within this time.
    opening: Duration,
    /// A connection with nothing in flight is closed after this long.
    idle: Duration,
}

impl Builders {
    fn new(config: &Config) -> Builders {
        let base = connection_builder(config);
        Builders {
            http1: base.clone().http1_only(),
            http2: base.clone().http2_only(),
            sniff: base,
            opening: config.gateway.header_read_timeout,
            idle: config.gateway.idle_timeout,
        }
    }
}

/// Keeps a connection counted (limit, drain, open gauge) until dropped.
struct Held {
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
    _place: Option<crate::connection::Place>,
    _drain: mpsc::Sender<()>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.metrics.connections_open.dec();
    }
}

/// One accepted client connection.
struct Connection {
    shared: Arc<Shared>,
    builders: Arc<Builders>,
    stop: watch::Receiver<bool>,
    held: Guard,
}

impl Connection {
    async fn serve(self, stream: TcpStream, peer: SocketAddr, tls: bool) {
        let metrics = self.shared.runtime.metrics.clone();
        let builders = self.builders.clone();
        if !tls {
            let conn = ConnInfo::new(peer, None, Some(self.held.clone())).with_idle_timeout(builders.idle);
            let io = Opening::new(stream, builders.opening);
            self.http(&builders.sniff, TokioIo::new(io), conn).await;
        } else if let Some(settings) = &self.shared.tls {
            // The certificate in force now: one a reload read from disk is
            // served from the next handshake on.
            let current = self
                .shared
                .runtime
                .config()
                .tls
                .as_ref()
                .map_or_else(|| settings.server_config.clone(), |t| t.server_config.clone());
            let acceptor = TlsAcceptor::from(current);
            let mut stop = self.stop.clone();
            let accepted = tokio::select! {
                accepted = tls::accept(stream, settings, &acceptor) => accepted,
                _ = stopped(&mut stop) => return,
            };
            match accepted {
                Ok((stream, info)) => {
                    // ALPN has chosen the protocol: no sniffing over TLS, and
                    // a client without ALPN speaks HTTP/1.1.
                    let builder = if info.alpn.as_deref() == Some(b"h2") {
                        &builders.http2
                    } else {
                        &builders.http1
                    };
                    let conn =
                        ConnInfo::new(peer, Some(info), Some(self.held.clone())).with_idle_timeout(builders.idle);
                    let io = Opening::new(stream, builders.opening);
                    self.http(builder, TokioIo::new(io), conn).await;
                }
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS connection dropped");
                    metrics
                        .tls_handshake_failures
                        .get_or_create(&ReasonLabels { reason: e.reason() })
                        .inc();
                }
            }
        }
    }

    async fn http<I>(mut self, builder: &auto::Builder<Executor>, io: I, conn: ConnInfo)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let gateway = self.shared.gateway.clone();
        let idle = conn.idle_timeout;
        let conn = Arc::new(conn);
        let activity = Arc::new(connection_cap::Activity::default());
        let active = activity.clone();
        let service = service_fn(move |req| {
            let busy = active.begin();
            // The request's future is hyper's, with no future of ours
            // around it: one around it would be moved into place and would
            // copy the response out of it and on, per request.
            gateway.clone().handle(req, conn.clone(), move |body| {
                // Made inside an HTTP/2 stream's task: its stall clock.
                connection_cap::Tracked::new(body, busy, super::streams::current())
            })
        });
        let served = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(served);
        // The stop signal keeps the task's waker from its first poll on (a
        // spawned task's waker does not change); polling it again on every
        // wake of the connection would only retake its lock to compare
        // wakers. So after the first poll it is polled again only once the
        // watch has changed: one atomic load per wake. The idle timer the
        // same way: polled when armed, then looked at only once elapsed.
        let probe = self.stop.clone();
        let stop = stopped(&mut self.stop);
        tokio::pin!(stop);
        let mut armed = false;
        let idle_ms: u64 = idle.as_millis().try_into().unwrap_or(u64::MAX);
        let idle_timer = tokio::time::sleep(idle);
        tokio::pin!(idle_timer);
        let mut idle_armed = false;
        let mut closing_idle = false;
        let metrics = self.shared.runtime.metrics.clone();
        let finished = std::future::poll_fn(|cx| {
            if !armed || probe.has_changed().unwrap_or(true) {
                armed = true;
                if stop.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
            }
            if !closing_idle && (!idle_armed || idle_timer.is_elapsed()) {
                let now = crate::clock::coarse_now_ms();
                let waited = match activity.idle_for(now) {
                    Some(quiet) if quiet >= idle_ms => {
                        // HTTP/1.1: closed at once; HTTP/2: GOAWAY, then closed.
                        closing_idle = true;
                        metrics.connections_idle_closed.inc();
                        served.as_mut().graceful_shutdown();
                        None
                    }
                    Some(quiet) => Some(quiet),
                    // Busy: idle only if the client stopped taking its
                    // response. Nothing graceful can finish that exchange:
                    // the connection goes, and its places with it.
                    None => match activity.stalled_for(now) {
                        Some(stalled) if stalled >= idle_ms => {
                            metrics.connections_idle_closed.inc();
                            tracing::debug!(stalled_ms = stalled, "the client stopped reading its response: closed");
                            return Poll::Ready(Some(Ok(())));
                        }
                        stalled => Some(stalled.unwrap_or(0)),
                    },
                };
                if let Some(waited) = waited {
                    let left = idle_ms - waited;
                    idle_timer
                        .as_mut()
                        .reset(tokio::time::Instant::now() + Duration::from_millis(left));
                    // Registers the waker; it fires `left` from now.
                    let _ = idle_timer.as_mut().poll(cx);
                    idle_armed = true;
                }
            }
            served.as_mut().poll(cx).map(Some)
        })
        .await;
        match finished {
            Some(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
            Some(Ok(())) => {}
            None => {
                served.as_mut().graceful_shutdown();
                let _ = served.await;
            }
        }
    }
}
