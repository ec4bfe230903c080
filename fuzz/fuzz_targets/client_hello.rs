//! The ClientHello framer (`record::client_hello_extent`) and parser
//! (`client_hello::parse`) on arbitrary bytes.
//!
//! Properties: nothing panics; a `Complete(end)` extent lies inside the
//! buffer, ends on a record boundary, holds the whole hello (whose length
//! is within `max`) and nothing past the record it ends in, and stays the
//! same when the bytes after it are cut off or any prefix is given instead
//! (`Incomplete`); a hello in records parses the same as its bare handshake
//! bytes, and a bare hello parses the same however it is split into records;
//! the framer that keeps its place across reads agrees with a fresh one.
#![no_main]

use leasegate::fingerprint::client_hello::{parse, MAX_HELLO};
use leasegate::fingerprint::record::{client_hello_extent, Extent, Framer, MAX_RECORD};
use libfuzzer_sys::fuzz_target;

/// The handshake bytes of the complete records at the start of `buf`, and
/// the length of the last record read (an independent re-reading).
fn handshake_of(buf: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    let mut last = 0;
    while pos + 5 <= buf.len() {
        let len = usize::from(u16::from_be_bytes([buf[pos + 3], buf[pos + 4]]));
        assert!(pos + 5 + len <= buf.len(), "a complete extent cuts a record");
        out.extend_from_slice(&buf[pos + 5..pos + 5 + len]);
        last = len;
        pos += 5 + len;
    }
    assert_eq!(pos, buf.len(), "a complete extent ends inside a record header");
    (out, last)
}

fn check_extent(data: &[u8], max: usize) {
    let Ok(Extent::Complete(end)) = client_hello_extent(data, max) else {
        return;
    };
    assert!(end <= data.len(), "extent {end} past the buffer ({})", data.len());
    assert!(end >= 9, "extent {end} shorter than a record header and a handshake header");
    let framed = &data[..end];
    let (hs, last) = handshake_of(framed);
    assert_eq!(hs[0], 1, "not a ClientHello");
    let n = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
    assert!(n <= max, "hello of {n} bytes accepted over max {max}");
    assert!(hs.len() >= 4 + n, "complete before the hello ends");
    assert!(
        hs.len() - (4 + n) < last,
        "the hello ended before the last record kept"
    );
    // The bytes after the extent change nothing; every shorter prefix is
    // incomplete (checked at a few cuts, not all: quadratic).
    assert_eq!(client_hello_extent(framed, max), Ok(Extent::Complete(end)));
    for cut in [0, 1, 4, 5, 9, end / 2, end - 1] {
        if cut < end {
            assert_eq!(
                client_hello_extent(&data[..cut], max),
                Ok(Extent::Incomplete),
                "prefix of {cut} bytes of a complete hello"
            );
        }
    }
}

/// The framer the TLS listener keeps across reads, fed `data` in steps of
/// a size taken from the data: it answers what a fresh framer does for
/// every prefix it is given.
fn check_piecewise(data: &[u8]) {
    let step = 1 + usize::from(data.first().copied().unwrap_or(0) % 13);
    let mut framer = Framer::new(MAX_HELLO);
    let mut cut = 0;
    loop {
        let want = client_hello_extent(&data[..cut], MAX_HELLO);
        assert_eq!(framer.advance(&data[..cut]), want, "step {step}, prefix {cut}");
        if want != Ok(Extent::Incomplete) || cut == data.len() {
            break;
        }
        cut = (cut + step).min(data.len());
    }
}

fuzz_target!(|data: &[u8]| {
    for max in [MAX_RECORD, MAX_HELLO, 64] {
        check_extent(data, max);
    }
    if data.len() <= 2_048 {
        check_piecewise(data);
    }
    let parsed = parse(data);
    if data.first() == Some(&0x16) {
        // Records: the framer said complete exactly when parsing got past
        // framing, and the records parse as their handshake bytes.
        if let Ok(Extent::Complete(end)) = client_hello_extent(data, MAX_HELLO) {
            let (hs, _) = handshake_of(&data[..end]);
            assert_eq!(parse(&hs), parsed, "records and their handshake bytes parse differently");
        } else {
            assert!(parsed.is_err(), "parsed without a complete extent");
        }
    }
    if data.first() == Some(&0x01) {
        // A bare hello, re-framed into records of one size (from the data).
        const CHUNKS: [usize; 9] = [1, 2, 3, 5, 7, 64, 100, 1000, MAX_RECORD];
        let chunk = CHUNKS[usize::from(data[data.len() - 1]) % CHUNKS.len()];
        let mut records = Vec::with_capacity(data.len() + data.len() / chunk * 5 + 5);
        for c in data.chunks(chunk) {
            records.extend([0x16, 3, 1, (c.len() >> 8) as u8, c.len() as u8]);
            records.extend_from_slice(c);
        }
        let framed = parse(&records);
        match (&parsed, &framed) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "chunk {chunk}"),
            (Err(_), Err(_)) => {}
            _ => panic!("bare {parsed:?} but in records of {chunk}: {framed:?}"),
        }
    }
});
