//! The shared store of a fleet: Redis (one node, the master a set of
//! Sentinels names, or a Redis Cluster),
//! changed only by the Lua scripts in `lua/`, which run the same integer
//! math as [`crate::quota`] on Redis's own clock.
//!
//! All Redis I/O runs on one dedicated thread with its own runtime: the
//! connection's driver, its reconnects and the scripts' replies never
//! depend on a request worker being free, and a worker's call is a channel
//! send and a wake-up. One multiplexed connection pipelines every
//! concurrent call (a cluster connection keeps one per master). Scripts run
//! by EVALSHA and are loaded transparently on NOSCRIPT (after a Redis
//! restart or a failover).
//!
//! No call ever waits for a dial. A single node's connection is kept by a
//! task of its own on the I/O thread (`node.rs`), dialled at start and
//! redialled with a short backoff whenever it breaks, moves (a Sentinel
//! switch) or was never made; a connection counts only once it has
//! answered a `PING` and loaded every script, so the first call on it is
//! one `EVALSHA`. A cluster is connected the same way by a background task
//! (`PING` and `SCRIPT LOAD` on every node). Until a connection is up a
//! call fails at once with [`StoreError::NotConnected`], the guard decides
//! what the request gets, and [`StoreLink`] tells start-up, the guard and
//! `/readyz` how the link stands.
//!
//! A single node's connection is ours, not the redis crate's
//! `ConnectionManager`: that one makes every call await its reconnect,
//! which retries with backoff (100 ms and more between attempts), so while
//! Redis refused connections each call hung until the guard's deadline and
//! a store that was down was reported as a slow one (`store_timeout`); and
//! a first call dialled (TCP, TLS, the scripts) inside its own deadline.
//! A connection that breaks (reset, closed) is dropped at its first such
//! error. Only the guard's deadline makes a timeout.
//!
//! With Sentinel, that single-node connection goes to the master the
//! sentinels name, and its address changes when they name another. The
//! discovery is ours too (`SENTINEL get-master-addr-by-name` over
//! short-lived connections, all sentinels at once, a majority of the
//! answers): the crate's `SentinelClient` asks on every connect, in the
//! caller's await, one sentinel after another. Here no call waits on a
//! sentinel: `follow_master` and `watch_switches` run in the
//! background, and a call made while no master is known fails at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisError, Script};
use tokio::sync::watch;

mod call_phases;
mod calls;
mod fleet_tables;
mod node;
mod overrides;
mod persistence;
mod region;
mod sentinel;

pub use persistence::warn_unless_persistent;

use super::link::StoreLink;
use super::{BoxFuture, FleetTables, QuotaStore, StoreError, Unspent};
use crate::quota::{Algorithm, Grant, Spec};
use node::{Address, Connection, Link, Node};
use sentinel::{follow_master, is_master, watch_switches, Sentinel};

static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/token_bucket.lua")));
static SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/sliding_window.lua")));
// The fixed-window scripts start with the calendar's windows
// (`lua/calendar.lua`), its one copy in Lua.
static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/calendar.lua"),
        include_str!("../../../lua/fixed_window.lua")
    ))
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../../lua/calendar.lua"),
        include_str!("../../../lua/release.lua")
    ))
});
static FLEET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/fleet.lua")));

/// The sorted set of the fleet's heartbeats (`lua/fleet.lua`): a name no
/// limit's key can take (those are `rl:{<limit>:...}`).
pub const FLEET_KEY: &str = "lg:fleet";

/// How long the client waits for a connection or a reply before calling it
/// broken. Far above the store deadline on purpose: the caller gives up
/// after `timeout_ms` (the guard), while a slow reply still lands and keeps
/// the pipeline in step.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the fleet's quota lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Node(String),
    Cluster(Vec<String>),
    /// The master the sentinels name for `master`.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

/// The Redis quota store. Cheap to share; dropping it stops its I/O thread.
pub struct RedisStore {
    connection: Arc<OnceLock<Connection>>,
    /// Where the overrides' change notices are heard (`overrides.rs`).
    notices: overrides::Notices,
    io: tokio::runtime::Handle,
    /// Where each quota call's time goes (`phases`), when set.
    metrics: Option<Arc<crate::telemetry::metrics::Metrics>>,
    /// How the connection stands (`/readyz`, start-up, the guard).
    link: Arc<StoreLink>,
    /// Where background connections are made (`aux` below).
    aux: tokio::runtime::Handle,
    /// Dropped with the store: ends the I/O threads.
    _stop: (tokio::sync::oneshot::Sender<()>, tokio::sync::oneshot::Sender<()>),
}

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("invalid Redis address {0}: {1}")]
    Address(String, RedisError),
    #[error("cannot start the Redis I/O thread: {0}")]
    Thread(std::io::Error),
}

/// A current-thread runtime on a thread named `name`, until the sender is
/// dropped.
fn io_thread(name: &str) -> Result<(tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>), RedisSetupError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RedisSetupError::Thread)?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            })
        })
        .map_err(RedisSetupError::Thread)?;
    Ok((handle, stop))
}

/// A client for `info`: over TLS (`rediss://`) trusting `ca` (PEM) when
/// given, else the system's roots.
pub(super) fn client(info: redis::ConnectionInfo, ca: Option<&[u8]>) -> redis::RedisResult<redis::Client> {
    match (info.addr(), ca) {
        (redis::ConnectionAddr::TcpTls { .. }, Some(ca)) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.to_vec()),
            },
        ),
        _ => redis::Client::open(info),
    }
}

impl RedisStore {
    /// Starts the I/O thread and begins connecting in the background;
    /// returns at once, whether or not Redis is up.
    pub fn start(target: &Target) -> Result<RedisStore, RedisSetupError> {
        RedisStore::start_with_ca(target, None)
    }

    /// [`RedisStore::start`], trusting `ca` (PEM CA certificates) for
    /// `rediss://` addresses instead of the system's roots.
    pub fn start_with_ca(target: &Target, ca: Option<Vec<u8>>) -> Result<RedisStore, RedisSetupError> {
        let (io, stop) = io_thread("leasegate-redis")?;
        // Connections made in the background besides the calls' own (the
        // overrides' notices, the sentinels asked each second), on a thread
        // of their own: a TLS handshake there never delays a call.
        let (aux, stop_aux) = io_thread("leasegate-redis-aux")?;
        let connection = Arc::new(OnceLock::new());
        let link = Arc::new(StoreLink::connecting());
        let notices;
        match target {
            Target::Node(url) => {
                let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                    .map_err(|e| RedisSetupError::Address(redact(url), e))?
                    .set_tcp_settings(tcp_settings());
                let client = client(info, ca.as_deref()).map_err(|e| RedisSetupError::Address(redact(url), e))?;
                let address = Address {
                    client: Some(client),
                    shown: redact(url),
                    epoch: 0,
                };
                let node = Arc::new(Node::new(address, None, link.clone()));
                notices = overrides::Notices::Node(node.clone());
                let _ = connection.set(Connection::Node(node.clone()));
                io.spawn(node.keep());
            }
            Target::Sentinel { sentinels, master } => {
                let shown: Vec<String> = sentinels.iter().map(|s| redact(s)).collect();
                let mut asks = Vec::new();
                let mut template = None;
                for (url, shown) in sentinels.iter().zip(&shown) {
                    let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                        .map_err(|e| RedisSetupError::Address(shown.clone(), e))?
                        .set_tcp_settings(tcp_settings());
                    // The master is dialled with the first sentinel URL's
                    // credentials and database.
                    template.get_or_insert_with(|| info.clone());
                    let resp3 = info
                        .redis_settings()
                        .clone()
                        .set_protocol(redis::ProtocolVersion::RESP3);
                    let events = client(info.clone().set_redis_settings(resp3), ca.as_deref())
                        .map_err(|e| RedisSetupError::Address(shown.clone(), e))?;
                    let client = client(info, ca.as_deref()).map_err(|e| RedisSetupError::Address(shown.clone(), e))?;
                    asks.push(Sentinel {
                        client,
                        events,
                        shown: shown.clone(),
                    });
                }
                let Some(template) = template else {
                    return Err(RedisSetupError::Address(
                        "sentinel".into(),
                        RedisError::from((redis::ErrorKind::InvalidClientConfig, "no sentinels")),
                    ));
                };
                let address = Address {
                    client: None,
                    shown: format!("master {master:?} of sentinels {}", shown.join(",")),
                    epoch: 0,
                };
                let notify = Arc::new(tokio::sync::Notify::new());
                let node = Arc::new(Node::new(address, Some(notify), link.clone()));
                notices = overrides::Notices::Node(node.clone());
                let _ = connection.set(Connection::Node(node.clone()));
                let asks = Arc::new(asks);
                io.spawn(node.clone().keep());
                aux.spawn(watch_switches(node.clone(), asks.clone(), master.clone()));
                aux.spawn(follow_master(node, asks, master.clone(), template, ca));
            }
            Target::Cluster(seeds) => {
                // Any node hears a PUBLISH in a cluster: the seeds, in turn.
                let mut each = Vec::new();
                for seed in seeds {
                    let info = redis::IntoConnectionInfo::into_connection_info(seed.as_str())
                        .map_err(|e| RedisSetupError::Address(redact(seed), e))?;
                    each.push(client(info, ca.as_deref()).map_err(|e| RedisSetupError::Address(redact(seed), e))?);
                }
                notices = overrides::Notices::Seeds(each);
                let builder = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str));
                let builder = match ca {
                    Some(ca) => builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca),
                    }),
                    None => builder,
                };
                let client = builder
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .tcp_settings(tcp_settings())
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(200)
                    .build()
                    .map_err(|e| {
                        let shown: Vec<String> = seeds.iter().map(|s| redact(s)).collect();
                        RedisSetupError::Address(shown.join(","), e)
                    })?;
                let slot = connection.clone();
                let shared = link.clone();
                io.spawn(async move {
                    let mut wait = Duration::from_millis(50);
                    // A cluster down for hours is retried twice a second:
                    // its WARN says when the reason changes, not each time.
                    let mut said = None;
                    loop {
                        match connect_cluster(&client).await {
                            Ok(c) => {
                                tracing::info!("connected to Redis Cluster");
                                let _ = slot.set(Connection::Cluster(c));
                                shared.answered();
                                return;
                            }
                            Err(e) => {
                                if said.as_ref() != Some(&e) {
                                    tracing::warn!(error = %e, "Redis Cluster is not reachable yet; retrying");
                                } else {
                                    tracing::debug!(error = %e, "Redis Cluster is not reachable yet; retrying");
                                }
                                said = Some(e.clone());
                                shared.dial_failed(e);
                            }
                        }
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_millis(500));
                    }
                });
            }
        }
        Ok(RedisStore {
            connection,
            notices,
            io,
            metrics: None,
            link,
            aux,
            _stop: (stop, stop_aux),
        })
    }

    /// How the connection stands: start-up waits on it, the guard follows
    /// it, `/readyz` reports it.
    pub fn link(&self) -> Arc<StoreLink> {
        self.link.clone()
    }

    /// Records where each quota call's time goes
    /// (`leasegate_store_call_phase_seconds`) in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::telemetry::metrics::Metrics>) -> RedisStore {
        self.metrics = Some(metrics);
        self
    }
}

impl RedisStore {
    /// `PING` on the I/O thread, over the connection calls use (dialling
    /// it if there is none, as a call would); with Sentinel, `ROLE`, which
    /// must say `master`.
    fn ping_on_io(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let Some(connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(not_connected())));
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.io.spawn(async move {
            let ping = redis::cmd("PING");
            let result = match connection {
                // With Sentinel, `ROLE` instead: a replica answers PING
                // too, and would close the circuit only for the next
                // scripts to meet READONLY.
                Connection::Node(node) if node.rediscover.is_some() => match node.connection() {
                    Ok((mut c, generation)) => match redis::cmd("ROLE").query_async::<redis::Value>(&mut c).await {
                        Ok(role) if is_master(&role) => Ok(()),
                        Ok(_) => {
                            node.not_master(generation);
                            Err(StoreError::Unavailable("the node is not the master (ROLE)".into()))
                        }
                        Err(e) => {
                            node.failed(generation, &e);
                            Err(classify(&e))
                        }
                    },
                    Err(e) => Err(e),
                },
                Connection::Node(node) => match node.connection() {
                    Ok((mut c, generation)) => {
                        let reply = ping.query_async::<String>(&mut c).await;
                        if let Err(e) = &reply {
                            node.failed(generation, e);
                        }
                        reply.map(|_| ()).map_err(|e| classify(&e))
                    }
                    Err(e) => Err(e),
                },
                Connection::Cluster(mut c) => ping
                    .query_async::<String>(&mut c)
                    .await
                    .map(|_| ())
                    .map_err(|e| classify(&e)),
            };
            let _ = answer.send(result);
        });
        Box::pin(async move {
            answered
                .await
                .unwrap_or_else(|_| Err(StoreError::Failed("the Redis I/O thread stopped".into())))
        })
    }
}

/// Connection trouble (refused, reset, closed, and the client's own
/// connect and reply timeouts, which only a deadline above them lets
/// anyone see) is `Unavailable`; anything Redis itself said (a script
/// error, OOM, a cluster redirect that did not settle) is `Failed`. Never
/// `Timeout`: that is the guard's deadline, and only the deadline's.
fn classify(e: &RedisError) -> StoreError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Failed(e.to_string())
    }
}

/// A call made before the first connection (a cluster's) was up.
pub(super) fn not_connected() -> StoreError {
    StoreError::NotConnected("not connected to Redis yet".into())
}

/// Every script the gateway runs, for loading on each new connection: the
/// first call on it is then one `EVALSHA`, not an `EVALSHA`, a `NOSCRIPT`,
/// a `SCRIPT LOAD` and an `EVALSHA` (three round trips, which a Redis a
/// zone away cannot make within the call's deadline).
fn scripts() -> Vec<&'static Script> {
    let mut all = vec![&*TOKEN_BUCKET, &*SLIDING_WINDOW, &*FIXED_WINDOW, &*RELEASE, &*FLEET];
    all.extend(fleet_tables::scripts());
    all.extend(overrides::scripts());
    all.extend(region::scripts());
    all
}

/// Loads [`scripts`] on `c` (a cluster connection sends `SCRIPT LOAD` to
/// every node), all at once.
pub(super) async fn load_scripts<C>(c: &C) -> Result<(), String>
where
    C: redis::aio::ConnectionLike + Clone + Send + 'static,
{
    let mut loads = tokio::task::JoinSet::new();
    for script in scripts() {
        let mut c = c.clone();
        loads.spawn(async move { script.load_async(&mut c).await });
    }
    while let Some(loaded) = loads.join_next().await {
        match loaded {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("Redis did not load the scripts: {e}")),
            Err(e) => return Err(format!("loading the scripts stopped: {e}")),
        }
    }
    Ok(())
}

/// One attempt at a cluster connection, proved as a node's is: `PING` and
/// the scripts on every node.
async fn connect_cluster(client: &redis::cluster::ClusterClient) -> Result<ClusterConnection, String> {
    let mut c = client
        .get_async_connection()
        .await
        .map_err(|e| format!("cannot connect to Redis Cluster: {e}"))?;
    redis::cmd("PING")
        .query_async::<String>(&mut c)
        .await
        .map_err(|e| format!("Redis Cluster did not answer PING: {e}"))?;
    load_scripts(&c).await?;
    Ok(c)
}

/// `release.lua`'s first argument.
fn algorithm_code(spec: &Spec) -> u64 {
    match spec.algorithm {
        Algorithm::TokenBucket => 0,
        Algorithm::SlidingWindow => 1,
        // A calendar's fixed window: 4 (week), 5 (month).
        Algorithm::FixedWindow => match spec.calendar().code() {
            0 => 2,
            c => 3 + c,
        },
        // Never released as tokens (`hold_slots` gives slots back).
        Algorithm::Concurrency => 3,
    }
}

/// Fail fast on a peer that vanished without a reset (a host that died, an
/// address moved in a failover): unacknowledged data or silent keepalives
/// end the connection within seconds, and the client reconnects, instead of
/// every call timing out until the kernel gives up many minutes later.
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(
            socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(5))
                .with_interval(Duration::from_secs(2))
                .with_retries(3),
        )
        .set_user_timeout(Duration::from_secs(5))
}

/// `redis://user:secret@host` → `redis://user:***@host`: summaries and logs
/// never show a password.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The last '@' ends the user info: a password may hold one.
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

impl RedisStore {
    /// The acquire script of `spec`'s algorithm; `reserve` goes to the
    /// token bucket's (the windows never reserve).
    fn acquire_with<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let give_back = Some([algorithm_code(spec), spec.count, spec.period_ms(), spec.capacity]);
        let Unspent {
            tokens,
            window_ms,
            charge,
            need,
        } = unspent;
        match spec.algorithm {
            Algorithm::TokenBucket => self.call(
                &TOKEN_BUCKET,
                key,
                vec![
                    spec.count,
                    spec.period_ms(),
                    spec.capacity,
                    want,
                    tokens,
                    u64::from(reserve),
                    charge,
                    need,
                ],
                give_back,
            ),
            Algorithm::SlidingWindow => self.call(
                &SLIDING_WINDOW,
                key,
                vec![spec.capacity, spec.period_ms(), want, tokens, window_ms, charge, need],
                give_back,
            ),
            Algorithm::FixedWindow => self.call(
                &FIXED_WINDOW,
                key,
                vec![
                    spec.capacity,
                    spec.period_ms(),
                    want,
                    tokens,
                    window_ms,
                    spec.calendar().code(),
                    charge,
                    need,
                ],
                give_back,
            ),
            Algorithm::Concurrency => Box::pin(std::future::ready(Err(StoreError::Failed(
                "a concurrency limit holds slots, not tokens".into(),
            )))),
        }
    }
}

impl QuotaStore for RedisStore {
    fn grant<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
        reserve: bool,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        self.acquire_with(key, spec, want, unspent, reserve)
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
        if spec.algorithm == Algorithm::Concurrency {
            return Box::pin(std::future::ready(Ok(())));
        }
        let call = self.call(
            &RELEASE,
            key,
            vec![
                algorithm_code(spec),
                spec.count,
                spec.period_ms(),
                spec.capacity,
                unspent.tokens,
                unspent.window_ms,
            ],
            None,
        );
        Box::pin(async move { call.await.map(|_| ()) })
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.ping_on_io()
    }
}

impl FleetTables for RedisStore {
    fn heartbeat(&self, member: u64, ttl_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let call = self.call_keys(&FLEET, vec![FLEET_KEY.to_string()], vec![member, ttl_ms]);
        Box::pin(async move { call.await.map(|r| r[0]) })
    }

    fn overrides<'a>(&'a self, op: super::OverrideOp<'a>) -> BoxFuture<'a, Result<super::Overridden, StoreError>> {
        self.overrides_call(op)
    }

    fn watch_overrides(&self, wake: Arc<tokio::sync::Notify>) {
        self.subscribe_overrides(wake);
    }

    fn hold_slots<'a>(&'a self, h: super::Hold<'a>) -> BoxFuture<'a, Result<super::Slots, StoreError>> {
        self.slots_call(h)
    }

    fn fair_share<'a>(&'a self, d: super::Demand<'a>) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.fair_share_call(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_master_role_is_the_master() {
        use redis::Value;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert!(is_master(&Value::Array(vec![
            bulk("master"),
            Value::Int(0),
            Value::Array(vec![])
        ])));
        assert!(!is_master(&Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(6379)
        ])));
        assert!(!is_master(&Value::Array(vec![bulk("sentinel")])));
        assert!(!is_master(&Value::Nil));
    }

    #[test]
    fn passwords_never_reach_a_log_or_summary() {
        assert_eq!(
            redact("redis://:hunter2@10.0.0.1:6379/0"),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            redact("rediss://app:pw@r.example:6380"),
            "rediss://app:***@r.example:6380"
        );
        // A password holding '@' is hidden whole.
        assert_eq!(
            redact("redis://app:p@ss@w0rd@10.0.0.1:6379"),
            "redis://app:***@10.0.0.1:6379"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
