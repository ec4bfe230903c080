//! `[region]`: this region's name, its slice of every quota, its link, and
//! when to ask the primary for more.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::{in_range, Check};
use crate::config::{raw, Region};
use crate::quota::Share;
use crate::region::threshold::IdSecret;

pub(super) fn region(c: &mut Check, spanned: &Spanned<raw::Region>, base: &Path) -> Option<Region> {
    let r = spanned.get_ref();
    let name = r.name.get_ref().clone();
    // The name appears in logs, metrics and transfer ids.
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        c.at(
            r.name.span(),
            "region.name",
            format!("{name:?}: use letters, digits, '_', '-' and '.' only"),
        );
    }
    let share = Share::from_fraction(*r.share.get_ref());
    if share.is_none() {
        c.at(
            r.share.span(),
            "region.share",
            format!(
                "{} is out of range: use a fraction above 0 and at most 1 (this region's slice of every quota)",
                r.share.get_ref()
            ),
        );
    }
    let link = match r.link.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.at(
                r.link.span(),
                "region.link",
                format!("{:?} is not an address such as \"127.0.0.1:9911\"", r.link.get_ref()),
            );
            None
        }
    };
    let tls = super::listeners::peer_tls(
        c,
        base,
        ("region", spanned.span()),
        [r.tls_cert.as_ref(), r.tls_key.as_ref(), r.client_ca.as_ref()],
        r.allow_subjects.as_ref(),
        &[b"http/1.1"],
        true,
    );
    let tls_set = r.tls_cert.is_some() || r.tls_key.is_some();
    let primary = match &r.primary {
        None => None,
        Some(p) => match primary_uri(p.get_ref(), tls_set) {
            Ok(uri) => Some(uri),
            Err(why) => {
                c.at(p.span(), "region.primary", why);
                None
            }
        },
    };
    let rebalance_at = in_range(c, &r.rebalance_at, "region.rebalance_at", 0.000_001, 1.0, 0.8);
    // At least four link timeouts: a transfer whose answer was lost is
    // asked again, and credited, within its window.
    let window = in_range(
        c,
        &r.rebalance_window_ms,
        "region.rebalance_window_ms",
        crate::region::MIN_WINDOW_MS,
        86_400_000,
        20_000,
    );
    let id_secret = r.id_secret_file.as_ref().and_then(|v| id_secret(c, v, base));
    Some(Region {
        name,
        share: share?,
        link: link?,
        primary,
        rebalance_at,
        rebalance_window: Duration::from_millis(window),
        tls,
        id_secret,
    })
}

/// Shortest `id_secret_file` content: guessing it must be out of reach.
const MIN_SECRET_LEN: usize = 16;

/// `[region] id_secret_file`: the fleet's secret for transfer ids, read at
/// load (trimmed of surrounding whitespace).
fn id_secret(c: &mut Check, v: &Spanned<String>, base: &Path) -> Option<IdSecret> {
    let path = super::resolve(base, v.get_ref());
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().len() >= MIN_SECRET_LEN => Some(IdSecret::new(text.trim().as_bytes())),
        Ok(_) => {
            c.at(
                v.span(),
                "region.id_secret_file",
                format!(
                    "{} must hold a secret of at least {MIN_SECRET_LEN} characters, the same on every gateway \
                     (e.g. `openssl rand -hex 32 > {}`)",
                    path.display(),
                    v.get_ref()
                ),
            );
            None
        }
        Err(e) => {
            c.at(
                v.span(),
                "region.id_secret_file",
                format!("cannot read {}: {e}", path.display()),
            );
            None
        }
    }
}

/// `http://host:port` (`https://` with the link's TLS), nothing more: the
/// link speaks HTTP/1.1 to one address.
fn primary_uri(s: &str, tls: bool) -> Result<http::Uri, String> {
    let uri: http::Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is not a URL such as \"http://10.0.0.1:9911\""))?;
    if uri.scheme_str().is_none() {
        return Err(format!("{s:?} is not a URL such as \"http://10.0.0.1:9911\""));
    }
    match (uri.scheme_str(), tls) {
        (Some("http"), false) | (Some("https"), true) => {}
        (_, false) => {
            return Err(format!(
                "{s:?}: without tls_cert and tls_key the link speaks plain http://"
            ))
        }
        (_, true) => return Err(format!("{s:?}: with tls_cert and tls_key the link speaks https://")),
    }
    match uri.authority() {
        Some(a) if a.port_u16().is_some() => {
            let host = a.host().trim_matches(['[', ']']).to_string();
            if tls && rustls_pki_types::ServerName::try_from(host).is_err() {
                return Err(format!(
                    "{s:?}: the host is not a name or address a certificate can carry"
                ));
            }
        }
        _ => return Err(format!("{s:?}: name the primary's link as http://host:port")),
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(format!("{s:?}: give the link's address only, without a path"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use crate::config::{parse, ConfigError};

    const BASE: &str = "[listeners]\nhttp = \"127.0.0.1:0\"\n";

    fn problems(region: &str) -> Vec<(usize, String, String)> {
        let text = format!("{BASE}{region}");
        match parse(Path::new("gw.toml"), &text) {
            Ok(_) => vec![],
            Err(ConfigError::Invalid(p)) => p.into_iter().map(|p| (p.line.unwrap_or(0), p.key, p.reason)).collect(),
            Err(e) => panic!("{e}"),
        }
    }

    fn region(body: &str) -> crate::config::Region {
        let text = format!("{BASE}[region]\n{body}");
        parse(Path::new("gw.toml"), &text).unwrap().region.unwrap()
    }

    #[test]
    fn a_full_region_compiles() {
        let r = region(
            "name = \"eu-central\"\nshare = 0.3\nlink = \"127.0.0.1:9911\"\nprimary = \"http://127.0.0.1:9921\"\nrebalance_at = 0.8\nrebalance_window_ms = 20000\n",
        );
        assert_eq!(r.name, "eu-central");
        assert_eq!(r.share.ppm(), 300_000);
        assert_eq!(r.link, "127.0.0.1:9911".parse().unwrap());
        assert_eq!(r.primary.unwrap().authority().unwrap().as_str(), "127.0.0.1:9921");
        assert_eq!(r.rebalance_at, 0.8);
        assert_eq!(r.rebalance_window.as_millis(), 20_000);
    }

    #[test]
    fn the_primary_is_the_region_without_a_primary_and_defaults_apply() {
        let r = region("name = \"us-east\"\nshare = 1.0\nlink = \"127.0.0.1:9921\"\n");
        assert!(r.primary.is_none());
        assert_eq!(r.rebalance_at, 0.8);
        assert_eq!(r.rebalance_window.as_millis(), 20_000);
    }

    #[test]
    fn every_bad_key_is_named_with_its_line() {
        let p = problems(
            "[region]\nname = \"eu central\"\nshare = 1.5\nlink = \"localhost\"\nprimary = \"https://x:1\"\nrebalance_at = 0.0\nrebalance_window_ms = 0\n",
        );
        let keys: Vec<(usize, &str)> = p.iter().map(|(l, k, _)| (*l, k.as_str())).collect();
        assert_eq!(
            keys,
            vec![
                (4, "region.name"),
                (5, "region.share"),
                (6, "region.link"),
                (7, "region.primary"),
                (8, "region.rebalance_at"),
                (9, "region.rebalance_window_ms"),
            ],
            "{p:?}"
        );
    }

    #[test]
    fn shares_are_in_zero_to_one() {
        for bad in ["0", "0.0", "-0.2", "1.01", "2"] {
            let p = problems(&format!(
                "[region]\nname = \"a\"\nshare = {bad}\nlink = \"127.0.0.1:1\"\n"
            ));
            assert!(p.iter().any(|(_, k, _)| k == "region.share"), "{bad}: {p:?}");
        }
        // An integer 1 reads as the whole, as a float would.
        for ok in ["0.000001", "0.5", "1.0", "1"] {
            let p = problems(&format!(
                "[region]\nname = \"a\"\nshare = {ok}\nlink = \"127.0.0.1:1\"\n"
            ));
            assert!(p.is_empty(), "{ok}: {p:?}");
        }
    }

    #[test]
    fn primary_urls_are_plain_http_host_port() {
        for bad in [
            "127.0.0.1:9921",
            "http://127.0.0.1",
            "http://h:1/v1",
            "ftp://h:1",
            "https://h:1",
        ] {
            let p = problems(&format!(
                "[region]\nname = \"a\"\nshare = 0.5\nlink = \"127.0.0.1:1\"\nprimary = \"{bad}\"\n"
            ));
            assert!(p.iter().any(|(_, k, _)| k == "region.primary"), "{bad}: {p:?}");
        }
        for ok in ["http://127.0.0.1:9921", "http://primary.internal:9921/"] {
            let p = problems(&format!(
                "[region]\nname = \"a\"\nshare = 0.5\nlink = \"127.0.0.1:1\"\nprimary = \"{ok}\"\n"
            ));
            assert!(p.is_empty(), "{ok}: {p:?}");
        }
    }

    #[test]
    fn a_window_is_at_least_four_link_timeouts() {
        let min = crate::region::MIN_WINDOW_MS;
        assert!(u128::from(min) >= 4 * crate::region::link::LINK_TIMEOUT.as_millis());
        let at = |ms: u64| {
            problems(&format!(
                "[region]\nname = \"a\"\nshare = 0.5\nlink = \"127.0.0.1:1\"\nrebalance_window_ms = {ms}\n"
            ))
        };
        for bad in [1, 1_000, min - 1] {
            assert!(
                at(bad).iter().any(|(_, k, _)| k == "region.rebalance_window_ms"),
                "{bad}"
            );
        }
        for ok in [min, 20_000, 86_400_000] {
            assert!(at(ok).is_empty(), "{ok}: {:?}", at(ok));
        }
    }

    #[test]
    fn unknown_and_missing_keys_are_errors() {
        let p = problems("[region]\nname = \"a\"\nshare = 0.5\nlink = \"127.0.0.1:1\"\nweight = 2\n");
        assert!(p.iter().any(|(l, _, r)| *l == 7 && r.contains("weight")), "{p:?}");
        let p = problems("[region]\nname = \"a\"\nshare = 0.5\n");
        assert!(p.iter().any(|(_, _, r)| r.contains("link")), "{p:?}");
    }

    #[test]
    fn every_limit_gets_the_region_share() {
        let text = format!(
            "{BASE}[region]\nname = \"a\"\nshare = 0.25\nlink = \"127.0.0.1:1\"\nprimary = \"http://127.0.0.1:2\"\n\
             [[limits]]\nname = \"l\"\nrate = \"100/min\"\nburst = 200\n"
        );
        let c = parse(Path::new("gw.toml"), &text).unwrap();
        assert_eq!(c.limits[0].share().ppm(), 250_000);
        let text = format!("{BASE}[[limits]]\nname = \"l\"\nrate = \"100/min\"\n");
        let c = parse(Path::new("gw.toml"), &text).unwrap();
        assert!(c.limits[0].share().is_whole());
    }
}
