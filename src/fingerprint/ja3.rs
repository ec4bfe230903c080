//! JA3 (Salesforce, BSD-3-Clause): `version,ciphers,extensions,groups,point
//! formats` in decimal, in the order sent, GREASE removed, and its MD5.
//!
//! JA3 changes between connections of clients that shuffle their extension
//! order (Chrome, rustls), so leasegate reports it for information and keys
//! identity on JA4 only.

use std::fmt::Write as _;

use md5::{Digest, Md5};

use super::client_hello::{is_grease, ClientHello};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ja3 {
    pub ja3: String,
    pub ja3_hash: String,
}

fn join<T: Copy + std::fmt::Display>(values: impl Iterator<Item = T>) -> String {
    let mut s = String::new();
    for (i, v) in values.enumerate() {
        if i > 0 {
            s.push('-');
        }
        let _ = write!(s, "{v}");
    }
    s
}

pub fn ja3(h: &ClientHello) -> Ja3 {
    let no_grease = |v: &&u16| !is_grease(**v);
    let text = format!(
        "{},{},{},{},{}",
        h.legacy_version,
        join(h.ciphers.iter().filter(no_grease).copied()),
        join(h.extensions.iter().filter(no_grease).copied()),
        join(h.groups.iter().filter(no_grease).copied()),
        join(h.point_formats.iter().copied()),
    );
    let ja3_hash = Md5::digest(text.as_bytes())
        .iter()
        .fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
    Ja3 { ja3: text, ja3_hash }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::client_hello::parse;

    #[test]
    fn chrome_matches_its_published_ja3() {
        let h = parse(&crate::fingerprint::ja4::tests_support::chrome()).unwrap();
        let f = ja3(&h);
        assert_eq!(
            f.ja3,
            "771,4865-4866-4867-49195-49199-49196-49200-52393-52392-49171-49172-156-157-47-53,\
             45-51-16-65037-23-17613-0-11-10-43-65281-35-18-5-13-27,4588-29-23-24,0"
        );
        assert_eq!(f.ja3_hash, "98487aa16281980e7d1120d399efb6a4");
    }
}
