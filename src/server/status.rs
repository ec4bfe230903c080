//! The admin status page (`GET /`): one self-contained HTML page, no
//! external assets, no script, that refreshes itself every
//! [`REFRESH_SECS`] seconds.
//!
//! Its counts are read from the text `/metrics` exports (the same registry,
//! encoded the same way, then parsed back), so the page and a scrape never
//! disagree, whichever series exist. Everything that comes from a config or
//! a client (names, keys) is HTML-escaped: a key holds header values.
//!
//! The bypass rate is shown twice: since start (bypassed ÷ answered
//! requests, all routes), and since the page's last refresh, from the
//! counts the previous page carried in its refresh URL (`?r=&b=&t=`): the
//! server keeps nothing per viewer.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use crate::config::StoreBackend;
use crate::limit::stage::Outcome;
use crate::runtime::Runtime;

/// Seconds between refreshes.
pub const REFRESH_SECS: u64 = 5;

/// Keys per hot list.
const HOT_KEYS: usize = 10;

const OUTCOMES: [Outcome; 4] = [
    Outcome::Admitted,
    Outcome::Limited,
    Outcome::ShadowLimited,
    Outcome::SoftLimited,
];

/// One sample of the OpenMetrics text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// The samples of an OpenMetrics (or Prometheus) text exposition; comment
/// lines and lines that do not parse are skipped.
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut label = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    let (_, '"') = chars.next()? else { return None };
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut label), value));
                }
                other => label.push(other),
            }
        };
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `&`, `<`, `>`, `"` and `'` as entities: safe in text and in quoted
/// attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A counter's value as the page prints it.
fn count(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn percent(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        "no requests".into()
    } else {
        format!("{:.3} %", part * 100.0 / whole)
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The previous page's counts, from its refresh URL.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Previous {
    requests: f64,
    bypassed: f64,
    at_ms: u64,
}

fn previous(query: Option<&str>) -> Option<Previous> {
    let mut p = Previous::default();
    let mut seen = 0;
    for (name, value) in super::query::query_pairs(query?) {
        let Some(v) = value else { continue };
        match name {
            "r" => p.requests = v.parse().ok()?,
            "b" => p.bypassed = v.parse().ok()?,
            "t" => p.at_ms = v.parse().ok()?,
            _ => continue,
        }
        seen += 1;
    }
    (seen == 3).then_some(p)
}

/// The page, from the metrics registry, the config in force and the
/// limiter's bounded sample of hot keys.
/// The fleet as the status page says it: the live count by heartbeats,
/// how fresh it is, and what the fallback divides a quota by.
fn fleet_line(f: crate::limit::fleet::FleetView) -> String {
    let bound = f
        .fleet_size
        .map(|n| format!(", at most {n} ([store] fleet_size)"))
        .unwrap_or_default();
    match (f.live, f.counted_ms_ago) {
        (Some(live), Some(ago)) => format!(
            "{live} instance(s) live by their heartbeats, counted {:.1} s ago{bound}; a fallback bucket gets 1/{} of a quota",
            ago as f64 / 1_000.0,
            f.divisor
        ),
        _ => format!(
            "not counted yet (the store has not answered a heartbeat){bound}; a fallback bucket gets 1/{} of a quota",
            f.divisor
        ),
    }
}

pub fn page(runtime: &Runtime, query: Option<&str>) -> String {
    let config = runtime.config();
    let samples = parse_metrics(&runtime.metrics.encode());
    let sum = |name: &str, filter: &dyn Fn(&Sample) -> bool| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name && filter(s))
            .map(|s| s.value)
            .sum()
    };
    let requests = sum("leasegate_requests_total", &|_| true);
    let bypassed = sum("rate_limit_bypassed_total", &|_| true);
    let circuit_open = sum("leasegate_circuit_open", &|_| true) >= 1.0;
    let now_ms = unix_ms(crate::clock::wall_now());

    let mut h = String::with_capacity(16 * 1024);
    let instance = escape(&config.gateway.instance_id);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}; url=/?r={r}&amp;b={b}&amp;t={now_ms}\">\
         <title>leasegate {instance}</title><style>{STYLE}</style></head><body>\n",
        r = count(requests),
        b = count(bypassed),
    );
    let _ = writeln!(h, "<h1>leasegate <span id=\"instance\">{instance}</span></h1>");

    // The instance, its config and its store.
    let store = match &config.store.backend {
        StoreBackend::Memory => "memory (embedded, this instance only)".to_string(),
        StoreBackend::Redis { url } => format!("redis {}", crate::store::redis::redact(url)),
        StoreBackend::RedisCluster { seeds } => format!("redis cluster ({} seeds)", seeds.len()),
        StoreBackend::RedisSentinel { sentinels, master } => {
            format!("redis sentinel, master {master:?} ({} sentinels)", sentinels.len())
        }
    };
    let loaded = humantime::format_rfc3339_seconds(config.source.loaded_at);
    let _ = writeln!(h, "<dl>");
    let _ = writeln!(
        h,
        "<dt>config</dt><dd><code id=\"config-sha256\">{}</code><br>loaded <span id=\"config-loaded\">{loaded}</span> from <code>{}</code></dd>",
        config.source.sha256_hex(),
        escape(&config.source.path.display().to_string())
    );
    if let Some(f) = runtime.reload_failure() {
        let _ = writeln!(
            h,
            "<dt>last reload</dt><dd id=\"reload-failed\" class=\"bad\">failed at {}, the config above stays in force: {}</dd>",
            humantime::format_rfc3339_seconds(f.at),
            escape(&f.why)
        );
    }
    let _ = writeln!(h, "<dt>store</dt><dd id=\"store\">{}</dd>", escape(&store));
    let link = &runtime.store_link;
    let class = if link.is_up() { "ok" } else { "bad" };
    let _ = writeln!(
        h,
        "<dt>link</dt><dd id=\"link\" class=\"{class}\">{}</dd>",
        escape(&link.describe())
    );
    let (class, state) = if circuit_open {
        (
            "bad",
            "open: no store calls; fail-open routes use their fallback buckets, fail-closed routes answer 503",
        )
    } else {
        ("ok", "closed")
    };
    let _ = writeln!(h, "<dt>circuit</dt><dd id=\"circuit\" class=\"{class}\">{state}</dd>");
    let _ = writeln!(
        h,
        "<dt>fleet</dt><dd id=\"fleet\">{}</dd>",
        escape(&fleet_line(runtime.limiter.report().fleet()))
    );
    let _ = write!(
        h,
        "<dt>bypass rate</dt><dd><span id=\"bypass\">{}</span> since start ({} of {} requests admitted by a fallback bucket)",
        percent(bypassed, requests),
        count(bypassed),
        count(requests)
    );
    if let Some(p) = previous(query) {
        let (dr, db) = (requests - p.requests, bypassed - p.bypassed);
        let secs = now_ms.saturating_sub(p.at_ms) as f64 / 1_000.0;
        if dr >= 0.0 && db >= 0.0 && now_ms >= p.at_ms {
            let _ = write!(
                h,
                "<br><span id=\"bypass-recent\">{}</span> over the last {secs:.0} s ({} of {})",
                percent(db, dr),
                count(db),
                count(dr)
            );
        }
    }
    let _ = writeln!(h, "</dd>");
    if runtime.is_draining() {
        let _ = writeln!(h, "<dt>state</dt><dd class=\"bad\">draining</dd>");
    }
    let _ = writeln!(h, "</dl>");

    // Requests per route, by status.
    let _ = writeln!(
        h,
        "<h2>Requests by route</h2><div class=\"scroll\"><table id=\"requests\"><tr><th>route</th><th>path</th><th>store failure</th><th>answered, by status</th></tr>"
    );
    let mut route_names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    route_names.push("none");
    for (i, name) in route_names.iter().enumerate() {
        let mut by_status: BTreeMap<u16, f64> = BTreeMap::new();
        for s in samples
            .iter()
            .filter(|s| s.name == "leasegate_requests_total" && s.label("route") == Some(name))
        {
            if let Some(status) = s.label("status").and_then(|v| v.parse().ok()) {
                *by_status.entry(status).or_default() += s.value;
            }
        }
        let statuses: Vec<String> = by_status
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(st, v)| format!("<span class=\"st\">{st}</span>&nbsp;{}", count(*v)))
            .collect();
        let (path, failure) = match config.routes.get(i) {
            Some(r) => (escape(&r.path_prefix), r.on_store_failure.as_str()),
            None if statuses.is_empty() => continue,
            None => ("(no route matched)".into(), ""),
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td><code>{path}</code></td><td>{failure}</td><td>{}</td></tr>",
            escape(name),
            if statuses.is_empty() {
                "none yet".into()
            } else {
                statuses.join(" · ")
            }
        );
    }
    let _ = writeln!(h, "</table></div>");

    // Decisions per route and limit, by outcome.
    let _ = write!(
        h,
        "<h2>Decisions by route and limit</h2><p class=\"note\">Decisions are counted per limit: a limit on two routes shows its total on both.</p>\
         <div class=\"scroll\"><table id=\"decisions\"><tr><th>route</th><th>limit</th><th>mode</th><th>rate</th>"
    );
    for o in OUTCOMES {
        let _ = write!(h, "<th>{}</th>", o.label().replace('_', " "));
    }
    let _ = writeln!(h, "</tr>");
    let mut rows: Vec<(&str, usize)> = config
        .routes
        .iter()
        .flat_map(|r| r.limits.iter().map(move |&l| (r.name.as_str(), l)))
        .collect();
    for (i, _) in config.limits.iter().enumerate() {
        if !rows.iter().any(|(_, l)| *l == i) {
            rows.push(("(no route)", i));
        }
    }
    for (route, i) in rows {
        let Some(limit) = config.limits.get(i) else { continue };
        let name = escape(&limit.name);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{name}</td><td>{}</td><td>{}</td>",
            escape(route),
            limit.mode.as_str(),
            if limit.algorithm == crate::quota::Algorithm::Concurrency {
                format!("{} in flight", limit.burst)
            } else {
                escape(&limit.rate.to_string())
            }
        );
        for o in OUTCOMES {
            let v = sum("leasegate_decisions_total", &|s| {
                s.label("limit") == Some(limit.name.as_str()) && s.label("outcome") == Some(o.label())
            });
            let class = if v > 0.0 && o != Outcome::Admitted {
                " class=\"bad\""
            } else {
                ""
            };
            let _ = write!(
                h,
                "<td data-limit=\"{name}\" data-outcome=\"{}\"{class}>{}</td>",
                o.label(),
                count(v)
            );
        }
        let _ = writeln!(h, "</tr>");
    }
    let _ = writeln!(h, "</table></div>");

    overrides_table(&mut h, runtime);

    // Hot keys, from a bounded sample of the lease table.
    let hot = runtime.limiter.report().hot_keys(HOT_KEYS);
    let _ = writeln!(
        h,
        "<h2>Hottest keys</h2><p class=\"note\">From <span id=\"sampled\">{}</span> of {} leased keys (at most {} are looked at per refresh). Admitted: this instance's, as of the store's last answer, in the unit of the key's quota: per second averaged over about a minute for a quota per second, admitted in about the last minute for one per minute or longer.</p>",
        hot.sampled,
        hot.tracked,
        crate::limit::report::HOT_KEY_SAMPLE
    );
    hot_table(&mut h, "hottest", &hot.busiest);
    let _ = writeln!(
        h,
        "<h2>Most-limited keys</h2><p class=\"note\">Refusals in the key's current window (one period of its quota), on this instance.</p>"
    );
    hot_table(&mut h, "most-limited", &hot.most_limited);

    let _ = writeln!(
        h,
        "<footer>leasegate {} · generated {} · refreshes every {REFRESH_SECS} s · <a href=\"/metrics\">/metrics</a> · <a href=\"/config\">/config</a></footer></body></html>",
        env!("CARGO_PKG_VERSION"),
        humantime::format_rfc3339_seconds(crate::clock::wall_now())
    );
    h
}

/// A hot key's admitted rate in its quota's unit: a `10/min` key reads
/// `9/min`, not the per-second average a burst in its first second makes
/// look like `10.02/s`.
fn admitted(k: &crate::limit::report::HotKey) -> String {
    if k.period_ms >= 60_000 {
        format!("{:.0}/min", k.admitted_last_minute)
    } else {
        format!("{:.2}/s", k.admitted_per_sec)
    }
}

/// The overrides in force, as `GET /overrides` lists them.
fn overrides_table(h: &mut String, runtime: &Runtime) {
    let all = runtime.limiter.report().overrides();
    let _ = writeln!(h, "<h2>Overrides in force</h2>");
    if all.is_empty() {
        let _ = writeln!(h, "<p id=\"overrides\" class=\"note\">none</p>");
        return;
    }
    let _ = writeln!(
        h,
        "<div class=\"scroll\"><table id=\"overrides\"><tr><th>limit</th><th>who</th><th>rate</th><th>burst</th><th>expires</th></tr>"
    );
    for (limit, who, o) in all {
        let expires = o.expires_ms.map_or_else(
            || "never".to_string(),
            |ms| {
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
                    .to_string()
            },
        );
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{expires}</td></tr>",
            escape(&limit),
            escape(&who),
            escape(&o.rate.to_string()),
            o.burst
        );
    }
    let _ = writeln!(h, "</table></div>");
}

fn hot_table(h: &mut String, id: &str, keys: &[crate::limit::report::HotKey]) {
    if keys.is_empty() {
        let _ = writeln!(h, "<p id=\"{id}\" class=\"note\">none</p>");
        return;
    }
    let _ = writeln!(
        h,
        "<div class=\"scroll\"><table id=\"{id}\"><tr><th>key</th><th>admitted</th><th>refusals</th></tr>"
    );
    for k in keys {
        let _ = writeln!(
            h,
            "<tr><td class=\"key\"><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&k.key),
            admitted(k),
            k.refusals
        );
    }
    let _ = writeln!(h, "</table></div>");
}

const STYLE: &str = "\
body{font:15px/1.4 system-ui,-apple-system,sans-serif;margin:0 auto;padding:12px;max-width:1100px;color:#222;background:#fafafa}\
h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.4em 0 .4em}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3em 1em;margin:0}dt{font-weight:600}dd{margin:0;min-width:0}\
code{font-size:.9em;word-break:break-all}\
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}\
table{border-collapse:collapse;width:100%;background:#fff}th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#f0f0f0;white-space:nowrap}td.key{max-width:40em}\
.ok{color:#176117}.bad{color:#a31515;font-weight:600}.note{color:#666;font-size:.9em;margin:.2em 0}.st{color:#555}\
footer{margin-top:2em;color:#777;font-size:.85em}\
@media (max-width:600px){body{padding:8px;font-size:14px}dl{grid-template-columns:1fr}dd{margin-bottom:.4em}th,td{padding:.25em .35em}}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_with_escaped_labels() {
        let text = "# HELP x y\nleasegate_decisions_total{limit=\"a\\\"b\",outcome=\"admitted\"} 5\nleasegate_circuit_open 0\nbad line\n";
        let s = parse_metrics(text);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].name, "leasegate_decisions_total");
        assert_eq!(s[0].label("limit"), Some("a\"b"));
        assert_eq!(s[0].label("outcome"), Some("admitted"));
        assert_eq!(s[0].value, 5.0);
        assert_eq!((s[1].name.as_str(), s[1].value), ("leasegate_circuit_open", 0.0));
    }

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn the_previous_counts_come_from_the_refresh_url() {
        assert_eq!(
            previous(Some("r=10&b=1&t=5000")),
            Some(Previous {
                requests: 10.0,
                bypassed: 1.0,
                at_ms: 5_000
            })
        );
        assert_eq!(previous(Some("r=10&b=x&t=5000")), None);
        assert_eq!(previous(Some("r=10")), None);
        assert_eq!(previous(None), None);
    }
}
