//! The `cert` tier's value: the subject of the client certificate that the
//! https listener verified against `[tls] client_ca`.
//!
//! Read from the certificate's DER with a small reader that walks only the
//! outer structure (TBSCertificate, then its subject Name): the common name
//! when there is one, else the first 16 hex digits of the SHA-256 of the
//! subject's DER. Bytes that are not such a certificate give `None`, never
//! a panic (the verifier accepted the certificate, so this is a second
//! line, fuzzed with the rest).

use sha2::{Digest, Sha256};

/// One DER element: its tag and contents, and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
/// `id-at-commonName`, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// A DER certificate's TBSCertificate fields from its `skip`-th on: after
/// the optional `[0]` version, 0 is serialNumber, then signature, issuer,
/// validity, subject (4), subjectPublicKeyInfo (5), ...
fn tbs_from(cert: &[u8], skip: usize) -> Option<&[u8]> {
    let (SEQUENCE, certificate, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.2;
    }
    for _ in 0..skip {
        rest = element(rest)?.2;
    }
    Some(rest)
}

/// The subject Name of a DER certificate: its whole element.
fn subject(cert: &[u8]) -> Option<&[u8]> {
    let rest = tbs_from(cert, 4)?;
    let (SEQUENCE, _, after) = element(rest)? else {
        return None;
    };
    Some(&rest[..rest.len() - after.len()])
}

/// The DER certificate's TBSCertificate fields after the subject: the
/// subjectPublicKeyInfo, then the optional unique ids and extensions.
fn after_subject(cert: &[u8]) -> Option<&[u8]> {
    tbs_from(cert, 5)
}

/// `id-ce-subjectAltName`, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// The dNSName entries of the certificate's subjectAltName extension.
fn dns_names(cert: &[u8]) -> Option<Vec<String>> {
    let mut rest = after_subject(cert)?;
    // subjectPublicKeyInfo, then [1] and [2] unique ids when present.
    rest = element(rest)?.2;
    let mut extensions = None;
    while !rest.is_empty() {
        let (tag, contents, next) = element(rest)?;
        if tag == 0xa3 {
            extensions = Some(contents);
        }
        rest = next;
    }
    let (SEQUENCE, mut list, _) = element(extensions?)? else {
        return None;
    };
    let mut out = Vec::new();
    while !list.is_empty() {
        let (SEQUENCE, extension, next) = element(list)? else {
            return None;
        };
        list = next;
        let (0x06, oid, mut rest) = element(extension)? else {
            return None;
        };
        if oid != SUBJECT_ALT_NAME {
            continue;
        }
        // critical, when present.
        if rest.first() == Some(&0x01) {
            rest = element(rest)?.2;
        }
        let (0x04, value, _) = element(rest)? else {
            return None;
        };
        let (SEQUENCE, mut names, _) = element(value)? else {
            return None;
        };
        while !names.is_empty() {
            let (tag, name, next) = element(names)?;
            names = next;
            // dNSName: [2] IA5String, implicit.
            if tag == 0x82 {
                if let Ok(text) = std::str::from_utf8(name) {
                    if !text.is_empty() && text.chars().all(|c| c.is_ascii_graphic()) {
                        out.push(text.to_string());
                    }
                }
            }
        }
    }
    Some(out)
}

/// The names a verified peer certificate (DER) is known by, for a plane's
/// `allow_subjects`: its subject's common name, then every dNSName of its
/// subjectAltName. Empty for bytes that are not such a certificate.
pub fn subject_names(cert: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = subject(cert).and_then(common_name).into_iter().collect();
    out.extend(dns_names(cert).unwrap_or_default());
    out
}

/// The first common name of a subject Name element, as text.
fn common_name(subject: &[u8]) -> Option<String> {
    let (_, mut rdns, _) = element(subject)?;
    while !rdns.is_empty() {
        let (SET, mut set, next) = element(rdns)? else {
            return None;
        };
        rdns = next;
        while !set.is_empty() {
            let (SEQUENCE, attribute, next) = element(set)? else {
                return None;
            };
            set = next;
            let (0x06, oid, value) = element(attribute)? else {
                return None;
            };
            if oid == COMMON_NAME {
                let (_, text, _) = element(value)?;
                let text = std::str::from_utf8(text).ok()?;
                return (!text.is_empty() && text.chars().all(|c| !c.is_control())).then(|| text.to_string());
            }
        }
    }
    None
}

/// The `cert` identity of a verified client certificate (DER): its subject's
/// common name, else a hash of the subject.
pub fn identity_of(cert: &[u8]) -> Option<String> {
    let subject = subject(cert)?;
    Some(common_name(subject).unwrap_or_else(|| {
        let d = Sha256::digest(subject);
        d[..8].iter().map(|b| format!("{b:02x}")).collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(dn: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_common_name_else_a_hash_of_the_subject() {
        use rcgen::DnType::{CommonName, OrganizationName};
        let named = cert(&[(OrganizationName, "Acme"), (CommonName, "envoy-1.edge")]);
        assert_eq!(identity_of(&named).as_deref(), Some("envoy-1.edge"));
        let unnamed = cert(&[(OrganizationName, "Acme")]);
        let id = identity_of(&unnamed).unwrap();
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_ne!(identity_of(&cert(&[(OrganizationName, "Other")])), Some(id));
    }

    #[test]
    fn subject_names_are_the_common_name_and_the_san_dns_names() {
        let mut p = rcgen::CertificateParams::new(vec![
            "envoy-1.edge".to_string(),
            "127.0.0.1".to_string(),
            "alt.edge".to_string(),
        ])
        .unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, "envoy-cn");
        let key = rcgen::KeyPair::generate().unwrap();
        let der = p.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(subject_names(&der), ["envoy-cn", "envoy-1.edge", "alt.edge"]);
        assert_eq!(subject_names(&cert(&[])), ["localhost"]);
        assert!(subject_names(&[0x30, 0x00]).is_empty());
    }

    #[test]
    fn garbage_gives_none_and_never_panics() {
        for bytes in [
            &[][..],
            &[0x30],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30, 0x02, 0x30, 0x00],
            &[0x31, 0x00],
        ] {
            assert_eq!(identity_of(bytes), None);
        }
        let mut x = 7u64;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            let _ = identity_of(&bytes);
            let _ = subject_names(&bytes);
        }
    }
}
