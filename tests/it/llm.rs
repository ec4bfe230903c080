//! The LLM API presets (`cost = { api = ... }`) against an upstream that
//! answers as each API does (support/llm_api.rs), with clients that behave
//! as the SDKs do by default: a stream without `include_usage` costs its
//! real usage and its client never sees the chunk that brought it; Anthropic
//! and Ollama streams cost input + output; a stream cut by the client costs
//! more than its reserve; a burst of concurrent requests owes its whole
//! debt; an upstream's error costs nothing; encoded, BOM'd and NaN bodies
//! cannot shrink a reserve. On the memory store and on Redis.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use crate::support::llm_api::{self, LlmApi, OUTPUT, PROMPT};
use crate::support::redis::Redis;
use crate::support::{check, client, Gateway, Toml};

/// Every answer's cost.
const COST: u64 = PROMPT + OUTPUT;
/// The quota of each preset's limit: per day, so that the refill during a
/// test is at most a token.
const QUOTA: u64 = 60_000;
const RESERVE_DEFAULT: u64 = 10;

fn toml(store: &str, api: &LlmApi) -> Toml {
    let mut t = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .raw(store)
        .upstream("llm", &api.target())
        .with("request_timeout_ms = 600000");
    for (name, preset) in [
        ("openai", "api = \"openai\""),
        ("anthropic", "api = \"anthropic\""),
        ("ollama", "api = \"ollama\""),
        ("burst", "api = \"openai\", reserve = 10"),
    ] {
        t = t
            .forward(name, &format!("/{name}/"), "llm")
            .with(&format!("limits = [\"{name}\"]"))
            .limit(name, &format!("{QUOTA}/day"))
            .with(&format!(
                "by = [\"route\"]\ncost = {{ {preset}, reserve_default = {RESERVE_DEFAULT} }}"
            ));
    }
    t
}

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Answer {
    /// `r` in the `RateLimit` header.
    fn remaining(&self) -> u64 {
        let v = self
            .headers
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        v.split(';')
            .find_map(|p| p.strip_prefix("r="))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("ratelimit: {v:?} ({})", self.status))
    }
}

async fn post(gw: &Gateway, path: &str, body: &[u8], encoding: Option<&str>) -> Answer {
    post_to(gw.http(), path, body.to_vec(), encoding).await
}

async fn post_to(addr: std::net::SocketAddr, path: &str, body: Vec<u8>, encoding: Option<&str>) -> Answer {
    let mut c = client::http1(addr).await;
    let mut req = Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "gw")
        .header("content-type", "application/json");
    if let Some(e) = encoding {
        req = req.header("content-encoding", e);
    }
    let resp = client::send(&mut c, req.body(Full::new(Bytes::from(body))).unwrap()).await;
    let (parts, b) = resp.into_parts();
    let body = b.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// What the key has left: a request to a path its preset does not price
/// (`…/models`) costs 1, and its `RateLimit` header shows the rest.
async fn left(gw: &Gateway, route: &str) -> u64 {
    let mut c = client::http1(gw.http()).await;
    let resp = client::send(&mut c, client::get(&format!("/{route}/v1/models"))).await;
    let (status, headers, body) = client::text(resp).await;
    assert_eq!(status, 200, "{body}");
    Answer {
        status: 200,
        headers,
        body,
    }
    .remaining()
        + 1
}

/// `spent` within a token of `expected` (the day's refill while the test runs).
fn about(spent: u64, expected: u64, what: &str) {
    assert!(
        spent == expected || spent + 1 == expected,
        "{what}: charged {spent}, expected {expected}"
    );
}

fn chat(stream: bool, include_usage: Option<bool>) -> String {
    let mut v = serde_json::json!({
        "model": "gpt-4o",
        "stream": stream,
        "messages": [{"role": "user", "content": "write 5000 words"}],
    });
    if let Some(iu) = include_usage {
        v["stream_options"] = serde_json::json!({ "include_usage": iu, "other": 1 });
    }
    v.to_string()
}

/// What a request of `len` body bytes reserves without an output field.
fn reserve_of(len: usize) -> u64 {
    (len as u64).div_ceil(4) + RESERVE_DEFAULT
}

/// OpenAI's stream without `include_usage` (what most SDKs send): the
/// upstream is asked for it, the request costs its usage, and the client's
/// stream is the upstream's less exactly the usage chunk. A client that
/// asked gets its chunk.
async fn openai_streams_cost_their_usage(gw: &Gateway, api: &LlmApi) {
    let before = left(gw, "openai").await;
    let a = post(gw, "/openai/v1/chat/completions", chat(true, None).as_bytes(), None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let sent = api.last_body();
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    assert_eq!(sent["messages"][0]["content"], "write 5000 words", "{sent}");
    assert!(
        !a.body.contains("\"choices\":[]"),
        "the usage chunk reached the client: {}",
        a.body
    );
    assert!(!a.body.contains("total_tokens"), "{}", a.body);
    assert_eq!(
        a.body.matches("data: ").count(),
        60 + 2,
        "every other event passes: {}",
        a.body
    );
    assert!(a.body.ends_with("data: [DONE]\n\n"), "{}", a.body);
    about(
        before - 1 - left(gw, "openai").await,
        COST,
        "a stream without include_usage",
    );

    // A client that asked, with other stream options: its own chunk.
    let before = left(gw, "openai").await;
    let a = post(
        gw,
        "/openai/v1/chat/completions",
        chat(true, Some(true)).as_bytes(),
        None,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(api.last_body()["stream_options"]["other"], 1);
    assert!(a.body.contains("\"choices\":[],\"usage\":{"), "{}", a.body);
    about(before - 1 - left(gw, "openai").await, COST, "a stream that asked");

    // Not streamed: the JSON answer's usage.
    let before = left(gw, "openai").await;
    let a = post(gw, "/openai/v1/chat/completions", chat(false, None).as_bytes(), None).await;
    assert_eq!(a.status, 200);
    assert!(
        api.last_body().get("stream_options").is_none(),
        "not asked when not streamed"
    );
    about(before - 1 - left(gw, "openai").await, COST, "a JSON answer");
}

/// Anthropic's `message_start` + `message_delta`, Ollama's NDJSON stream
/// (its default) and its JSON answer: input + output.
async fn anthropic_and_ollama_cost_input_and_output(gw: &Gateway) {
    let body = r#"{"model":"claude","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let before = left(gw, "anthropic").await;
    let a = post(gw, "/anthropic/v1/messages", body.as_bytes(), None).await;
    assert_eq!(a.status, 200);
    assert!(a.body.contains("message_delta"), "{}", a.body);
    about(before - 1 - left(gw, "anthropic").await, COST, "an Anthropic stream");

    for body in [
        r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#,
        r#"{"model":"llama3","stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
    ] {
        let before = left(gw, "ollama").await;
        let a = post(gw, "/ollama/api/chat", body.as_bytes(), None).await;
        assert_eq!(a.status, 200);
        assert!(a.body.contains("\"done\":true"), "{}", a.body);
        about(before - 1 - left(gw, "ollama").await, COST, body);
    }
}

/// A client that reads five chunks of a sixty-chunk stream and hangs up is
/// charged an estimate of what the upstream sent (the prompt estimate
/// plus content ÷ 4), more than its reserve, not nothing.
async fn a_cut_stream_costs_what_was_sent(gw: &Gateway) {
    let before = left(gw, "openai").await;
    let body = chat(true, None);
    let mut c = client::http1(gw.http()).await;
    let req = Request::builder()
        .method("POST")
        .uri("/openai/v1/chat/completions?ms=20")
        .header("host", "gw")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let resp = client::send(&mut c, req).await;
    assert_eq!(resp.status(), 200);
    let mut body_in = resp.into_body();
    let mut read = 0;
    while read < 5 {
        let frame = body_in.frame().await.expect("a frame").expect("no error");
        if frame.is_data() {
            read += 1;
        }
    }
    drop(body_in);
    drop(c);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let spent = before - 1 - left(gw, "openai").await;
    let reserve = reserve_of(body.len());
    let content = 5 * (llm_api::WORD.len() as u64 / 4);
    assert!(
        spent >= reserve - RESERVE_DEFAULT + content && spent > reserve,
        "a stream cut after 5 chunks cost {spent}; its reserve was {reserve}"
    );
    assert!(
        spent < reserve + 40 * 4,
        "charged for what was sent, not the whole stream: {spent}"
    );
}

/// An upstream's error answer (400, 429, 500), reporting no usage, costs
/// nothing, whatever the request reserved.
async fn upstream_errors_cost_nothing(gw: &Gateway) {
    for status in [400, 429, 500] {
        let before = left(gw, "openai").await;
        let body = r#"{"model":"m","max_tokens":500,"messages":[]}"#;
        let a = post(
            gw,
            &format!("/openai/v1/chat/completions?status={status}"),
            body.as_bytes(),
            None,
        )
        .await;
        assert_eq!(a.status, status);
        about(
            before - 1 - left(gw, "openai").await,
            0,
            &format!("an upstream {status}"),
        );
    }
}

/// A body the gateway cannot read the way the upstream will is refused
/// (`Content-Encoding`: 415); a byte order mark is skipped; a body serde
/// cannot read (NaN) still reserves its size and the default.
async fn bodies_cannot_shrink_a_reserve(gw: &Gateway) {
    let a = post(
        gw,
        "/openai/v1/chat/completions",
        chat(false, None).as_bytes(),
        Some("gzip"),
    )
    .await;
    assert_eq!(a.status, 415, "{}", a.body);
    let before = left(gw, "openai").await;
    let bom = format!("\u{feff}{}", r#"{"model":"m","max_tokens":50,"messages":[]}"#);
    let a = post(gw, "/openai/v1/chat/completions", bom.as_bytes(), None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let reserve = (bom.len() as u64).div_ceil(4) + 50;
    assert!(
        a.remaining() + reserve == before - 1 || a.remaining() + reserve + 1 == before - 1,
        "a BOM'd body reserves its max_tokens: {} of {before}",
        a.remaining()
    );
    let before = left(gw, "openai").await;
    let nan = r#"{"model":"m","temperature":NaN,"max_tokens":1,"messages":[]}"#;
    let a = post(gw, "/openai/v1/chat/completions", nan.as_bytes(), None).await;
    let reserve = reserve_of(nan.len());
    assert!(
        a.remaining() + reserve == before - 1 || a.remaining() + reserve + 1 == before - 1,
        "an unreadable body reserves its size and the default: {} of {before}",
        a.remaining()
    );
}

async fn scenario(gw: &Gateway, api: &LlmApi) {
    openai_streams_cost_their_usage(gw, api).await;
    anthropic_and_ollama_cost_input_and_output(gw).await;
    a_cut_stream_costs_what_was_sent(gw).await;
    upstream_errors_cost_nothing(gw).await;
    bodies_cannot_shrink_a_reserve(gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_charge_real_usage_on_memory() {
    let api = llm_api::start().await;
    let gw = Gateway::start(&toml("", &api));
    scenario(&gw, &api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_charge_real_usage_on_redis() {
    let api = llm_api::start().await;
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n",
        redis.url()
    );
    let gw = Gateway::start_connected(&toml(&store, &api));
    scenario(&gw, &api).await;
}

/// Thirty concurrent requests reserving 10 and costing 600 each on a
/// bucket of 6000 an hour: all admitted (their reserves fit), each charged
/// 600, and the debt (18 000 − 6 000) is owed whole: the next refusal's
/// `Retry-After` is the refill of the debt and the next reserve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_completions_owes_its_whole_debt() {
    let api = llm_api::start().await;
    let text = toml("", &api)
        .forward("hourly", "/hourly/", "llm")
        .with("limits = [\"hourly\"]")
        .limit("hourly", "6000/h")
        .with("by = [\"route\"]\ncost = { api = \"openai\", reserve = 10 }")
        .to_string();
    let gw = Gateway::start(&text);
    let body = chat(false, None);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..30 {
        calls.spawn(post_to(
            gw.http(),
            "/hourly/v1/chat/completions",
            body.clone().into_bytes(),
            None,
        ));
    }
    let statuses: Vec<u16> = calls.join_all().await.iter().map(|a| a.status).collect();
    assert!(statuses.iter().all(|&s| s == 200), "all admitted: {statuses:?}");
    let next = post(&gw, "/hourly/v1/chat/completions", body.as_bytes(), None).await;
    assert_eq!(next.status, 429, "{}", next.body);
    let retry: u64 = next.headers["retry-after"].to_str().unwrap().parse().unwrap();
    // 12 000 owed and 10 to reserve, at 6000 an hour (0.6 s a token).
    let exact = (30 * COST - 6000 + 10) * 6 / 10;
    assert!(
        retry <= exact && retry + 5 >= exact,
        "Retry-After {retry}, the debt's refill {exact}"
    );
}

/// `check` shows a preset's resolved rules, and warns of the 30 s request
/// timeout a long completion that is not streamed would hit.
#[test]
fn check_shows_the_preset_and_warns_of_the_default_timeout() {
    let text = Toml::new()
        .upstream("llm", "http://127.0.0.1:9")
        .forward("chat", "/v1/", "llm")
        .with("limits = [\"tokens\"]")
        .limit("tokens", "100000/min")
        .with("by = [\"route\"]\ncost = { api = \"openai\" }")
        .to_string();
    let (code, out, err, _dir) = check(&text);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("api openai"), "{out}");
    assert!(out.contains("request_timeout_ms"), "{out}");
    let bad = text.replace("api = \"openai\"", "api = \"gemini\"");
    let (code, _, err, _dir) = check(&bad);
    assert_eq!(code, 1);
    assert!(err.contains("unknown api \"gemini\""), "{err}");
}

/// The usage route on one instance is exact: one request costing 600 on
/// `3000/h` leaves 2400 (not a lease short, and still so once the lease
/// has expired and before it went back), with no debt; six leave none and
/// a debt of exactly the excess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_route_is_exact_after_a_settle() {
    let api = llm_api::start().await;
    let text = Toml::new()
        .gateway("workers = 1\naccess_log = \"off\"")
        .upstream("llm", &api.target())
        .forward("chat", "/v1/", "llm")
        .with("limits = [\"tokens\"]")
        .limit("tokens", "3000/h")
        .with("cost = { api = \"openai\", reserve = 1 }")
        .raw("[[routes]]\nname = \"usage\"\npath_prefix = \"/usage\"\nusage = [\"tokens\"]\nlimits = [\"looks\"]")
        .limit("looks", "100/min")
        .to_string();
    let gw = Gateway::start(&text);
    let usage = || async {
        let mut c = client::http1(gw.http()).await;
        let (status, _, body) = client::text(client::send(&mut c, client::get("/usage")).await).await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let l = &v["limits"][0];
        (
            l["remaining"].as_u64().unwrap(),
            l["debt"].as_u64().unwrap(),
            l["reset"].as_u64().unwrap(),
        )
    };
    let body = chat(false, None);
    assert_eq!(
        post(&gw, "/v1/chat/completions", body.as_bytes(), None).await.status,
        200
    );
    let (remaining, debt, _) = usage().await;
    assert!(
        (2400..=2401).contains(&remaining) && debt == 0,
        "right after: {remaining}, debt {debt}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let (remaining, debt, _) = usage().await;
    assert!(
        (2400..=2402).contains(&remaining) && debt == 0,
        "after the lease's TTL: {remaining}, debt {debt}"
    );
    for _ in 0..5 {
        assert_eq!(
            post(&gw, "/v1/chat/completions", body.as_bytes(), None).await.status,
            200
        );
    }
    let (remaining, debt, reset) = usage().await;
    assert_eq!(remaining, 0);
    assert!((597..=600).contains(&debt), "six times 600 on 3000: {debt} owed");
    assert!(reset <= 3600, "reset {reset} is never longer than the window");
}

/// A monthly budget on a Redis that keeps nothing on disk would reset at
/// its restart: the gateway says so at start (where `CONFIG GET` is
/// allowed), and says nothing of a Redis with an append-only file.
#[test]
fn a_monthly_budget_on_a_redis_that_keeps_nothing_is_warned_of() {
    let redis = Redis::start();
    let text = Toml::new()
        .gateway("workers = 1")
        .redis(&redis.url(), "timeout_ms = 1000")
        .respond("demo", "/", &["monthly"])
        .limit("monthly", "1000000/month")
        .with("algorithm = \"fixed_window\"")
        .to_string();
    let warning = "keeps nothing on disk";
    let gw = Gateway::start_connected(&text);
    assert!(
        gw.wait_for_log(warning, std::time::Duration::from_secs(5)),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("monthly"), "names the limit: {}", gw.log());
    drop(gw);
    redis.cli(&["CONFIG", "SET", "appendonly", "yes"]);
    let gw = Gateway::start_connected(&text);
    assert!(
        !gw.wait_for_log(warning, std::time::Duration::from_secs(1)),
        "{}",
        gw.log()
    );
}
