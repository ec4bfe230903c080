//! Fixtures for the decision core's tests, in one place: the facts of a
//! request and the limiter's settings the tests decide with.

use std::sync::Arc;

use super::handle::LimitRef;
use super::key::Facts;
use super::lease::Sizing;
use super::{LimitRuntime, Settings};

/// The facts of a request by `identity` on route `r` from 127.0.0.1, with
/// `headers`, no tenant, plan or claimed rate.
pub fn facts<'a>(identity: &'a str, headers: &'a http::HeaderMap) -> Facts<'a> {
    Facts {
        identity,
        tenant: None,
        plan: None,
        rates: &[],
        route: "r",
        ip: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        headers,
    }
}

/// The limiter's settings in the tests: default lease sizing, a generous
/// store deadline, room for 100 000 keys.
pub fn settings() -> Settings {
    Settings {
        sizing: Sizing::default(),
        max_block_ms: 5_000,
        reserve: true,
        max_keys: 100_000,
        fleet_size: None,
        deadline_ms: 1_000,
    }
}

/// Handles to `which` of `all`, in that order: the limits a request is
/// decided on.
pub fn pick<'l>(all: &'l [Arc<LimitRuntime>], which: &[usize]) -> Vec<LimitRef<'l>> {
    which.iter().map(|&i| LimitRef::new(&all[i])).collect()
}
