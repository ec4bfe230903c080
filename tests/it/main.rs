//! leasegate's integration tests, one test binary with a module per
//! feature (as cargo's and linkerd's suites are laid out): the real
//! `leasegate` binary, real upstreams, real Redis processes and real
//! clients, all on 127.0.0.1. One feature: `cargo test --test it edge::`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::disallowed_methods)]

mod support;

mod access_log;
mod admin;
mod alerts;
mod calendar;
mod check;
mod cli;
mod concurrency;
mod costs;
mod dashboard;
mod edge;
mod events;
mod explain;
mod fingerprint;
mod fleet;
mod flow_control;
mod hardening;
mod headers;
mod identity;
mod key_churn;
mod limits;
mod llm;
mod overrides;
mod planes;
mod priced_bodies;
mod proxy;
mod queue;
mod redis_store;
mod regions;
mod reload;
mod resilience;
mod rlqs;
mod rls;
mod sentinel;
mod simulate;
mod store_link;
mod store_parity;
mod upstream_checks;
mod upstream_health;
mod upstream_tls;
mod usage;
