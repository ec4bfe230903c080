//! The fleet's overrides on Redis: `lua/overrides.lua` (a version key,
//! `lg:{overrides}`, and one hash per limit, `lg:{overrides}:<limit>`, all
//! under the `{overrides}` hash tag), and the
//! change notices it publishes, which wake every instance's poll at once.
//! The poll (each second) still runs: a notice lost to a reconnect costs a
//! second, not the change.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio_stream::StreamExt as _;

use super::node::Node;
use super::RedisStore;
use crate::store::{BoxFuture, Overridden, OverrideOp, StoreError};

static OVERRIDES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/overrides.lua")));

/// The scripts of this file, loaded on every new connection.
pub(super) fn scripts() -> [&'static Script; 1] {
    [&OVERRIDES]
}

/// The overrides' version: a counter, beside the limits' hashes
/// (`lg:{overrides}:<limit>`), never one of them.
pub const VERSION: &str = "lg:{overrides}";

/// The channel `lua/overrides.lua` publishes each change on.
pub const CHANGED: &str = "lg:{overrides}:changed";

/// Where change notices are subscribed: the node calls go to (its
/// address follows the sentinels), or a cluster's seeds in turn (a PUBLISH
/// reaches every node of a cluster).
pub(super) enum Notices {
    Node(Arc<Node>),
    Seeds(Vec<redis::Client>),
}

impl RedisStore {
    /// `lua/overrides.lua`: the version key and one hash per limit, all
    /// under the `{overrides}` hash tag.
    pub(super) fn overrides_call<'a>(&'a self, op: OverrideOp<'a>) -> BoxFuture<'a, Result<Overridden, StoreError>> {
        let Some(mut connection) = self.connection.get().cloned() else {
            return Box::pin(std::future::ready(Err(super::not_connected())));
        };
        let hash = |limit: &str| format!("lg:{{overrides}}:{limit}");
        // The version's key has no `:` after the tag, so no limit's hash
        // can be it (a limit named `version` once was).
        let mut keys = vec![VERSION.to_string()];
        let (limits, args): (Vec<String>, Vec<String>) = match op {
            OverrideOp::Version => (vec![], vec!["version".into()]),
            OverrideOp::Load(limits) => {
                keys.extend(limits.iter().map(|l| hash(l)));
                (limits.to_vec(), vec!["load".into()])
            }
            OverrideOp::Set { limit, who, value } => {
                keys.push(hash(limit));
                (
                    vec![],
                    vec![
                        "set".into(),
                        who.into(),
                        value.into(),
                        crate::store::MAX_OVERRIDES_PER_LIMIT.to_string(),
                    ],
                )
            }
            OverrideOp::Delete { limit, who } => {
                keys.push(hash(limit));
                (vec![], vec!["del".into(), who.into()])
            }
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.io.spawn(async move {
            let _ = answer.send(connection.run_values(&OVERRIDES, &keys, &args).await);
        });
        Box::pin(async move {
            let reply = match answered.await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => return Err(e.classify()),
                Err(_) => return Err(StoreError::Failed("the Redis I/O thread stopped".into())),
            };
            if reply.first().is_some_and(|v| v == "full") {
                return Ok(Overridden {
                    full: true,
                    ..Overridden::default()
                });
            }
            let version = reply.first().and_then(|v| v.parse().ok()).unwrap_or(0);
            let entries = reply
                .get(1..)
                .unwrap_or_default()
                .chunks_exact(3)
                .filter_map(|e| {
                    let limit = limits.get(e[0].parse::<usize>().ok()?.checked_sub(1)?)?;
                    Some((limit.clone(), e[1].clone(), e[2].clone()))
                })
                .collect();
            Ok(Overridden {
                version,
                entries,
                full: false,
            })
        })
    }

    /// Subscribes to [`CHANGED`] on the background thread, for as long as the
    /// store lives, waking `wake` at each notice; reconnects a second after
    /// any failure.
    pub(super) fn subscribe_overrides(&self, wake: Arc<tokio::sync::Notify>) {
        let clients: Vec<Box<dyn Fn() -> Option<redis::Client> + Send + Sync>> = match &self.notices {
            Notices::Node(node) => {
                let node = node.clone();
                vec![Box::new(move || node.address().client)]
            }
            Notices::Seeds(seeds) => seeds
                .iter()
                .map(|c| {
                    let c = c.clone();
                    Box::new(move || Some(c.clone())) as Box<dyn Fn() -> Option<redis::Client> + Send + Sync>
                })
                .collect(),
        };
        self.aux.spawn(async move {
            for turn in 0usize.. {
                let Some(client) = clients.get(turn % clients.len().max(1)).and_then(|c| c()) else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                let subscribed = async {
                    let mut pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
                        .await
                        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
                    pubsub.subscribe(CHANGED).await?;
                    // Whatever changed while unsubscribed: the poll sees it
                    // too, but a wake now costs nothing.
                    wake.notify_one();
                    let mut messages = pubsub.on_message();
                    while messages.next().await.is_some() {
                        wake.notify_one();
                    }
                    Ok::<(), redis::RedisError>(())
                }
                .await;
                if let Err(e) = subscribed {
                    tracing::debug!(error = %e, "override notices: not subscribed; polling meanwhile");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}
