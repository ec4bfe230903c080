//! JA3 and JA4 of arbitrary bytes (`fingerprint::fingerprint`).
//!
//! Properties: nothing panics; when the bytes parse, `to_json` works and
//! agrees with the struct, JA4 has its documented shape
//! (`t13d1516h2_8daaf6152771_d8a2da3f94cd`: a 10-character prefix and two
//! 12-hex-digit hashes), its hashes are those of the lists `ja4_r` spells
//! out, the cipher count is the length of that list (at most 99), and JA3 is
//! five comma-separated fields with a 32-hex-digit MD5.
#![no_main]

use leasegate::fingerprint::fingerprint;
use leasegate::fingerprint::ja4::hash12;
use libfuzzer_sys::fuzz_target;

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const VERSIONS: [&str; 11] = ["13", "12", "11", "10", "s3", "s2", "s1", "d1", "d2", "d3", "00"];

fuzz_target!(|data: &[u8]| {
    let Ok(f) = fingerprint(data) else {
        return;
    };
    let json = f.to_json();
    assert_eq!(json["ja4"].as_str(), Some(f.ja4.ja4.as_str()));
    assert_eq!(json["ja4_r"].as_str(), Some(f.ja4.ja4_r.as_str()));
    assert_eq!(json["ja3"].as_str(), Some(f.ja3.ja3.as_str()));
    assert_eq!(json["ja3_hash"].as_str(), Some(f.ja3.ja3_hash.as_str()));
    assert_eq!(json["sni"].as_str(), f.server_name.as_deref());
    assert_eq!(json["alpn"].as_array().map(Vec::len), Some(f.alpn.len()));
    let text = serde_json::to_string(&json).expect("the JSON serialises");
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());

    // JA4: three '_'-separated parts.
    let ja4 = &f.ja4.ja4;
    let parts: Vec<&str> = ja4.split('_').collect();
    assert_eq!(parts.len(), 3, "ja4 {ja4:?}");
    let prefix = parts[0];
    assert_eq!(prefix.len(), 10, "ja4 prefix {prefix:?}");
    let b = prefix.as_bytes();
    assert!(matches!(b[0], b't' | b'q'), "transport in {prefix:?}");
    assert!(VERSIONS.contains(&&prefix[1..3]), "version in {prefix:?}");
    assert!(matches!(b[3], b'd' | b'i'), "sni flag in {prefix:?}");
    assert!(b[4..8].iter().all(u8::is_ascii_digit), "counts in {prefix:?}");
    assert!(b[8..10].iter().all(u8::is_ascii_alphanumeric), "alpn chars in {prefix:?}");
    assert!(is_hex(parts[1], 12) && is_hex(parts[2], 12), "hashes in {ja4:?}");

    // ja4_r spells out what the hashes are of.
    let raw: Vec<&str> = f.ja4.ja4_r.splitn(3, '_').collect();
    assert_eq!(raw.len(), 3, "ja4_r {:?}", f.ja4.ja4_r);
    assert_eq!(raw[0], prefix);
    assert_eq!(parts[1], hash12(raw[1]), "cipher hash of {:?}", raw[1]);
    let ext_hash = if raw[2].is_empty() || raw[2].starts_with('_') {
        hash12("")
    } else {
        hash12(raw[2])
    };
    assert_eq!(parts[2], ext_hash, "extension hash of {:?}", raw[2]);
    let ciphers = if raw[1].is_empty() { 0 } else { raw[1].split(',').count() };
    assert_eq!(prefix[4..6].parse::<usize>().ok(), Some(ciphers.min(99)), "{ja4} {}", f.ja4.ja4_r);

    // JA3: version,ciphers,extensions,groups,point formats; its MD5.
    assert_eq!(f.ja3.ja3.split(',').count(), 5, "ja3 {:?}", f.ja3.ja3);
    assert!(f.ja3.ja3.bytes().all(|b| b.is_ascii_digit() || b == b',' || b == b'-'));
    assert!(is_hex(&f.ja3.ja3_hash, 32), "ja3 hash {:?}", f.ja3.ja3_hash);
});
