//! How a store's connection stands, told by the store and read by the
//! composition root (start waits for it), the guard (a failed dial is one
//! breaker event; a fresh connection is probed at once) and `/readyz`
//! (`ok` only for a connection that has answered).
//!
//! A connection is dialled and redialled in the background, never in a
//! call: a call that finds none fails at once with
//! [`super::StoreError::NotConnected`]. The embedded store is always up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// The state of the link, as the store last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Connected, and the connection answered (`PING`, the scripts
    /// loaded).
    Up,
    /// No answering connection: never dialled yet, dialling, or the last
    /// attempt failed or the connection broke (why, when known).
    Connecting(Option<String>),
}

/// A store's link: shared by the store that dials and everyone who waits
/// on it or reports it.
#[derive(Debug)]
pub struct StoreLink {
    state: watch::Sender<LinkState>,
    /// Dial attempts that failed so far: each is one breaker event.
    failed_dials: AtomicU64,
    /// The store has answered at least once since start.
    answered: AtomicBool,
}

impl StoreLink {
    /// A link that is up for good: the embedded store.
    pub fn always_up() -> StoreLink {
        StoreLink {
            state: watch::Sender::new(LinkState::Up),
            failed_dials: AtomicU64::new(0),
            answered: AtomicBool::new(true),
        }
    }

    /// A link not dialled yet.
    pub fn connecting() -> StoreLink {
        StoreLink {
            state: watch::Sender::new(LinkState::Connecting(None)),
            failed_dials: AtomicU64::new(0),
            answered: AtomicBool::new(false),
        }
    }

    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
    }

    pub fn is_up(&self) -> bool {
        matches!(*self.state.borrow(), LinkState::Up)
    }

    /// Whether the store has ever answered since start.
    pub fn has_answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// Failed dial attempts since start.
    pub fn failed_dials(&self) -> u64 {
        self.failed_dials.load(Ordering::Acquire)
    }

    /// A connection answered: the link is up.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Release);
        self.state.send_if_modified(|s| {
            let changed = *s != LinkState::Up;
            *s = LinkState::Up;
            changed
        });
    }

    /// The connection broke (or moved): down until a dial answers.
    pub fn lost(&self, why: String) {
        self.state.send_replace(LinkState::Connecting(Some(why)));
    }

    /// One dial attempt failed: one event for the breaker.
    pub fn dial_failed(&self, why: String) {
        self.failed_dials.fetch_add(1, Ordering::AcqRel);
        // Sent even when the state is the same: a follower counts attempts.
        self.state.send_replace(LinkState::Connecting(Some(why)));
    }

    /// Follows every change of the link.
    pub fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// Waits up to `timeout` for the link to be up; true if it is.
    pub async fn wait_up(&self, timeout: Duration) -> bool {
        let mut rx = self.state.subscribe();
        let up = async move { rx.wait_for(|s| *s == LinkState::Up).await.is_ok() };
        tokio::time::timeout(timeout, up).await.unwrap_or(false)
    }

    /// What `/readyz` and the log say of it: `ok`, or `connecting (why)`.
    pub fn describe(&self) -> String {
        match self.state() {
            LinkState::Up => "ok".to_string(),
            LinkState::Connecting(None) => "connecting".to_string(),
            LinkState::Connecting(Some(why)) => format!("connecting ({why})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_store_is_up_and_has_answered() {
        let link = StoreLink::always_up();
        assert!(link.is_up());
        assert!(link.has_answered());
        assert_eq!(link.describe(), "ok");
    }

    #[test]
    fn a_link_is_ok_only_once_a_connection_answered() {
        let link = StoreLink::connecting();
        assert_eq!(link.describe(), "connecting");
        link.dial_failed("connection refused".into());
        assert_eq!(link.describe(), "connecting (connection refused)");
        assert!(!link.has_answered());
        assert_eq!(link.failed_dials(), 1);
        link.answered();
        assert_eq!(link.describe(), "ok");
        link.lost("reset".into());
        assert_eq!(link.describe(), "connecting (reset)");
        // Once answered, always answered: what `ready_without_store` asks.
        assert!(link.has_answered());
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_the_link_ends_when_it_answers_or_at_the_timeout() {
        let link = std::sync::Arc::new(StoreLink::connecting());
        assert!(!link.wait_up(Duration::from_millis(100)).await);
        let l = link.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            l.answered();
        });
        assert!(link.wait_up(Duration::from_secs(5)).await);
    }
}
