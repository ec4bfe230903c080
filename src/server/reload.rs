//! Hot reload: the file is re-read on change and on SIGHUP, parsed and
//! validated whole, then swapped in atomically. A file that fails never
//! replaces the config in force; the reason is logged with its file and
//! line and counted.
//!
//! Changes are found by polling the file's metadata every 500 ms and
//! comparing the SHA-256 of its bytes when the metadata moved: this sees
//! in-place writes and editors or GitOps tools that write a new file and
//! rename it over the old one alike, with no watcher dependency.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::runtime::Runtime;
use crate::sync::Recover;
use crate::telemetry::metrics::ResultLabels;

pub struct Reloader {
    path: PathBuf,
    runtime: Arc<Runtime>,
    /// The config the process started on: what its listeners, workers
    /// and store were built from, whatever reloads said since.
    at_start: Arc<Config>,
    /// SHA-256 of the bytes last tried (by the watcher or by SIGHUP), so a
    /// file is reloaded once per edit whatever triggered it.
    last_tried: std::sync::Mutex<Option<[u8; 32]>>,
}

/// Why a reload was asked for.
type Fingerprint = ((SystemTime, u64, u64), Vec<(PathBuf, Option<SystemTime>, u64, u64)>);

#[derive(Debug, Clone, Copy)]
pub enum Trigger {
    FileChanged,
    Sighup,
}

impl Reloader {
    pub fn new(path: PathBuf, runtime: Arc<Runtime>) -> Reloader {
        // The bytes of the config in force: an edit made between loading
        // and watching is still seen.
        let at_start = runtime.config();
        let last_tried = std::sync::Mutex::new(Some(at_start.inputs_sha256()));
        Reloader {
            path,
            runtime,
            at_start,
            last_tried,
        }
    }

    fn remember(&self, hash: Option<[u8; 32]>) {
        *self.last_tried.lock().recover() = hash;
    }

    fn last_tried(&self) -> Option<[u8; 32]> {
        *self.last_tried.lock().recover()
    }

    /// Reads, validates and applies the file. Counts `ok` or `error`.
    pub async fn reload(&self, trigger: Trigger) -> bool {
        let result = crate::config::load(&self.path);
        let outcome = match result {
            Ok(config) => {
                // The bytes just loaded, not a second read of the file.
                self.remember(Some(config.inputs_sha256()));
                self.warn_about_restart_only_changes(&config);
                for warning in config.warnings() {
                    tracing::warn!("{warning}");
                }
                let sha = config.source.sha256_hex();
                // Each [rls] domain's YAML, as `sha256sum` prints it.
                let rls: Vec<String> = config
                    .rls
                    .iter()
                    .flat_map(|r| r.rules.domain_sha256.iter().map(|(d, s)| format!("{d}:{s}")))
                    .collect();
                let rls = if rls.is_empty() {
                    "none".to_string()
                } else {
                    rls.join(",")
                };
                self.runtime.apply(config).await;
                self.runtime.reload_failed(None);
                tracing::info!(?trigger, sha256 = %sha, %rls, "config reloaded");
                "ok"
            }
            Err(e) => {
                self.remember(self.hash());
                tracing::error!(?trigger, error = %e, "config reload failed: keeping the config in force");
                self.runtime.reload_failed(Some(crate::runtime::ReloadFailure {
                    at: crate::clock::wall_now(),
                    why: e.to_string(),
                }));
                "error"
            }
        };
        self.runtime
            .metrics
            .config_reloads
            .get_or_create(&ResultLabels { result: outcome })
            .inc();
        outcome == "ok"
    }

    /// Settings bound at start: say so rather than half-apply them.
    fn warn_about_restart_only_changes(&self, new: &Config) {
        for warning in pending_restart(&self.at_start, &self.runtime.config(), new) {
            tracing::warn!("{warning}");
        }
    }

    /// Polls the file and reloads when its bytes change. Runs forever.
    pub async fn watch(self: Arc<Self>) {
        // No fingerprint yet: the first poll compares the file's hash with
        // the config in force.
        let mut seen = None;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.fingerprint();
            if now == seen {
                continue;
            }
            seen = now;
            let hash = self.hash();
            if hash.is_some() && hash != self.last_tried() {
                self.reload(Trigger::FileChanged).await;
            }
        }
    }

    /// runtime.toml's modification time, size and inode, and the `[rls]`
    /// files' (named by the config in force).
    fn fingerprint(&self) -> Option<Fingerprint> {
        let m = std::fs::metadata(&self.path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&m);
        #[cfg(not(unix))]
        let inode = 0;
        let mut files = self
            .rls_path()
            .map(|p| crate::config::rls::fingerprint_of(&p))
            .unwrap_or_default();
        // The certificates, keys and CAs in force: replaced on disk, they
        // are reloaded like an edit.
        let config = self.runtime.config();
        {
            for path in config.tls_files() {
                let (modified, len, inode) = match std::fs::metadata(path) {
                    Ok(m) => {
                        #[cfg(unix)]
                        let inode = std::os::unix::fs::MetadataExt::ino(&m);
                        #[cfg(not(unix))]
                        let inode = 0;
                        (m.modified().ok(), m.len(), inode)
                    }
                    Err(_) => (None, 0, 0),
                };
                files.push((path.to_path_buf(), modified, len, inode));
            }
        }
        Some(((m.modified().ok()?, m.len(), inode), files))
    }

    /// The digest a load of the files on disk would record
    /// ([`Config::inputs_sha256`]).
    fn hash(&self) -> Option<[u8; 32]> {
        let bytes = std::fs::read(&self.path).ok()?;
        let toml: [u8; 32] = Sha256::digest(&bytes).into();
        // Unreadable YAML: a digest of zeros, unlike the one in force, so
        // a reload runs and reports it.
        let rls = self
            .rls_path()
            .map(|p| crate::config::rls::digest_of(&p).unwrap_or_default());
        let config = self.runtime.config();
        let files = config.tls_files();
        let tls = (!files.is_empty()).then(|| crate::config::tls_files_digest(&files));
        Some(crate::config::inputs_digest_with_tls(&toml, rls.as_ref(), tls.as_ref()))
    }

    /// The `[rls] config` the file on disk names (resolved as a load
    /// resolves it), else the one in force: after an edit that moved it
    /// was refused, the new place is the one to watch.
    fn rls_path(&self) -> Option<PathBuf> {
        #[derive(serde::Deserialize)]
        struct Peek {
            rls: Option<PeekRls>,
        }
        #[derive(serde::Deserialize)]
        struct PeekRls {
            config: Option<String>,
        }
        let on_disk = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| toml::from_str::<Peek>(&t).ok())
            .map(|p| p.rls.and_then(|r| r.config));
        match on_disk {
            Some(named) => {
                let base = self.path.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
                named.map(|c| base.join(c))
            }
            None => self.runtime.config().rls.as_ref().map(|r| r.config_path.clone()),
        }
    }
}

/// What a reload to `new` has to say needs a restart, the config in force
/// being `last` and the process having started on `at_start`: what
/// differs from both. A setting put back as it was at start (the address
/// actually bound) needs nothing; one a reload before changed, and this
/// one leaves alone, was said then.
pub fn pending_restart(at_start: &Config, last: &Config, new: &Config) -> Vec<String> {
    let since_last = restart_only_changes(last, new);
    restart_only_changes(at_start, new)
        .into_iter()
        .filter(|w| since_last.contains(w))
        .collect()
}

/// What a reload from `old` to `new` cannot apply, one message per group of
/// settings bound at start: listener addresses, TLS material, worker count,
/// connection and header limits, the access-log writer and the store. The
/// reload logs each at WARN; `docs/operations.md` lists them (a test holds
/// the two together).
pub fn restart_only_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut warn = |changed: bool, message: &str| {
        if changed {
            out.push(message.to_string());
        }
    };
    let (o, n) = (&old.listeners, &new.listeners);
    warn(
        o.http != n.http || o.https != n.https || o.admin != n.admin,
        "listener addresses changed: they apply after a restart",
    );
    // Certificates apply at a reload, to new handshakes (a new https
    // listener is the listeners' warning above).
    let g = |c: &Config| {
        (
            c.gateway.workers,
            c.gateway.max_connections,
            c.gateway.max_header_bytes,
            c.gateway.header_read_timeout,
            c.gateway.grace_period,
            c.gateway.max_connections_per_ip,
            c.gateway.idle_timeout,
        )
    };
    warn(
        g(old) != g(new),
        "[gateway] workers, connection, header or grace settings changed: they apply after a restart",
    );
    warn(
        old.identity.trusted_proxies != new.identity.trusted_proxies,
        "[identity] trusted_proxies changed: identities use the new list now; the per-address connection cap's exemptions apply after a restart",
    );
    warn(
        old.identity.ipv6_prefix != new.identity.ipv6_prefix,
        "[identity] ipv6_prefix changed: identities use it now; the per-address connection cap's grouping applies after a restart",
    );
    warn(
        old.tls.as_ref().map(|t| t.client_hello_timeout) != new.tls.as_ref().map(|t| t.client_hello_timeout),
        "[tls] client_hello_timeout_ms changed: it applies after a restart",
    );
    warn(
        old.gateway.access_log != new.gateway.access_log,
        "[gateway] access_log changed: the format applies after a restart",
    );
    warn(
        old.store.max_keys != new.store.max_keys,
        "[store] max_keys changed: it applies after a restart",
    );
    warn(
        (&old.store.backend, old.store.ca.as_ref().map(|c| &c.pem))
            != (&new.store.backend, new.store.ca.as_ref().map(|c| &c.pem)),
        "[store] backend changed: it applies after a restart",
    );
    warn(
        old.store.connect_timeout != new.store.connect_timeout,
        "[store] connect_timeout_ms changed: it applies at the next start",
    );
    warn(
        (old.store.timeout, old.store.breaker) != (new.store.timeout, new.store.breaker),
        "[store] timeout_ms or [store.breaker] changed: they apply after a restart",
    );
    warn(
        old.rls.as_ref().map(|r| r.listen) != new.rls.as_ref().map(|r| r.listen),
        "[rls] listen changed: it applies after a restart",
    );
    // New certificates at the same paths apply at the next handshake;
    // turning TLS on or off, or a new peer check, needs a restart.
    let peer_tls = |t: Option<&crate::config::PeerTls>| t.map(|t| (t.cert.clone(), t.key.clone(), t.client_ca.clone()));
    warn(
        peer_tls(old.rls.as_ref().and_then(|r| r.tls.as_ref()))
            != peer_tls(new.rls.as_ref().and_then(|r| r.tls.as_ref()))
            || old.rls.as_ref().map(|r| r.workers) != new.rls.as_ref().map(|r| r.workers),
        "[rls] tls_cert, tls_key, client_ca or workers changed: they apply after a restart",
    );
    let region = |r: Option<&crate::config::Region>| {
        r.map(|r| {
            (
                (r.name.clone(), r.share, r.link, r.primary.clone()),
                (r.rebalance_at, r.rebalance_window, r.id_secret.clone()),
                peer_tls(r.tls.as_ref()),
            )
        })
    };
    warn(
        region(old.region.as_ref()) != region(new.region.as_ref()),
        "[region] changed: it applies after a restart",
    );
    out
}
