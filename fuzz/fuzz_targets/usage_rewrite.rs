//! The `openai` preset's rewrites (`limit::cost::rewrite`): a request body
//! made to ask for its stream's usage, and the usage chunk removed from
//! the stream its client receives.
//!
//! Input: byte 0 is the piece size, byte 1 the bound on a held event; the
//! rest is both a request body and a response stream.
//!
//! Never panics. A body that lacks usage is rewritten into valid JSON that
//! asks for it and means exactly what the original meant otherwise: the
//! same document but for `stream_options.include_usage = true`. The client's
//! stream does not depend on how the frames cut the upstream's: whole or
//! in pieces, the same bytes, the same chunks removed; with none removed,
//! the upstream's bytes exactly; and it never holds more than the bound
//! plus a frame.
#![no_main]

use bytes::Bytes;
use leasegate::limit::cost::rewrite::{ask_usage, lacks_usage, UsageFilter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [piece, bound, input @ ..] = data else {
        return;
    };
    if lacks_usage(input) {
        let asked = ask_usage(input);
        if let Some(asked) = asked {
            assert!(!lacks_usage(&asked), "asks for its usage");
            let unbom = |b: &[u8]| b.strip_prefix(b"\xEF\xBB\xBF").map(<[u8]>::to_vec).unwrap_or_else(|| b.to_vec());
            // A document a parser reads whole reads the same but for the
            // usage asked (one serde refuses, a lone surrogate escape say,
            // stays as refusable as it was).
            if let Ok(mut old) = serde_json::from_slice::<serde_json::Value>(&unbom(input)) {
                let new: serde_json::Value = serde_json::from_slice(&unbom(&asked)).expect("valid JSON");
                if !old["stream_options"].is_object() {
                    old["stream_options"] = serde_json::json!({});
                }
                old["stream_options"]["include_usage"] = serde_json::Value::Bool(true);
                assert_eq!(new, old, "the same document but for include_usage");
            }
        }
    }
    let max = usize::from(*bound) * 16 + 1;
    let filter = |size: usize| {
        let mut f = UsageFilter::new(max);
        let mut out = Vec::new();
        for chunk in input.chunks(size.max(1)) {
            out.extend_from_slice(&f.push(Bytes::copy_from_slice(chunk)));
        }
        out.extend_from_slice(&f.finish());
        (out, f.removed)
    };
    let (whole, removed) = filter(input.len());
    let (pieces, removed_in_pieces) = filter(usize::from(*piece));
    if removed == 0 {
        assert_eq!(whole, input, "nothing removed: the stream as it came");
    }
    // A stream past the bound passes as it comes from wherever it passed
    // it, which depends on the pieces: compare only when none was.
    if input.len() <= max {
        assert_eq!(whole, pieces, "cut in pieces of {piece}");
        assert_eq!(removed, removed_in_pieces);
    }
});
