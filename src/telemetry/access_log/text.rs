//! The access-log line in the text format, through `tracing`'s fmt layer
//! (`key=value`), into the same batches as the JSON lines. A field left
//! out by `[gateway] access_log_fields` is recorded as `None`: `tracing`
//! writes nothing for it.

use std::fmt;

use super::{Field, Line};

/// `tokens:120,requests:1`; `-` for none.
struct Costs<'a>(&'a [(&'a str, u64)]);

impl fmt::Display for Costs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (i, (limit, n)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{limit}:{n}")?;
        }
        Ok(())
    }
}

/// An IP address, or `-`.
struct Client(Option<std::net::IpAddr>);

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{ip}"),
            None => f.write_str("-"),
        }
    }
}

/// Decimal milliseconds, or `-`.
struct Millis(Option<u64>);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(m) => write!(f, "{}", m as f64 / 1_000.0),
            None => f.write_str("-"),
        }
    }
}

/// Logs one request in the text format.
pub fn record_text(line: &Line<'_>) {
    let f = line.fields;
    let on = |field: Field| f.has(field);
    // Whole microseconds: 0.263, not 0.26327300000000003.
    let ms = |m: u64| m as f64 / 1_000.0;
    tracing::info!(
        target: "access",
        request_id = on(Field::RequestId).then_some(line.request_id),
        route = on(Field::Route).then_some(line.route),
        method = on(Field::Method).then_some(line.method),
        path = on(Field::Path).then_some(tracing::field::display(line.path)),
        status = on(Field::Status).then_some(line.status),
        identity = on(Field::Identity).then_some(line.identity),
        outcome = on(Field::Outcome).then_some(line.outcome),
        limit = on(Field::Limit).then_some(line.limit),
        key = on(Field::Key).then_some(line.key),
        upstream = on(Field::Upstream).then_some(line.upstream),
        ms = on(Field::Ms).then_some(ms(line.micros)),
        client = on(Field::Client).then_some(tracing::field::display(Client(line.client))),
        tenant = on(Field::Tenant).then_some(line.tenant),
        key_id = on(Field::KeyId).then_some(line.key_id),
        bytes_in = on(Field::BytesIn).then_some(line.bytes_in),
        bytes_out = on(Field::BytesOut).then_some(line.bytes_out),
        upstream_target = on(Field::UpstreamTarget).then_some(line.upstream_target),
        upstream_ms = on(Field::UpstreamMs).then_some(tracing::field::display(Millis(line.upstream_micros))),
        cost = on(Field::Cost).then_some(tracing::field::display(Costs(line.cost))),
        aborted = on(Field::Aborted).then_some(line.aborted),
    );
}
