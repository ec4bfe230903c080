//! leasegate: an edge API gateway whose heart is distributed rate limiting.
//!
//! The pure rooms (`quota`, `route`, `upstream`, `fingerprint`, `config`
//! validation) do no network I/O and take time as an argument; the I/O shells
//! (`server`, `proxy`) wrap them. See `docs/architecture.md`.

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
pub mod store;
pub mod sync;
pub mod telemetry;

#[cfg(test)]
mod architecture;
