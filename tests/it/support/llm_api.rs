//! An upstream that answers as the LLM APIs do, by how the path ends:
//! OpenAI's Chat Completions (`…/chat/completions`: a stream carries its
//! usage only when the request has `stream_options.include_usage`, in a
//! last chunk whose `choices` is empty, and then every other chunk has
//! `"usage": null`), Anthropic's Messages (`…/messages`: `message_start`
//! and `message_delta` events) and Ollama's chat (`…/api/chat`: NDJSON by
//! default, the `done` line with the counts). Every answer costs
//! [`PROMPT`] + [`OUTPUT`] tokens. It keeps every request body it
//! received.
//!
//! Query: `chunks=N` (content chunks of a stream, default 60), `ms=N` (a
//! pause before each), `status=N` (answer that error status instead, with
//! no usage), `pad=N` (a JSON answer carries N bytes of text before its
//! usage, in 64 KiB frames).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::scripted::{Scripted, Step};

/// The prompt and output tokens of every answer.
pub const PROMPT: u64 = 100;
pub const OUTPUT: u64 = 500;
/// The text of each content chunk: 16 bytes.
pub const WORD: &str = "lorem ipsum dol ";

pub struct LlmApi {
    pub addr: SocketAddr,
    /// The request bodies received, in order.
    pub bodies: Arc<Mutex<Vec<String>>>,
}

impl LlmApi {
    pub fn target(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The last request body received, as JSON.
    pub fn last_body(&self) -> serde_json::Value {
        let bodies = self.bodies.lock().unwrap();
        serde_json::from_str(bodies.last().expect("a request")).expect("JSON")
    }
}

fn query(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

pub async fn start() -> LlmApi {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let kept = kept.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(req, &kept).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    LlmApi { addr, bodies }
}

async fn answer(req: Request<Incoming>, kept: &Mutex<Vec<String>>) -> Response<Scripted> {
    let path = req.uri().path().to_string();
    let chunks = query(&req, "chunks").unwrap_or(60);
    let ms = query(&req, "ms").unwrap_or(0);
    let status = query(&req, "status");
    let pad = query(&req, "pad").unwrap_or(0);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).into_owned();
    kept.lock().unwrap().push(text);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut steps = VecDeque::new();
    let mut data = |s: String| steps.push_back(Step::Data(Bytes::from(s)));
    if let Some(status) = status {
        data(r#"{"error":{"message":"failed","type":"server_error"}}"#.to_string());
        return Response::builder()
            .status(status as u16)
            .header("content-type", "application/json")
            .body(Scripted::new(steps))
            .unwrap();
    }
    let (content_type, steps) = if path.ends_with("/chat/completions") && pad > 0 {
        padded(pad)
    } else if path.ends_with("/chat/completions") {
        openai(&json, chunks, ms)
    } else if path.ends_with("/messages") {
        anthropic(&json, chunks, ms)
    } else if path.ends_with("/api/chat") {
        ollama(&json, chunks, ms)
    } else {
        data(r#"{"object":"list","data":[{"id":"m"}]}"#.to_string());
        ("application/json", steps)
    };
    Response::builder()
        .header("content-type", content_type)
        .body(Scripted::new(steps))
        .unwrap()
}

/// A pause of `ms` (none for 0), then `text`.
fn push(steps: &mut VecDeque<Step>, ms: u64, text: String) {
    if ms > 0 {
        steps.push_back(Step::Pause(ms));
    }
    steps.push_back(Step::Data(Bytes::from(text)));
}

fn openai(req: &serde_json::Value, chunks: u64, ms: u64) -> (&'static str, VecDeque<Step>) {
    let mut steps = VecDeque::new();
    let usage = format!(
        r#"{{"prompt_tokens":{PROMPT},"completion_tokens":{OUTPUT},"total_tokens":{}}}"#,
        PROMPT + OUTPUT
    );
    if req["stream"] != true {
        push(
            &mut steps,
            ms,
            format!(
                r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{WORD}"}},"finish_reason":"stop"}}],"usage":{usage}}}"#
            ),
        );
        return ("application/json", steps);
    }
    let include = req["stream_options"]["include_usage"] == true;
    let null = if include { r#","usage":null"# } else { "" };
    for _ in 0..chunks {
        push(
            &mut steps,
            ms,
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{WORD}\"}},\"finish_reason\":null}}]{null}}}\n\n"
            ),
        );
    }
    push(
        &mut steps,
        ms,
        format!("data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]{null}}}\n\n"),
    );
    if include {
        push(
            &mut steps,
            0,
            format!("data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{usage}}}\n\n"),
        );
    }
    push(&mut steps, 0, "data: [DONE]\n\n".to_string());
    ("text/event-stream", steps)
}

/// A JSON answer with `pad` bytes of text before its usage, in frames.
fn padded(pad: u64) -> (&'static str, VecDeque<Step>) {
    let mut steps = VecDeque::new();
    push(
        &mut steps,
        0,
        r#"{"id":"chatcmpl-1","choices":[{"message":{"content":""#.to_string(),
    );
    let mut left = pad as usize;
    while left > 0 {
        let n = left.min(64 * 1024);
        push(&mut steps, 0, "x".repeat(n));
        left -= n;
    }
    push(
        &mut steps,
        0,
        format!(
            r#""}}}}],"usage":{{"prompt_tokens":{PROMPT},"total_tokens":{}}}}}"#,
            PROMPT + OUTPUT
        ),
    );
    ("application/json", steps)
}

fn anthropic(req: &serde_json::Value, chunks: u64, ms: u64) -> (&'static str, VecDeque<Step>) {
    let mut steps = VecDeque::new();
    if req["stream"] != true {
        push(
            &mut steps,
            ms,
            format!(
                r#"{{"id":"msg_1","type":"message","content":[{{"type":"text","text":"{WORD}"}}],"usage":{{"input_tokens":{PROMPT},"output_tokens":{OUTPUT}}}}}"#
            ),
        );
        return ("application/json", steps);
    }
    push(
        &mut steps,
        0,
        format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"usage\":{{\"input_tokens\":{PROMPT},\"output_tokens\":1}}}}}}\n\n"),
    );
    for _ in 0..chunks {
        push(
            &mut steps,
            ms,
            format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{WORD}\"}}}}\n\n"),
        );
    }
    push(
        &mut steps,
        0,
        format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{OUTPUT}}}}}\n\n"),
    );
    push(
        &mut steps,
        0,
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string(),
    );
    ("text/event-stream", steps)
}

fn ollama(req: &serde_json::Value, chunks: u64, ms: u64) -> (&'static str, VecDeque<Step>) {
    let mut steps = VecDeque::new();
    let done = format!(r#""done":true,"prompt_eval_count":{PROMPT},"eval_count":{OUTPUT}"#);
    if req["stream"] == false {
        push(
            &mut steps,
            ms,
            format!(r#"{{"model":"llama3","message":{{"role":"assistant","content":"{WORD}"}},{done}}}"#),
        );
        return ("application/json", steps);
    }
    for _ in 0..chunks {
        push(
            &mut steps,
            ms,
            format!("{{\"model\":\"llama3\",\"message\":{{\"role\":\"assistant\",\"content\":\"{WORD}\"}},\"done\":false}}\n"),
        );
    }
    push(
        &mut steps,
        0,
        format!("{{\"model\":\"llama3\",\"message\":{{\"role\":\"assistant\",\"content\":\"\"}},{done}}}\n"),
    );
    ("application/x-ndjson", steps)
}
