//! `leasegate explain --admin URL`: the live state of the keys `explain`
//! printed, asked of a running gateway's admin listener
//! (`GET /limits/state?key=K&key=K2`, JSON).
//!
//! A tiny blocking HTTP/1.1 client over a `TcpStream`: one request, one
//! answer read to the end (`Connection: close`), both bounded in time and
//! size. The request building and the answer parsing are pure functions,
//! tested apart from the socket. Plain HTTP only: the admin listener serves
//! no TLS.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::Deserialize;

/// The admin path that answers the live state of store keys.
pub const STATE_PATH: &str = "/limits/state";

/// The largest answer read: far above what a few keys' state takes.
const MAX_ANSWER: usize = 1 << 20;

/// Why the live state could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    #[error("bad --admin {0:?}: want the admin listener's address, such as http://127.0.0.1:9901")]
    Url(String),
    #[error("bad --admin {0:?}: the admin listener serves plain HTTP, not https")]
    Https(String),
    #[error("cannot reach the admin listener at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} answered {status}{hint}: {body}")]
    Status {
        url: String,
        status: String,
        hint: &'static str,
        body: String,
    },
    #[error("{url} did not answer HTTP: {reason}")]
    NotHttp { url: String, reason: String },
    #[error("{url} answered JSON explain cannot read ({reason}): {body}")]
    Json { url: String, reason: String, body: String },
}

/// Where the admin listener is, from `--admin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    /// `host:port`, for the socket and the `Host` header.
    pub authority: String,
    /// A path prefix the listener sits behind (empty, or `/x` without a
    /// trailing slash).
    pub base_path: String,
}

impl AdminUrl {
    /// `http://HOST:PORT[/PREFIX]`, or `HOST:PORT` without the scheme.
    pub fn parse(url: &str) -> Result<AdminUrl, AdminError> {
        let bad = || AdminError::Url(url.to_string());
        let trimmed = url.trim();
        if trimmed.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) {
            return Err(AdminError::Https(url.to_string()));
        }
        let rest = match trimmed.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &trimmed[7..],
            _ if trimmed.contains("://") => return Err(bad()),
            _ => trimmed,
        };
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) if rest[i..].starts_with('/') && !rest[i..].contains(['?', '#']) => (&rest[..i], &rest[i..]),
            Some(_) => return Err(bad()),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains(['@', ' ']) {
            return Err(bad());
        }
        // Brackets around an IPv6 address; a port after the host.
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(bad)?;
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':').ok_or_else(bad)?),
                };
                (format!("[{host}]"), port)
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
                Some(_) => return Err(bad()),
                None => (authority.to_string(), None),
            },
        };
        let port: u16 = match port {
            None => 80,
            Some(p) => p.parse().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        };
        if host.is_empty() || host == "[]" {
            return Err(bad());
        }
        Ok(AdminUrl {
            authority: format!("{host}:{port}"),
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    /// The URL asked, for messages.
    pub fn state_url(&self) -> String {
        format!("http://{}{}{STATE_PATH}", self.authority, self.base_path)
    }
}

/// One key's live state on the gateway, as `/limits/state` answers it.
pub use crate::limit::report::KeyState;

#[derive(Debug, Deserialize)]
struct StateAnswer {
    keys: Vec<KeyState>,
}

/// Percent-encodes a query value: everything but RFC 3986's unreserved
/// characters, so `rl:{a:b/c}` survives any server's query parser.
pub fn encode_query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The bytes of `GET /limits/state?key=K...` for `keys`.
pub fn state_request(url: &AdminUrl, keys: &[&str], whos: &[&str], bearer: Option<&str>) -> String {
    let query: Vec<String> = keys
        .iter()
        .map(|k| format!("key={}", encode_query_value(k)))
        .chain(whos.iter().map(|w| format!("who={}", encode_query_value(w))))
        .collect();
    let authorization = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "GET {}{STATE_PATH}?{} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nUser-Agent: leasegate-explain/{}\r\n{authorization}Connection: close\r\n\r\n",
        url.base_path,
        query.join("&"),
        url.authority,
        env!("CARGO_PKG_VERSION"),
    )
}

/// Reads a whole HTTP/1.1 answer: its status code and line, and its body
/// (by `Content-Length`, chunked, or to the end).
pub fn parse_response(raw: &[u8]) -> Result<(u16, String, Vec<u8>), String> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer ended before its head did")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "the answer's head is not text")?;
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let code: u16 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| format!("not an HTTP/1.1 status line: {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(n) = length {
        body.get(..n).ok_or("the answer ended before its body did")?.to_vec()
    } else {
        body.to_vec()
    };
    Ok((code, status_line.trim().to_string(), body))
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunked body ended early")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(rest.get(..size).ok_or("a chunked body ended early")?);
        rest = rest.get(size + 2..).ok_or("a chunked body ended early")?;
    }
}

/// The key states in a `/limits/state` body.
pub fn parse_state(body: &[u8]) -> Result<Vec<KeyState>, String> {
    let keys = serde_json::from_slice::<StateAnswer>(body)
        .map(|a| a.keys)
        .map_err(|e| e.to_string())?;
    if keys.iter().any(|k| k.key.is_empty()) {
        return Err("an entry names no key".to_string());
    }
    Ok(keys)
}

/// Asks the admin listener at `url` for the state of `keys`, waiting at
/// most `timeout` for each step (connect, write, every read).
/// `bearer`: the admin token to present (`[admin] token_file` of the
/// config explain read), if any.
pub fn fetch_state(
    url: &AdminUrl,
    keys: &[&str],
    whos: &[&str],
    bearer: Option<&str>,
    timeout: Duration,
) -> Result<Vec<KeyState>, AdminError> {
    let shown = url.state_url();
    let unreachable = |reason: String| AdminError::Unreachable {
        url: format!("http://{}{}", url.authority, url.base_path),
        reason,
    };
    let addrs: Vec<SocketAddr> = url
        .authority
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .collect();
    let mut last = String::from("the name resolves to no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e.to_string(),
        }
    }
    let mut stream = stream.ok_or_else(|| unreachable(last))?;
    let io = |e: std::io::Error| unreachable(e.to_string());
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream
        .write_all(state_request(url, keys, whos, bearer).as_bytes())
        .map_err(io)?;
    let mut raw = Vec::new();
    stream.take(MAX_ANSWER as u64 + 1).read_to_end(&mut raw).map_err(io)?;
    if raw.len() > MAX_ANSWER {
        return Err(AdminError::NotHttp {
            url: shown,
            reason: format!("the answer is over {MAX_ANSWER} bytes"),
        });
    }
    let (code, status, body) = parse_response(&raw).map_err(|reason| AdminError::NotHttp {
        url: shown.clone(),
        reason,
    })?;
    let excerpt = |b: &[u8]| {
        let text = String::from_utf8_lossy(b);
        let text = text.trim();
        match text.char_indices().nth(200) {
            Some((i, _)) => format!("{}...", &text[..i]),
            None => text.to_string(),
        }
    };
    if code != 200 {
        return Err(AdminError::Status {
            url: shown,
            status: status.trim_start_matches(|c: char| c != ' ').trim().to_string(),
            hint: match code {
                404 => " (is this a leasegate admin listener with /limits/state?)",
                401 => " (the gateway wants its [admin] token_file's token: explain sends the one its --config names)",
                _ => "",
            },
            body: excerpt(&body),
        });
    }
    parse_state(&body).map_err(|reason| AdminError::Json {
        url: shown,
        reason,
        body: excerpt(&body),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn admin_urls_parse() {
        let ok = |u: &str, authority: &str, base: &str| {
            assert_eq!(
                AdminUrl::parse(u),
                Ok(AdminUrl {
                    authority: authority.into(),
                    base_path: base.into()
                }),
                "{u}"
            );
        };
        ok("http://127.0.0.1:9901", "127.0.0.1:9901", "");
        ok("http://127.0.0.1:9901/", "127.0.0.1:9901", "");
        ok("HTTP://localhost:9901/gw/", "localhost:9901", "/gw");
        ok("127.0.0.1:9901", "127.0.0.1:9901", "");
        // Multi-byte characters where the scheme would end: no panic.
        for u in ["aéééé", "httpéé://x", "htté"] {
            let _ = AdminUrl::parse(u);
        }
        ok("http://[::1]:9901", "[::1]:9901", "");
        ok("http://admin.internal", "admin.internal:80", "");
        assert!(matches!(
            AdminUrl::parse("https://127.0.0.1:9901"),
            Err(AdminError::Https(_))
        ));
        for bad in [
            "",
            "http://",
            "ftp://x:1",
            "http://x:0",
            "http://x:99999",
            "http://x:port",
            "http://u@x:1",
            "http://x:1/?q",
            "http://[::1",
            "http://::1:9901",
        ] {
            assert!(matches!(AdminUrl::parse(bad), Err(AdminError::Url(_))), "{bad}");
        }
    }

    #[test]
    fn the_request_asks_for_each_key_encoded() {
        let url = AdminUrl::parse("http://127.0.0.1:9901").unwrap();
        let req = state_request(
            &url,
            &["rl:{per_client:key:acme}", "rl:{per_subnet:198.51.100.0/24:s02}"],
            &["key:acme"],
            None,
        );
        let mut lines = req.split("\r\n");
        assert_eq!(
            lines.next(),
            Some(
                "GET /limits/state?key=rl%3A%7Bper_client%3Akey%3Aacme%7D&key=rl%3A%7Bper_subnet%3A198.51.100.0%2F24%3As02%7D&who=key%3Aacme HTTP/1.1"
            )
        );
        assert!(req.contains("\r\nHost: 127.0.0.1:9901\r\n"), "{req}");
        assert!(req.contains("\r\nConnection: close\r\n"), "{req}");
        assert!(req.ends_with("\r\n\r\n"), "{req}");
        assert!(!req.contains("Authorization"), "{req}");
        let with_token = state_request(&url, &["k"], &[], Some("0123456789abcdef"));
        assert!(
            with_token.contains("\r\nAuthorization: Bearer 0123456789abcdef\r\n"),
            "{with_token}"
        );
        let behind = AdminUrl::parse("http://gw:80/admin/").unwrap();
        assert!(state_request(&behind, &["k"], &[], None).starts_with("GET /admin/limits/state?key=k HTTP/1.1\r\n"));
        // Spaces, percent signs and non-ASCII bytes are encoded too.
        assert_eq!(encode_query_value("a b%c/é"), "a%20b%25c%2F%C3%A9");
        assert_eq!(encode_query_value("Az09-._~"), "Az09-._~");
    }

    const ANSWER: &str = r#"{"keys":[{"key":"rl:{per_client:key:acme}","tracked":true,"tokens_at_hand":4,"blocked_for_ms":0,"retry_after_ms":0,"store_remaining":95,"reset_ms":1200,"last_store_failure":null}]}"#;

    #[test]
    fn answers_parse_by_length_chunks_or_close() {
        let by_length = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}trailing",
            ANSWER.len()
        );
        let (code, status, body) = parse_response(by_length.as_bytes()).unwrap();
        assert_eq!(
            (code, status.as_str(), body.as_slice()),
            (200, "HTTP/1.1 200 OK", ANSWER.as_bytes())
        );
        let (a, b) = ANSWER.split_at(20);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:X};ext=1\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        assert_eq!(parse_response(chunked.as_bytes()).unwrap().2, ANSWER.as_bytes());
        let to_close = format!("HTTP/1.0 200 OK\r\n\r\n{ANSWER}");
        assert_eq!(parse_response(to_close.as_bytes()).unwrap().2, ANSWER.as_bytes());
        let not_found = "HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\n\r\nnot found\n";
        assert_eq!(parse_response(not_found.as_bytes()).unwrap().0, 404);
        for bad in [
            "",
            "HTTP/1.1 200 OK\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
            "HTTP/1.1 abc OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\nshort",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(parse_response(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn key_states_parse_leniently_but_need_keys() {
        let states = parse_state(ANSWER.as_bytes()).unwrap();
        assert_eq!(
            states,
            [KeyState {
                key: "rl:{per_client:key:acme}".into(),
                tracked: true,
                tokens_at_hand: 4,
                tokens_reserved: 0,
                blocked_for_ms: 0,
                retry_after_ms: 0,
                store_remaining: 95,
                reset_ms: 1200,
                last_store_failure: None,
                overridden: None,
            }]
        );
        // Fields a gateway does not send read as zero; extra ones are ignored.
        let sparse = parse_state(br#"{"keys":[{"key":"k","tracked":false,"extra":1}],"now":5}"#).unwrap();
        assert_eq!(sparse[0].key, "k");
        assert!(!sparse[0].tracked);
        assert_eq!(sparse[0].store_remaining, 0, "a field not sent reads as zero");
        for bad in [
            &b"not json"[..],
            br#"{"key":"k"}"#,
            br#"{"keys":[{"tracked":true}]}"#,
            br#"{"keys":[{"key":"k","tokens_at_hand":-1}]}"#,
        ] {
            assert!(parse_state(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
