//! Which headers go out, through the real binary: each limit's
//! `RateLimit*` fields as its `headers` says, and `x-request-id` both ways
//! as `[gateway] request_id` says.

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;

use crate::support::{client, upstream, Gateway, Toml};

const FIELDS: [&str; 5] = [
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
];

/// One route, `demo`, answered by the gateway itself under `limits`.
fn config(limits: &[&str]) -> Toml {
    Toml::new().gateway("workers = 2").respond("demo", "/", limits)
}

async fn get(c: &mut client::Sender1) -> (StatusCode, HeaderMap, String) {
    client::text(client::send(c, client::get("/")).await).await
}

fn no_fields(h: &HeaderMap) -> bool {
    h.keys().all(|k| !k.as_str().starts_with("ratelimit"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_show_the_fields_on_429s_only() {
    let gw = Gateway::start(
        &config(&["quiet"])
            .limit("quiet", "2/min")
            .with("headers = \"refusals\""),
    );
    let mut c = client::http1(gw.http()).await;
    for i in 0..2 {
        let (status, h, _) = get(&mut c).await;
        assert_eq!(status, 200, "request {i}");
        assert!(no_fields(&h), "a 200 under \"refusals\" shows none: {h:?}");
    }
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 429);
    for f in FIELDS {
        assert!(h.contains_key(f), "a 429 shows {f}: {h:?}");
    }
    assert_eq!(h["ratelimit-policy"], r#""quiet";q=2;w=60"#);
    assert_eq!(h["ratelimit-limit"], "2");
    assert_eq!(h["ratelimit-remaining"], "0");
    assert!(h.contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_shows_no_field_and_its_429_says_only_when_to_retry() {
    let gw = Gateway::start(&config(&["hidden"]).limit("hidden", "1/min").with("headers = \"none\""));
    let mut c = client::http1(gw.http()).await;
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 200);
    assert!(no_fields(&h), "{h:?}");
    let (status, h, body) = get(&mut c).await;
    assert_eq!(status, 429);
    assert!(no_fields(&h), "{h:?}");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    assert_eq!(h["content-type"], "application/problem+json");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["limit"].as_str(), v["retry_after"].as_u64()),
        (Some("hidden"), Some(retry))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_of_one_route_each_keep_their_own_setting() {
    let gw = Gateway::start(
        &config(&["open", "quiet"])
            .respond("hidden", "/hidden", &["open", "hidden"])
            .limit("open", "100/min")
            .limit("quiet", "1/min")
            .with("headers = \"refusals\"")
            .limit("hidden", "1/min")
            .with("headers = \"none\""),
    );
    let mut c = client::http1(gw.http()).await;
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 200);
    assert_eq!(
        h["ratelimit-policy"], r#""open";q=100;w=60"#,
        "only \"all\" limits on a 200"
    );
    // Refused by `quiet`: the 429 shows every limit but the hidden ones,
    // the trio the refusing limit's.
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 429);
    assert_eq!(h["ratelimit-policy"], r#""open";q=100;w=60, "quiet";q=1;w=60"#);
    assert_eq!(h["ratelimit-limit"], "1");
    // Refused by `hidden`: no field at all, not even `open`'s.
    let hidden = || {
        Request::get("/hidden")
            .header("host", "x")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let h = client::send(&mut c, hidden()).await.headers().clone();
    assert_eq!(h["ratelimit-policy"], r#""open";q=100;w=60"#);
    let resp = client::send(&mut c, hidden()).await;
    assert_eq!(resp.status(), 429);
    assert!(no_fields(resp.headers()), "{:?}", resp.headers());
    assert!(resp.headers().contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_limit_without_fields_still_warns() {
    let gw = Gateway::start(
        &config(&["gentle"])
            .limit("gentle", "1/min")
            .with("mode = \"soft\"\nheaders = \"none\""),
    );
    let mut c = client::http1(gw.http()).await;
    assert!(no_fields(&get(&mut c).await.1));
    let (status, h, _) = get(&mut c).await;
    assert_eq!(status, 200);
    assert_eq!(h["ratelimit-warning"], "100% over quota; this limit will be enforced");
    assert!(
        h.keys()
            .all(|k| k == "ratelimit-warning" || !k.as_str().starts_with("ratelimit")),
        "{h:?}"
    );
}

/// A gateway forwarding `/` to `up` under `request_id` (the default when
/// `None`), with `/limited` answered by itself under a 1/min limit.
fn forwarding(up: &upstream::Upstream, request_id: Option<&str>) -> Gateway {
    let gateway = match request_id {
        Some(mode) => format!("workers = 2\nrequest_id = \"{mode}\""),
        None => "workers = 2".to_string(),
    };
    Gateway::start(
        &Toml::new()
            .gateway(&gateway)
            .upstream("backend", &up.target())
            .forward("api", "/", "backend")
            .respond("limited", "/limited", &["one"])
            .limit("one", "1/min"),
    )
}

/// What one request with `id` (none if `None`) ends with: its status, the
/// response's `x-request-id`, and the ones the upstream saw.
async fn exchange(c: &mut client::Sender1, path: &str, id: Option<&str>) -> (u16, Option<String>, Vec<String>) {
    let mut req = Request::get(path).header("host", "x");
    if let Some(id) = id {
        req = req.header("x-request-id", id);
    }
    let resp = client::send(c, req.body(Full::new(Bytes::new())).unwrap()).await;
    let back = resp
        .headers()
        .get_all("x-request-id")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert!(back.len() <= 1, "{back:?}");
    let (status, _, body) = client::text(resp).await;
    let seen = match serde_json::from_str::<serde_json::Value>(&body) {
        Ok(v) => v["headers"]["x-request-id"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default(),
        Err(_) => vec![],
    };
    (status.as_u16(), back.into_iter().next(), seen)
}

fn made(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_sets_the_id_both_ways() {
    let up = upstream::start("a").await;
    for mode in [Some("generate"), None] {
        let gw = forwarding(&up, mode);
        let mut c = client::http1(gw.http()).await;
        // The client's, sent up and back, in place of the upstream's.
        let (status, back, seen) = exchange(&mut c, "/id?set=up-1", Some("client-1")).await;
        assert_eq!(
            (status, back.as_deref(), seen),
            (200, Some("client-1"), vec!["client-1".to_string()])
        );
        // None, or one that is not sane: one made here, both ways.
        for sent in [None, Some("has space")] {
            let (_, back, seen) = exchange(&mut c, "/id?set=up-1", sent).await;
            let back = back.unwrap();
            assert!(made(&back), "{back}");
            assert_eq!(seen, [back]);
        }
        // The gateway's own answers carry it too.
        assert_eq!(exchange(&mut c, "/limited", Some("c-2")).await.0, 200);
        let (status, back, _) = exchange(&mut c, "/limited", Some("c-2")).await;
        assert_eq!((status, back.as_deref()), (429, Some("c-2")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_keeps_the_clients_and_the_upstreams() {
    let up = upstream::start("a").await;
    let gw = forwarding(&up, Some("forward"));
    let mut c = client::http1(gw.http()).await;
    let (status, back, seen) = exchange(&mut c, "/id?set=up-1", Some("client-1")).await;
    assert_eq!(
        (status, back.as_deref()),
        (200, Some("up-1")),
        "the upstream's comes back"
    );
    assert_eq!(seen, ["client-1"]);
    let (_, back, seen) = exchange(&mut c, "/id", Some("client-1")).await;
    assert_eq!(
        (back.as_deref(), seen),
        (Some("client-1"), vec!["client-1".to_string()])
    );
    // Made only when absent (or not sane).
    let (_, back, seen) = exchange(&mut c, "/id", None).await;
    let back = back.unwrap();
    assert!(made(&back), "{back}");
    assert_eq!(seen, [back]);
    let (_, back, seen) = exchange(&mut c, "/id?set=up-2", Some("has space")).await;
    assert_eq!(back.as_deref(), Some("up-2"));
    assert!(seen.len() == 1 && made(&seen[0]), "{seen:?}");
    assert_eq!(exchange(&mut c, "/limited", None).await.0, 200);
    let (status, back, _) = exchange(&mut c, "/limited", Some("c-2")).await;
    assert_eq!((status, back.as_deref()), (429, Some("c-2")));
    let (status, back, _) = exchange(&mut c, "/limited", None).await;
    assert_eq!(status, 429);
    assert!(back.as_deref().is_some_and(made), "{back:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_neither_makes_nor_sets_one() {
    let up = upstream::start("a").await;
    let gw = forwarding(&up, Some("off"));
    let mut c = client::http1(gw.http()).await;
    let (status, back, seen) = exchange(&mut c, "/id", None).await;
    assert_eq!((status, back, seen), (200, None, vec![]));
    // The client's and the upstream's pass as they are, sane or not.
    let (_, back, seen) = exchange(&mut c, "/id", Some("client-1")).await;
    assert_eq!((back, seen), (None, vec!["client-1".to_string()]));
    let (_, back, seen) = exchange(&mut c, "/id?set=up-1", Some("has space")).await;
    assert_eq!((back.as_deref(), seen), (Some("up-1"), vec!["has space".to_string()]));
    // The gateway's own answers carry none.
    assert_eq!(exchange(&mut c, "/limited", Some("c-2")).await.0, 200);
    let (status, back, _) = exchange(&mut c, "/limited", Some("c-2")).await;
    assert_eq!((status, back), (429, None));
}

/// How one HTTP/2 response's header block represents its fields (RFC 7541
/// §6), counted without decoding a string: what the wire says of each
/// field's place in the connection's HPACK table.
#[derive(Debug, Default)]
struct Representations {
    /// Fields sent as a reference to the dynamic table (index > 61).
    from_table: usize,
    /// Literals the decoder must add to its table.
    added: usize,
    /// Never-indexed literals (§6.2.3).
    never_indexed: usize,
    /// Never-indexed literals whose name is a reference to the dynamic
    /// table, not spelt out.
    never_indexed_named_from_table: usize,
}

/// An HPACK integer with an `n`-bit prefix at `block[*at]`.
fn hpack_int(block: &[u8], at: &mut usize, n: u32) -> usize {
    let max = (1usize << n) - 1;
    let mut v = usize::from(block[*at]) & max;
    *at += 1;
    if v < max {
        return v;
    }
    let mut shift = 0;
    loop {
        let b = block[*at];
        *at += 1;
        v += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return v;
        }
    }
}

fn hpack_skip_string(block: &[u8], at: &mut usize) {
    let len = hpack_int(block, at, 7);
    *at += len;
}

fn representations(block: &[u8]) -> Representations {
    let mut r = Representations::default();
    let mut at = 0;
    while at < block.len() {
        let b = block[at];
        let name_prefix = if b & 0x80 != 0 {
            if hpack_int(block, &mut at, 7) > 61 {
                r.from_table += 1;
            }
            continue;
        } else if b & 0xc0 == 0x40 {
            r.added += 1;
            6
        } else if b & 0xe0 == 0x20 {
            hpack_int(block, &mut at, 5); // a table size update
            continue;
        } else {
            4
        };
        let never_indexed = b & 0xf0 == 0x10;
        let name = hpack_int(block, &mut at, name_prefix);
        if never_indexed {
            r.never_indexed += 1;
            if name > 61 {
                r.never_indexed_named_from_table += 1;
            }
        }
        if name == 0 {
            hpack_skip_string(block, &mut at);
        }
        hpack_skip_string(block, &mut at);
    }
    r
}

/// GETs `/` on stream `id` of a raw HTTP/2 connection and returns its
/// response's header block, acknowledging the server's settings on the
/// way.
async fn h2_get(tcp: &mut tokio::net::TcpStream, authority: &str, id: u32) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // :method GET, :scheme http, :path / (static table), :authority as a
    // literal that is not indexed.
    let mut block = vec![0x82, 0x86, 0x84, 0x01, authority.len() as u8];
    block.extend_from_slice(authority.as_bytes());
    let mut frame = (block.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[0x1, 0x4 | 0x1]); // HEADERS, END_HEADERS | END_STREAM
    frame.extend_from_slice(&id.to_be_bytes());
    frame.extend_from_slice(&block);
    tcp.write_all(&frame).await.unwrap();
    loop {
        let mut head = [0u8; 9];
        tcp.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        tcp.read_exact(&mut payload).await.unwrap();
        match kind {
            // The server's SETTINGS: acknowledged.
            0x4 if flags & 0x1 == 0 => tcp.write_all(&[0, 0, 0, 0x4, 0x1, 0, 0, 0, 0]).await.unwrap(),
            0x1 if stream == id => {
                assert!(flags & 0x4 != 0, "one HEADERS frame holds the whole head");
                assert!(flags & 0x28 == 0, "no padding or priority expected");
                return payload;
            }
            0x7 => panic!("GOAWAY: {payload:?}"),
            _ => {}
        }
    }
}

/// The fields that change from one response to the next (`RateLimit`'s
/// counts, `RateLimit-Remaining`, `x-request-id`) go out over HTTP/2 as
/// never-indexed literals, so they do not fill the connection's HPACK table
/// with entries no later response matches; the ones that repeat
/// (`RateLimit-Policy`, `RateLimit-Limit`) are sent once and then referred
/// to from the table. The first response of a connection, and one in 256
/// after it, sends the changing ones indexed, so their names are in the
/// table for the never-indexed ones to refer to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_changing_fields_stay_out_of_the_hpack_table() {
    use tokio::io::AsyncWriteExt;
    let gw = Gateway::start(&config(&["open"]).limit("open", "100000/min"));
    let mut tcp = tokio::net::TcpStream::connect(gw.http()).await.unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let authority = gw.http().to_string();
    let mut seeding = Vec::new();
    for n in 0..300u32 {
        let r = representations(&h2_get(&mut tcp, &authority, 2 * n + 1).await);
        if r.never_indexed == 0 {
            assert!(
                r.added >= 3,
                "response {n} seeds ratelimit, ratelimit-remaining, x-request-id: {r:?}"
            );
            seeding.push(n);
            continue;
        }
        // x-request-id is never repeated; a count may be (leased tokens
        // are counted as they are taken), and then it is the table's.
        assert!(
            r.never_indexed >= 1 && r.never_indexed == r.never_indexed_named_from_table,
            "response {n}: the changing fields never indexed, their names from the table: {r:?}"
        );
        assert!(
            r.from_table >= 2,
            "response {n}: ratelimit-policy and ratelimit-limit from the table: {r:?}"
        );
        assert!(
            r.added <= 2,
            "response {n}: at most date and ratelimit-reset added again, not the counts: {r:?}"
        );
    }
    assert_eq!(seeding, [0, 256], "the first response and one in 256 seed the names");
}
