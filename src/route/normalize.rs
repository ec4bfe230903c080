//! One request, one meaning: the request target as routing sees it and as
//! the upstream gets it.
//!
//! An edge limit is only worth the requests it cannot be tricked into
//! letting through. nginx (`merge_slashes`), Go's `net/http`, Express and
//! most frameworks serve `/v1//login`, `/v1/./login`, `/v1/x/../login` and
//! `/v1/%6Cogin` as `/v1/login`; so the gateway routes (and limits) them as
//! `/v1/login` too, and forwards that normal form, so what was limited is
//! what is served.
//!
//! The path, in this order:
//! 1. percent-escapes of unreserved characters are decoded (RFC 3986
//!    §6.2.2.2) and the others upper-cased (§6.2.2.1); an escaped `/`, `\`
//!    or NUL, a bare `\`, or a `%` not followed by two hex digits is refused:
//!    upstreams disagree on what they mean;
//! 2. repeated slashes are merged, and a segment that is only `;`
//!    parameters (`/;x/`) counts as empty: merged away, parameters and all
//!    (Tomcat and Spring cut parameters before they merge slashes, so
//!    `/v1/;x/login` is their `/v1/login`; matching `/v1//login` instead
//!    would let it walk past a `/v1/login` route);
//! 3. dot segments are removed (§5.2.4); `..` that would climb above the
//!    root is refused, and so is a segment that is a dot segment only once
//!    its `;` parameters are dropped (`..;x`: Tomcat reads `..`, nginx a
//!    name).
//!
//! Other `;` parameters stay in the forwarded path (matrix parameters
//! belong to the upstream) but not in the path that routing matches: Tomcat, Jetty and
//! Spring serve `/v1/login;jsessionid=x` and `/v1;x/login` as `/v1/login`,
//! so matching without them puts those requests under the stricter route.
//! nginx and Envoy keep them literal, which lets `/v1;x/login` walk past a
//! `/v1/` location in front of such an upstream.
//!
//! Hosts compare lower-cased, without a trailing dot and without the port.
//!
//! Pure and allocation-free for a path that is already normal.

use std::borrow::Cow;

use http::uri::PathAndQuery;
use http::{header, HeaderValue, Request, Uri, Version};

/// Why a request target is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the path holds an encoded '/' (%2F)")]
    EncodedSlash,
    #[error("the path holds a backslash, bare or encoded")]
    Backslash,
    #[error("the path holds an encoded NUL (%00)")]
    Nul,
    #[error("the path holds a '%' that is not followed by two hex digits")]
    BadEscape,
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    #[error("the path holds a dot segment with parameters ('..;' or '.;')")]
    DotWithParameters,
    #[error("the request has more than one Host header")]
    DuplicateHost,
    #[error("the Host header and :authority disagree")]
    HostMismatch,
    #[error("the host is not a host name (an empty label, or not host[:port])")]
    BadHost,
}

/// Normalises `req`'s target in place, as routing will see it and the
/// upstream will get it: its path ([`path`], the query unchanged) and its
/// host. An absolute-form target or HTTP/2 `:authority` wins over `Host`,
/// which is rewritten to it; two `Host` lines, or an HTTP/2 `host` that
/// differs from `:authority`, are refused.
pub fn target<B>(req: &mut Request<B>) -> Result<(), TargetError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(TargetError::DuplicateHost);
    }
    // The host routing will read must be one routes can name: a host
    // with an empty label (`api.example.com..`) or a stray colon would
    // match no route's host and fall through to a catch-all, where an
    // upstream may still read it as the named host.
    let named = req
        .uri()
        .authority()
        .map(|a| a.as_str().as_bytes())
        .or(first.map(|h| h.as_bytes()));
    if let Some(h) = named {
        if !valid_host(h) {
            return Err(TargetError::BadHost);
        }
    }
    if let Some(authority) = req.uri().authority() {
        let same = first.is_some_and(|h| h.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()));
        if !same {
            // An h2 `host` naming another host is refused; one that names
            // the same host as routes compare hosts (another port, a
            // trailing dot, another case) is only rewritten.
            let names_another = first.is_some_and(|h| {
                !h.to_str()
                    .is_ok_and(|h| host(h).eq_ignore_ascii_case(host(authority.as_str())))
            });
            if req.version() == Version::HTTP_2 && names_another {
                return Err(TargetError::HostMismatch);
            }
            if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(header::HOST, v);
            }
        }
    }
    let normal = match path(req.uri().path())? {
        Cow::Borrowed(_) => return Ok(()),
        Cow::Owned(p) => p,
    };
    let mut parts = req.uri().clone().into_parts();
    let with_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    parts.path_and_query = Some(PathAndQuery::try_from(with_query).map_err(|_| TargetError::BadEscape)?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| TargetError::BadEscape)?;
    Ok(())
}

/// The normal form of an origin-form `path` (no query). Borrowed when it
/// already is normal. A path that does not start with `/` (`*`) is left
/// alone.
pub fn path(path: &str) -> Result<Cow<'_, str>, TargetError> {
    if !path.starts_with('/') {
        return Ok(Cow::Borrowed(path));
    }
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path)?;
    let mut out = String::with_capacity(decoded.len());
    // Segments after the leading '/', kept as (start, end) in `out`.
    let mut starts: Vec<usize> = Vec::new();
    let mut segments = decoded[1..].split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        let bare = seg.split(';').next().unwrap_or("");
        match seg {
            // `//` merged; a trailing '/' kept. A segment that is empty but
            // for its parameters (`/;x/`) is an empty segment too, dropped
            // with its parameters: Tomcat and Spring cut the parameters
            // first and then merge what is left, so `/v1/;x/login` is their
            // `/v1/login`, and `/v1/x/;y/../login` is too.
            _ if bare.is_empty() => {
                if last && !out.ends_with('/') {
                    out.push('/');
                }
            }
            "." => {
                if last && !out.ends_with('/') {
                    out.push('/');
                }
            }
            ".." => {
                let start = starts.pop().ok_or(TargetError::AboveRoot)?;
                out.truncate(start);
                if last {
                    out.push('/');
                }
            }
            _ if bare == "." || bare == ".." => return Err(TargetError::DotWithParameters),
            _ => {
                if !out.ends_with('/') {
                    out.push('/');
                }
                starts.push(out.len() - 1);
                out.push_str(seg);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// The path routing matches: `path` (already normal) without the `;`
/// parameters of its segments.
pub fn match_path(path: &str) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(seg.split(';').next().unwrap_or(""));
    }
    Cow::Owned(out)
}

/// A host as routes compare it: without the port and a trailing dot (any
/// case; the comparison ignores it). `[::1]:80` → `[::1]`. One backward
/// scan over the port's digits, no search: it runs on every request.
pub fn host(host: &str) -> &str {
    let b = host.as_bytes();
    let end = if b.first() == Some(&b'[') {
        b.iter().position(|&c| c == b']').map_or(b.len(), |i| i + 1)
    } else {
        let mut i = b.len();
        while i > 0 && b[i - 1].is_ascii_digit() {
            i -= 1;
        }
        if i > 0 && b[i - 1] == b':' {
            i - 1
        } else {
            b.len()
        }
    };
    let host = host.get(..end).unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host)
}

/// `host[:port]` that routes can name: a registered name whose labels are
/// not empty (one trailing dot allowed) or an IPv6 literal in brackets, and
/// a port of 1 to 5 digits. No user info, no stray colon. One forward scan
/// with no allocation: it runs on every request.
fn valid_host(h: &[u8]) -> bool {
    let port = |p: &[u8]| (1..=5).contains(&p.len()) && p.iter().all(u8::is_ascii_digit);
    if let Some(rest) = h.strip_prefix(b"[") {
        let Some(end) = rest.iter().position(|&c| c == b']') else {
            return false;
        };
        let (literal, after) = (&rest[..end], &rest[end + 1..]);
        let literal_ok = !literal.is_empty()
            && literal
                .iter()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, b':' | b'.'));
        return literal_ok
            && match after {
                [] => true,
                [b':', p @ ..] => port(p),
                _ => false,
            };
    }
    let mut label = 0usize;
    for (i, &c) in h.iter().enumerate() {
        match c {
            b'.' if label == 0 => return false, // an empty label
            b'.' => label = 0,
            // The name ends: not empty, and ending in a label or one dot.
            b':' => return i > 0 && port(&h[i + 1..]),
            _ if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'~' | b'%') => label += 1,
            _ => return false,
        }
    }
    !h.is_empty()
}

/// True when `path` has nothing to normalise: no `%` but upper-case escapes
/// of characters that stay escaped, no `\`, no `//`, no segment of
/// parameters only, no dot segment.
fn is_normal(p: &[u8]) -> bool {
    let mut prev_slash = false;
    for (i, &b) in p.iter().enumerate() {
        match b {
            b'\\' => return false,
            b'%' => {
                // Normal only as an upper-case escape of a character that
                // stays escaped.
                let upper = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c));
                let (h, l) = (p.get(i + 1), p.get(i + 2));
                if !upper(h) || !upper(l) {
                    return false;
                }
                let v = h.and_then(hex).unwrap_or(0) << 4 | l.and_then(hex).unwrap_or(0);
                if v == 0 || v == b'/' || v == b'\\' || unreserved(v) {
                    return false;
                }
            }
            // `//`, or a segment that is only parameters (`/;x`).
            b'/' | b';' if prev_slash => return false,
            b'.' if prev_slash => {
                // `/.` then end, `/`, `;` or `.` (then end, `/` or `;`): a dot segment, bare or with parameters.
                let rest = p.get(i + 1..).unwrap_or(&[]);
                let dot_segment = |r: &[u8]| matches!(r.first(), None | Some(b'/') | Some(b';'));
                if dot_segment(rest) || (rest.first() == Some(&b'.') && dot_segment(rest.get(1..).unwrap_or(&[]))) {
                    return false;
                }
            }
            _ => {}
        }
        prev_slash = b == b'/';
    }
    true
}

/// Decodes escapes of unreserved characters, upper-cases the others'
/// hex digits, and refuses what upstreams disagree on.
fn decode_unreserved(p: &str) -> Result<Cow<'_, str>, TargetError> {
    let b = p.as_bytes();
    if !b.iter().any(|&c| c == b'%' || c == b'\\') {
        return Ok(Cow::Borrowed(p));
    }
    let mut out = String::with_capacity(p.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => return Err(TargetError::Backslash),
            b'%' => {
                let (Some(h), Some(l)) = (b.get(i + 1).and_then(hex), b.get(i + 2).and_then(hex)) else {
                    return Err(TargetError::BadEscape);
                };
                let v = h << 4 | l;
                match v {
                    b'/' => return Err(TargetError::EncodedSlash),
                    b'\\' => return Err(TargetError::Backslash),
                    0 => return Err(TargetError::Nul),
                    _ if unreserved(v) => out.push(char::from(v)),
                    _ => {
                        const HEX: &[u8; 16] = b"0123456789ABCDEF";
                        out.push('%');
                        out.push(char::from(HEX[usize::from(h)]));
                        out.push(char::from(HEX[usize::from(l)]));
                    }
                }
                i += 3;
            }
            _ => {
                // Request targets are ASCII (the parser refused the rest);
                // a multi-byte character is copied whole all the same.
                let ch_len = p[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&p[i..i + ch_len]);
                i += ch_len;
            }
        }
    }
    Ok(Cow::Owned(out))
}

/// RFC 3986's unreserved characters: their escapes mean the character.
fn unreserved(v: u8) -> bool {
    v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~')
}

fn hex(c: &u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, TargetError> {
        path(p).map(Cow::into_owned)
    }

    #[test]
    fn the_issues_walkarounds_all_become_the_login_path() {
        for p in [
            "/v1//login",
            "/v1/./login",
            "/v1/x/../login",
            "/v1/%6Cogin",
            "/v1/%6cogin",
            "//v1///login",
        ] {
            assert_eq!(norm(p).unwrap(), "/v1/login", "{p}");
        }
        assert_eq!(norm("/%76%31/login").unwrap(), "/v1/login");
        assert_eq!(norm("/v1/%2e%2e/v1/login").unwrap(), "/v1/login");
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for p in ["/", "/v1/login", "/v1/", "/a.b/c..d/.e/f.", "/x;y=1/z", "/..a", "*"] {
            assert!(matches!(path(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn dot_segments_and_trailing_slashes() {
        assert_eq!(norm("/a/b/..").unwrap(), "/a/");
        assert_eq!(norm("/a/b/.").unwrap(), "/a/b/");
        assert_eq!(norm("/a/.").unwrap(), "/a/");
        assert_eq!(norm("/.").unwrap(), "/");
        assert_eq!(norm("/a/..").unwrap(), "/");
        assert_eq!(norm("/a//").unwrap(), "/a/");
        assert_eq!(norm("//").unwrap(), "/");
        assert_eq!(norm("/a/./b/../../c/").unwrap(), "/c/");
        assert_eq!(
            norm("/a/%2e%2e/%2E%2E/b"),
            Err(TargetError::AboveRoot),
            "decoded first: /a/../../b"
        );
        assert_eq!(norm("/a/..%2e/b").unwrap(), "/a/.../b", "'...' is a name");
    }

    #[test]
    fn what_upstreams_disagree_on_is_refused() {
        assert_eq!(norm("/v1%2Flogin"), Err(TargetError::EncodedSlash));
        assert_eq!(norm("/v1%2flogin"), Err(TargetError::EncodedSlash));
        assert_eq!(norm("/v1%5Clogin"), Err(TargetError::Backslash));
        assert_eq!(norm("/v1\\login"), Err(TargetError::Backslash));
        assert_eq!(norm("/v1/login%00"), Err(TargetError::Nul));
        assert_eq!(norm("/v1/%4"), Err(TargetError::BadEscape));
        assert_eq!(norm("/v1/%zz"), Err(TargetError::BadEscape));
        assert_eq!(norm("/.."), Err(TargetError::AboveRoot));
        assert_eq!(norm("/a/../.."), Err(TargetError::AboveRoot));
        assert_eq!(norm("/v1/..;x/login"), Err(TargetError::DotWithParameters));
        assert_eq!(norm("/v1/.;/login"), Err(TargetError::DotWithParameters));
    }

    #[test]
    fn other_escapes_are_kept_upper_cased() {
        assert_eq!(norm("/a%3ab%20c").unwrap(), "/a%3Ab%20c");
        assert_eq!(norm("/%e2%82%ac").unwrap(), "/%E2%82%AC");
        assert_eq!(norm("/%7e%5f").unwrap(), "/~_");
    }

    #[test]
    fn parameters_are_matched_without_and_forwarded_with() {
        assert_eq!(match_path("/v1;x=1/login;jsessionid=2"), "/v1/login");
        assert_eq!(match_path("/v1/login"), "/v1/login");
        assert_eq!(norm("/v1;x/./login;y").unwrap(), "/v1;x/login;y");
    }

    #[test]
    fn a_segment_of_parameters_only_is_an_empty_segment() {
        for p in [
            "/v1/;x/login",
            "/;/v1/login",
            "/;x=1;y/v1/;/login",
            "/v1/x/;y/../login",
            "/v1/;x/;y/login",
        ] {
            let once = norm(p).unwrap();
            assert_eq!(once, "/v1/login", "{p}");
            assert_eq!(match_path(&once), "/v1/login", "{p}");
        }
        assert_eq!(norm("/v1/login/;x").unwrap(), "/v1/login/");
        assert_eq!(norm("/;x").unwrap(), "/");
        assert_eq!(norm("/;x/.."), Err(TargetError::AboveRoot), "Tomcat: //.. climbs");
        assert_eq!(norm("/v1;a/;b/login;c").unwrap(), "/v1;a/login;c");
    }

    #[test]
    fn hosts_with_empty_labels_or_stray_colons_are_refused() {
        for bad in [
            "api.example.com..",
            "api..example.com",
            ".api.example.com",
            "api.example.com.:80:80",
            "a@b",
            "",
            ".",
            "a:b",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
        }
        for good in [
            "api.example.com",
            "api.example.com.",
            "API.example.com.:8443",
            "127.0.0.1:80",
            "[::1]:80",
            "localhost",
        ] {
            assert!(valid_host(good.as_bytes()), "{good:?}");
        }
        let mut req = Request::get("/").header("host", "api.example.com..").body(()).unwrap();
        assert_eq!(target(&mut req), Err(TargetError::BadHost));
    }

    #[test]
    fn an_h2_host_must_name_the_authoritys_host() {
        let h2 = |authority: &str, host_header: &str| {
            let mut req = Request::get(format!("http://{authority}/x"))
                .version(Version::HTTP_2)
                .header("host", host_header)
                .body(())
                .unwrap();
            target(&mut req).map(|()| req.headers()["host"].to_str().unwrap().to_string())
        };
        assert_eq!(h2("a.example:443", "a.example"), Ok("a.example:443".to_string()));
        assert_eq!(h2("a.example", "A.Example."), Ok("a.example".to_string()));
        assert_eq!(h2("a.example", "b.example"), Err(TargetError::HostMismatch));
    }

    #[test]
    fn hosts_lose_port_and_trailing_dot() {
        assert_eq!(host("api.example.com."), "api.example.com");
        assert_eq!(host("api.example.com.:8443"), "api.example.com");
        assert_eq!(host("a.b:80"), "a.b");
        assert_eq!(host("[2001:db8::1]:443"), "[2001:db8::1]");
        assert_eq!(host("a.b:x"), "a.b:x");
    }

    proptest::proptest! {
        /// Normalising twice changes nothing; the result never climbs above
        /// the root and has no `//` or dot segment left.
        #[test]
        fn normal_forms_are_fixed_points(p in "/[a-zA-Z0-9./%;~_-]{0,40}") {
            if let Ok(once) = path(&p) {
                let twice = path(&once).unwrap();
                proptest::prop_assert_eq!(&*twice, &*once);
                proptest::prop_assert!(matches!(path(&once), Ok(Cow::Borrowed(_))));
                proptest::prop_assert!(once.starts_with('/'));
                proptest::prop_assert!(!once.contains("//"));
                proptest::prop_assert!(!once.split('/').any(|s| s == "." || s == ".."));
                // What routing matches is a normal path too: cutting the
                // parameters leaves no `//` and no dot segment.
                let m = match_path(&once);
                proptest::prop_assert!(matches!(path(&m), Ok(Cow::Borrowed(_))), "{} -> {}", once, m);
                proptest::prop_assert!(!m.contains(';'));
            }
        }

        /// `;` parameters never change the route: a path with parameters on
        /// any segment (an empty one included, as in `/v1/;x/login`) is
        /// refused or accepted as the same path without them is, and then
        /// matched as it. Tomcat's reading: parameters cut first, then
        /// slashes merged and dot segments removed. Dot segments get none:
        /// `..;x` is refused on purpose.
        #[test]
        fn parameters_never_change_the_route(
            segments in proptest::collection::vec(
                (
                    proptest::prop_oneof!["", "\\.", "\\.\\.", "[a-zA-Z0-9_~-]{1,3}"],
                    proptest::option::of(";[a-z0-9=;]{0,4}"),
                ),
                0..8,
            )
        ) {
            let mut with = String::new();
            let mut without = String::new();
            for (name, params) in &segments {
                with.push('/');
                with.push_str(name);
                without.push('/');
                without.push_str(name);
                if let (Some(params), false) = (params, name == "." || name == "..") {
                    with.push_str(params);
                }
            }
            if with.is_empty() {
                with.push('/');
                without.push('/');
            }
            match (path(&with), path(&without)) {
                (Ok(a), Ok(b)) => proptest::prop_assert_eq!(&*match_path(&a), &*b, "{}", with),
                (Err(a), Err(b)) => proptest::prop_assert_eq!(a, b, "{}", with),
                (a, b) => proptest::prop_assert!(false, "{} gave {:?}, {} gave {:?}", with, a, without, b),
            }
        }
    }
}
