//! Whether the Redis the store dials keeps its data on disk. A weekly or
//! monthly budget (`fixed_window` of a week or a month) lives in Redis for
//! that long: on a Redis with neither an append-only file nor RDB saves, a
//! restart forgets every budget and every tenant starts the month afresh.
//! Asked once, in the background, when the connection first answers, with
//! `CONFIG GET` (where the ACL allows it: a managed Redis may refuse, and
//! then nothing is said). A Redis Cluster is not asked.

use std::time::Duration;

use super::{Connection, RedisStore};

/// Warns once the store has answered if it keeps nothing on disk and
/// `limits` (the week and month limits it holds) would lose their
/// counts at its restart. Never waits: the question goes on the
/// background thread.
pub fn warn_unless_persistent(store: &RedisStore, limits: Vec<String>) {
    if limits.is_empty() {
        return;
    }
    let connection = store.connection.clone();
    let link = store.link.clone();
    store.aux.spawn(async move {
        // However long the store takes to come.
        while !link.wait_up(Duration::from_secs(3_600)).await {}
        let Some(Connection::Node(node)) = connection.get().cloned() else {
            return;
        };
        let Ok((mut c, _)) = node.connection() else { return };
        let get = |name: &'static str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            cmd
        };
        let aof = get("appendonly").query_async::<Vec<String>>(&mut c).await;
        let save = get("save").query_async::<Vec<String>>(&mut c).await;
        match (aof, save) {
            (Ok(aof), Ok(save)) => {
                let appends = aof.get(1).is_some_and(|v| v.eq_ignore_ascii_case("yes"));
                let saves = save.get(1).is_some_and(|v| !v.trim().is_empty());
                if !appends && !saves {
                    tracing::warn!(
                        limits = %limits.join(", "),
                        "the Redis store keeps nothing on disk (appendonly no, no RDB saves): a restart of it \
                         forgets these weekly or monthly budgets, and every key starts its window afresh; \
                         set appendonly yes (or RDB saves) on it"
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "CONFIG GET refused: whether the store keeps its data is not known");
            }
        }
    });
}
