//! The `openai` preset's rewrites (`limit::cost::rewrite`): a request body
//! made to ask for its stream's usage, and the usage chunk removed from
//! the stream its client receives.
//!
//! Input: byte 0 is the piece size, byte 1 the bound on a held event; the
//! rest is both a request body and a response stream.
//!
//! Never panics. A body that lacks usage is rewritten into valid JSON that
//! asks for it, every byte of the original kept in order. The client's
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
            assert!(serde_json::from_slice::<serde_json::Value>(&asked).is_ok(), "valid JSON");
            assert!(!lacks_usage(&asked), "asks for its usage");
            // The original's bytes, in order, within the new body.
            let mut rest = asked.as_slice();
            for b in input {
                let at = rest.iter().position(|c| c == b).expect("every original byte kept in order");
                rest = &rest[at + 1..];
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
