//! TLS ClientHello bytes: framing, parsing, JA4 and JA3.
//!
//! Pure functions over bytes. Nothing here reads a socket or a clock, and no
//! input may make it panic.

pub mod client_hello;
pub mod ja3;
pub mod ja4;
pub mod record;

pub use client_hello::{parse, ClientHello, ParseError};

/// Every fingerprint of one ClientHello, as `leasegate fingerprint` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprints {
    pub ja4: ja4::Ja4,
    pub ja3: ja3::Ja3,
    pub server_name: Option<String>,
    pub alpn: Vec<String>,
}

/// Parses `bytes` (records or a bare handshake message) and fingerprints it.
pub fn fingerprint(bytes: &[u8]) -> Result<Fingerprints, ParseError> {
    let hello = parse(bytes)?;
    Ok(Fingerprints {
        ja4: ja4::ja4(&hello),
        ja3: ja3::ja3(&hello),
        alpn: hello
            .alpn
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        server_name: hello.server_name,
    })
}

impl Fingerprints {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ja4": self.ja4.ja4,
            "ja4_r": self.ja4.ja4_r,
            "ja3": self.ja3.ja3,
            "ja3_hash": self.ja3.ja3_hash,
            "sni": self.server_name,
            "alpn": self.alpn,
        })
    }
}

/// Decodes hex, ignoring whitespace, `:` and a `0x` prefix.
pub fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim().trim_start_matches("0x");
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace() && *b != b':').collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", digits.len()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                _ => Err(format!("not hex: {:?}", String::from_utf8_lossy(pair))),
            }
        })
        .collect()
}
