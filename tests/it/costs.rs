//! `cost = { reserve, settle }`: a request reserves tokens at admission and
//! settles what its response says it really cost once the response has
//! ended (a JSON field, the last event of a stream, a header, bytes), with
//! refunds and debts kept on the instance's lease and sent with its next
//! store call. Real binaries, a real Redis, and a scripted upstream that
//! answers like an LLM API.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::support::redis::Redis;
use crate::support::scripted::{Scripted, Step};
use crate::support::{check, client, sample, Gateway, Toml};

fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

/// An upstream that answers by the last segment of the path:
/// - `json?cost=N[&ms=M]`: `{"usage":{"total_tokens":N}}` (after M ms), and
///   the request body's length in `x-got-bytes`;
/// - `sse?costs=A,B,C`: an event stream, one usage event per cost, then
///   `[DONE]`;
/// - `header?cost=N`: `x-cost: N`;
/// - `cut`: a JSON body that breaks off half way;
/// - `ssecut?costs=A,B`: usage events, then the stream breaks off;
/// - `fail?n=S`: status S (500 when absent or below 400) with no cost;
/// - `bytes?n=N`: N bytes.
async fn llm() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().rsplit('/').next().unwrap_or("").to_string();
                    let cost = query(&req, "cost").unwrap_or_default();
                    let ms: u64 = query(&req, "ms").and_then(|m| m.parse().ok()).unwrap_or(0);
                    let costs = query(&req, "costs").unwrap_or_default();
                    let n: usize = query(&req, "n").and_then(|m| m.parse().ok()).unwrap_or(0);
                    let encoding = req
                        .headers()
                        .get("accept-encoding")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_string();
                    let got = req.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
                    let mut steps = VecDeque::new();
                    let mut resp = Response::builder()
                        .header("x-got-bytes", got.to_string())
                        .header("x-got-accept-encoding", encoding);
                    match path.as_str() {
                        "json" => {
                            steps.push_back(Step::Pause(ms));
                            let body = format!(r#"{{"id":"c1","usage":{{"prompt_tokens":1,"total_tokens":{cost}}}}}"#);
                            steps.push_back(Step::Data(Bytes::from(body)));
                            resp = resp.header("content-type", "application/json");
                        }
                        "sse" => {
                            resp = resp.header("content-type", "text/event-stream");
                            for c in costs.split(',') {
                                steps.push_back(Step::Data(Bytes::from(
                                    "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
                                )));
                                steps.push_back(Step::Pause(5));
                                steps.push_back(Step::Data(Bytes::from(format!(
                                    "data: {{\"usage\":{{\"total_tokens\":{c}}}}}\n\n"
                                ))));
                            }
                            steps.push_back(Step::Data(Bytes::from("data: [DONE]\n\n")));
                        }
                        "header" => {
                            resp = resp.header("x-cost", cost);
                            steps.push_back(Step::Data(Bytes::from("ok")));
                        }
                        "ssecut" => {
                            resp = resp.header("content-type", "text/event-stream");
                            for c in costs.split(',') {
                                steps.push_back(Step::Data(Bytes::from(format!(
                                    "data: {{\"usage\":{{\"total_tokens\":{c}}}}}\n\n"
                                ))));
                            }
                            steps.push_back(Step::Pause(20));
                            steps.push_back(Step::Fail);
                        }
                        "cut" => {
                            resp = resp.header("content-type", "application/json");
                            steps.push_back(Step::Data(Bytes::from(r#"{"id":"c1","usa"#)));
                            steps.push_back(Step::Pause(20));
                            steps.push_back(Step::Fail);
                        }
                        "fail" => {
                            resp = resp.status(n.max(400) as u16);
                            steps.push_back(Step::Data(Bytes::from("{\"error\":\"overloaded\"}")));
                        }
                        _ => steps.push_back(Step::Data(Bytes::from(vec![b'x'; n]))),
                    }
                    Ok::<_, std::convert::Infallible>(resp.body(Scripted { steps, sleep: None }).unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// `[leasing] max`: the most one instance leases at once.
const MAX_LEASE: u64 = 20;

/// One limit per kind of cost, each on a route of its own (`/<limit>/...`),
/// each with a key of its own, and a usage route showing `llm`.
fn toml(store: &str, upstream: SocketAddr) -> Toml {
    let mut t = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"\nmax_cost_body_bytes = 1024")
        .raw(store)
        .table("leasing", &format!("max = {MAX_LEASE}"))
        .upstream("llm", &format!("http://{upstream}"));
    let limits: [(&str, &str, &str); 8] = [
        (
            "llm",
            "100/100s",
            "{ reserve = 10, settle = \"json:usage.total_tokens\" }",
        ),
        (
            "stream",
            "100/100s",
            "{ reserve = 10, settle = \"json:usage.total_tokens\" }",
        ),
        ("hdr", "100/100s", "{ reserve = 10, settle = \"header:x-cost\" }"),
        (
            "prompt",
            "100/100s",
            "{ reserve = \"json:max_tokens\", settle = \"json:usage.total_tokens\" }",
        ),
        (
            "cut",
            "100/100s",
            "{ reserve = 10, settle = \"json:usage.total_tokens\" }",
        ),
        ("bw", "4000/min", "{ reserve = 1, settle = \"response_bytes\" }"),
        ("upload", "4000/min", "{ reserve = 1, settle = \"request_bytes\" }"),
        ("asked", "100/100s", "{ reserve = \"header:x-tokens\" }"),
    ];
    for (name, _, _) in limits {
        t = t
            .forward(name, &format!("/{name}/"), "llm")
            .with(&format!("limits = [\"{name}\"]"));
    }
    for (name, rate, cost) in limits {
        let burst = if matches!(name, "bw" | "upload") { 4000 } else { 100 };
        // The usage route reads `llm`'s key: one the two routes share.
        let by = if name == "llm" { "identity" } else { "route" };
        t = t
            .limit(name, rate)
            .with(&format!("burst = {burst}\nby = [\"{by}\"]\ncost = {cost}"));
    }
    t.raw("[[routes]]\nname = \"usage\"\npath_prefix = \"/usage\"\nusage = [\"llm\"]\nlimits = [\"usage_calls\"]")
        .limit("usage_calls", "100/min")
}

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    /// The body, or how it broke off.
    body: Result<String, String>,
}

impl Answer {
    /// `r` of `limit` in the `RateLimit` header.
    fn remaining(&self, limit: &str) -> u64 {
        let v = self
            .headers
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let item = v
            .split(", ")
            .find(|i| i.starts_with(&format!("\"{limit}\"")))
            .unwrap_or_else(|| panic!("no {limit} in ratelimit: {v:?}"));
        item.split(';')
            .find_map(|p| p.strip_prefix("r="))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{item}"))
    }

    fn retry_after(&self) -> u64 {
        self.headers["retry-after"].to_str().unwrap().parse().unwrap()
    }
}

async fn call(gw: &Gateway, method: &str, path: &str, body: &str) -> Answer {
    let mut c = client::http1(gw.http()).await;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gw")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client::send(&mut c, req).await;
    let (parts, b) = resp.into_parts();
    let body = match b.collect().await {
        Ok(c) => Ok(String::from_utf8_lossy(&c.to_bytes()).into_owned()),
        Err(e) => Err(e.to_string()),
    };
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

async fn get(gw: &Gateway, path: &str) -> Answer {
    call(gw, "GET", path, "").await
}

/// A `json:` settle: refunds show on the next response, a response over its
/// reserve leaves the key in debt, and the debt's 429 says exactly when the
/// debt and the next reserve are repaid.
async fn json_settles_and_debt_is_exact(gw: &Gateway) {
    let a = get(gw, "/llm/json?cost=4").await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(a.remaining("llm"), 90, "the reserve of 10 is taken");
    // Settled at 4: 6 back. This one reserves 10 of the 96 and costs 150.
    let b = get(gw, "/llm/json?cost=150").await;
    assert_eq!(b.status, 200);
    assert_eq!(b.remaining("llm"), 86, "the next response shows the settled state");
    let settled = Instant::now();
    // 154 spent of 100: 54 owed. Refilled at 1 a second, the next reserve
    // of 10 fits in 64 s.
    let c = get(gw, "/llm/json?cost=1").await;
    let elapsed = settled.elapsed();
    assert_eq!(c.status, 429, "{:?}", c.body);
    if elapsed < Duration::from_millis(900) {
        assert_eq!(c.retry_after(), 64, "{:?}", c.headers);
    } else {
        assert!((63..=64).contains(&c.retry_after()), "{:?}", c.headers);
    }
    let u = get(gw, "/usage").await;
    let v: serde_json::Value = serde_json::from_str(u.body.as_ref().unwrap()).unwrap();
    assert_eq!(v["limits"][0]["remaining"], 0, "{v}");
    assert!((53..=54).contains(&v["limits"][0]["debt"].as_u64().unwrap()), "{v}");
}

/// The other rules, one limit each.
async fn every_other_rule_settles(gw: &Gateway) {
    // An event stream settles from its last usage event (30), streamed
    // whole to the client.
    let a = get(gw, "/stream/sse?costs=5,12,30").await;
    assert_eq!(a.status, 200);
    let body = a.body.unwrap();
    assert!(
        body.contains("\"total_tokens\":12") && body.ends_with("data: [DONE]\n\n"),
        "{body}"
    );
    assert_eq!(get(gw, "/stream/json?cost=10").await.remaining("stream"), 100 - 30 - 10);

    // A header.
    assert_eq!(get(gw, "/hdr/header?cost=25").await.status, 200);
    assert_eq!(get(gw, "/hdr/header?cost=10").await.remaining("hdr"), 100 - 25 - 10);

    // A cut stream keeps its reserve, and is counted. An upstream's error
    // answers (400, 429, 500) that report no usage cost nothing: their
    // reserves go back (`errors = "free"`).
    let cut = get(gw, "/cut/cut").await;
    assert!(cut.body.is_err(), "the client sees the cut: {:?}", cut.body);
    for status in [500, 400, 429] {
        let fail = get(gw, &format!("/cut/fail?n={status}")).await;
        assert_eq!(fail.status, status);
    }
    assert_eq!(get(gw, "/cut/json?cost=10").await.remaining("cut"), 100 - 10 - 10);
    // Cut after its usage said 40: the 40 is charged all the same.
    assert!(get(gw, "/cut/ssecut?costs=25,40").await.body.is_err());
    assert_eq!(get(gw, "/cut/json?cost=10").await.remaining("cut"), 100 - 20 - 40 - 10);
    let m = gw.metrics().await;
    assert_eq!(
        sample(&m, "leasegate_cost_unsettled_total{limit=\"cut\",reason=\"cut\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "leasegate_cost_unsettled_total{limit=\"cut\",reason=\"upstream_status\"}"
        ),
        3.0,
        "{m}"
    );

    // Bytes as a bandwidth limit: 4000 a minute; two downloads of 3000
    // owe 2000, repaid at 4000/min with the next byte: 30 s.
    assert_eq!(get(gw, "/bw/bytes?n=3000").await.status, 200);
    assert_eq!(get(gw, "/bw/bytes?n=3000").await.status, 200);
    let over = get(gw, "/bw/bytes?n=10").await;
    assert_eq!(over.status, 429);
    assert!((30..=31).contains(&over.retry_after()), "{:?}", over.headers);
}

/// Bytes sent as an upload quota; a reserve from a header, and the 400 for
/// one that is not a number; a JSON settle asks for an uncompressed body.
async fn uploads_headers_and_encodings(gw: &Gateway) {
    let body = "x".repeat(3000);
    assert_eq!(call(gw, "POST", "/upload/bytes", &body).await.status, 200);
    assert_eq!(call(gw, "POST", "/upload/bytes", &body).await.status, 200);
    let over = call(gw, "POST", "/upload/bytes", "x").await;
    assert_eq!(over.status, 429, "6000 bytes sent of 4000 a minute");
    assert!((30..=31).contains(&over.retry_after()), "{:?}", over.headers);

    let (status, headers, _) = asked(gw, "30").await;
    assert_eq!(status, 200);
    assert_eq!(headers["ratelimit"].to_str().unwrap(), "\"asked\";r=70;t=30");
    // Only a JSON settle needs the body's text: this limit leaves the
    // encoding alone.
    assert_eq!(headers["x-got-accept-encoding"], "gzip, br");
    let (status, _, body) = asked(gw, "thirty").await;
    assert_eq!(status, 400);
    assert!(
        body.contains("the x-tokens header must be a whole number of tokens"),
        "{body}"
    );

    let mut c = client::http1(gw.http()).await;
    let req = Request::get("/stream/json?cost=1")
        .header("host", "gw")
        .header("accept-encoding", "gzip")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, headers, _) = client::text(client::send(&mut c, req).await).await;
    assert_eq!(headers["x-got-accept-encoding"], "-", "a JSON settle reads the text");
}

/// A call on the `asked` limit reserving `tokens` by its header.
async fn asked(gw: &Gateway, tokens: &str) -> (u16, http::HeaderMap, String) {
    let mut c = client::http1(gw.http()).await;
    let req = Request::get("/asked/header?cost=0")
        .header("host", "gw")
        .header("x-tokens", tokens)
        .header("accept-encoding", "gzip, br")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = client::text(client::send(&mut c, req).await).await;
    (status.as_u16(), headers, body)
}

/// A `json:max_tokens` reserve: read from the request body (forwarded as
/// sent), refused when it does not fit, 413 past the bound.
async fn a_body_reserve_refuses_what_does_not_fit(gw: &Gateway) {
    let body = r#"{"model":"m","max_tokens":80,"messages":[]}"#;
    let a = call(gw, "POST", "/prompt/json?cost=70", body).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    assert_eq!(
        a.headers["x-got-bytes"],
        body.len().to_string().as_str(),
        "forwarded whole"
    );
    assert_eq!(a.remaining("prompt"), 20);
    // Settled at 70: 30 left. 50 does not fit, for 20 s at 1 a second.
    let b = call(gw, "POST", "/prompt/json?cost=1", r#"{"max_tokens":50}"#).await;
    assert_eq!(b.status, 429);
    assert!((19..=20).contains(&b.retry_after()), "{:?}", b.headers);
    // The problem says that the request's own reserve is what did not fit.
    let problem: serde_json::Value = serde_json::from_str(b.body.as_ref().unwrap()).unwrap();
    assert_eq!(
        (problem["reserve"].as_u64(), problem["remaining"].as_u64()),
        (Some(50), Some(30)),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("this request reserves 50; 30 remain"),
        "{problem}"
    );
    let big = format!(r#"{{"max_tokens":1,"pad":"{}"}}"#, "x".repeat(2000));
    assert_eq!(call(gw, "POST", "/prompt/json?cost=1", &big).await.status, 413);
}

async fn all(gw: &Gateway) {
    json_settles_and_debt_is_exact(gw).await;
    every_other_rule_settles(gw).await;
    uploads_headers_and_encodings(gw).await;
    a_body_reserve_refuses_what_does_not_fit(gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_settle_from_the_response_on_memory() {
    let upstream = llm().await;
    let gw = Gateway::start(&toml("", upstream));
    all(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_settle_from_the_response_on_redis() {
    let upstream = llm().await;
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let gw = Gateway::start_connected(&toml(&store, upstream));
    all(&gw).await;
}

/// Two instances on one Redis, every response costing 20 more than its
/// reserve: what the fleet admits stays within the written bound,
/// allowance + N × largest lease + the overshoot of responses in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_two_keeps_within_the_written_bound() {
    let upstream = llm().await;
    let redis = Redis::start();
    let config = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .redis(&redis.url(), "timeout_ms = 1000")
        .table("leasing", "max = 40")
        .upstream("llm", &format!("http://{upstream}"))
        .forward("api", "/", "llm")
        .with("limits = [\"tokens\"]")
        .limit("tokens", "600/min")
        .with("burst = 400\nby = [\"route\"]\ncost = { reserve = 10, settle = \"json:usage.total_tokens\" }");
    let gws = [Gateway::start_connected(&config), Gateway::start_connected(&config)];
    const CLIENTS: usize = 4;
    let started = Instant::now();
    let run = Duration::from_millis(2_500);
    let mut tasks = Vec::new();
    for gw in &gws {
        for _ in 0..CLIENTS {
            let addr = gw.http();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                let mut c = client::http1(addr).await;
                while started.elapsed() < run {
                    let resp = client::send(&mut c, client::get("/v1/json?cost=30&ms=10")).await;
                    let ok = resp.status() == 200;
                    let _ = resp.into_body().collect().await;
                    if ok {
                        admitted += 1;
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let spent = admitted * 30;
    let allowance = 400.0 + 10.0 * elapsed;
    let bound = allowance + 2.0 * 40.0 + (2 * CLIENTS) as f64 * 20.0;
    assert!(
        (spent as f64) <= bound,
        "{admitted} admitted cost {spent}, past the bound {bound:.0} (allowance {allowance:.0})"
    );
    assert!(
        (spent as f64) >= allowance * 0.6,
        "{admitted} admitted cost {spent}: far below the allowance {allowance:.0}"
    );
}

#[test]
fn check_refuses_a_settle_without_an_upstream_and_a_body_reserve_without_a_body() {
    let base = "[listeners]\nhttp = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"u\"\ntargets = [\"http://127.0.0.1:9\"]\n";
    let limit = |cost: &str| format!("[[limits]]\nname = \"l\"\nrate = \"100/min\"\ncost = {cost}\n");
    let direct = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nresponse = { status = 200 }\nlimits = [\"l\"]\n";
    let (code, _, err, _dir) = check(&format!(
        "{base}{}{direct}",
        limit("{ reserve = 5, settle = \"header:x-cost\" }")
    ));
    assert_ne!(code, 0);
    assert!(
        err.contains("routes[0].limits") && err.contains("answers by itself"),
        "{err}"
    );
    let gets = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\nmethods = [\"GET\", \"HEAD\"]\nlimits = [\"l\"]\n";
    let (code, _, err, _dir) = check(&format!("{base}{}{gets}", limit("{ reserve = \"json:max_tokens\" }")));
    assert_ne!(code, 0);
    assert!(err.contains("reserves from the JSON request body"), "{err}");
    let (code, _, err, _dir) = check(&format!("{base}{}{gets}", limit("{ reserve = 0 }")));
    assert_ne!(code, 0);
    assert!(
        err.contains("limits[0].cost.reserve") && err.contains("use 1 or more"),
        "{err}"
    );
    let (code, _, err, _dir) = check(&format!("{base}{}{gets}", limit("{ settle = \"tokens\" }")));
    assert_ne!(code, 0);
    assert!(err.contains("limits[0].cost.settle"), "{err}");
    let (code, _, err, _dir) = check(&format!(
        "{base}{}{gets}",
        limit("{ settle = \"header:x-cost\", errors = \"never\" }")
    ));
    assert_ne!(code, 0);
    assert!(
        err.contains("limits[0].cost.errors") && err.contains("use \"free\" or \"reserve\""),
        "{err}"
    );
    let (code, out, err, _dir) = check(&format!(
        "{base}{}{gets}",
        limit("{ settle = \"header:x-cost\", errors = \"reserve\" }")
    ));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("cost reserve 1, settle header:x-cost, errors reserve"),
        "{out}"
    );
    let posts = gets.replace("\"GET\", \"HEAD\"", "\"POST\"");
    let (code, out, err, _dir) = check(&format!(
        "{base}{}{posts}",
        limit("{ reserve = \"json:max_tokens\", settle = \"json:usage.input_tokens+usage.output_tokens\" }")
    ));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("cost reserve json:max_tokens, settle json:usage.input_tokens+usage.output_tokens"),
        "{out}"
    );
}

/// Sequential requests on one keep-alive connection, as an SDK sends them:
/// 2000 tokens an hour, each reserving 1 and costing 600. The fourth
/// leaves the key 400 in debt; the fifth is refused with the debt's own
/// wait (the refill of 401 tokens: 722 s), not a wait computed before the
/// debt was known, and so is every one after it. On the memory store and
/// on Redis.
async fn the_first_refusal_after_a_debt_has_the_debts_wait(store: &str) {
    let upstream = llm().await;
    let text = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .upstream("llm", &format!("http://{upstream}"))
        .forward("chat", "/v1/", "llm")
        .with("limits = [\"tokens\"]")
        .forward("deep", "/deep/", "llm")
        .with("limits = [\"deep\"]")
        .limit("tokens", "2000/h")
        .with("by = [\"route\"]\ncost = { reserve = 1, settle = \"json:usage.total_tokens\" }")
        .limit("deep", "100/100s")
        .with("by = [\"route\"]\ncost = { reserve = 1, settle = \"json:usage.total_tokens\" }")
        .to_string();
    let gw = Gateway::start(&text);
    let mut c = client::http1(gw.http()).await;
    let mut seen = Vec::new();
    for _ in 0..7 {
        let resp = client::send(&mut c, client::get("/v1/json?cost=600")).await;
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let _ = resp.into_body().collect().await;
        seen.push((status, retry));
    }
    assert_eq!(&seen[..4], &[(200, None); 4], "{seen:?}");
    for (status, retry) in &seen[4..] {
        assert_eq!(*status, 429, "{seen:?}");
        let retry = retry.unwrap_or(0);
        assert!((721..=722).contains(&retry), "the debt's wait: {seen:?}\n{}", gw.log());
    }
    // A debt of nine bursts is owed whole, not cut to one burst: a bucket
    // of 100 at 1/s, one request reserving 1 and costing 1 000, owes 900,
    // and the next waits 901 s.
    assert_eq!(get(&gw, "/deep/json?cost=1000").await.status, 200);
    let after = get(&gw, "/deep/json?cost=1").await;
    assert_eq!(after.status, 429);
    assert!((900..=901).contains(&after.retry_after()), "{:?}", after.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_the_first_refusal_after_a_debt_has_the_debts_wait() {
    the_first_refusal_after_a_debt_has_the_debts_wait("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_first_refusal_after_a_debt_has_the_debts_wait() {
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    the_first_refusal_after_a_debt_has_the_debts_wait(&store).await;
}
