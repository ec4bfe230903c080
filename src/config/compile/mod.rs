//! Validation: turns the serde mirror into a compiled [`Config`], collecting
//! every problem with its line rather than stopping at the first.
//!
//! One file per part of the config: `listeners` (listeners and TLS), `store`
//! (store, Redis URLs, leasing), `identity` (trusted proxies, JWT, API keys),
//! `upstreams`, `limits`, `routes`, `events` and `region`. This file holds the [`Check`] that
//! collects problems, the order of compilation, `[gateway]`, and the helpers
//! they share.

mod events;
mod identity;
mod limits;
mod listeners;
mod region;
mod rls;
mod routes;
mod store;
mod upstreams;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::error::{line_of, Problem};
use super::{raw, AccessLog, Config, ConfigError, Gateway, HeaderStyle, Limit, RequestIds, RouteTable, Source};
use identity::identity;
use limits::limits;
use listeners::{listeners, tls};
use routes::routes;
use store::{leasing, store};
use upstreams::upstreams;

/// Collects problems, each located by a span of the source text.
struct Check<'a> {
    file: &'a str,
    text: &'a str,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn at(&mut self, span: Range<usize>, key: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            line: Some(line_of(self.text, span.start)),
            key: key.into(),
            reason: reason.into(),
        });
    }
}

pub(super) fn compile(
    raw: raw::File,
    source: Source,
    file: &str,
    text: &str,
    base: &Path,
) -> Result<Config, ConfigError> {
    let mut c = Check {
        file,
        text,
        problems: Vec::new(),
    };

    let gateway = gateway(&mut c, raw.gateway);
    let listeners = listeners(&mut c, &raw.listeners, raw.admin.as_ref(), base);
    let tls = match (&raw.tls, listeners.https) {
        (Some(t), _) => tls(&mut c, t, base),
        (None, Some(_)) => {
            let span = raw.listeners.get_ref().https.as_ref().map_or(0..0, Spanned::span);
            c.at(
                span,
                "listeners.https",
                "an https listener needs a [tls] section with cert and key",
            );
            None
        }
        (None, None) => None,
    };
    // The cert tier needs client certificates asked for and verified.
    if let (Some(order), None) = (
        raw.identity.order.as_ref(),
        tls.as_ref().and_then(|t| t.client_ca.as_ref()),
    ) {
        if order.get_ref().iter().any(|t| t == "cert") {
            c.at(
                order.span(),
                "identity.order",
                "\"cert\" needs [tls] client_ca (the CA whose client certificates name the caller) and an https listener",
            );
        }
    }
    let store = store(&mut c, raw.store, base);
    let leasing = leasing(&mut c, raw.leasing);
    // The JWT claims limits take their rates from, each read once per token.
    let rate_claims = limits::rate_claims(&raw.limits);
    let jwt_configured = raw.identity.jwt.is_some();
    let identity = identity(&mut c, raw.identity, base, &rate_claims);
    let region = raw.region.as_ref().and_then(|r| region::region(&mut c, r, base));
    let mut limits = limits(&mut c, raw.limits, &rate_claims, jwt_configured);
    let upstreams = upstreams(&mut c, raw.upstreams, base, &limits::read_headers(&limits));
    if let Some(r) = &region {
        for l in &mut limits {
            l.share = r.share;
        }
    }
    let routes = routes(&mut c, raw.routes, &upstreams, &limits);
    let events = raw.events.as_ref().and_then(|e| events::events(&mut c, e));
    let rls = raw.rls.as_ref().and_then(|r| rls::rls(&mut c, r, base));
    if gateway.strict {
        refuse_open_planes(
            &mut c,
            (raw.rls.as_ref(), rls.as_ref()),
            (raw.region.as_ref(), region.as_ref()),
        );
    }

    if !c.problems.is_empty() {
        return Err(ConfigError::Invalid(c.problems));
    }
    // Every draft's rules were checked, and reported at their keys, where
    // it was read: with no problem, each makes a limit. One that still did
    // not would be a problem of its own, never a panic.
    let mut made = Vec::with_capacity(limits.len());
    for (n, d) in limits.into_iter().enumerate() {
        match Limit::try_new(d) {
            Ok(l) => made.push(Arc::new(l)),
            Err(e) => c.at(0..0, format!("limits[{n}]"), e.to_string()),
        }
    }
    if !c.problems.is_empty() {
        return Err(ConfigError::Invalid(c.problems));
    }
    let limits = made;
    let mut config = Config {
        source,
        gateway,
        listeners,
        tls,
        store,
        leasing,
        identity,
        upstreams,
        routes: RouteTable::new(routes),
        limits,
        events,
        rls,
        region,
        tls_files_sha256: None,
    };
    // The TLS files as read now: a reload compares the files on disk with
    // this, so a file replaced after this load is a change.
    let files = config.tls_files();
    config.tls_files_sha256 = (!files.is_empty()).then(|| super::tls_files_digest(&files));
    Ok(config)
}

/// `[gateway] strict = true`: a plane that `check` would warn of as open
/// is a problem at its address.
fn refuse_open_planes(
    c: &mut Check,
    rls: (Option<&Spanned<raw::Rls>>, Option<&super::Rls>),
    region: (Option<&Spanned<raw::Region>>, Option<&super::Region>),
) {
    use super::open_planes::{openness, REMEDY};
    use super::peer_tls::PeerTls;
    let mut refuse = |span: Range<usize>, key: &str, addr: std::net::SocketAddr, tls: Option<&PeerTls>| {
        if let Some(why) = openness(addr, tls) {
            c.at(
                span,
                key,
                format!(
                    "{addr} is beyond loopback, {why}, and [gateway] strict = true refuses an open plane: {REMEDY}"
                ),
            );
        }
    };
    if let (Some(written), Some(r)) = rls {
        let span = written.get_ref().listen.as_ref().map_or(written.span(), Spanned::span);
        refuse(span, "rls.listen", r.listen, r.tls.as_ref());
    }
    if let (Some(written), Some(r)) = region {
        refuse(written.get_ref().link.span(), "region.link", r.link, r.tls.as_ref());
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "leasegate".to_string())
}

/// A number from the file, checked against `lo..=hi` and converted to the
/// type the runtime keeps. The raw mirror reads integers as `i64` whatever
/// their range, so that `-5` reaches this check and is refused in words
/// ("use 1 to 1000") with the key's index, rather than by serde in Rust type
/// names (`expected u64`).
fn in_range<R, T>(c: &mut Check, v: &Option<Spanned<R>>, key: &str, lo: T, hi: T, default: T) -> T
where
    R: Copy + std::fmt::Display + TryInto<T>,
    T: PartialOrd + Copy + std::fmt::Display,
{
    match v {
        None => default,
        Some(s) => match (*s.get_ref()).try_into() {
            Ok(n) if n >= lo && n <= hi => n,
            _ => {
                c.at(
                    s.span(),
                    key,
                    format!("{} is out of range: use {lo} to {hi}", s.get_ref()),
                );
                default
            }
        },
    }
}

/// An enumerated key: the value `options` pairs with what is written, and
/// `default` when the key is absent. Anything else is a problem naming every
/// option, and `default` stands in so that checking goes on and every
/// problem is listed at once.
fn choice<T: Copy>(c: &mut Check, v: Option<&Spanned<String>>, key: &str, options: &[(&str, T)], default: T) -> T {
    let Some(v) = v else { return default };
    if let Some((_, t)) = options.iter().find(|(name, _)| *name == v.get_ref().as_str()) {
        return *t;
    }
    let noun = key.rsplit('.').next().unwrap_or(key);
    let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
    let list = match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    c.at(v.span(), key, format!("unknown {noun} {:?}: use {list}", v.get_ref()));
    default
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn gateway(c: &mut Check, g: raw::Gateway) -> Gateway {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Gateway {
        instance_id: g.instance_id.filter(|s| !s.is_empty()).unwrap_or_else(host_name),
        workers: in_range(c, &g.workers, "gateway.workers", 1, 1024, cpus),
        grace_period: Duration::from_millis(in_range(
            c,
            &g.grace_period_ms,
            "gateway.grace_period_ms",
            0,
            3_600_000,
            10_000,
        )),
        max_connections: in_range(c, &g.max_connections, "gateway.max_connections", 1, 10_000_000, 10_000),
        // hyper's HTTP/1.1 reader needs at least 8 KiB of buffer.
        max_header_bytes: in_range(
            c,
            &g.max_header_bytes,
            "gateway.max_header_bytes",
            8_192,
            1 << 20,
            65_536,
        ),
        strict: g.strict.as_ref().is_some_and(|s| *s.get_ref()),
        rate_limit_headers: choice(
            c,
            g.rate_limit_headers.as_ref(),
            "gateway.rate_limit_headers",
            HeaderStyle::SPELLINGS,
            HeaderStyle::All,
        ),
        request_id: choice(
            c,
            g.request_id.as_ref(),
            "gateway.request_id",
            &RequestIds::SPELLINGS,
            RequestIds::Generate,
        ),
        access_log: choice(
            c,
            g.access_log.as_ref(),
            "gateway.access_log",
            &[
                ("json", AccessLog::Json),
                ("text", AccessLog::Text),
                ("off", AccessLog::Off),
            ],
            AccessLog::Json,
        ),
        access_log_fields: match &g.access_log_fields {
            None => crate::telemetry::access_log::Fields::ALL,
            Some(list) => crate::telemetry::access_log::Fields::parse(list.get_ref()).unwrap_or_else(|e| {
                c.at(list.span(), "gateway.access_log_fields", e.to_string());
                crate::telemetry::access_log::Fields::ALL
            }),
        },
        header_read_timeout: Duration::from_millis(in_range(
            c,
            &g.header_read_timeout_ms,
            "gateway.header_read_timeout_ms",
            1,
            3_600_000,
            10_000,
        )),
        max_connections_per_ip: in_range(
            c,
            &g.max_connections_per_ip,
            "gateway.max_connections_per_ip",
            1,
            10_000_000,
            256,
        ),
        idle_timeout: Duration::from_millis(in_range(
            c,
            &g.idle_timeout_ms,
            "gateway.idle_timeout_ms",
            1,
            86_400_000,
            60_000,
        )),
        max_cost_body_bytes: in_range(
            c,
            &g.max_cost_body_bytes,
            "gateway.max_cost_body_bytes",
            1_024,
            64 << 20,
            1 << 20,
        ),
        // Apache's mod_reqtimeout asks 500 bytes/s of a request body.
        min_body_rate: in_range(c, &g.min_body_rate, "gateway.min_body_rate", 0, 1 << 30, 500),
    }
}
