//! The single-node connection: ours, not the crate's `ConnectionManager`
//! (see the parent module), whose address changes when the sentinels name
//! another master; and the connection enum a call runs on.

use super::*;
use crate::sync::Recover;

#[derive(Clone)]
pub(super) enum Connection {
    Node(Arc<Node>),
    Cluster(ClusterConnection),
}

/// Why a call failed: Redis's own error, or no connection to send it on.
pub(super) enum CallError {
    Redis(RedisError),
    NotConnected(StoreError),
}

impl From<RedisError> for CallError {
    fn from(e: RedisError) -> CallError {
        CallError::Redis(e)
    }
}

impl CallError {
    pub(super) fn classify(&self) -> StoreError {
        match self {
            CallError::Redis(e) => classify(e),
            CallError::NotConnected(e) => e.clone(),
        }
    }
}

impl Connection {
    /// `script` over `keys` with string arguments, its reply as Redis sent
    /// it (the overrides script answers strings).
    pub(super) async fn run_values(
        &mut self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Vec<String>, CallError> {
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(k);
        }
        for a in args {
            call.arg(a);
        }
        self.invoke(&call).await
    }

    /// Runs a prepared script call on this connection; a node's connection
    /// that fails is dropped for the next call to dial again.
    async fn invoke<T: redis::FromRedisValue>(&mut self, call: &redis::ScriptInvocation<'_>) -> Result<T, CallError> {
        Ok(match self {
            Connection::Node(node) => {
                let (mut c, generation) = node.connection().await.map_err(CallError::NotConnected)?;
                let reply = call.invoke_async(&mut c).await;
                if let Err(e) = &reply {
                    node.failed(generation, e);
                }
                reply?
            }
            Connection::Cluster(c) => call.invoke_async(c).await?,
        })
    }

    pub(super) async fn run(&mut self, script: &Script, key: &str, args: &[u64]) -> Result<[u64; 7], CallError> {
        self.run_keys(script, &[key], args).await
    }

    /// `run` with several keys (all in one hash slot: `rl:{...}` and keys
    /// named after it).
    pub(super) async fn run_keys(
        &mut self,
        script: &Script,
        keys: &[&str],
        args: &[u64],
    ) -> Result<[u64; 7], CallError> {
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(*k);
        }
        for a in args {
            call.arg(*a);
        }
        let reply: Vec<i64> = self.invoke(&call).await?;
        // Scripts answer five to seven integers (the acquires: what the
        // token bucket reserved, what the key owes), never negative;
        // anything else is a script from another version, not a reason to
        // wrap around.
        match reply[..] {
            [a, b, c, d, e] => Ok([a, b, c, d, e, 0, 0].map(|v| v.max(0) as u64)),
            [a, b, c, d, e, f] => Ok([a, b, c, d, e, f, 0].map(|v| v.max(0) as u64)),
            [a, b, c, d, e, f, g] => Ok([a, b, c, d, e, f, g].map(|v| v.max(0) as u64)),
            _ => Err(CallError::Redis(RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected script reply",
                format!("{reply:?}"),
            )))),
        }
    }
}

/// One Redis node's connection, dialled on demand. Lives on the I/O
/// thread: its methods run in tasks there, and so do its dials. The node's
/// address is fixed for `url`; with Sentinel it is the master the sentinels
/// named last, and changes when they name another.
pub(super) struct Node {
    pub(super) address: std::sync::Mutex<Address>,
    pub(super) config: AsyncConnectionConfig,
    pub(super) link: watch::Sender<Link>,
    /// Connections made so far: the next one's generation.
    pub(super) dialled: AtomicU64,
    pub(super) io: tokio::runtime::Handle,
    /// Sentinel only: wakes the discovery task (a call failed, or there is
    /// no master to dial).
    pub(super) rediscover: Option<Arc<tokio::sync::Notify>>,
}

/// Where a node's connection goes.
#[derive(Clone)]
pub(super) struct Address {
    /// `None`: the sentinels have named no master yet.
    pub(super) client: Option<redis::Client>,
    /// Redacted address, for logs.
    pub(super) shown: String,
    /// Changes with every new address: a connection dialled to an older
    /// one is not kept.
    pub(super) epoch: u64,
}

#[derive(Clone)]
pub(super) enum Link {
    /// No connection: never dialled, the connection broke, or the last
    /// attempt failed (its reason). The next call dials.
    Down(Option<String>),
    /// One connect attempt in flight; callers wait for its outcome.
    Connecting,
    /// Connected. `generation` tells this connection from later ones, so a
    /// late failure on an old connection cannot drop a new one.
    Up {
        connection: MultiplexedConnection,
        generation: u64,
    },
}

impl Node {
    pub(super) fn new(
        address: Address,
        io: tokio::runtime::Handle,
        rediscover: Option<Arc<tokio::sync::Notify>>,
    ) -> Node {
        Node {
            address: std::sync::Mutex::new(address),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT)),
            link: watch::Sender::new(Link::Down(None)),
            dialled: AtomicU64::new(0),
            io,
            rediscover,
        }
    }

    pub(super) fn address(&self) -> Address {
        self.address.lock().recover().clone()
    }

    pub(super) fn shown(&self) -> String {
        self.address().shown
    }

    /// Sentinel: ask the sentinels again, soon (in the background; nobody
    /// waits for it).
    pub(super) fn rediscover(&self) {
        if let Some(notify) = &self.rediscover {
            notify.notify_one();
        }
    }

    /// The sentinels named `client` (shown as `shown`) the master. A new
    /// address drops the connection to the old one; the next call dials
    /// the new one. True if the address is new.
    pub(super) fn moved_to(&self, client: redis::Client, shown: String) -> bool {
        {
            let mut address = self.address.lock().recover();
            if address.client.is_some() && address.shown == shown {
                return false;
            }
            tracing::info!(from = %address.shown, to = %shown, "the sentinels name a new Redis master");
            *address = Address {
                client: Some(client),
                shown: shown.clone(),
                epoch: address.epoch + 1,
            };
        }
        // A dial in flight sees the new epoch when it ends.
        self.link.send_if_modified(|link| match link {
            Link::Up { .. } => {
                *link = Link::Down(Some(format!("the Redis master moved to {shown}")));
                true
            }
            Link::Down(_) | Link::Connecting => false,
        });
        true
    }

    /// The connection to send a call on: the one at hand, or the outcome of
    /// the connect attempt in flight (started here if there is none).
    pub(super) async fn connection(self: &Arc<Self>) -> Result<(MultiplexedConnection, u64), StoreError> {
        // The steady state: one read lock and a clone of a handle.
        if let Link::Up { connection, generation } = &*self.link.borrow() {
            return Ok((connection.clone(), *generation));
        }
        let mut watching = self.link.subscribe();
        let dial = self.link.send_if_modified(|link| match link {
            Link::Down(_) => {
                *link = Link::Connecting;
                true
            }
            Link::Connecting | Link::Up { .. } => false,
        });
        if dial {
            self.io.spawn(self.clone().dial());
        }
        let link = watching
            .wait_for(|link| !matches!(link, Link::Connecting))
            .await
            .map(|link| link.clone())
            .map_err(|_| StoreError::Failed("the Redis connection state is gone".into()))?;
        match link {
            Link::Up { connection, generation } => Ok((connection, generation)),
            Link::Down(reason) => Err(StoreError::Unavailable(
                reason.unwrap_or_else(|| "not connected to Redis".into()),
            )),
            Link::Connecting => Err(StoreError::Unavailable("connecting to Redis".into())),
        }
    }

    /// One connect attempt; its outcome is the new link. No retries and no
    /// backoff here: the next call (the breaker's probe, once it is open)
    /// makes the next attempt.
    pub(super) async fn dial(self: Arc<Self>) {
        let address = self.address();
        let result = match &address.client {
            Some(client) => client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
                .map_err(|e| format!("cannot connect to Redis: {e}")),
            None => Err("no Redis master known: the sentinels have not named one".to_string()),
        };
        let moved = self.address().epoch != address.epoch;
        if result.is_err() || moved {
            self.rediscover();
        }
        self.link.send_modify(|link| {
            *link = match result {
                Ok(_) if moved => Link::Down(Some("the Redis master moved while connecting".into())),
                Ok(connection) => {
                    tracing::info!(redis = %address.shown, "connected to Redis");
                    let generation = self.dialled.fetch_add(1, Ordering::Relaxed);
                    Link::Up { connection, generation }
                }
                Err(e) => {
                    tracing::debug!(redis = %address.shown, error = %e, "cannot connect to Redis");
                    Link::Down(Some(e))
                }
            }
        });
    }

    /// Connection `generation` goes to a node that says it is not the
    /// master: dropped, and the sentinels asked where the master is.
    pub(super) fn not_master(&self, generation: u64) {
        self.rediscover();
        self.link.send_if_modified(|link| match link {
            Link::Up { generation: g, .. } if *g == generation => {
                tracing::warn!(redis = %self.shown(), "the Redis node is not the master (ROLE); asking the sentinels");
                *link = Link::Down(Some("the node is not the master".into()));
                true
            }
            _ => false,
        });
    }

    /// A call on connection `generation` failed with `e`: a connection that
    /// broke is dropped, so the next call dials instead of failing on it.
    /// With Sentinel, so is one to a node that is no longer the master
    /// (`READONLY`: a replica now) or not yet one (`LOADING`), and the
    /// sentinels are asked where the master went.
    pub(super) fn failed(&self, generation: u64, e: &RedisError) {
        let demoted = self.rediscover.is_some()
            && matches!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::BusyLoading)
            );
        if !e.is_unrecoverable_error() && !demoted {
            return; // a script error, OOM, a timeout: the connection is fine
        }
        self.rediscover();
        self.link.send_if_modified(|link| match link {
            Link::Up { generation: g, .. } if *g == generation => {
                tracing::warn!(redis = %self.shown(), error = %e, "lost the Redis connection");
                *link = Link::Down(Some(format!("lost the Redis connection: {e}")));
                true
            }
            _ => false,
        });
    }
}
