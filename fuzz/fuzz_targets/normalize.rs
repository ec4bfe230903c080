//! The path and host normaliser (`route::normalize`).
//!
//! Input: UTF-8 text; its first line is a request target, the other lines
//! `name: value` headers (a line `h2` makes the request HTTP/2).
//!
//! On a target that starts with `/` and that `http` accepts, `path`:
//! - is idempotent: normalising its result again returns it borrowed;
//! - starts with `/`, holds no `//` and no `.` or `..` segment;
//! - never climbs above the root: when a reference normaliser (below, an
//!   upstream's view: decode escapes of unreserved characters, merge
//!   slashes, RFC 3986 remove_dot_segments) sees `..` climb above the root,
//!   `path` refuses;
//! - routes the same: the reference normaliser gives the same path for the
//!   original (its segments that are only `;` parameters emptied, as
//!   `path` reads them) and for `path`'s result.
//!
//! `match_path` of a normal path has no `;`, is a fixed point, starts
//! with `/` and is normal; it is what Tomcat maps (parameters cut from
//! every segment first, then the reference), and when that climbs above
//! the root, `path` refuses. `host` returns a prefix of its input. `target` on a request
//! built from the input never panics and, when it accepts, leaves a normal
//! path (the one `path` gives), the query untouched and a Host header equal
//! to the target's authority when it has one.
#![no_main]

use std::borrow::Cow;

use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Request, Version};
use leasegate::route::normalize::{host, match_path, path, target};
use libfuzzer_sys::fuzz_target;

/// RFC 3986 unreserved characters.
fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

/// Step 1 of the reference: escapes of unreserved characters decoded, the
/// others' hex digits upper-cased. `None` for a `%` without two hex digits.
fn ref_decode(p: &str) -> Option<String> {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let s = std::str::from_utf8(hex).ok()?;
            let v = u8::from_str_radix(s, 16).ok()?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            if unreserved(v) {
                out.push(v);
            } else {
                out.push(b'%');
                out.extend(s.to_ascii_uppercase().bytes());
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Step 2: runs of `/` merged into one.
fn ref_merge(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// Step 3: RFC 3986 §5.2.4 remove_dot_segments, written as the RFC states
/// it (input and output buffers). Also says whether a `..` found nothing to
/// remove (climbed above the root, which the RFC silently ignores).
fn remove_dot_segments(path: &str) -> (String, bool) {
    let mut input = path.to_string();
    let mut output = String::new();
    let mut climbed = false;
    let pop = |output: &mut String, climbed: &mut bool| match output.rfind('/') {
        Some(i) => output.truncate(i),
        None => {
            if output.is_empty() {
                *climbed = true;
            }
            output.clear();
        }
    };
    while !input.is_empty() {
        if input.starts_with("../") {
            input.drain(..3);
        } else if input.starts_with("./") {
            input.drain(..2);
        } else if input.starts_with("/./") {
            input.replace_range(..3, "/");
        } else if input == "/." {
            input = "/".into();
        } else if input.starts_with("/../") {
            input.replace_range(..4, "/");
            pop(&mut output, &mut climbed);
        } else if input == "/.." {
            input = "/".into();
            pop(&mut output, &mut climbed);
        } else if input == "." || input == ".." {
            input.clear();
        } else {
            let start = usize::from(input.starts_with('/'));
            let end = input[start..].find('/').map_or(input.len(), |i| i + start);
            output.push_str(&input[..end]);
            input.drain(..end);
        }
    }
    (output, climbed)
}

/// What an upstream that normalises makes of a path, and whether `..`
/// climbed above the root on the way.
fn reference(p: &str) -> Option<(String, bool)> {
    Some(remove_dot_segments(&ref_merge(&ref_decode(p)?)))
}

/// Each segment of `p` cut at its first `;` (`all`), or only those that are
/// empty once cut (`!all`).
fn cut_parameters(p: &str, all: bool) -> String {
    p.split('/')
        .map(|seg| {
            let bare = seg.split(';').next().unwrap_or("");
            if all || bare.is_empty() {
                bare
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn check_path(p: &str) {
    let Ok(ours) = path(p) else {
        return;
    };
    let ours: &str = &ours;
    // Idempotent, and the normal form is recognised as such.
    match path(ours) {
        Ok(Cow::Borrowed(again)) => assert_eq!(again, ours),
        other => panic!("path({ours:?}) of path({p:?}) gave {other:?}, not itself borrowed"),
    }
    assert!(ours.starts_with('/'), "{p:?} -> {ours:?}");
    assert!(!ours.contains("//"), "{p:?} -> {ours:?}");
    assert!(
        !ours.split('/').any(|s| s == "." || s == ".."),
        "{p:?} -> {ours:?} keeps a dot segment"
    );
    if let Some((upstream, climbed)) = reference(&cut_parameters(p, false)) {
        assert!(!climbed, "{p:?} climbs above the root (upstream sees {upstream:?}) but was accepted as {ours:?}");
        let (of_ours, _) = reference(ours).expect("a normal path has only valid escapes");
        assert_eq!(
            upstream, of_ours,
            "{p:?}: an upstream serves {upstream:?} but the gateway routes {ours:?}, which it serves as {of_ours:?}"
        );
    }
    let m = match_path(ours);
    assert!(m.starts_with('/'), "match_path({ours:?}) = {m:?}");
    assert!(!m.contains(';'), "match_path({ours:?}) = {m:?}");
    assert!(matches!(match_path(&m), Cow::Borrowed(_)));
    assert!(matches!(path(&m), Ok(Cow::Borrowed(_))), "match_path({ours:?}) = {m:?} is not normal");
    if let Some((tomcat, climbed)) = reference(&cut_parameters(p, true)) {
        assert!(!climbed, "{p:?} climbs above the root in Tomcat's reading but was accepted as {ours:?}");
        assert_eq!(tomcat, m, "{p:?}: Tomcat maps {tomcat:?} but the gateway matches {m:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));

    let h = host(first);
    assert!(first.starts_with(h), "host({first:?}) = {h:?}");

    let original = if first.starts_with('/') {
        PathAndQuery::try_from(first).ok()
    } else {
        None
    };
    if let Some(pq) = &original {
        check_path(pq.path());
    }

    let Ok(uri) = first.parse::<http::Uri>() else {
        return;
    };
    let mut req = Request::new(());
    *req.uri_mut() = uri;
    for line in rest.split('\n') {
        if line == "h2" {
            *req.version_mut() = Version::HTTP_2;
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value.trim())) {
            req.headers_mut().append(n, v);
        }
    }
    let before = req.uri().clone();
    let expected = path(before.path()).map(Cow::into_owned);
    match target(&mut req) {
        Ok(()) => {
            let after = req.uri();
            assert_eq!(Ok(after.path().to_string()), expected, "target and path disagree on {before}");
            assert!(matches!(path(after.path()), Ok(Cow::Borrowed(_))), "{before} -> {after}");
            assert_eq!(after.query(), before.query(), "the query changed");
            if let Some(authority) = before.authority() {
                let hosts: Vec<_> = req.headers().get_all(http::header::HOST).iter().collect();
                assert_eq!(hosts.len(), 1, "{before}: Host headers {hosts:?}");
                assert!(
                    hosts[0].as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()),
                    "{before}: Host {:?}",
                    hosts[0]
                );
            }
            // An accepted request's host, as routes compare it, is already
            // in that form: no second trailing dot or port left to strip.
            let routed = req
                .uri()
                .authority()
                .map(|a| a.as_str().to_string())
                .or_else(|| req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string));
            if let Some(r) = routed {
                let h = host(&r);
                assert_eq!(host(h), h, "host is not idempotent on accepted {r:?}");
            }
        }
        Err(_) => {}
    }
});
