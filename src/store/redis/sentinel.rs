//! Finding the master through Redis Sentinel: all the sentinels asked at
//! once (`SENTINEL get-master-addr-by-name`, a majority of the answers
//! wins), polled in the background and prompted by failing calls and by
//! `+switch-master`. No request waits on any of it: the node's address
//! changes, and calls made while none is known fail at once.

use super::*;

/// How long discovery waits for one sentinel (connect and reply). The
/// sentinels are asked together, so one that hangs costs this, once.
pub(super) const SENTINEL_TIMEOUT: Duration = Duration::from_millis(300);
/// How often discovery asks the sentinels when nothing prompts it: an idle
/// gateway follows a failover within this, plus the sentinels' own delay.
pub(super) const SENTINEL_POLL: Duration = Duration::from_secs(1);
/// How often while there is no connection to the master (a failover in
/// progress): the promoted replica is found within this of being named,
/// without waiting for a call to prompt it (the breaker's probe only comes
/// every `open_ms`).
pub(super) const SENTINEL_POLL_DOWN: Duration = Duration::from_millis(250);
/// Least time between two discoveries: failing calls prompt one each, and
/// the sentinels need not hear about every one.
pub(super) const SENTINEL_GAP: Duration = Duration::from_millis(100);

/// One sentinel to ask: its client, the same over RESP3 (for its
/// `+switch-master` events), and its address for logs.
pub(super) struct Sentinel {
    pub(super) client: redis::Client,
    pub(super) events: redis::Client,
    pub(super) shown: String,
}

/// Listens on one sentinel at a time for `+switch-master` (the moment the
/// sentinels switch to a promoted replica) and then prompts discovery at
/// once, which still takes the sentinels' majority answer. When the
/// connection ends, or cannot be made, the next sentinel is tried a
/// [`SENTINEL_POLL`] later. Only speeds up following a failover: the polls
/// of [`follow_master`] find it without this too.
pub(super) async fn watch_switches(node: Arc<Node>, sentinels: Arc<Vec<Sentinel>>, master: String) {
    let Some(notify) = node.rediscover.clone() else {
        return;
    };
    let mut turn = 0usize;
    loop {
        if let Some(s) = sentinels.get(turn % sentinels.len().max(1)) {
            let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(SENTINEL_TIMEOUT))
                .set_response_timeout(Some(SENTINEL_TIMEOUT))
                .set_push_sender(events);
            let subscribed = match s.events.get_multiplexed_async_connection_with_config(&config).await {
                Ok(mut c) => c.subscribe("+switch-master").await.map(|()| c),
                Err(e) => Err(e),
            };
            match subscribed {
                Ok(_connection) => {
                    tracing::debug!(sentinel = %s.shown, "watching the sentinel for +switch-master");
                    while let Some(push) = received.recv().await {
                        match push.kind {
                            redis::PushKind::Disconnection => break,
                            redis::PushKind::Message => {
                                // "<name> <old ip> <old port> <new ip> <new port>"
                                let about = push
                                    .data
                                    .get(1)
                                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                                    .is_some_and(|p| p.split(' ').next() == Some(master.as_str()));
                                if about {
                                    tracing::debug!(sentinel = %s.shown, "+switch-master");
                                    notify.notify_one();
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) => tracing::debug!(sentinel = %s.shown, error = %e, "cannot watch the sentinel"),
            }
        }
        turn = turn.wrapping_add(1);
        tokio::time::sleep(SENTINEL_POLL).await;
    }
}

/// Keeps `node` on the master the sentinels name for `master`: asks them
/// all at once, at start, when a call prompts it (a lost connection, a
/// refused dial, `READONLY`), and every [`SENTINEL_POLL`] otherwise
/// ([`SENTINEL_POLL_DOWN`] while not connected). Runs
/// on the I/O thread for the store's life; no request ever waits on it.
pub(super) async fn follow_master(
    node: Arc<Node>,
    sentinels: Arc<Vec<Sentinel>>,
    master: String,
    template: redis::ConnectionInfo,
    ca: Option<Vec<u8>>,
) {
    let Some(notify) = node.rediscover.clone() else {
        return;
    };
    let mut unknown_since_logged = false;
    // The master last found unusable: each poll meets it again.
    let mut unusable: Option<String> = None;
    loop {
        let known = node.address().client.is_some();
        match discover(&sentinels, &master, known).await {
            Ok((host, port)) => {
                unknown_since_logged = false;
                // The master over TLS when the sentinels are (rediss://).
                let tls = matches!(template.addr(), redis::ConnectionAddr::TcpTls { .. });
                let shown = format!("{}://{host}:{port}", if tls { "rediss" } else { "redis" });
                let addr = match template.addr() {
                    redis::ConnectionAddr::TcpTls { insecure, .. } => redis::ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: *insecure,
                        tls_params: None,
                    },
                    _ => redis::ConnectionAddr::Tcp(host, port),
                };
                let info = template.clone().set_addr(addr).set_tcp_settings(tcp_settings());
                match super::client(info, ca.as_deref()) {
                    // A new address: the node's keeper dials it at once.
                    Ok(client) => {
                        unusable = None;
                        node.moved_to(client, shown);
                    }
                    Err(e) => {
                        if unusable.as_deref() != Some(shown.as_str()) {
                            tracing::warn!(master = %shown, error = %e, "the sentinels name an unusable master");
                            unusable = Some(shown);
                        }
                    }
                }
            }
            Err(why) => {
                if !unknown_since_logged {
                    tracing::warn!(master = %master, error = %why, "no sentinel names the Redis master");
                    unknown_since_logged = true;
                }
            }
        }
        let connected = matches!(&*node.link.borrow(), Link::Up { .. });
        let poll = if connected { SENTINEL_POLL } else { SENTINEL_POLL_DOWN };
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(poll) => {}
        }
        tokio::time::sleep(SENTINEL_GAP).await;
    }
}

/// The master's address by a vote of the sentinels that answer within
/// [`SENTINEL_TIMEOUT`] (`SENTINEL get-master-addr-by-name`): the address
/// most of them name, so one sentinel cut off from the others cannot send
/// the fleet back to a demoted master.
async fn discover(sentinels: &Arc<Vec<Sentinel>>, master: &str, known: bool) -> Result<(String, u16), String> {
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..sentinels.len() {
        let sentinels = sentinels.clone();
        let master = master.to_string();
        asks.spawn(async move {
            let Some(s) = sentinels.get(i) else {
                return Err("no such sentinel".to_string());
            };
            let ask = async {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(SENTINEL_TIMEOUT))
                    .set_response_timeout(Some(SENTINEL_TIMEOUT));
                let mut c = s.client.get_multiplexed_async_connection_with_config(&config).await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&master)
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await
            };
            match tokio::time::timeout(SENTINEL_TIMEOUT * 2, ask).await {
                Ok(Ok(Some(addr))) => Ok(addr),
                Ok(Ok(None)) => Err(format!("{}: does not monitor {master:?}", s.shown)),
                Ok(Err(e)) => Err(format!("{}: {e}", s.shown)),
                Err(_) => Err(format!("{}: no answer", s.shown)),
            }
        });
    }
    let mut votes: Vec<((String, u16), usize)> = Vec::new();
    let mut errors = Vec::new();
    while let Some(answer) = asks.join_next().await {
        match answer {
            Ok(Ok(addr)) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, n)) => *n += 1,
                None => votes.push((addr, 1)),
            },
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    decide(votes, sentinels.len(), known).ok_or_else(|| {
        if errors.is_empty() {
            "the sentinels that answered do not agree, and none names the master by a majority".to_string()
        } else {
            errors.join("; ")
        }
    })
}

/// Which address to follow, from the votes of the sentinels that answered
/// (of `configured`): one named by a majority of the configured sentinels;
/// or, while no master is known yet (start-up), the one every answering
/// sentinel names. Anything else (a minority, a tie, a disagreement) keeps
/// the master in use: one sentinel cut off from the others must not send
/// the gateway back to a demoted master.
fn decide(votes: Vec<((String, u16), usize)>, configured: usize, known: bool) -> Option<(String, u16)> {
    let unanimous = votes.len() == 1;
    let (addr, n) = votes.into_iter().max_by_key(|(_, n)| *n)?;
    (n * 2 > configured || (!known && unanimous)).then_some(addr)
}

/// A `ROLE` reply from a master: `["master", offset, replicas]`.
pub(super) fn is_master(role: &redis::Value) -> bool {
    match role {
        redis::Value::Array(parts) => parts
            .first()
            .and_then(|p| redis::from_redis_value_ref::<String>(p).ok())
            .is_some_and(|r| r == "master"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16, n: usize) -> ((String, u16), usize) {
        (("127.0.0.1".to_string(), port), n)
    }

    #[test]
    fn a_master_is_followed_only_on_a_majority_of_the_configured_sentinels() {
        let a = ("127.0.0.1".to_string(), 1);
        assert_eq!(decide(vec![at(1, 2)], 3, true), Some(a.clone()));
        // One of three answering cannot move a gateway that has a master...
        assert_eq!(decide(vec![at(1, 1)], 3, true), None);
        // ...but can start one that has none, if nobody disagrees.
        assert_eq!(decide(vec![at(1, 1)], 3, false), Some(a.clone()));
        // A tie moves nothing, whichever answered last.
        assert_eq!(decide(vec![at(1, 1), at(2, 1)], 3, true), None);
        assert_eq!(decide(vec![at(2, 1), at(1, 1)], 3, false), None);
        assert_eq!(decide(vec![at(1, 2), at(2, 1)], 3, true), Some(a));
        assert_eq!(decide(vec![], 3, false), None);
    }
}
