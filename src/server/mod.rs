//! The composition root: binds every listener, builds the stores, the
//! [`Runtime`] and the [`Gateway`], starts the workers (`worker.rs`) and
//! runs every other accept loop (admin, `[rls]`, the region link) on the
//! control runtime, with the reload watch and the lease sweeper.
//!
//! Thread per core: `gateway.workers` threads, each with a single-threaded
//! tokio runtime and its own clone of every listening socket, so a request
//! stays on one thread from accept to response. The main thread waits for
//! SIGINT/SIGTERM, then asks every worker to stop accepting and drain its
//! connections within the grace period.

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
mod admin_response;
pub mod connection_cap;
pub mod opening_deadline;
mod overrides;
pub mod ping_store;
pub mod prefixed;
pub mod query;
pub mod reload;
pub mod status;
mod stores;
mod streams;
pub mod tls;
mod worker;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::Config;
use crate::gateway::Gateway;
use crate::limit::fleet::Heartbeat;
use crate::limit::slots::SlotRenewer;
use crate::runtime::Runtime;
use crate::store::redis::RedisSetupError;
use crate::telemetry::metrics::Metrics;
use reload::{Reloader, Trigger};
use stores::{limit_quotas, store, wait_for_store, RuntimeCell, Stores};
use worker::{worker, Listeners, Shared};

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

/// How much lower than the rest of the process the RLS threads run: a
/// step above the process's own niceness, so that a gateway started under
/// `nice` keeps its workers ahead of RLS.
const RLS_NICE: i32 = 10;

/// The highest niceness Linux gives.
const NICE_MAX: i32 = 19;

/// The niceness of the RLS threads: the calling thread's (the process's
/// own, asked before any thread was lowered) plus [`RLS_NICE`], at most
/// [`NICE_MAX`].
fn rls_nice() -> i32 {
    let own = rustix::process::getpriority_process(None).unwrap_or(0);
    own.saturating_add(RLS_NICE).min(NICE_MAX)
}

/// Returns expired leases to the store and forgets idle keys, for as long
/// as the process runs.
async fn sweep_leases(runtime: Arc<Runtime>) {
    loop {
        let (every, idle_ms) = crate::limit::sweep::sweep_timing(&runtime.limiter.settings());
        tokio::time::sleep(every).await;
        runtime.limiter.sweeper().sweep(idle_ms).await;
        runtime
            .metrics
            .lease_keys
            .set(runtime.limiter.report().tracked_keys() as i64);
    }
}

/// This instance's member of the fleet's heartbeats: random per process,
/// so two instances never share one (even with one `instance_id`).
fn fleet_member(instance_id: &str) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one((instance_id, std::process::id()))
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
        (Some(t), Some(_)) => Some(t.clone()),
        (None, Some(_)) => return Err(ServeError::NoTls),
        _ => None,
    };
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let workers = config.gateway.workers;
    let grace = config.gateway.grace_period;
    let runtime_cell = RuntimeCell::default();
    let Stores {
        quota: store,
        guard,
        link: store_link,
        regional: region_store,
        region,
    } = store(&config, &metrics, &runtime_cell)?;
    let connect_timeout = config.store.connect_timeout;
    let store_name = store.name();
    let connections = Arc::new(Semaphore::new(config.gateway.max_connections));
    let per_ip = connection_cap::per_ip(&config);
    let config_instance_id = config.gateway.instance_id.clone();
    let rls_threads = config.rls.as_ref().map(|r| r.workers);
    let runtime = Arc::new(Runtime::new(config, metrics, store).with_store_link(store_link.clone()));
    let _ = runtime_cell.set(Arc::downgrade(&runtime));
    // RLS on its own threads: a flood of calls cannot delay admin, the
    // region link, the lease sweeps or a reload on the control thread. At a
    // lower CPU priority: on a core they share, the workers and the control
    // thread preempt them, so a flood takes the CPU those leave over.
    let rls_runtime = rls_threads
        .map(RlsRuntime::start)
        .transpose()
        .map_err(ServeError::Runtime)?;
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
    let rls_rt = rls_runtime.as_ref();
    let checked = shared.runtime.clone();
    let served = control.block_on(async move {
        // Active health checks run on this thread's runtime.
        checked.start_health_checks();
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(ServeError::Runtime)?;
        let mut sigint =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(ServeError::Runtime)?;
        let mut sighup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(ServeError::Runtime)?;
        let (stop_tx, stop_rx) = watch::channel(false);

        // The admin listener first, so `/readyz` says how the store stands
        // while start waits for it; then the store's first answer, before
        // any listener that takes traffic is served (connections made
        // meanwhile wait in the kernel's backlog).
        if let Some(admin) = admin {
            let listener = TcpListener::from_std(admin).map_err(ServeError::Runtime)?;
            announce("admin", &listener);
            tokio::spawn(admin::serve(listener, shared.runtime.clone()));
        }
        tokio::spawn(guard.follow(store_link.clone()));
        wait_for_store(&store_link, store_name, connect_timeout).await;

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
            let tls = PlaneTls::of(&shared.runtime, ("region_link", "region_link_subject"), |c| {
                c.region.as_ref()?.tls.as_ref()
            });
            tokio::spawn(accept::serve_each(
                listener,
                "region link",
                link.limits.connections,
                move |stream, peer| {
                    let (link, tls) = (link.clone(), tls.clone());
                    async move {
                        if let Some(stream) = PlaneTls::open(tls.as_ref(), stream, peer).await {
                            link.serve_connection(stream, peer).await
                        }
                    }
                },
            ));
        }
        if let (Some(rls), Some(rls_runtime)) = (rls, rls_rt.map(RlsRuntime::handle)) {
            let _entered = rls_runtime.enter();
            let listener = TcpListener::from_std(rls).map_err(ServeError::Runtime)?;
            announce("rls", &listener);
            let service = crate::rls::RlsService::new(shared.runtime.clone());
            let tls = PlaneTls::of(&shared.runtime, ("rls", "rls_subject"), |c| {
                c.rls.as_ref()?.tls.as_ref()
            });
            rls_runtime.spawn(accept::serve_each(
                listener,
                "rls",
                crate::rls::MAX_CONNECTIONS,
                move |stream, peer| {
                    let (rls, tls) = (service.clone(), tls.clone());
                    async move {
                        if let Some(stream) = PlaneTls::open(tls.as_ref(), stream, peer).await {
                            rls.serve_connection(stream).await
                        }
                    }
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
        let slot_renewer = Arc::new(SlotRenewer::of(&shared.runtime.limiter));
        tokio::spawn(slot_renewer.clone().run());
        let in_force = shared.runtime.clone();
        tokio::spawn(
            shared
                .runtime
                .overrides
                .clone()
                .run(move || overrides::overridable(&in_force.config())),
        );
        let member = fleet_member(&config_instance_id);
        let heartbeat = Arc::new(Heartbeat::of(&shared.runtime.limiter, member));
        let heartbeats = tokio::spawn(heartbeat.clone().run());
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
            shared.runtime.limiter.sweeper().release_all(),
        )
        .await
        {
            Ok(released) => tracing::info!(released_tokens = released, "stopped"),
            Err(_) => tracing::warn!("stopped before every leased token went back to the store"),
        }
        // Idle in-flight slots go back too (in flight ones ended with the
        // connections).
        let _ = tokio::time::timeout(Duration::from_millis(500), slot_renewer.renew(true)).await;
        // No heartbeat after leaving: it would count this instance again.
        heartbeats.abort();
        let _ = tokio::time::timeout(Duration::from_millis(500), heartbeat.leave()).await;
        Ok(())
    });
    if let Some(rls_runtime) = rls_runtime {
        rls_runtime.stop();
    }
    served
}

/// RLS's own runtime, its threads named `leasegate-rls` at [`rls_nice`].
/// One worker: a current-thread runtime on a thread of its own (a
/// multi-thread runtime's scheduling cost a fifth of the calls a second
/// then); more: a multi-thread runtime.
enum RlsRuntime {
    One {
        handle: tokio::runtime::Handle,
        stop: tokio::sync::oneshot::Sender<()>,
    },
    Many(tokio::runtime::Runtime),
}

/// Sets the calling thread's niceness to `nice` (from [`rls_nice`]):
/// absolute, not a step from the thread's own, as a thread an RLS thread
/// starts is born lowered already.
fn lower_priority(nice: i32) {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), nice) {
        tracing::debug!(error = %e, "rls: cannot lower this thread's priority");
    }
}

impl RlsRuntime {
    fn start(workers: usize) -> io::Result<RlsRuntime> {
        let nice = rls_nice();
        if workers > 1 {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("leasegate-rls")
                .on_thread_start(move || lower_priority(nice))
                .enable_all()
                .build()?;
            return Ok(RlsRuntime::Many(runtime));
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("leasegate-rls".into())
            .spawn(move || {
                lower_priority(nice);
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(RlsRuntime::One { handle, stop })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        match self {
            RlsRuntime::One { handle, .. } => handle,
            RlsRuntime::Many(runtime) => runtime.handle(),
        }
    }

    /// Stops it without waiting for its connections (the process is
    /// ending).
    fn stop(self) {
        match self {
            RlsRuntime::One { stop, .. } => {
                let _ = stop.send(());
            }
            RlsRuntime::Many(runtime) => runtime.shutdown_background(),
        }
    }
}

/// A connection of `[rls]` or the region link: TCP, or TLS over it.
trait PlaneIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> PlaneIo for T {}
type PlaneStream = Box<dyn PlaneIo>;

/// The TLS of a plane that talks to machines (`[rls]`, the region link):
/// on or off for the life of the process (a reload cannot turn it off),
/// with the certificates of the config in force at each handshake.
#[derive(Clone)]
struct PlaneTls {
    runtime: Arc<Runtime>,
    /// `reason` of `leasegate_tls_handshake_failures_total`.
    plane: &'static str,
    /// Its `reason` for a verified certificate not in `allow_subjects`.
    unlisted: &'static str,
    at_start: crate::config::PeerTls,
    current: fn(&Config) -> Option<&crate::config::PeerTls>,
}

impl PlaneTls {
    fn of(
        runtime: &Arc<Runtime>,
        (plane, unlisted): (&'static str, &'static str),
        current: fn(&Config) -> Option<&crate::config::PeerTls>,
    ) -> Option<PlaneTls> {
        let at_start = current(&runtime.config())?.clone();
        Some(PlaneTls {
            runtime: runtime.clone(),
            plane,
            unlisted,
            at_start,
            current,
        })
    }

    fn count(&self, reason: &'static str) {
        self.runtime
            .metrics
            .tls_handshake_failures
            .get_or_create(&crate::telemetry::metrics::ReasonLabels { reason })
            .inc();
    }

    /// A plane's connection as its service reads it: the TCP stream
    /// itself without TLS, else after the handshake; `None` when the peer
    /// failed that.
    async fn open(tls: Option<&PlaneTls>, stream: tokio::net::TcpStream, peer: SocketAddr) -> Option<PlaneStream> {
        match tls {
            None => Some(Box::new(stream)),
            Some(tls) => Some(Box::new(tls.accept(stream, peer).await?)),
        }
    }

    /// The handshake; `None` (counted, logged at DEBUG) when the peer
    /// failed it: no certificate, one the CA did not sign, or too slow.
    /// A certificate the CA signed whose names are not in the plane's
    /// `allow_subjects` is refused right after the handshake, before a
    /// byte of gRPC or HTTP is read: counted under its own reason and
    /// logged at WARN (an insider's certificate used on the wrong plane).
    async fn accept(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let config = self.runtime.config();
        let current = (self.current)(&config).unwrap_or(&self.at_start);
        match tls::accept_peer(stream, current.server.clone()).await {
            Ok(s) => {
                let names = s
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|leaf| crate::identity::client_cert::subject_names(leaf))
                    .unwrap_or_default();
                if current.allows(&names) {
                    return Some(s);
                }
                // The names are the peer's own text: a few, each cut short
                // and escaped by `?`.
                let shown: Vec<&str> = names
                    .iter()
                    .take(4)
                    .map(|n| n.get(..n.len().min(64)).unwrap_or_default())
                    .collect();
                tracing::warn!(plane = self.plane, %peer, names = ?shown, "certificate not in allow_subjects: connection refused");
                self.count(self.unlisted);
                None
            }
            Err(e) => {
                tracing::debug!(plane = self.plane, %peer, error = %e, "TLS connection dropped");
                self.count(self.plane);
                None
            }
        }
    }
}

fn announce(kind: &str, listener: &TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(kind, %addr, "listening");
    }
}
