//! TLS ClientHello bytes: framing now, parsing and JA3/JA4 to come.
//!
//! Pure functions over bytes. Nothing here reads a socket or a clock, and no
//! input may make it panic.

pub mod record;
