//! The shared store of a fleet: Redis (one node, or a Redis Cluster),
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
//! Start-up never waits for Redis: a single node is connected lazily (and
//! reconnected on its own), a cluster is connected by a background task
//! that retries with backoff; until then calls fail at once with
//! [`StoreError::Unavailable`], and the guard decides what a request gets.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};

use super::{BoxFuture, QuotaStore, StoreError, Unspent};
use crate::quota::{Algorithm, Grant, Spec};

static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/token_bucket.lua")));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/sliding_window.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/release.lua")));

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
}

#[derive(Clone)]
enum Connection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn run(&mut self, script: &Script, key: &str, args: &[u64]) -> Result<[u64; 5], RedisError> {
        let mut call = script.key(key);
        for a in args {
            call.arg(*a);
        }
        let reply: Vec<i64> = match self {
            Connection::Node(c) => call.invoke_async(c).await?,
            Connection::Cluster(c) => call.invoke_async(c).await?,
        };
        // Scripts answer five integers, never negative; anything else is a
        // script from another version, not a reason to wrap around.
        match reply[..] {
            [a, b, c, d, e] => Ok([a, b, c, d, e].map(|v| v.max(0) as u64)),
            _ => Err(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected script reply",
                format!("{reply:?}"),
            ))),
        }
    }
}

/// The Redis quota store. Cheap to share; dropping it stops its I/O thread.
pub struct RedisStore {
    connection: Arc<OnceLock<Connection>>,
    io: tokio::runtime::Handle,
    /// Dropped with the store: ends the I/O thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("invalid Redis address {0}: {1}")]
    Address(String, RedisError),
    #[error("cannot start the Redis I/O thread: {0}")]
    Thread(std::io::Error),
}

impl RedisStore {
    /// Starts the I/O thread and begins connecting in the background;
    /// returns at once, whether or not Redis is up.
    pub fn start(target: &Target) -> Result<RedisStore, RedisSetupError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(RedisSetupError::Thread)?;
        let io = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("leasegate-redis".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                })
            })
            .map_err(RedisSetupError::Thread)?;
        let connection = Arc::new(OnceLock::new());
        match target {
            Target::Node(url) => {
                let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                    .map_err(|e| RedisSetupError::Address(redact(url), e))?
                    .set_tcp_settings(tcp_settings());
                let client = redis::Client::open(info).map_err(|e| RedisSetupError::Address(redact(url), e))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_millis(500));
                // Lazy: nothing is dialled until the first call, which the
                // warm-up below makes on the I/O thread.
                let manager = {
                    let _on_io = io.enter();
                    ConnectionManager::new_lazy_with_config(client, config)
                        .map_err(|e| RedisSetupError::Address(redact(url), e))?
                };
                let mut warm = manager.clone();
                let _ = connection.set(Connection::Node(manager));
                let url = redact(url);
                io.spawn(async move {
                    match redis::cmd("PING").query_async::<String>(&mut warm).await {
                        Ok(_) => tracing::info!(redis = %url, "connected to Redis"),
                        Err(e) => {
                            tracing::warn!(redis = %url, error = %e, "Redis is not reachable yet; retrying on use")
                        }
                    }
                });
            }
            Target::Cluster(seeds) => {
                let client = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
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
                io.spawn(async move {
                    let mut wait = Duration::from_millis(100);
                    loop {
                        match client.get_async_connection().await {
                            Ok(c) => {
                                tracing::info!("connected to Redis Cluster");
                                let _ = slot.set(Connection::Cluster(c));
                                return;
                            }
                            Err(e) => tracing::warn!(error = %e, "Redis Cluster is not reachable yet; retrying"),
                        }
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(2));
                    }
                });
            }
        }
        Ok(RedisStore {
            connection,
            io,
            _stop: stop,
        })
    }

    /// Runs `script` on the I/O thread. `give_back`: for an acquire, the
    /// release arguments (without the tokens and their window) that return
    /// its grant if the caller stopped waiting (the deadline passed) before
    /// the answer came, so tokens taken for nobody go back, to the window
    /// they were taken in, instead of being lost.
    fn call<'a>(
        &'a self,
        script: &'static Script,
        key: &str,
        args: Vec<u64>,
        give_back: Option<[u64; 4]>,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let Some(mut connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(StoreError::Unavailable(
                "not connected to Redis yet".into(),
            ))));
        };
        let key = key.to_owned();
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.io.spawn(async move {
            let result = connection.run(script, &key, &args).await;
            if let Err(Ok([granted, _, _, _, window_ms])) = answer.send(result) {
                if let (true, Some([algorithm, count, period, capacity])) = (granted > 0, give_back) {
                    let args = [algorithm, count, period, capacity, granted, window_ms];
                    if let Err(e) = connection.run(&RELEASE, &key, &args).await {
                        tracing::debug!(%key, error = %e, "returning a late grant failed");
                    }
                }
            }
        });
        Box::pin(async move {
            match answered.await {
                Ok(Ok([granted, remaining, reset_ms, retry_after_ms, window_ms])) => Ok(Grant {
                    granted,
                    remaining,
                    reset_ms,
                    retry_after_ms,
                    window_ms,
                }),
                Ok(Err(e)) => Err(classify(&e)),
                Err(_) => Err(StoreError::Failed("the Redis I/O thread stopped".into())),
            }
        })
    }
}

/// Connection trouble is `Unavailable`; anything Redis itself said (a
/// script error, OOM, a cluster redirect that did not settle) is `Failed`.
fn classify(e: &RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout(RESPONSE_TIMEOUT.as_millis() as u64)
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Failed(e.to_string())
    }
}

/// `release.lua`'s first argument.
fn algorithm_code(spec: &Spec) -> u64 {
    match spec.algorithm {
        Algorithm::TokenBucket => 0,
        Algorithm::SlidingWindow => 1,
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

fn redact(url: &str) -> String {
    crate::config::redact(url)
}

impl QuotaStore for RedisStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        spec: &'a Spec,
        want: u64,
        unspent: Unspent,
    ) -> BoxFuture<'a, Result<Grant, StoreError>> {
        let give_back = Some([algorithm_code(spec), spec.count, spec.period_ms(), spec.capacity]);
        let Unspent { tokens, window_ms } = unspent;
        match spec.algorithm {
            Algorithm::TokenBucket => self.call(
                &TOKEN_BUCKET,
                key,
                vec![spec.count, spec.period_ms(), spec.capacity, want, tokens],
                give_back,
            ),
            Algorithm::SlidingWindow => self.call(
                &SLIDING_WINDOW,
                key,
                vec![spec.capacity, spec.period_ms(), want, tokens, window_ms],
                give_back,
            ),
        }
    }

    fn release<'a>(&'a self, key: &'a str, spec: &'a Spec, unspent: Unspent) -> BoxFuture<'a, Result<(), StoreError>> {
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
}
