//! A TLS ClientHello parser over raw bytes: every length checked, no
//! allocation beyond the lists it returns, never a panic.
//!
//! Accepts either whole TLS records (`16 03 ..`, the hello possibly split
//! over several records) or a bare handshake message (`01 ..`).

use super::record::{client_hello_extent, Extent, FramingError};

/// What fingerprinting needs from a ClientHello, in wire order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientHello {
    /// `legacy_version` of the handshake (0x0303 for TLS 1.2 and 1.3).
    pub legacy_version: u16,
    pub ciphers: Vec<u16>,
    /// Extension types, in the order sent.
    pub extensions: Vec<u16>,
    /// From `supported_versions` (43), if sent.
    pub supported_versions: Vec<u16>,
    /// From `application_layer_protocol_negotiation` (16).
    pub alpn: Vec<Vec<u8>>,
    /// From `signature_algorithms` (13), in the order sent.
    pub signature_algorithms: Vec<u16>,
    /// From `supported_groups` (10).
    pub groups: Vec<u16>,
    /// From `ec_point_formats` (11).
    pub point_formats: Vec<u8>,
    /// The host name from `server_name` (0), if sent and readable.
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("incomplete: the ClientHello ends before its stated length")]
    Incomplete,
    #[error("{0}")]
    Framing(#[from] FramingError),
    #[error("not a ClientHello: first byte {0:#04x} (expected 0x16 for a record or 0x01 for a handshake message)")]
    NotClientHello(u8),
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Largest ClientHello body accepted.
pub const MAX_HELLO: usize = 1 << 16;

/// GREASE values (RFC 8701): `0x?a?a` with both bytes equal.
pub fn is_grease(v: u16) -> bool {
    (v & 0x0f0f) == 0x0a0a && (v >> 8) == (v & 0xff)
}

/// Parses a ClientHello from records or a bare handshake message.
pub fn parse(bytes: &[u8]) -> Result<ClientHello, ParseError> {
    match bytes.first() {
        Some(0x16) => {
            let end = match client_hello_extent(bytes, MAX_HELLO)? {
                Extent::Complete(end) => end,
                Extent::Incomplete => return Err(ParseError::Incomplete),
            };
            parse_handshake(&handshake_bytes(&bytes[..end]))
        }
        Some(0x01) => parse_handshake(bytes),
        Some(&b) => Err(ParseError::NotClientHello(b)),
        None => Err(ParseError::Incomplete),
    }
}

/// The handshake bytes carried by complete records (framing already checked).
fn handshake_bytes(records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len());
    let mut pos = 0;
    while let Some(h) = records.get(pos..pos + 5) {
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if let Some(body) = records.get(pos + 5..pos + 5 + len) {
            out.extend_from_slice(body);
        }
        pos += 5 + len;
    }
    out
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        let out = self
            .buf
            .get(self.pos..self.pos.checked_add(n).ok_or(ParseError::Incomplete)?)
            .ok_or(ParseError::Incomplete)?;
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, ParseError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Result<usize, ParseError> {
        let b = self.take(3)?;
        Ok((usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A sub-reader over a `u8`-length-prefixed vector.
    fn vec8(&mut self) -> Result<Reader<'a>, ParseError> {
        let n = usize::from(self.u8()?);
        Ok(Reader::new(self.take(n)?))
    }

    fn vec16(&mut self) -> Result<Reader<'a>, ParseError> {
        let n = usize::from(self.u16()?);
        Ok(Reader::new(self.take(n)?))
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn u16_list(mut self, what: &'static str) -> Result<Vec<u16>, ParseError> {
        if !self.buf.len().is_multiple_of(2) {
            return Err(ParseError::Malformed(what));
        }
        let mut out = Vec::with_capacity(self.buf.len() / 2);
        while !self.is_empty() {
            out.push(self.u16()?);
        }
        Ok(out)
    }
}

fn parse_handshake(bytes: &[u8]) -> Result<ClientHello, ParseError> {
    let mut r = Reader::new(bytes);
    let kind = r.u8()?;
    if kind != 0x01 {
        return Err(ParseError::NotClientHello(kind));
    }
    let len = r.u24()?;
    if len > MAX_HELLO {
        return Err(ParseError::Malformed("ClientHello longer than 64 KiB"));
    }
    let mut body = Reader::new(r.take(len)?);
    // Inside the stated length, running out of bytes is malformed, not
    // incomplete: the length said it was all there.
    let malformed = |what: &'static str| {
        move |e: ParseError| {
            if e == ParseError::Incomplete {
                ParseError::Malformed(what)
            } else {
                e
            }
        }
    };
    let mut hello = ClientHello {
        legacy_version: body.u16().map_err(malformed("no version"))?,
        ..ClientHello::default()
    };
    body.take(32).map_err(malformed("short random"))?;
    let session = body.vec8().map_err(malformed("session id"))?;
    if session.buf.len() > 32 {
        return Err(ParseError::Malformed("session id longer than 32 bytes"));
    }
    hello.ciphers = body
        .vec16()
        .map_err(malformed("cipher suites"))?
        .u16_list("odd cipher suites length")?;
    body.vec8().map_err(malformed("compression methods"))?;
    if body.is_empty() {
        return Ok(hello); // no extensions: allowed before TLS 1.3
    }
    let mut exts = body.vec16().map_err(malformed("extensions"))?;
    while !exts.is_empty() {
        let kind = exts.u16().map_err(malformed("extension header"))?;
        let mut data = exts.vec16().map_err(malformed("extension data"))?;
        hello.extensions.push(kind);
        // A body we cannot read is fingerprinted as empty: the extension
        // still counts, as reference implementations do.
        let _ = read_extension(&mut hello, kind, &mut data);
    }
    Ok(hello)
}

fn read_extension(hello: &mut ClientHello, kind: u16, data: &mut Reader<'_>) -> Result<(), ParseError> {
    {
        match kind {
            0x0000 => {
                // server_name_list: (type u8, name vec16)*; take the first host name.
                let mut list = data.vec16()?;
                while !list.is_empty() {
                    let name_type = list.u8()?;
                    let name = list.vec16()?;
                    if name_type == 0 && hello.server_name.is_none() {
                        hello.server_name = std::str::from_utf8(name.buf).ok().map(str::to_string);
                    }
                }
            }
            0x000a => hello.groups = data.vec16()?.u16_list("odd supported_groups")?,
            0x000b => hello.point_formats = data.vec8()?.buf.to_vec(),
            0x000d => hello.signature_algorithms = data.vec16()?.u16_list("odd signature_algorithms")?,
            0x0010 => {
                let mut list = data.vec16()?;
                while !list.is_empty() {
                    hello.alpn.push(list.vec8()?.buf.to_vec());
                }
            }
            0x002b => hello.supported_versions = data.vec8()?.u16_list("odd supported_versions")?,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a ClientHello handshake message.
    pub fn build(ciphers: &[u16], exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]);
        body.push(32);
        body.extend([9u8; 32]);
        body.extend(((ciphers.len() * 2) as u16).to_be_bytes());
        for c in ciphers {
            body.extend(c.to_be_bytes());
        }
        body.extend([1, 0]);
        let mut e = Vec::new();
        for (kind, data) in exts {
            e.extend(kind.to_be_bytes());
            e.extend((data.len() as u16).to_be_bytes());
            e.extend(data);
        }
        body.extend((e.len() as u16).to_be_bytes());
        body.extend(e);
        let mut m = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        m.extend(body);
        m
    }

    pub fn u16s(prefix_len: usize, values: &[u16]) -> Vec<u8> {
        let mut out = Vec::new();
        let n = values.len() * 2;
        if prefix_len == 1 {
            out.push(n as u8);
        } else {
            out.extend((n as u16).to_be_bytes());
        }
        for v in values {
            out.extend(v.to_be_bytes());
        }
        out
    }

    pub fn sni(host: &str) -> Vec<u8> {
        let mut entry = vec![0u8];
        entry.extend((host.len() as u16).to_be_bytes());
        entry.extend(host.as_bytes());
        let mut out = (entry.len() as u16).to_be_bytes().to_vec();
        out.extend(entry);
        out
    }

    pub fn alpn(protocols: &[&str]) -> Vec<u8> {
        let mut list = Vec::new();
        for p in protocols {
            list.push(p.len() as u8);
            list.extend(p.as_bytes());
        }
        let mut out = (list.len() as u16).to_be_bytes().to_vec();
        out.extend(list);
        out
    }

    #[test]
    fn parses_every_field_it_needs() {
        let m = build(
            &[0x1301, 0x0a0a, 0xc02b],
            &[
                (0x0000, sni("api.example.com")),
                (0x0010, alpn(&["h2", "http/1.1"])),
                (0x000d, u16s(2, &[0x0403, 0x0804])),
                (0x000a, u16s(2, &[0x001d, 0x0017])),
                (0x000b, vec![1, 0]),
                (0x002b, u16s(1, &[0x0304, 0x0303])),
            ],
        );
        let h = parse(&m).unwrap();
        assert_eq!(h.legacy_version, 0x0303);
        assert_eq!(h.ciphers, [0x1301, 0x0a0a, 0xc02b]);
        assert_eq!(h.extensions, [0x0000, 0x0010, 0x000d, 0x000a, 0x000b, 0x002b]);
        assert_eq!(h.server_name.as_deref(), Some("api.example.com"));
        assert_eq!(h.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert_eq!(h.signature_algorithms, [0x0403, 0x0804]);
        assert_eq!(h.groups, [0x001d, 0x0017]);
        assert_eq!(h.point_formats, [0]);
        assert_eq!(h.supported_versions, [0x0304, 0x0303]);
        // The same hello inside records split at every size parses the same.
        for chunk in [1, 7, 100, 16_384] {
            let mut records = Vec::new();
            for c in m.chunks(chunk) {
                records.extend([0x16, 3, 1, (c.len() >> 8) as u8, c.len() as u8]);
                records.extend(c);
            }
            assert_eq!(parse(&records).unwrap(), h, "chunk {chunk}");
        }
    }

    #[test]
    fn every_prefix_is_incomplete_or_malformed_never_a_panic() {
        let m = build(&[0x1301], &[(0x0000, sni("x")), (0x0010, alpn(&["h2"]))]);
        for cut in 0..m.len() {
            assert!(parse(&m[..cut]).is_err(), "cut {cut}");
        }
        let mut records = vec![0x16, 3, 1, (m.len() >> 8) as u8, m.len() as u8];
        records.extend(&m);
        for cut in 0..records.len() {
            assert!(
                matches!(parse(&records[..cut]), Err(ParseError::Incomplete)),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn lies_about_lengths_are_malformed() {
        let mut m = build(&[0x1301], &[(0x0000, sni("x"))]);
        let last = m.len() - 1;
        m[last - 6] = 0xff; // the extension claims more bytes than there are
        assert!(matches!(parse(&m), Err(ParseError::Malformed(_))));
        assert_eq!(parse(b"\x02\x00\x00\x00"), Err(ParseError::NotClientHello(2)));
        assert_eq!(parse(b"GET /"), Err(ParseError::NotClientHello(b'G')));
    }

    #[test]
    fn grease_is_recognised() {
        for v in [0x0a0a, 0x1a1a, 0x2a2a, 0xaaaa, 0xfafa] {
            assert!(is_grease(v));
        }
        for v in [0x0a1a, 0x1301, 0x000a, 0xabab] {
            assert!(!is_grease(v), "{v:#x}");
        }
    }

    proptest::proptest! {
        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
            let mut as_record = vec![0x16, 3, 1, (bytes.len() >> 8) as u8, bytes.len() as u8];
            as_record.extend(&bytes);
            let _ = parse(&as_record);
            let mut as_hello = vec![1, 0, (bytes.len() >> 8) as u8, bytes.len() as u8];
            as_hello.extend(&bytes);
            let _ = parse(&as_hello);
        }
    }
}
