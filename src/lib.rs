//! leasegate: an edge API gateway whose heart is distributed rate limiting.
//!
//! Rooms import only rooms on a lower floor (the `floors` block of
//! `docs/architecture.md`, held by the `architecture` test): `server` builds
//! the `runtime` that `gateway`, `rls` and `explain` hold; `config` builds the
//! policy types `limit` owns; `limit` decides against a `store`. The pure
//! rooms (`quota`, `route`, `fingerprint`, `identity`, `config` validation)
//! do no network I/O and take time as an argument; the I/O shells (`server`,
//! `proxy`, `store`) wrap them.

pub mod clock;
pub mod config;
pub mod connection;
pub mod events;
pub mod explain;
pub mod fingerprint;
pub mod gateway;
pub mod identity;
pub mod int_hash;
pub mod limit;
pub mod proxy;
pub mod quota;
pub mod region;
pub mod rls;
pub mod route;
pub mod runtime;
pub mod server;
pub mod simulate;
mod spelling;
pub mod store;
pub mod sync;
pub mod telemetry;

#[cfg(test)]
mod architecture;
