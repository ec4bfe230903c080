//! The credentials a request presents (an API key, a bearer token) and the
//! configured API keys they are looked up in. Pure: reading headers and
//! comparing digests, no verification (that is `jwt`'s).

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName};

pub(super) static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// One configured API key.
#[derive(Debug, Clone)]
pub struct ApiKey {
    pub sha256: [u8; 32],
    pub id: Option<Arc<str>>,
    pub tenant: Option<Arc<str>>,
    pub plan: Option<Arc<str>>,
}

/// The configured API keys, found by their SHA-256: one hash lookup per
/// request however many there are (a key file may hold a hundred
/// thousand), where a scan compared against each. The lookup's timing
/// depends on the presented key's digest, which tells nothing of any
/// configured key; the match is then confirmed in constant time.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    keys: Vec<ApiKey>,
    by_digest: std::collections::HashMap<[u8; 32], usize>,
}

impl From<Vec<ApiKey>> for ApiKeys {
    fn from(keys: Vec<ApiKey>) -> Self {
        let by_digest = keys.iter().enumerate().map(|(i, k)| (k.sha256, i)).collect();
        ApiKeys { keys, by_digest }
    }
}

impl ApiKeys {
    /// The key whose SHA-256 is `digest`.
    pub fn find(&self, digest: &[u8; 32]) -> Option<&ApiKey> {
        let k = self.keys.get(*self.by_digest.get(digest)?)?;
        constant_time_eq(&k.sha256, digest).then_some(k)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ApiKey> {
        self.keys.iter()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// `X-API-Key`, else a Bearer token that is not a JWT (three dot-separated
/// base64url segments).
pub(super) fn api_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(&X_API_KEY) {
        return Some(v.as_bytes()).filter(|v| !v.is_empty());
    }
    let token = bearer(headers)?;
    (!token.is_empty() && !looks_like_jwt(token)).then_some(token)
}

/// A Bearer value shaped like a JWT.
pub(super) fn bearer_jwt(headers: &HeaderMap) -> Option<&str> {
    let token = bearer(headers)?;
    // JWT-shaped bytes are ASCII: the conversion cannot fail.
    looks_like_jwt(token).then(|| std::str::from_utf8(token).ok()).flatten()
}

/// The value of `Authorization: Bearer <value>`, trimmed.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let auth = headers.get(AUTHORIZATION)?.as_bytes();
    let token = auth
        .strip_prefix(b"Bearer ")
        .or_else(|| auth.strip_prefix(b"bearer "))?;
    Some(token.trim_ascii())
}

/// Three dot-separated segments of base64url (and `=`): one table lookup a
/// byte, since a forged token is read on every request that carries it.
fn looks_like_jwt(token: &[u8]) -> bool {
    const JWT_BYTE: [bool; 256] = {
        let mut t = [false; 256];
        let mut b = 0;
        while b < 256 {
            let c = b as u8;
            t[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'=';
            b += 1;
        }
        t
    };
    let mut dots = 0;
    for &b in token {
        if b == b'.' {
            dots += 1;
        } else if !JWT_BYTE[usize::from(b)] {
            return false;
        }
    }
    dots == 2
}
