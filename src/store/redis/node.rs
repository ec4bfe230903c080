//! The single-node connection: ours, not the crate's `ConnectionManager`
//! (see the parent module), whose address changes when the sentinels name
//! another master; and the connection enum a call runs on.

use super::*;
use crate::store::link::StoreLink;
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
                let (mut c, generation) = node.connection().map_err(CallError::NotConnected)?;
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

/// One Redis node's connection, kept dialled by [`Node::keep`] in the
/// background, on the I/O thread: a call takes the connection at hand or
/// fails at once.
/// The node's address is fixed for `url`; with Sentinel it is the master
/// the sentinels named last, and changes when they name another.
pub(super) struct Node {
    pub(super) address: std::sync::Mutex<Address>,
    pub(super) config: AsyncConnectionConfig,
    pub(super) link: watch::Sender<Link>,
    /// Connections made so far: the next one's generation.
    pub(super) dialled: AtomicU64,
    /// Sentinel only: wakes the discovery task (a call failed, or there is
    /// no master to dial).
    pub(super) rediscover: Option<Arc<tokio::sync::Notify>>,
    /// What everyone else reads of the link (`/readyz`, the guard).
    pub(super) shared: Arc<StoreLink>,
    /// Cuts a dial's backoff short: the address changed.
    redial: tokio::sync::Notify,
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
    /// attempt failed (its reason). The keeper is dialling.
    Down(Option<String>),
    /// Connected, and the connection answered. `generation` tells this
    /// connection from later ones, so a late failure on an old connection
    /// cannot drop a new one.
    Up {
        connection: MultiplexedConnection,
        generation: u64,
    },
}

/// The keeper's first wait after a failed dial, and its longest: a Redis
/// back on its port is found within [`REDIAL_MAX`].
const REDIAL_FIRST: Duration = Duration::from_millis(50);
const REDIAL_MAX: Duration = Duration::from_millis(500);

impl Node {
    pub(super) fn new(address: Address, rediscover: Option<Arc<tokio::sync::Notify>>, shared: Arc<StoreLink>) -> Node {
        Node {
            address: std::sync::Mutex::new(address),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT)),
            link: watch::Sender::new(Link::Down(None)),
            dialled: AtomicU64::new(0),
            rediscover,
            shared,
            redial: tokio::sync::Notify::new(),
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
    /// address drops the connection to the old one; the keeper dials the
    /// new one at once. True if the address is new.
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
        self.drop_link(|_| true, format!("the Redis master moved to {shown}"));
        self.redial.notify_one();
        true
    }

    /// The connection to send a call on, or at once
    /// [`StoreError::NotConnected`]: no call waits for a dial.
    pub(super) fn connection(&self) -> Result<(MultiplexedConnection, u64), StoreError> {
        match &*self.link.borrow() {
            Link::Up { connection, generation } => Ok((connection.clone(), *generation)),
            Link::Down(reason) => Err(StoreError::NotConnected(
                reason.clone().unwrap_or_else(|| "connecting to Redis".into()),
            )),
        }
    }

    /// Keeps the node dialled for the store's life: dials whenever the
    /// link is down, with a backoff from [`REDIAL_FIRST`] to
    /// [`REDIAL_MAX`] between failed attempts (each one event for the
    /// breaker, through [`StoreLink::dial_failed`]).
    pub(super) async fn keep(self: Arc<Self>) {
        let mut links = self.link.subscribe();
        let mut wait = REDIAL_FIRST;
        loop {
            if links.wait_for(|l| matches!(l, Link::Down(_))).await.is_err() {
                return;
            }
            if self.dial().await {
                wait = REDIAL_FIRST;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.redial.notified() => {}
            }
            wait = (wait * 2).min(REDIAL_MAX);
        }
    }

    /// One connect attempt, and the round trip that proves it: `PING`
    /// (`ROLE`, which must say `master`, with Sentinel) and every script
    /// loaded, so the first call on it is one `EVALSHA`. Its outcome is
    /// the new link; true if it is up.
    async fn dial(&self) -> bool {
        let address = self.address();
        let result = match &address.client {
            Some(client) => match client.get_multiplexed_async_connection_with_config(&self.config).await {
                Ok(mut c) => self.prove(&mut c).await.map(|()| c),
                Err(e) => Err(format!("cannot connect to Redis: {e}")),
            },
            None => Err("no Redis master known: the sentinels have not named one".to_string()),
        };
        let moved = self.address().epoch != address.epoch;
        if result.is_err() || moved {
            self.rediscover();
        }
        let up = match result {
            Ok(_) if moved => {
                self.link
                    .send_replace(Link::Down(Some("the Redis master moved while connecting".into())));
                false
            }
            Ok(connection) => {
                tracing::info!(redis = %address.shown, "connected to Redis");
                let generation = self.dialled.fetch_add(1, Ordering::Relaxed);
                self.link.send_replace(Link::Up { connection, generation });
                self.shared.answered();
                true
            }
            Err(e) => {
                tracing::debug!(redis = %address.shown, error = %e, "cannot connect to Redis");
                self.link.send_replace(Link::Down(Some(e.clone())));
                self.shared.dial_failed(e);
                false
            }
        };
        up
    }

    /// The first round trip on a new connection.
    async fn prove(&self, c: &mut MultiplexedConnection) -> Result<(), String> {
        if self.rediscover.is_some() {
            let role = redis::cmd("ROLE")
                .query_async::<redis::Value>(c)
                .await
                .map_err(|e| format!("Redis did not answer ROLE: {e}"))?;
            if !is_master(&role) {
                return Err("the node is not the master (ROLE)".into());
            }
        } else {
            redis::cmd("PING")
                .query_async::<String>(c)
                .await
                .map_err(|e| format!("Redis did not answer PING: {e}"))?;
        }
        super::load_scripts(c).await
    }

    /// Drops the link if it is up and `which` (its generation) says so:
    /// the keeper dials again, and everyone reads `connecting (why)`.
    fn drop_link(&self, which: impl Fn(u64) -> bool, why: String) -> bool {
        let dropped = self.link.send_if_modified(|link| match link {
            Link::Up { generation, .. } if which(*generation) => {
                *link = Link::Down(Some(why.clone()));
                true
            }
            _ => false,
        });
        if dropped {
            self.shared.lost(why);
        }
        dropped
    }

    /// Connection `generation` goes to a node that says it is not the
    /// master: dropped, and the sentinels asked where the master is.
    pub(super) fn not_master(&self, generation: u64) {
        self.rediscover();
        if self.drop_link(|g| g == generation, "the node is not the master".into()) {
            tracing::warn!(redis = %self.shown(), "the Redis node is not the master (ROLE); asking the sentinels");
        }
    }

    /// A call on connection `generation` failed with `e`: a connection that
    /// broke is dropped, and the keeper dials again.
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
        if self.drop_link(|g| g == generation, format!("lost the Redis connection: {e}")) {
            tracing::warn!(redis = %self.shown(), error = %e, "lost the Redis connection");
        }
    }
}
