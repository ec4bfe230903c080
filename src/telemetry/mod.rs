//! What the gateway tells its operators: the metrics registry, the access
//! log and the gate that keeps a repeated warning from flooding the log.
//! Pure bookkeeping: nothing here decides a request.

pub mod access_log;
pub mod log_limit;
pub mod metrics;
