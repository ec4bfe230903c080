//! `[events]` through the real binary: shadow and soft decisions arrive as
//! DogStatsD events at a real UDP socket standing in for the agent, one
//! per key per interval, and an agent that is down slows no request.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;

use crate::support::{self, client, Gateway, Toml};

/// A UDP socket on 127.0.0.1 playing the DogStatsD agent.
struct Agent(UdpSocket);

impl Agent {
    fn bind() -> Agent {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        Agent(s)
    }

    fn addr(&self) -> String {
        self.0.local_addr().unwrap().to_string()
    }

    /// Every datagram received until `want` have come (then `quiet` more
    /// to catch extras), or 5 s have passed. `want` 0: what comes within
    /// `quiet`.
    fn receive(&self, want: usize, quiet: Duration) -> Vec<Datagram> {
        let mut out = Vec::new();
        let mut buf = [0u8; 65_536];
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut quiet_until = None;
        loop {
            let now = Instant::now();
            if now > deadline || quiet_until.is_some_and(|q| now > q) {
                return out;
            }
            if let Ok(n) = self.0.recv(&mut buf) {
                out.push(Datagram::parse(std::str::from_utf8(&buf[..n]).unwrap()));
            }
            if out.len() >= want && quiet_until.is_none() {
                quiet_until = Some(Instant::now() + quiet);
            }
        }
    }
}

/// One event as an agent reads it: lengths first, then the fields.
#[derive(Debug)]
struct Datagram {
    title: String,
    text: String,
    alert_type: String,
    tags: Vec<String>,
}

impl Datagram {
    fn parse(d: &str) -> Datagram {
        let rest = d.strip_prefix("_e{").unwrap_or_else(|| panic!("not an event: {d}"));
        let (lens, rest) = rest.split_once("}:").unwrap();
        let (t, x) = lens.split_once(',').unwrap();
        let (t, x): (usize, usize) = (t.parse().unwrap(), x.parse().unwrap());
        let title = rest[..t].to_string();
        let text = rest[t + 1..t + 1 + x].to_string();
        let mut alert_type = String::new();
        let mut tags = Vec::new();
        for field in rest[t + 1 + x..].split('|').skip(1) {
            if let Some(a) = field.strip_prefix("t:") {
                alert_type = a.into();
            } else if let Some(list) = field.strip_prefix('#') {
                tags = list.split(',').map(String::from).collect();
            }
        }
        Datagram {
            title,
            text,
            alert_type,
            tags,
        }
    }

    fn has_tags(&self, want: &[&str]) -> bool {
        want.iter().all(|w| self.tags.iter().any(|t| t == w))
    }

    /// The over-quota percent the text names.
    fn percent(&self) -> u64 {
        let before = self.text.split("% over quota").next().unwrap();
        before.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

/// Two API keys (tenants `a` and `b`), client addresses behind a trusted
/// proxy, events to `agent` (`events`: more `[events]` lines), and
/// `routes_and_limits`.
fn config(agent: &str, events: &str, routes_and_limits: &str) -> Toml {
    Toml::new()
        .gateway("instance_id = \"gw-test\"\nworkers = 2\naccess_log = \"off\"")
        .table("identity", "ipv4_prefix = 32\ntrusted_proxies = [\"127.0.0.1/32\"]")
        .raw("[[identity.api_keys]]\nkey = \"key-a\"\ntenant = \"a\"")
        .raw("[[identity.api_keys]]\nkey = \"key-b\"\ntenant = \"b\"")
        .table("events", &format!("dogstatsd = \"{agent}\"\n{events}"))
        .raw(routes_and_limits)
}

const SHADOW_AND_SOFT: &str = r#"
[[routes]]
name = "watched"
path_prefix = "/watched"
response = { status = 200, body = "ok" }
limits = ["watch"]

[[routes]]
name = "warned"
path_prefix = "/warned"
response = { status = 200, body = "ok" }
limits = ["gentle"]

[[limits]]
name = "watch"
rate = "3/min"
mode = "shadow"

[[limits]]
name = "gentle"
rate = "2/min"
mode = "soft"
"#;

async fn get(c: &mut client::Sender1, path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap) {
    let mut req = Request::get(path).header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, h, _) = client::text(client::send(c, req.body(Full::new(Bytes::new())).unwrap()).await).await;
    (status, h)
}

/// One route under one shadow limit of 1/min: every request after a key's
/// first is a shadow block.
const ONE_SHADOW_LIMIT: &str = r#"
[[routes]]
name = "watched"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["watch"]

[[limits]]
name = "watch"
rate = "1/min"
mode = "shadow"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_and_soft_decisions_over_quota_send_their_events() {
    let agent = Agent::bind();
    let gw = Gateway::start(&config(&agent.addr(), "", SHADOW_AND_SOFT));
    assert!(gw.log().contains("shadow and soft events on"), "{}", gw.log());
    let mut c = client::http1(gw.http()).await;
    let key_a = [("x-api-key", "key-a")];
    for _ in 0..5 {
        assert_eq!(get(&mut c, "/watched", &key_a).await.0, 200);
    }
    let mut warning = None;
    for _ in 0..4 {
        let (status, h) = get(&mut c, "/warned", &key_a).await;
        assert_eq!(status, 200);
        if warning.is_none() {
            warning = h.get("ratelimit-warning").map(|v| v.to_str().unwrap().to_string());
        }
    }
    let got = agent.receive(2, Duration::from_millis(300));
    assert_eq!(got.len(), 2, "{got:?}");

    let shadow = got.iter().find(|d| d.title == "RateLimitShadowBlock").unwrap();
    assert!(
        shadow.has_tags(&["limit:watch", "route:watched", "tier:key"]),
        "{shadow:?}"
    );
    assert_eq!(shadow.alert_type, "info");
    assert!(shadow.text.contains("key:a is "), "{shadow:?}");
    // The first refusal: one over a quota of three.
    assert_eq!(shadow.percent(), 34, "{shadow:?}");

    let soft = got.iter().find(|d| d.title == "RateLimitSoftBlock").unwrap();
    assert!(soft.has_tags(&["limit:gentle", "route:warned", "tier:key"]), "{soft:?}");
    assert_eq!(soft.alert_type, "warning");
    // The percent the client was warned about.
    let warning = warning.expect("a RateLimit-Warning");
    assert!(
        warning.starts_with(&format!("{}% over quota", soft.percent())),
        "{warning} vs {soft:?}"
    );

    let m = gw.metrics().await;
    assert!(m.contains(r#"leasegate_events_total{result="sent"} 2"#), "{m}");
    assert!(m.contains(r#"leasegate_events_total{result="dropped"} 0"#), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_per_key_per_interval() {
    let agent = Agent::bind();
    let limits = ONE_SHADOW_LIMIT;
    let gw = Gateway::start(&config(&agent.addr(), "", limits));
    let mut c = client::http1(gw.http()).await;
    // One admitted, then 50 over the quota, for each of two keys.
    for key in ["key-a", "key-b"] {
        for _ in 0..51 {
            assert_eq!(get(&mut c, "/", &[("x-api-key", key)]).await.0, 200);
        }
    }
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"leasegate_decisions_total{limit="watch",outcome="shadow_limited"} 100"#),
        "{m}"
    );
    let got = agent.receive(2, Duration::from_millis(500));
    assert_eq!(got.len(), 2, "one per key: {got:?}");
    assert!(got.iter().all(|d| d.title == "RateLimitShadowBlock"), "{got:?}");
    assert!(got.iter().any(|d| d.text.contains("key:a is ")), "{got:?}");
    assert!(got.iter().any(|d| d.text.contains("key:b is ")), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_costs_requests_nothing() {
    // A UDP port nothing listens on: sends get ICMP port unreachable.
    let dead = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let limits = r#"
[[routes]]
name = "watched"
path_prefix = "/"
response = { status = 200, body = "ok" }
limits = ["watch", "gentle"]

[[limits]]
name = "watch"
rate = "1/min"
mode = "shadow"

[[limits]]
name = "gentle"
rate = "1/min"
mode = "soft"
"#;
    let gw = Gateway::start(&config(&dead, "min_interval_ms = 100", limits));
    let mut c = client::http1(gw.http()).await;
    let mut slowest = Duration::ZERO;
    // 100 clients (one address each behind the trusted proxy), each over
    // both quotas on its second request: 200 events for a dead agent.
    for i in 0..100 {
        let xff = format!("10.0.{}.{}", i / 250, i % 250 + 1);
        for _ in 0..2 {
            let started = Instant::now();
            let (status, _) = get(&mut c, "/", &[("x-forwarded-for", &xff)]).await;
            let took = started.elapsed();
            assert_eq!(status, 200);
            assert!(took < Duration::from_millis(200), "a request took {took:?}");
            slowest = slowest.max(took);
        }
    }
    // Every event was tried (or dropped), and the failures were seen.
    let gw_ref = &gw;
    let (total, m) = support::eventually(
        Duration::from_secs(5),
        || async move {
            let m = gw_ref.metrics().await;
            let n = |r: &str| support::sample(&m, &format!("leasegate_events_total{{result=\"{r}\"}} "));
            let (sent, failed, dropped) = (n("sent"), n("failed"), n("dropped"));
            (sent + failed + dropped >= 200.0 && failed >= 1.0).then_some((sent + failed + dropped, m))
        },
        || "200 events tried, one of them failed".into(),
    )
    .await;
    assert_eq!(total, 200.0, "{m}");
    eprintln!("slowest request with a dead agent: {slowest:?}");
}

#[test]
fn check_names_the_line_of_a_bad_agent_address() {
    let text = config("datadog:8125", "min_interval_ms = 0", SHADOW_AND_SOFT);
    let (code, _, stderr, _dir) = support::check(&text);
    assert_eq!(code, 1, "{stderr}");
    let line = text.lines().position(|l| l.starts_with("dogstatsd")).unwrap() + 1;
    assert!(
        stderr.contains(&format!("gateway.toml:{line}: events.dogstatsd: ")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("gateway.toml:{}: events.min_interval_ms: ", line + 1)),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_moves_events_to_a_new_agent_and_can_turn_them_off() {
    let (first, second) = (Agent::bind(), Agent::bind());
    let limits = ONE_SHADOW_LIMIT;
    let gw = Gateway::start(&config(&first.addr(), "", limits));
    let mut c = client::http1(gw.http()).await;
    let over = |c: &'static str| [("x-forwarded-for", c)];
    for _ in 0..2 {
        get(&mut c, "/", &over("10.1.0.1")).await;
    }
    assert_eq!(first.receive(1, Duration::from_millis(100)).len(), 1);

    let reload = |text: &str, n: usize| {
        std::fs::write(&gw.config, text).unwrap();
        gw.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(5);
        while gw.log().matches("config reloaded").count() < n {
            assert!(Instant::now() < deadline, "{}", gw.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    reload(&config(&second.addr(), "", limits), 1);
    for _ in 0..2 {
        get(&mut c, "/", &over("10.1.0.2")).await;
    }
    let got = second.receive(1, Duration::from_millis(200));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].text.contains("subnet:10.1.0.2/32"), "{got:?}");
    assert!(first.receive(0, Duration::from_millis(200)).is_empty());

    // Without [events]: nothing is sent.
    let off = config(&second.addr(), "", limits).replace("[events]\ndogstatsd", "# dogstatsd");
    reload(&off, 2);
    for _ in 0..2 {
        get(&mut c, "/", &over("10.1.0.3")).await;
    }
    assert!(second.receive(0, Duration::from_millis(300)).is_empty());
    assert!(!gw.log().contains("reload failed"), "{}", gw.log());
}
