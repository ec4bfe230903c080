//! The cost meter (`limit::cost::meter`): what a response body says it
//! cost, read as the body streams past, and the content it counts for an
//! estimate.
//!
//! Input: byte 0 picks the rule and the content type (a JSON body, an
//! event stream or an NDJSON stream) and byte 1 the piece size; the rest
//! is the body.
//!
//! Never panics, and the answer does not depend on how the body was cut
//! into frames: whole, or in pieces of any size, the same cost (or the same
//! reason there is none), the same cost seen so far, the same content.
#![no_main]

use bytes::Bytes;
use http::HeaderMap;
use leasegate::limit::cost::meter::Meter;
use leasegate::limit::cost::{Api, ApiSettle, Settle};
use libfuzzer_sys::fuzz_target;

const RULES: [&str; 4] = [
    "json:usage.total_tokens",
    "json:message.usage.input_tokens+usage.output_tokens",
    "json:choices.0.n",
    "response_bytes",
];

fuzz_target!(|data: &[u8]| {
    let [pick, piece, body @ ..] = data else {
        return;
    };
    let rule = match pick % 8 {
        4 => Settle::Api(ApiSettle::new(Api::OpenAi)),
        5 => Settle::Api(ApiSettle::new(Api::Anthropic)),
        6 | 7 => Settle::Api(ApiSettle::new(Api::Ollama)),
        n => Settle::parse(RULES[usize::from(n)]).expect("the rules parse"),
    };
    let mut headers = HeaderMap::new();
    let content_type = match (pick >> 4) % 3 {
        0 => "application/json",
        1 => "text/event-stream",
        _ => "application/x-ndjson",
    };
    headers.insert(http::header::CONTENT_TYPE, content_type.parse().expect("a valid value"));
    // A small bound too, so the too-large paths are found.
    let max = if pick & 0x80 == 0 { 1 << 20 } else { 64 };
    let mut whole = Meter::new(&rule, &headers, None, max, true);
    whole.data(&Bytes::copy_from_slice(body));
    let mut pieces = Meter::new(&rule, &headers, None, max, true);
    for chunk in body.chunks(usize::from(*piece).max(1)) {
        pieces.data(&Bytes::copy_from_slice(chunk));
    }
    assert_eq!(whole.content(), pieces.content(), "content, cut in pieces of {piece}");
    assert_eq!(whole.seen(), pieces.seen(), "seen, cut in pieces of {piece}");
    assert_eq!(whole.finish(), pieces.finish(), "cut in pieces of {piece}");
});
