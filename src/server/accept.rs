//! The accept loop of the side listeners (admin, Envoy RLS, region link):
//! a pause after an accept error instead of a hot loop, at most `max`
//! connections at once (one more is closed at once, so a crowding peer
//! cannot take the process's descriptors), and a task per connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Serves each connection of `listener` with `serve` until the task is
/// dropped. `what` names the listener in logs.
pub async fn serve_each<F, Fut>(listener: TcpListener, what: &'static str, max: usize, serve: F)
where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let open = Arc::new(Semaphore::new(max));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                let gate = &crate::telemetry::log_limit::ACCEPT_FAILED;
                if let Some(held_back) = gate.check(crate::clock::coarse_now_ms()) {
                    tracing::warn!(listener = what, error = %e, held_back, "accept failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(listener = what, %peer, max, "too many connections: closing one");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = serve(stream, peer);
        tokio::spawn(async move {
            conn.await;
            drop(permit);
        });
    }
}
