//! JA4 (FoxIO, BSD-3-Clause) and its raw form `ja4_r`, from a parsed
//! ClientHello.
//!
//! `t13d1516h2_8daaf6152771_d8a2da3f94cd`: transport, version (highest in
//! supported_versions, else the handshake version), SNI present (d) or not
//! (i), cipher and extension counts (GREASE excluded, at most 99), first and
//! last character of the first ALPN value; then SHA-256 (first 12 hex) of
//! the sorted cipher list, and of the sorted extension list without SNI and
//! ALPN followed by the signature algorithms in the order sent.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::client_hello::{is_grease, ClientHello};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ja4 {
    pub ja4: String,
    pub ja4_r: String,
}

fn version(v: u16) -> &'static str {
    match v {
        0x0304 => "13",
        0x0303 => "12",
        0x0302 => "11",
        0x0301 => "10",
        0x0300 => "s3",
        0x0200 => "s2",
        0x0100 => "s1",
        0xfeff => "d1",
        0xfefd => "d2",
        0xfefc => "d3",
        _ => "00",
    }
}

fn alpn_chars(alpn: Option<&Vec<u8>>) -> String {
    match alpn.and_then(|a| Some((*a.first()?, *a.last()?))) {
        None => "00".into(),
        Some((first, last)) if first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() => {
            format!("{}{}", first as char, last as char)
        }
        // Not alphanumeric: the first hex digit of the first byte and the
        // last hex digit of the last byte.
        Some((first, last)) => {
            let hex = |b: u8| format!("{b:02x}");
            format!("{}{}", &hex(first)[..1], &hex(last)[1..])
        }
    }
}

fn hex_list(values: &[u16]) -> String {
    let mut s = String::with_capacity(values.len() * 5);
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{v:04x}");
    }
    s
}

/// First 12 hex digits of SHA-256, or twelve zeros for an empty input.
pub fn hash12(s: &str) -> String {
    if s.is_empty() {
        return "000000000000".into();
    }
    Sha256::digest(s.as_bytes())
        .iter()
        .take(6)
        .fold(String::with_capacity(12), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// JA4 and `ja4_r` of a ClientHello received over TCP.
pub fn ja4(h: &ClientHello) -> Ja4 {
    let ciphers: Vec<u16> = h.ciphers.iter().copied().filter(|c| !is_grease(*c)).collect();
    let extensions: Vec<u16> = h.extensions.iter().copied().filter(|e| !is_grease(*e)).collect();
    let highest = h
        .supported_versions
        .iter()
        .copied()
        .filter(|v| !is_grease(*v))
        .max()
        .unwrap_or(h.legacy_version);
    let sni = if h.extensions.contains(&0x0000) { 'd' } else { 'i' };
    // QUIC carries its transport parameters in the ClientHello.
    let transport = if h.extensions.contains(&0x0039) { 'q' } else { 't' };
    let prefix = format!(
        "{transport}{}{sni}{:02}{:02}{}",
        version(highest),
        ciphers.len().min(99),
        extensions.len().min(99),
        alpn_chars(h.alpn.first())
    );

    let mut sorted_ciphers = ciphers;
    sorted_ciphers.sort_unstable();
    let cipher_list = hex_list(&sorted_ciphers);

    let mut sorted_exts: Vec<u16> = extensions
        .into_iter()
        .filter(|e| *e != 0x0000 && *e != 0x0010)
        .collect();
    sorted_exts.sort_unstable();
    let sigalgs: Vec<u16> = h
        .signature_algorithms
        .iter()
        .copied()
        .filter(|s| !is_grease(*s))
        .collect();
    let mut ext_part = hex_list(&sorted_exts);
    if !sigalgs.is_empty() {
        ext_part.push('_');
        ext_part.push_str(&hex_list(&sigalgs));
    }

    Ja4 {
        ja4: format!(
            "{prefix}_{}_{}",
            hash12(&cipher_list),
            if sorted_exts.is_empty() {
                hash12("")
            } else {
                hash12(&ext_part)
            }
        ),
        ja4_r: format!("{prefix}_{cipher_list}_{ext_part}"),
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use crate::fingerprint::client_hello::tests::{alpn, build, sni, u16s};

    /// A Chrome 143 ClientHello as published with its JA4, JA4_r and JA3 by
    /// a fingerprinting service, rebuilt field by field in the order sent,
    /// with GREASE values where Chrome puts them.
    pub(crate) fn chrome() -> Vec<u8> {
        let ciphers = [
            0x8a8a, 4865, 4866, 4867, 49195, 49199, 49196, 49200, 52393, 52392, 49171, 49172, 156, 157, 47, 53,
        ];
        let exts: Vec<(u16, Vec<u8>)> = vec![
            (0x3a3a, vec![]),
            (45, vec![1, 1]),
            (51, vec![0, 0]),
            (16, alpn(&["h2", "http/1.1"])),
            (65037, vec![0]),
            (23, vec![]),
            (17613, vec![0, 3, 2, b'h', b'2']),
            (0, sni("tls.browserleaks.com")),
            (11, vec![1, 0]),
            (10, u16s(2, &[0x9a9a, 4588, 29, 23, 24])),
            (43, u16s(1, &[0xdada, 0x0304, 0x0303])),
            (65281, vec![0]),
            (35, vec![]),
            (18, vec![]),
            (5, vec![1, 0, 0, 0, 0]),
            (
                13,
                u16s(2, &[0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601]),
            ),
            (27, vec![2, 0, 2]),
            (0x1a1a, vec![0]),
        ];
        build(&ciphers, &exts)
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::chrome;
    use super::*;
    use crate::fingerprint::client_hello::parse;
    use crate::fingerprint::client_hello::tests::{alpn, build, sni, u16s};

    #[test]
    fn chrome_matches_its_published_ja4() {
        let h = parse(&chrome()).unwrap();
        let f = ja4(&h);
        assert_eq!(f.ja4, "t13d1516h2_8daaf6152771_d8a2da3f94cd");
        assert_eq!(
            f.ja4_r,
            "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_\
             0005,000a,000b,000d,0012,0017,001b,0023,002b,002d,0033,44cd,fe0d,ff01_\
             0403,0804,0401,0503,0805,0501,0806,0601"
        );
    }

    /// The worked example of the JA4 specification (technical_details/JA4.md):
    /// its cipher list, its extensions in the order given there, its
    /// signature algorithms, SNI and ALPN h2, TLS 1.3.
    #[test]
    fn the_specifications_example() {
        let ciphers = [
            0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d,
            0x002f, 0x0035,
        ];
        let sigalgs = [0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601];
        let exts: Vec<(u16, Vec<u8>)> = [
            0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023, 0x0012, 0x002b, 0xff01,
            0x000b, 0x000a, 0x0015,
        ]
        .iter()
        .map(|&e| match e {
            0x0000 => (e, sni("example.com")),
            0x0010 => (e, alpn(&["h2", "http/1.1"])),
            0x000d => (e, u16s(2, &sigalgs)),
            0x002b => (e, u16s(1, &[0x0304, 0x0303])),
            _ => (e, vec![]),
        })
        .collect();
        let f = ja4(&parse(&build(&ciphers, &exts)).unwrap());
        assert_eq!(f.ja4, "t13d1516h2_8daaf6152771_e5627efa2ab1");
        assert!(f.ja4_r.ends_with("_0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01_0403,0804,0401,0503,0805,0501,0806,0601"));
    }

    #[test]
    fn specification_edge_cases() {
        // GREASE-only lists count as empty.
        let f = ja4(&parse(&build(&[0x0a0a, 0xfafa], &[(0x1a1a, vec![])])).unwrap());
        assert!(f.ja4.starts_with("t12i000000_000000000000_000000000000"), "{}", f.ja4);
        // More than 99 ciphers or extensions print 99.
        let many: Vec<u16> = (1..=150).collect();
        let exts: Vec<(u16, Vec<u8>)> = (0x0100..0x0100 + 120).map(|e| (e, vec![])).collect();
        let f = ja4(&parse(&build(&many, &exts)).unwrap());
        assert_eq!(&f.ja4[4..8], "9999", "{}", f.ja4);
        // The highest supported version wins, GREASE ignored.
        let f = ja4(&parse(&build(
            &[0x1301],
            &[(0x002b, u16s(1, &[0x0a0a, 0xaaaa, 0x0303, 0x0304, 0xfafa]))],
        ))
        .unwrap());
        assert!(f.ja4.starts_with("t13"), "{}", f.ja4);
        // Without supported_versions, the handshake version.
        for (v, s) in [
            (0x0303u16, "12"),
            (0x0302, "11"),
            (0x0301, "10"),
            (0x0300, "s3"),
            (0x0200, "s2"),
            (0x0100, "s1"),
        ] {
            let mut m = build(&[0x1301], &[]);
            m[4..6].copy_from_slice(&v.to_be_bytes());
            assert_eq!(&ja4(&parse(&m).unwrap()).ja4[1..3], s);
        }
        // One-character ALPN is both first and last; no signature
        // algorithms: the extension string ends without an underscore.
        let f = ja4(&parse(&build(&[0x1301], &[(0x0010, alpn(&["q"])), (0x000a, vec![0, 0])])).unwrap());
        assert_eq!(&f.ja4[8..10], "qq");
        assert!(f.ja4_r.ends_with("_000a"), "{}", f.ja4_r);
        // QUIC is recognised by its transport parameters.
        assert!(ja4(&parse(&build(&[0x1301], &[(0x0039, vec![])])).unwrap())
            .ja4
            .starts_with('q'));
        // Empty ALPN, signature algorithm and version extensions do not
        // break fingerprinting.
        let f = ja4(&parse(&build(
            &[0x1301],
            &[(0x000d, vec![]), (0x0010, vec![]), (0x002b, vec![])],
        ))
        .unwrap());
        assert!(f.ja4.starts_with("t12i0103"), "{}", f.ja4);
    }

    #[test]
    fn no_sni_no_alpn_no_extensions() {
        let h = parse(&build(&[0x1301, 0x1302], &[])).unwrap();
        let f = ja4(&h);
        assert!(f.ja4.starts_with("t12i020000_"), "{}", f.ja4);
        assert!(f.ja4.ends_with("_000000000000"), "{}", f.ja4);
    }

    #[test]
    fn alpn_that_is_not_alphanumeric_becomes_hex() {
        assert_eq!(alpn_chars(Some(&vec![0xab, b'x', 0xcd])), "ad");
        assert_eq!(alpn_chars(Some(&b"http/1.1".to_vec())), "h1");
        assert_eq!(alpn_chars(None), "00");
        assert_eq!(alpn_chars(Some(&vec![])), "00");
    }

    #[test]
    fn extension_order_does_not_change_ja4() {
        let a = build(
            &[0x1301],
            &[(0, sni("a")), (10, u16s(2, &[29])), (13, u16s(2, &[0x0403]))],
        );
        let b = build(
            &[0x1301],
            &[(13, u16s(2, &[0x0403])), (10, u16s(2, &[29])), (0, sni("a"))],
        );
        assert_eq!(ja4(&parse(&a).unwrap()).ja4, ja4(&parse(&b).unwrap()).ja4);
    }
}
