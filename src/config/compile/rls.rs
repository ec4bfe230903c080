//! `[rls]`: the gRPC listener for Envoy's rate limit services and the
//! envoyproxy/ratelimit YAML it serves, loaded here so that `check`, start
//! and reload all refuse a bad file.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::Check;
use crate::config::{raw, rls, Rls, RlsFailure};

pub(super) fn rls(c: &mut Check, r: &Spanned<raw::Rls>, base: &Path) -> Option<Rls> {
    let raw = r.get_ref();
    let listen = match &raw.listen {
        None => {
            c.at(
                r.span(),
                "rls.listen",
                "missing: set the gRPC address, such as \"127.0.0.1:8081\"",
            );
            None
        }
        Some(a) => match a.get_ref().parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                c.at(
                    a.span(),
                    "rls.listen",
                    format!("{:?} is not a socket address such as \"127.0.0.1:8081\"", a.get_ref()),
                );
                None
            }
        },
    };
    // "unavailable": answer UNAVAILABLE (Envoy's failure_mode_deny decides
    // per route); "allow": answer OK.
    let on_store_failure = super::choice(
        c,
        raw.on_store_failure.as_ref(),
        "rls.on_store_failure",
        &[("unavailable", RlsFailure::Unavailable), ("allow", RlsFailure::Allow)],
        RlsFailure::Unavailable,
    );
    let Some(config) = &raw.config else {
        c.at(
            r.span(),
            "rls.config",
            "missing: set the envoyproxy/ratelimit YAML file or directory, such as \"ratelimit\"",
        );
        return None;
    };
    let path = base.join(config.get_ref());
    let rules = match rls::load(&path) {
        Ok(rules) => rules,
        Err(problems) => {
            // The YAML's own problems, each in its file; and one here
            // pointing at the key that named it.
            c.at(
                config.span(),
                "rls.config",
                format!("{} has {} problem(s), listed below", path.display(), problems.len()),
            );
            c.problems.extend(problems);
            return None;
        }
    };
    let tls = super::listeners::peer_tls(
        c,
        base,
        ("rls", r.span()),
        [raw.tls_cert.as_ref(), raw.tls_key.as_ref(), raw.client_ca.as_ref()],
        raw.allow_subjects.as_ref(),
        &[b"h2"],
        false,
    );
    let workers: usize = super::in_range(c, &raw.workers, "rls.workers", 1, 64, 1);
    // Off unless asked for: each distinct override makes keys of its own.
    let allow_overrides = raw.allow_overrides.as_ref().is_some_and(|v| *v.get_ref());
    let max_override_values: usize =
        super::in_range(c, &raw.max_override_values, "rls.max_override_values", 1, 10_000, 16);
    let max_hits_fraction = super::in_range(c, &raw.max_hits_fraction, "rls.max_hits_fraction", 0.000_001, 1.0, 0.1);
    Some(Rls {
        listen: listen?,
        config_path: path,
        on_store_failure,
        rules: Arc::new(rules),
        tls,
        workers,
        allow_overrides,
        max_override_values,
        max_hits_fraction,
    })
}
