//! Planes open to whoever reaches them: `[rls]` or the region link
//! listening beyond loopback without checking its peers (no `client_ca`).
//! `check` and start warn of each, one line naming the plane;
//! `[gateway] strict = true` refuses the config instead.
//!
//! Loopback is the one address where "whoever reaches it" is this host.
//! Anything else (a private address included) is reachable by every
//! machine on that network, which for these planes means spending any
//! limit's quota (RLS) or asking for this region's slice (the link).

use std::net::SocketAddr;

use super::peer_tls::PeerTls;
use super::Config;

/// Why a plane listening on `addr` with `tls` serves whoever reaches it,
/// or `None` when it does not (loopback, or peers verified).
pub(super) fn openness(addr: SocketAddr, tls: Option<&PeerTls>) -> Option<&'static str> {
    if addr.ip().to_canonical().is_loopback() {
        return None;
    }
    match tls {
        None => Some("cleartext and unauthenticated"),
        Some(t) if !t.verifies_peers() => Some("unauthenticated (TLS without client_ca)"),
        Some(_) => None,
    }
}

/// What to do about an open plane, said the same by the warning and the
/// refusal.
pub(super) const REMEDY: &str = "set tls_cert, tls_key and client_ca, or listen on a loopback address";

impl Config {
    /// One line per open plane, for `check` and the start log.
    pub fn open_planes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut warn = |plane: &str, key: &str, addr: SocketAddr, tls: Option<&PeerTls>| {
            if let Some(why) = openness(addr, tls) {
                out.push(format!(
                    "{plane}: {key} {addr} is beyond loopback, {why}: whoever reaches it is served; {REMEDY} \
                     ([gateway] strict = true refuses this)"
                ));
            }
        };
        if let Some(r) = &self.rls {
            warn("rls", "[rls] listen", r.listen, r.tls.as_ref());
        }
        if let Some(r) = &self.region {
            warn("region link", "[region] link", r.link, r.tls.as_ref());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{parse, ConfigError};

    /// A directory holding an RLS YAML file, removed on drop.
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir() -> Dir {
        let d = std::env::temp_dir().join(format!(
            "leasegate-open-planes-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ratelimit.yaml"), "domain: d\n").unwrap();
        Dir(d)
    }

    fn load(d: &Dir, text: &str) -> Result<crate::config::Config, ConfigError> {
        let text = format!("[listeners]\nhttp = \"127.0.0.1:0\"\n{text}");
        parse(&d.0.join("gateway.toml"), &text)
    }

    const RLS: &str = "[rls]\nconfig = \"ratelimit.yaml\"\nlisten = ";
    const REGION: &str = "[region]\nname = \"eu\"\nshare = 0.5\nlink = ";

    #[test]
    fn a_plane_beyond_loopback_without_peer_checks_is_named() {
        let d = dir();
        let c = load(&d, &format!("{RLS}\"0.0.0.0:8081\"\n")).unwrap();
        assert_eq!(
            c.warnings(),
            vec![
                "rls: [rls] listen 0.0.0.0:8081 is beyond loopback, cleartext and unauthenticated: whoever \
                  reaches it is served; set tls_cert, tls_key and client_ca, or listen on a loopback address \
                  ([gateway] strict = true refuses this)"
                    .to_string()
            ]
        );
        assert!(c
            .summary()
            .contains("warning   rls: [rls] listen 0.0.0.0:8081 is beyond loopback"));
        let c = load(&d, &format!("{REGION}\"[::]:9911\"\n")).unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("region link: [region] link [::]:9911 is beyond loopback, cleartext and unauthenticated"),
            "{w:?}"
        );
        let c = load(&d, &format!("{RLS}\"10.0.0.11:8081\"\n")).unwrap();
        assert_eq!(c.warnings().len(), 1, "a private address is beyond loopback");
    }

    #[test]
    fn loopback_planes_are_not_named() {
        let d = dir();
        for text in [
            format!("{RLS}\"127.0.0.1:8081\"\n"),
            format!("{RLS}\"[::1]:8081\"\n"),
            format!("{REGION}\"127.0.0.1:9911\"\n"),
        ] {
            let c = load(&d, &text).unwrap();
            assert!(c.warnings().is_empty(), "{text}: {:?}", c.warnings());
        }
    }

    #[test]
    fn strict_refuses_an_open_plane_at_its_address() {
        let d = dir();
        let text = format!("[gateway]\nstrict = true\n{RLS}\"0.0.0.0:8081\"\n{REGION}\"0.0.0.0:9911\"\n");
        let Err(ConfigError::Invalid(problems)) = load(&d, &text) else {
            panic!("an open plane passed strict");
        };
        let keys: Vec<(&str, Option<usize>)> = problems.iter().map(|p| (p.key.as_str(), p.line)).collect();
        assert_eq!(
            keys,
            [("rls.listen", Some(7)), ("region.link", Some(11))],
            "{problems:?}"
        );
        assert!(
            problems[0].reason.contains(
                "0.0.0.0:8081 is beyond loopback, cleartext and unauthenticated, and [gateway] strict = true"
            ),
            "{problems:?}"
        );
        // Loopback passes strict; so does the default, with a warning.
        let strict_loopback = format!("[gateway]\nstrict = true\n{RLS}\"127.0.0.1:8081\"\n");
        assert!(load(&d, &strict_loopback).is_ok());
        assert!(load(&d, &format!("[gateway]\nstrict = false\n{RLS}\"0.0.0.0:8081\"\n")).is_ok());
        assert!(!load(&d, "").unwrap().gateway.strict);
        assert!(Path::new(&d.0).exists());
    }
}
