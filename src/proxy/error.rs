//! What can go wrong while forwarding a request: the upstream's faults
//! and a request body that broke off. `gateway::respond` turns each into
//! what the client sees.

/// A forwarded request that got no response.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// `target`: the `host:port` tried last, named in the log line.
    #[error("upstream {upstream:?} target {target} is unreachable: {reason}")]
    UpstreamUnreachable {
        upstream: String,
        target: String,
        reason: String,
    },
    #[error("upstream {upstream:?} target {target} did not answer within {timeout_ms} ms")]
    UpstreamTimeout {
        upstream: String,
        target: String,
        timeout_ms: u128,
    },
    #[error("upstream {upstream:?} target {target} failed: {reason}")]
    UpstreamFailed {
        upstream: String,
        target: String,
        reason: String,
    },
    /// The client's request body broke off while it was being forwarded:
    /// malformed chunked framing (a chunk size that is not hex, or above
    /// 2^64), or a client that went away mid-body. Its fault, not ours.
    #[error("the request body could not be read: {reason}")]
    BadRequestBody { reason: String },
    /// The client's request body came slower than `[gateway]
    /// min_body_rate` while the upstream waited for it. Its fault.
    #[error("the request body arrived slower than {rate} bytes/s")]
    BodyTooSlow { rate: u64 },
    /// The upstream has `max_in_flight` requests in flight already.
    #[error("upstream {upstream:?} has {max} requests in flight")]
    UpstreamBusy { upstream: String, max: usize },
}

impl ForwardError {
    /// The upstream at fault and the `kind` label of
    /// `leasegate_upstream_errors_total`; `None`: the client's fault.
    pub fn upstream_fault(&self) -> Option<(&str, &'static str)> {
        match self {
            ForwardError::UpstreamUnreachable { upstream, .. } => Some((upstream, "unreachable")),
            ForwardError::UpstreamTimeout { upstream, .. } => Some((upstream, "timeout")),
            ForwardError::UpstreamFailed { upstream, .. } => Some((upstream, "failed")),
            ForwardError::UpstreamBusy { upstream, .. } => Some((upstream, "busy")),
            ForwardError::BadRequestBody { .. } | ForwardError::BodyTooSlow { .. } => None,
        }
    }
}
