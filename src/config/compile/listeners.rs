//! `[listeners]` and `[tls]`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use toml::Spanned;

use super::{in_range, resolve, Check};
use crate::config::admin::{AdminToken, MIN_TOKEN_LEN};
use crate::config::{raw, Listeners, Tls};

fn socket_addr(c: &mut Check, v: &Option<Spanned<String>>, key: &str) -> Option<SocketAddr> {
    let v = v.as_ref()?;
    match v.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.at(
                v.span(),
                key,
                format!(
                    "{:?} is not a socket address such as \"127.0.0.1:8080\" or \"[::1]:8080\"",
                    v.get_ref()
                ),
            );
            None
        }
    }
}

pub(super) fn listeners(
    c: &mut Check,
    l: &Spanned<raw::Listeners>,
    admin: Option<&Spanned<raw::Admin>>,
    base: &Path,
) -> Listeners {
    let raw = l.get_ref();
    let out = Listeners {
        http: socket_addr(c, &raw.http, "listeners.http"),
        https: socket_addr(c, &raw.https, "listeners.https"),
        admin: socket_addr(c, &raw.admin, "listeners.admin"),
        admin_token: admin.and_then(|a| admin_token(c, a, base)),
    };
    // Without a token, anyone who reaches the admin listener reads the
    // metrics, the config and the keys: only this host may.
    if let (Some(addr), Some(v), None) = (out.admin, &raw.admin, &out.admin_token) {
        if !addr.ip().is_loopback() {
            c.at(
                v.span(),
                "listeners.admin",
                format!(
                    "{addr} is not a loopback address, and the admin listener has no authentication without \
                     [admin] token_file: bind it to 127.0.0.1 (or [::1]), or set [admin] token_file"
                ),
            );
        }
    }
    if raw.http.is_none() && raw.https.is_none() {
        c.at(l.span(), "listeners", "set at least one of http or https");
    }
    let mut seen = HashMap::new();
    for (name, addr, v) in [
        ("http", out.http, &raw.http),
        ("https", out.https, &raw.https),
        ("admin", out.admin, &raw.admin),
    ] {
        if let (Some(addr), Some(v)) = (addr, v) {
            if addr.port() != 0 {
                if let Some(other) = seen.insert(addr, name) {
                    c.at(
                        v.span(),
                        format!("listeners.{name}"),
                        format!("{addr} is already used by listeners.{other}"),
                    );
                }
            }
        }
    }
    out
}

/// `[admin] token_file`: the token, read now (a reload reads it again),
/// trimmed of surrounding whitespace, at least
/// [`MIN_TOKEN_LEN`](crate::config::admin::MIN_TOKEN_LEN) characters.
fn admin_token(c: &mut Check, a: &Spanned<raw::Admin>, base: &Path) -> Option<AdminToken> {
    let v = &a.get_ref().token_file;
    let path = resolve(base, v.get_ref());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            c.at(
                v.span(),
                "admin.token_file",
                format!("cannot read {}: {e}", path.display()),
            );
            return None;
        }
    };
    let token = text.trim();
    if token.len() < MIN_TOKEN_LEN || token.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
        c.at(
            v.span(),
            "admin.token_file",
            format!(
                "{} must hold one token of at least {MIN_TOKEN_LEN} characters with no space in it \
                 (e.g. `openssl rand -hex 32 > {}`)",
                path.display(),
                v.get_ref()
            ),
        );
        return None;
    }
    Some(AdminToken::new(token, path))
}

pub(super) fn tls(c: &mut Check, t: &Spanned<raw::Tls>, base: &Path) -> Option<Tls> {
    let raw = t.get_ref();
    let cert = resolve(base, raw.cert.get_ref());
    let key = resolve(base, raw.key.get_ref());
    let timeout = in_range(
        c,
        &raw.client_hello_timeout_ms,
        "tls.client_hello_timeout_ms",
        1,
        600_000,
        5_000,
    );

    let chain: Result<Vec<CertificateDer<'static>>, _> = match CertificateDer::pem_file_iter(&cert) {
        Ok(it) => it.collect(),
        Err(e) => Err(e),
    };
    let chain = match chain {
        Ok(chain) if !chain.is_empty() => Some(chain),
        Ok(_) => {
            c.at(
                raw.cert.span(),
                "tls.cert",
                format!("{}: no PEM certificate in the file", cert.display()),
            );
            None
        }
        Err(e) => {
            c.at(raw.cert.span(), "tls.cert", format!("{}: {e}", cert.display()));
            None
        }
    };
    let private = match PrivateKeyDer::from_pem_file(&key) {
        Ok(k) => Some(k),
        Err(e) => {
            c.at(raw.key.span(), "tls.key", format!("{}: {e}", key.display()));
            None
        }
    };
    let (chain, private) = (chain?, private?);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let built = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private));
    match built {
        Ok(mut sc) => {
            sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(Tls {
                files_sha256: crate::config::tls_files_digest(&cert, &key),
                cert,
                key,
                server_config: Arc::new(sc),
                client_hello_timeout: Duration::from_millis(timeout),
            })
        }
        Err(e) => {
            c.at(
                raw.key.span(),
                "tls.key",
                format!("the certificate and key do not make a TLS identity: {e}"),
            );
            None
        }
    }
}
