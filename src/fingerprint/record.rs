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
    Framer::new(max).advance(buf)
}

/// [`client_hello_extent`] over a buffer that grows between calls: each
/// call looks only at the bytes added since the last one (and the headers
/// of records they complete), so reading a hello a byte at a time costs
/// linear time, not a rescan of the whole buffer per read.
#[derive(Debug, Clone)]
pub struct Framer {
    max: usize,
    /// Start of the first record not yet read to its end.
    pos: usize,
    /// Body bytes of that record already counted.
    in_record: usize,
    head: [u8; 4],
    /// Handshake bytes seen so far.
    seen: usize,
    /// 4 + the ClientHello's body length, once known.
    total: Option<usize>,
}

impl Framer {
    pub fn new(max: usize) -> Framer {
        Framer {
            max,
            pos: 0,
            in_record: 0,
            head: [0; 4],
            seen: 0,
            total: None,
        }
    }

    /// Where the ClientHello ends in `buf`, which holds every byte given to
    /// earlier calls (unchanged) and maybe more.
    pub fn advance(&mut self, buf: &[u8]) -> Result<Extent, FramingError> {
        loop {
            let pos = self.pos;
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
            // Only the bytes not counted before; of those, only the first
            // four handshake bytes are looked at.
            let fresh = buf.get(body + self.in_record..body + avail).unwrap_or(&[]);
            let before = self.seen;
            for &b in fresh.iter().take(4usize.saturating_sub(before)) {
                if self.seen == 0 && b != HANDSHAKE_CLIENT_HELLO {
                    return Err(FramingError::NotClientHello(b));
                }
                self.head[self.seen] = b;
                self.seen += 1;
                if self.seen == 4 {
                    let h = self.head;
                    let n = (usize::from(h[1]) << 16) | (usize::from(h[2]) << 8) | usize::from(h[3]);
                    if n > self.max {
                        return Err(FramingError::TooLarge(n, self.max));
                    }
                    self.total = Some(4 + n);
                }
            }
            // The rest of the fresh bytes are counted, not looked at.
            self.seen = before + fresh.len();
            self.in_record = avail;
            if avail < len {
                return Ok(Extent::Incomplete);
            }
            self.pos = body + len;
            self.in_record = 0;
            if self.total.is_some_and(|t| self.seen >= t) {
                return Ok(Extent::Complete(self.pos));
            }
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

    /// Fed a byte at a time (and in uneven steps), the framer that keeps
    /// its place answers what a fresh one does for every prefix.
    #[test]
    fn a_framer_fed_piecewise_agrees_with_a_fresh_one() {
        for chunk in [1, 2, 3, 5, 100, MAX_RECORD] {
            let mut r = records(&hello(300), chunk);
            r.extend([0x14, 3, 3, 0, 1, 1]);
            for step in [1, 2, 7] {
                let mut framer = Framer::new(16_384);
                let mut cut = 0;
                loop {
                    let want = client_hello_extent(&r[..cut], 16_384);
                    assert_eq!(framer.advance(&r[..cut]), want, "chunk {chunk} step {step} cut {cut}");
                    if want != Ok(Extent::Incomplete) || cut == r.len() {
                        break;
                    }
                    cut = (cut + step).min(r.len());
                }
            }
        }
        // A wrong first handshake byte is still refused when it arrives late.
        let mut f = Framer::new(16_384);
        assert_eq!(f.advance(&[0x16, 3, 1, 0, 4]), Ok(Extent::Incomplete));
        assert_eq!(f.advance(&[0x16, 3, 1, 0, 4, 2]), Err(FramingError::NotClientHello(2)));
    }

    proptest::proptest! {
        /// On any bytes, fed in any steps, the kept-place framer and a fresh
        /// one agree.
        #[test]
        fn piecewise_equals_whole_on_any_input(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300), step in 1usize..9) {
            let mut framer = Framer::new(200);
            let mut cut = 0;
            loop {
                let want = client_hello_extent(&bytes[..cut], 200);
                proptest::prop_assert_eq!(framer.advance(&bytes[..cut]), want);
                if want != Ok(Extent::Incomplete) || cut == bytes.len() {
                    break;
                }
                cut = (cut + step).min(bytes.len());
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
