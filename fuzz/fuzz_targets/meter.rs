//! The cost meter (`limit::cost::meter`): what a response body says it
//! cost, read as the body streams past.
//!
//! Input: byte 0 picks the rule and the content type (a JSON body or an
//! event stream) and byte 1 the piece size; the rest is the body.
//!
//! Never panics, and the answer does not depend on how the body was cut
//! into frames: whole, or in pieces of any size, the same cost (or the same
//! reason there is none).
#![no_main]

use bytes::Bytes;
use http::HeaderMap;
use leasegate::limit::cost::meter::Meter;
use leasegate::limit::cost::Settle;
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
    let rule = Settle::parse(RULES[usize::from(pick % 4)]).expect("the rules parse");
    let mut headers = HeaderMap::new();
    let content_type = if pick & 0x10 == 0 { "application/json" } else { "text/event-stream" };
    headers.insert(http::header::CONTENT_TYPE, content_type.parse().expect("a valid value"));
    // A small bound too, so the too-large paths are found.
    let max = if pick & 0x20 == 0 { 1 << 20 } else { 64 };
    let mut whole = Meter::new(&rule, &headers, None, max);
    whole.data(&Bytes::copy_from_slice(body));
    let mut pieces = Meter::new(&rule, &headers, None, max);
    for chunk in body.chunks(usize::from(*piece).max(1)) {
        pieces.data(&Bytes::copy_from_slice(chunk));
    }
    assert_eq!(whole.finish(), pieces.finish(), "cut in pieces of {piece}");
});
