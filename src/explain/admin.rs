//! `leasegate explain --admin URL`: the live state of the keys `explain`
//! printed, asked of a running gateway's admin listener
//! (`GET /limits/state?key=K&key=K2`, JSON).
//!
//! One request on hyper's HTTP/1.1 client (the one the proxy uses), on a
//! runtime of its own for the command, bounded in time (each step) and in
//! size (the answer). The request target and the answer's JSON are pure
//! functions, tested apart from the socket. Plain HTTP only: the admin
//! listener serves no TLS.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
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
use crate::limit::report::KeyState;

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

/// The request target of `GET /limits/state?key=K...&who=W...`.
pub fn state_target(url: &AdminUrl, keys: &[&str], whos: &[&str]) -> String {
    let query: Vec<String> = keys
        .iter()
        .map(|k| format!("key={}", encode_query_value(k)))
        .chain(whos.iter().map(|w| format!("who={}", encode_query_value(w))))
        .collect();
    format!("{}{STATE_PATH}?{}", url.base_path, query.join("&"))
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
    let mut request = http::Request::get(state_target(url, keys, whos))
        .header(http::header::HOST, url.authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("leasegate-explain/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(token) = bearer {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let (code, status, body) = runtime.block_on(async {
        let step = |what: &'static str| move |_| format!("no answer within {} ms ({what})", timeout.as_millis());
        let mut last = String::from("the name resolves to no address");
        let mut stream = None;
        for addr in addrs {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("connecting took over {} ms", timeout.as_millis()),
            }
        }
        let stream = stream.ok_or_else(|| unreachable(last))?;
        let not_http = |reason: String| AdminError::NotHttp {
            url: shown.clone(),
            reason,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // The connection is driven here: it ends with the exchange.
        let exchange = async move {
            let answer = tokio::time::timeout(timeout, sender.send_request(request))
                .await
                .map_err(step("the head"))?
                .map_err(|e| e.to_string())?;
            let status = answer.status();
            let body = tokio::time::timeout(timeout, Limited::new(answer.into_body(), MAX_ANSWER).collect())
                .await
                .map_err(step("the body"))?
                .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
                    Ok(_) => format!("the answer is over {MAX_ANSWER} bytes"),
                    Err(e) => e.to_string(),
                })?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let mut exchange = std::pin::pin!(exchange);
        let mut conn = std::pin::pin!(conn);
        let (status, body) = tokio::select! {
            biased;
            r = &mut exchange => r.map_err(not_http)?,
            c = &mut conn => match c {
                Err(e) => return Err(not_http(e.to_string())),
                Ok(()) => exchange.await.map_err(not_http)?,
            },
        };
        let line = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or_default());
        Ok::<_, AdminError>((status.as_u16(), line, body.to_vec()))
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
            status: status.trim().to_string(),
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
        assert_eq!(
            state_target(
                &url,
                &["rl:{per_client:key:acme}", "rl:{per_subnet:198.51.100.0/24:s02}"],
                &["key:acme"],
            ),
            "/limits/state?key=rl%3A%7Bper_client%3Akey%3Aacme%7D&key=rl%3A%7Bper_subnet%3A198.51.100.0%2F24%3As02%7D&who=key%3Aacme"
        );
        let behind = AdminUrl::parse("http://gw:80/admin/").unwrap();
        assert_eq!(state_target(&behind, &["k"], &[]), "/admin/limits/state?key=k");
        // Spaces, percent signs and non-ASCII bytes are encoded too.
        assert_eq!(encode_query_value("a b%c/é"), "a%20b%25c%2F%C3%A9");
        assert_eq!(encode_query_value("Az09-._~"), "Az09-._~");
    }

    const ANSWER: &str = r#"{"keys":[{"key":"rl:{per_client:key:acme}","tracked":true,"tokens_at_hand":4,"blocked_for_ms":0,"retry_after_ms":0,"store_remaining":95,"reset_ms":1200,"last_store_failure":null}]}"#;

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
