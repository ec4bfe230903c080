//! Listeners and connection serving.
//!
//! Thread per core: `gateway.workers` threads, each with a single-threaded
//! tokio runtime and its own clone of every listening socket, so a request
//! stays on one thread from accept to response. The main thread runs the
//! admin listener and waits for SIGINT/SIGTERM, then asks every worker to
//! stop accepting and drain its connections within the grace period.

/// Writes of a read-side wrapper (`Prefixed`, `Opening`) go straight
/// through to the stream it wraps, held in its `inner` field.
macro_rules! delegate_async_write {
    ($wrapper:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<S> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use delegate_async_write;

pub mod accept;
pub mod admin;
pub mod door;
pub mod opening;
pub mod prefixed;
pub mod reload;
pub mod status;
pub mod tls;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::config::{Config, StoreBackend};
use crate::connection::{ConnInfo, Guard};
use crate::gateway::Gateway;
use crate::region::Region;
use crate::runtime::Runtime;
use crate::store::guard::{Deadlined, Guarded};
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisSetupError, RedisStore, Target};
use crate::store::{NoRegions, QuotaStore, RegionStore};
use crate::telemetry::metrics::{ListenerLabels, Metrics, ReasonLabels};
use opening::Opening;
use reload::{Reloader, Trigger};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr} ({listener}): {source}")]
    Bind {
        listener: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] io::Error),
    #[error("listeners.https is set but [tls] is missing")]
    NoTls,
    #[error(transparent)]
    Redis(#[from] RedisSetupError),
}

/// `[region]` as the region room takes it.
fn region_settings(r: &crate::config::Region) -> crate::region::Settings {
    crate::region::Settings {
        name: r.name.clone(),
        share: r.share,
        link: r.link,
        primary: r.primary.as_ref().and_then(|u| u.authority()).map(|a| a.to_string()),
        rebalance_at: r.rebalance_at,
        window_ms: r.rebalance_window.as_millis() as u64,
    }
}

/// Limit `name` of `config` as the primary grants transfers by it: its
/// quota and its plans' (whole, before the slice), and its sub-buckets. The
/// config in force, so a reload that changes a limit changes what the
/// primary accepts with it.
fn limit_quotas(config: &Config, name: &str) -> Option<crate::region::LimitQuotas> {
    let limit = config.limits.iter().find(|l| l.name == name)?;
    let mut specs = vec![limit.spec()];
    specs.extend(limit.plans.iter().map(|(plan, _)| limit.spec_for(Some(plan))));
    Some(crate::region::LimitQuotas {
        specs,
        shards: limit.shards,
    })
}

/// The quota store the config asks for, behind the guard (deadline,
/// breaker, store metrics), with `[region]`'s credit and rebalance signal
/// inside the guard. Returns at once even if Redis is down.
fn store(config: &Config, metrics: &Arc<Metrics>) -> Result<Stores, ServeError> {
    let redis = match &config.store.backend {
        StoreBackend::Memory => None,
        StoreBackend::Redis { url } => Some(Target::Node(url.clone())),
        StoreBackend::RedisCluster { seeds } => Some(Target::Cluster(seeds.clone())),
        StoreBackend::RedisSentinel { sentinels, master } => Some(Target::Sentinel {
            sentinels: sentinels.clone(),
            master: master.clone(),
        }),
    };
    // Redis serves both the quota and the region calls; the memory store
    // has no region calls.
    let (inner, regional): (Arc<dyn QuotaStore>, Arc<dyn RegionStore>) = match redis {
        None => (Arc::new(MemoryStore::new(config.store.max_keys)), Arc::new(NoRegions)),
        Some(target) => {
            let redis = Arc::new(RedisStore::start(&target)?);
            (redis.clone(), redis)
        }
    };
    let regional: Arc<dyn RegionStore> = Arc::new(Deadlined::new(regional, config.store.timeout));
    let (region, inner) = match &config.region {
        Some(r) => {
            let (region, wrapped) = Region::wrap(region_settings(r), inner, regional.clone());
            (Some(region), wrapped)
        }
        None => (None, inner),
    };
    let guarded = Arc::new(Guarded::new(
        inner,
        config.store.timeout,
        config.store.breaker,
        crate::clock::monotonic_clock(),
        metrics.clone(),
    ));
    Ok(Stores {
        quota: guarded,
        regional,
        region,
    })
}

/// The stores the gateway runs on: quota for requests (guarded), the
/// region calls (under the deadline), and `[region]`'s background side.
struct Stores {
    quota: Arc<dyn QuotaStore>,
    regional: Arc<dyn RegionStore>,
    region: Option<Region>,
}

/// Returns expired leases to the store and forgets idle keys, for as long
/// as the process runs.
async fn sweep_leases(runtime: Arc<Runtime>) {
    loop {
        let settings = runtime.limiter.settings();
        let every = Duration::from_millis((settings.sizing.ttl_ms / 2).clamp(100, 1_000));
        tokio::time::sleep(every).await;
        let idle_ms = settings.sizing.ttl_ms.max(settings.max_block_ms) + 1_000;
        runtime.limiter.sweep(idle_ms).await;
        runtime.metrics.lease_keys.set(runtime.limiter.tracked_keys() as i64);
    }
}

/// What every worker shares.
struct Shared {
    /// What every front holds: admin, RLS, reload and the request path.
    runtime: Arc<Runtime>,
    /// The HTTP request path the workers serve.
    gateway: Arc<Gateway>,
    connections: Arc<Semaphore>,
    /// `max_connections_per_ip`, bound at start like `max_connections`.
    per_ip: Arc<door::PerIp>,
    tls: Option<(crate::config::Tls, TlsAcceptor)>,
}

struct Listeners {
    http: Option<std::net::TcpListener>,
    https: Option<std::net::TcpListener>,
}

fn bind(listener: &'static str, addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let err = |source| ServeError::Bind { listener, addr, source };
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(err)?;
    }
    socket.bind(&addr.into()).map_err(err)?;
    socket.listen(4096).map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    Ok(socket.into())
}

/// Serves `config` until SIGINT or SIGTERM, then drains and returns.
pub fn run(config: Config) -> Result<(), ServeError> {
    let config_path = config.source.path.clone();
    let metrics = Arc::new(Metrics::with_store_deadline(config.store.timeout));
    let http = config.listeners.http.map(|a| bind("http", a)).transpose()?;
    let https = config.listeners.https.map(|a| bind("https", a)).transpose()?;
    let admin = config.listeners.admin.map(|a| bind("admin", a)).transpose()?;
    let rls = config.rls.as_ref().map(|r| bind("rls", r.listen)).transpose()?;
    let link = config
        .region
        .as_ref()
        .map(|r| bind("region link", r.link))
        .transpose()?;
    let tls = match (&config.tls, &https) {
        (Some(t), Some(_)) => Some((t.clone(), TlsAcceptor::from(t.server_config.clone()))),
        (None, Some(_)) => return Err(ServeError::NoTls),
        _ => None,
    };
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let workers = config.gateway.workers;
    let grace = config.gateway.grace_period;
    let Stores {
        quota: store,
        regional: region_store,
        region,
    } = store(&config, &metrics)?;
    let store_name = store.name();
    let connections = Arc::new(Semaphore::new(config.gateway.max_connections));
    let per_ip = door::PerIp::new(
        config.gateway.max_connections_per_ip,
        config.identity.trusted_proxies.clone(),
    );
    let runtime = Arc::new(Runtime::new(config, metrics, store));
    let shared = Arc::new(Shared {
        gateway: Arc::new(Gateway::new(runtime.clone())),
        runtime,
        connections,
        per_ip,
        tls,
    });

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    control.block_on(async move {
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(ServeError::Runtime)?;
        let mut sigint =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(ServeError::Runtime)?;
        let mut sighup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(ServeError::Runtime)?;
        let (stop_tx, stop_rx) = watch::channel(false);

        let mut threads = Vec::with_capacity(workers);
        for index in 0..workers {
            let listeners = Listeners {
                http: http
                    .as_ref()
                    .map(std::net::TcpListener::try_clone)
                    .transpose()
                    .map_err(ServeError::Runtime)?,
                https: https
                    .as_ref()
                    .map(std::net::TcpListener::try_clone)
                    .transpose()
                    .map_err(ServeError::Runtime)?,
            };
            let shared = shared.clone();
            let stop = stop_rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("leasegate-worker-{index}"))
                .spawn(move || worker(listeners, shared, stop, grace))
                .map_err(ServeError::Runtime)?;
            threads.push(thread);
        }
        if let (Some(region), Some(link)) = (region, link) {
            let listener = TcpListener::from_std(link).map_err(ServeError::Runtime)?;
            announce("link", &listener);
            let runtime = shared.runtime.clone();
            let quotas: crate::region::Quotas = Arc::new(move |name: &str| limit_quotas(&runtime.config(), name));
            let link = region.start(region_store, quotas, &shared.runtime.metrics);
            tokio::spawn(accept::serve_each(
                listener,
                "region link",
                link.limits.connections,
                move |stream, peer| {
                    let link = link.clone();
                    async move { link.serve_connection(stream, peer).await }
                },
            ));
        }
        if let Some(admin) = admin {
            let listener = TcpListener::from_std(admin).map_err(ServeError::Runtime)?;
            announce("admin", &listener);
            tokio::spawn(admin::serve(listener, shared.runtime.clone()));
        }
        if let Some(rls) = rls {
            let listener = TcpListener::from_std(rls).map_err(ServeError::Runtime)?;
            announce("rls", &listener);
            let rls = crate::rls::RlsService::new(shared.runtime.clone());
            tokio::spawn(accept::serve_each(
                listener,
                "rls",
                crate::rls::MAX_CONNECTIONS,
                move |stream, _peer| {
                    let rls = rls.clone();
                    async move { rls.serve_connection(stream).await }
                },
            ));
        }
        for (kind, l) in [("http", &http), ("https", &https)] {
            if let Some(addr) = l.as_ref().and_then(|l| l.local_addr().ok()) {
                tracing::info!(kind, %addr, "listening");
            }
        }
        drop((http, https));
        tokio::spawn(sweep_leases(shared.runtime.clone()));
        let reloader = Arc::new(Reloader::new(config_path.clone(), shared.runtime.clone()));
        tokio::spawn(reloader.clone().watch());
        tracing::info!(workers, store = store_name, "leasegate ready");

        let signal = loop {
            tokio::select! {
                _ = sigterm.recv() => break "SIGTERM",
                _ = sigint.recv() => break "SIGINT",
                _ = sighup.recv() => {
                    reloader.reload(Trigger::Sighup).await;
                }
            }
        };
        tracing::info!(
            signal,
            grace_ms = grace.as_millis() as u64,
            "shutting down: draining connections"
        );
        shared.runtime.begin_drain();
        let _ = stop_tx.send(true);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        // Unspent leased tokens go back to the shared store, within the
        // grace period (each call has the store deadline).
        match tokio::time::timeout(
            grace.max(Duration::from_millis(100)),
            shared.runtime.limiter.release_all(),
        )
        .await
        {
            Ok(released) => tracing::info!(released_tokens = released, "stopped"),
            Err(_) => tracing::warn!("stopped before every leased token went back to the store"),
        }
        Ok(())
    })
}

fn announce(kind: &str, listener: &TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(kind, %addr, "listening");
    }
}

fn worker(listeners: Listeners, shared: Arc<Shared>, stop: watch::Receiver<bool>, grace: Duration) {
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
                tracing::warn!(error = %e, "accept failed");
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

fn connection_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let g = &config.gateway;
    let mut builder = auto::Builder::new(TokioExecutor::new());
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
    sniff: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
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
    _place: Option<door::Place>,
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
        } else if let Some((settings, acceptor)) = &self.shared.tls {
            let mut stop = self.stop.clone();
            let accepted = tokio::select! {
                accepted = tls::accept(stream, settings, acceptor) => accepted,
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

    async fn http<I>(mut self, builder: &auto::Builder<TokioExecutor>, io: I, conn: ConnInfo)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let gateway = self.shared.gateway.clone();
        let idle = conn.idle_timeout;
        let conn = Arc::new(conn);
        let activity = Arc::new(door::Activity::default());
        let active = activity.clone();
        let service = service_fn(move |req| {
            let busy = active.begin();
            let (gateway, conn) = (gateway.clone(), conn.clone());
            // The request's future is made inside this one, in place: made
            // outside and moved in, it would be copied once more per request.
            async move {
                let resp = gateway.handle(req, conn).await?;
                Ok::<_, std::convert::Infallible>(resp.map(|body| door::Tracked::new(body, busy)))
            }
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
