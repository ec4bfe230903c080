//! `[listeners]` and `[tls]`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use toml::Spanned;

use super::{in_range, resolve, Check};
use crate::config::admin::{AdminToken, MIN_TOKEN_LEN};
use crate::config::{raw, Listeners, PeerTls, Tls};

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

/// A certificate chain and its private key, read from `cert` and `key`
/// (keys `<section>.<cert_key>` and `<section>.<key_key>` in problems).
pub(super) struct Identity {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) private: PrivateKeyDer<'static>,
}

pub(super) fn identity(
    c: &mut Check,
    base: &Path,
    (cert_v, cert_name): (&Spanned<String>, &str),
    (key_v, key_name): (&Spanned<String>, &str),
) -> Option<Identity> {
    let cert = resolve(base, cert_v.get_ref());
    let key = resolve(base, key_v.get_ref());
    let chain: Result<Vec<CertificateDer<'static>>, _> = match CertificateDer::pem_file_iter(&cert) {
        Ok(it) => it.collect(),
        Err(e) => Err(e),
    };
    let chain = match chain {
        Ok(chain) if !chain.is_empty() => Some(chain),
        Ok(_) => {
            c.at(
                cert_v.span(),
                cert_name,
                format!("{}: no PEM certificate in the file", cert.display()),
            );
            None
        }
        Err(e) => {
            c.at(cert_v.span(), cert_name, format!("{}: {e}", cert.display()));
            None
        }
    };
    let private = match PrivateKeyDer::from_pem_file(&key) {
        Ok(k) => Some(k),
        Err(e) => {
            c.at(key_v.span(), key_name, format!("{}: {e}", key.display()));
            None
        }
    };
    Some(Identity {
        chain: chain?,
        private: private?,
        cert,
        key,
    })
}

/// The CA certificates in `v`'s PEM file, as trust roots.
pub(super) fn roots(
    c: &mut Check,
    base: &Path,
    v: &Spanned<String>,
    name: &str,
) -> Option<(PathBuf, Arc<RootCertStore>)> {
    let path = resolve(base, v.get_ref());
    let certs: Result<Vec<CertificateDer<'static>>, _> = match CertificateDer::pem_file_iter(&path) {
        Ok(it) => it.collect(),
        Err(e) => Err(e),
    };
    let certs = match certs {
        Ok(certs) => certs,
        Err(e) => {
            c.at(v.span(), name, format!("{}: {e}", path.display()));
            return None;
        }
    };
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(certs);
    if added == 0 {
        c.at(
            v.span(),
            name,
            format!("{}: no usable PEM CA certificate in the file", path.display()),
        );
        return None;
    }
    Some((path, Arc::new(store)))
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A client-certificate verifier for `roots`; `optional`: a client without
/// a certificate is let through (and simply has none).
fn client_verifier(
    roots: Arc<RootCertStore>,
    optional: bool,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, rustls::server::VerifierBuilderError> {
    let builder = WebPkiClientVerifier::builder_with_provider(roots, provider());
    if optional {
        builder.allow_unauthenticated().build()
    } else {
        builder.build()
    }
}

pub(super) fn tls(c: &mut Check, t: &Spanned<raw::Tls>, base: &Path) -> Option<Tls> {
    let raw = t.get_ref();
    let timeout = in_range(
        c,
        &raw.client_hello_timeout_ms,
        "tls.client_hello_timeout_ms",
        1,
        600_000,
        5_000,
    );
    let id = identity(c, base, (&raw.cert, "tls.cert"), (&raw.key, "tls.key"));
    let client_ca = match &raw.client_ca {
        Some(v) => Some(roots(c, base, v, "tls.client_ca")?),
        None => None,
    };
    let id = id?;
    let built = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())
        .and_then(|b| match &client_ca {
            // Asked, not required: a client without a certificate goes on
            // down the identity waterfall.
            Some((_, roots)) => client_verifier(roots.clone(), true)
                .map(|v| b.with_client_cert_verifier(v))
                .map_err(|e| format!("tls.client_ca: {e}")),
            None => Ok(b.with_no_client_auth()),
        })
        .and_then(|b| b.with_single_cert(id.chain, id.private).map_err(|e| e.to_string()));
    match built {
        Ok(mut sc) => {
            sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(Tls {
                client_ca: client_ca.map(|(p, _)| p),
                cert: id.cert,
                key: id.key,
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

/// `tls_cert`, `tls_key` and `client_ca` of `[rls]` or `[region]`
/// (`section`): `None` when none is set. `allow`: `allow_subjects`.
/// `alpn`: the protocols the plane speaks. `client_side`: the plane also
/// calls its peers (the region link), with the same certificate, trusting
/// `client_ca` alone.
pub(super) fn peer_tls(
    c: &mut Check,
    base: &Path,
    section: (&str, std::ops::Range<usize>),
    files: [Option<&Spanned<String>>; 3],
    allow: Option<&Spanned<Vec<String>>>,
    alpn: &[&[u8]],
    client_side: bool,
) -> Option<PeerTls> {
    let (name, span) = section;
    let [cert, key, ca] = files;
    let allow_subjects = allow_subjects(c, name, allow, ca.is_some());
    let (cert, key) = match (cert, key) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) => {
            if let Some(ca) = ca {
                c.at(
                    ca.span(),
                    format!("{name}.client_ca"),
                    "needs tls_cert and tls_key: peers are verified only over TLS",
                );
            }
            return None;
        }
        (Some(_), None) | (None, Some(_)) => {
            c.at(span, name, "set tls_cert and tls_key together");
            return None;
        }
    };
    let (cert_key, key_key) = (format!("{name}.tls_cert"), format!("{name}.tls_key"));
    let id = identity(c, base, (cert, &cert_key), (key, &key_key));
    let roots = match ca {
        Some(v) => Some(roots(c, base, v, &format!("{name}.client_ca"))?),
        None => None,
    };
    let id = id?;
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())
        .and_then(|b| match &roots {
            Some((_, r)) => client_verifier(r.clone(), false)
                .map(|v| b.with_client_cert_verifier(v))
                .map_err(|e| e.to_string()),
            None => Ok(b.with_no_client_auth()),
        })
        .and_then(|b| {
            b.with_single_cert(id.chain.clone(), id.private.clone_key())
                .map_err(|e| e.to_string())
        });
    let mut server = match server {
        Ok(s) => s,
        Err(e) => {
            c.at(
                key.span(),
                key_key,
                format!("the certificate and key do not make a TLS identity: {e}"),
            );
            return None;
        }
    };
    server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let client = match (&roots, client_side) {
        (Some((_, r)), true) => {
            let built = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())
                .map(|b| b.with_root_certificates(r.clone()))
                .and_then(|b| b.with_client_auth_cert(id.chain, id.private).map_err(|e| e.to_string()));
            match built {
                Ok(mut cc) => {
                    cc.alpn_protocols = server.alpn_protocols.clone();
                    Some(Arc::new(cc))
                }
                Err(e) => {
                    c.at(key.span(), key_key, format!("cannot present this certificate: {e}"));
                    return None;
                }
            }
        }
        (None, true) => {
            c.at(
                span,
                format!("{name}.client_ca"),
                "missing: the link's TLS needs the CA that signed every region's certificate, to verify the \
                 peers it serves and the primary it calls",
            );
            return None;
        }
        (_, false) => None,
    };
    Some(PeerTls {
        cert: id.cert,
        key: id.key,
        client_ca: roots.map(|(p, _)| p),
        allow_subjects: allow_subjects?,
        server: Arc::new(server),
        client,
    })
}

/// Most names in one plane's `allow_subjects`.
const MAX_ALLOW_SUBJECTS: usize = 1_000;

/// `allow_subjects` of `[rls]` or `[region]`: the names, lowercased (the
/// match ignores ASCII case, as DNS names do). Needs `client_ca`: only a
/// verified certificate has names worth checking.
fn allow_subjects(
    c: &mut Check,
    section: &str,
    allow: Option<&Spanned<Vec<String>>>,
    has_ca: bool,
) -> Option<Vec<String>> {
    let Some(allow) = allow else {
        return Some(Vec::new());
    };
    let key = format!("{section}.allow_subjects");
    if !has_ca {
        c.at(
            allow.span(),
            key,
            "needs client_ca (and tls_cert, tls_key): only a certificate the CA verified has names to check",
        );
        return None;
    }
    let names = allow.get_ref();
    if names.is_empty() || names.len() > MAX_ALLOW_SUBJECTS {
        c.at(
            allow.span(),
            key,
            format!(
                "lists {} names: list 1 to {MAX_ALLOW_SUBJECTS} (leave the key out to accept every certificate client_ca signed)",
                names.len()
            ),
        );
        return None;
    }
    if let Some(bad) = names
        .iter()
        .find(|n| n.is_empty() || n.len() > 255 || !n.chars().all(|ch| ch.is_ascii_graphic() || ch == ' '))
    {
        c.at(
            allow.span(),
            key,
            format!(
                "{bad:?} is not a certificate name: use a common name or DNS name, 1 to 255 printable ASCII characters"
            ),
        );
        return None;
    }
    Some(names.iter().map(|n| n.to_ascii_lowercase()).collect())
}
