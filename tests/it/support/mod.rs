//! Test harness: the real `leasegate` binary, real upstreams, real clients,
//! all on 127.0.0.1 ephemeral ports, bounded in time and cleaned up on drop.
#![allow(dead_code)]

pub mod client;
mod config;
pub mod llm_api;
pub mod promql;
pub mod redis;
pub mod relay;
pub mod scripted;
pub mod tls_upstream;
pub mod upstream;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use config::Toml;

/// The suite's one wait loop: polls `check` every 20 ms until it gives
/// `Some` (its value is returned), for `within` at most; then fails the
/// test with `what()`, evaluated only then (so it can show the state the
/// wait gave up on).
pub async fn eventually<T>(
    within: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
    what: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("not within {within:?}: {}", what());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("leasegate-test-{}-{:x}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_leasegate")
}

/// A development certificate for localhost/127.0.0.1 made at test time.
pub struct TestCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCert {
    pub fn new() -> TestCert {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        TestCert {
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
        }
    }
}

/// A private CA made at test time, which issues certificates for
/// 127.0.0.1/localhost good for both server and client authentication.
pub struct TestCa {
    pub cert_pem: String,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let issuer = rcgen::CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        TestCa {
            cert_pem: issuer.pem(),
            issuer,
        }
    }

    /// A certificate with common name `cn`, for localhost and 127.0.0.1.
    pub fn issue(&self, cn: &str) -> TestCert {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

#[derive(Default)]
struct LogState {
    text: String,
    listeners: Vec<(String, SocketAddr)>,
    ready: bool,
    closed: bool,
}

/// A running `leasegate run` process.
pub struct Gateway {
    child: Child,
    log: Arc<(Mutex<LogState>, Condvar)>,
    /// Access-log lines (stdout).
    access: Arc<Mutex<Vec<String>>>,
    /// The thread reading stdout: finished once stdout closed.
    stdout_reader: std::thread::JoinHandle<()>,
    pub dir: TempDir,
    pub config: PathBuf,
    pub cert: Option<TestCert>,
}

impl Gateway {
    /// Starts the gateway on `config` (TOML text). `{cert}` and `{key}` in
    /// the text are replaced by paths of a test certificate.
    pub fn start(config: &str) -> Gateway {
        Gateway::start_with(config, &[])
    }

    /// Starts a gateway whose directory also holds `files` (name, contents),
    /// written before it starts: YAML the config names, keys, ...
    pub fn start_with(config: &str, files: &[(&str, &str)]) -> Gateway {
        Gateway::start_niced(config, files, 0)
    }

    /// As [`Gateway::start_with`], the process run under `nice -n by`
    /// (`nice` execs it: the pid is the gateway's).
    pub fn start_niced(config: &str, files: &[(&str, &str)], by: i32) -> Gateway {
        let dir = TempDir::new();
        for (name, contents) in files {
            if let Some(parent) = Path::new(name).parent() {
                std::fs::create_dir_all(dir.path().join(parent)).unwrap();
            }
            dir.write(name, contents);
        }
        let mut cert = None;
        let mut text = config.to_string();
        if text.contains("{cert}") {
            let c = TestCert::new();
            dir.write("cert.pem", &c.cert_pem);
            dir.write("key.pem", &c.key_pem);
            text = text.replace("{cert}", "cert.pem").replace("{key}", "key.pem");
            cert = Some(c);
        }
        let path = dir.write("gateway.toml", &text);
        let mut command = if by == 0 {
            Command::new(binary())
        } else {
            let mut c = Command::new("nice");
            c.args(["-n", &by.to_string(), binary()]);
            c
        };
        let mut child = command
            .args(["run", "--config"])
            .arg(&path)
            .env("LEASEGATE_LOG", "info,leasegate=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start leasegate");
        let stderr = child.stderr.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let access = Arc::new(Mutex::new(Vec::new()));
        let lines = access.clone();
        let stdout_reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        let log = Arc::new((Mutex::new(LogState::default()), Condvar::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let (state, cv) = &*sink;
                let mut s = state.lock().unwrap();
                if line.contains(" listening") {
                    let field = |name: &str| {
                        line.split_whitespace()
                            .find_map(|t| t.strip_prefix(name))
                            .map(|v| v.trim_matches('"').to_string())
                    };
                    if let (Some(kind), Some(addr)) = (field("kind="), field("addr=")) {
                        s.listeners.push((kind, addr.parse().unwrap()));
                    }
                }
                if line.contains("leasegate ready") {
                    s.ready = true;
                }
                s.text.push_str(&line);
                s.text.push('\n');
                cv.notify_all();
            }
            let (state, cv) = &*sink;
            state.lock().unwrap().closed = true;
            cv.notify_all();
        });
        let gw = Gateway {
            child,
            log,
            access,
            stdout_reader,
            dir,
            config: path,
            cert,
        };
        gw.wait_until(Duration::from_secs(15), |s| s.ready || s.closed);
        assert!(gw.state(|s| s.ready), "leasegate did not become ready:\n{}", gw.log());
        gw
    }

    fn state<T>(&self, f: impl FnOnce(&LogState) -> T) -> T {
        f(&self.log.0.lock().unwrap())
    }

    fn wait_until(&self, timeout: Duration, done: impl Fn(&LogState) -> bool) -> bool {
        let (state, cv) = &*self.log;
        let deadline = Instant::now() + timeout;
        let mut s = state.lock().unwrap();
        while !done(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = cv.wait_timeout(s, left).unwrap().0;
        }
        true
    }

    /// Waits up to `timeout` for a log line containing `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_until(timeout, |s| s.text.contains(needle))
    }

    pub fn addr(&self, kind: &str) -> SocketAddr {
        self.state(|s| s.listeners.iter().find(|(k, _)| k == kind).map(|(_, a)| *a))
            .unwrap_or_else(|| panic!("no {kind} listener announced:\n{}", self.log()))
    }

    pub fn http(&self) -> SocketAddr {
        self.addr("http")
    }

    pub fn https(&self) -> SocketAddr {
        self.addr("https")
    }

    pub fn admin(&self) -> SocketAddr {
        self.addr("admin")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http())
    }

    /// GET `path` on the admin listener; the body (the status must be 200).
    pub async fn admin_get(&self, path: &str) -> String {
        let mut c = client::http1(self.admin()).await;
        let (status, _, body) = client::text(client::send(&mut c, client::get(path)).await).await;
        assert_eq!(status, 200, "{path}: {body}");
        body
    }

    /// The metrics text from the admin listener.
    pub async fn metrics(&self) -> String {
        self.admin_get("/metrics").await
    }

    /// Access-log lines so far.
    pub fn access_log(&self) -> Vec<String> {
        self.access.lock().unwrap().clone()
    }

    pub fn log(&self) -> String {
        self.state(|s| s.text.clone())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`TERM`, `INT`, `HUP`, `KILL`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -s {name} failed");
    }

    /// Stops the gateway as an operator does (SIGTERM) and waits, up to
    /// `timeout`, for it to exit and for its stdout to close: from then on
    /// [`Gateway::access_log`] holds every line it wrote, and no more can
    /// come. Its exit status.
    pub fn stop(&mut self, timeout: Duration) -> ExitStatus {
        self.signal("TERM");
        let status = self
            .wait_exit(timeout)
            .unwrap_or_else(|| panic!("leasegate did not exit within {timeout:?}:\n{}", self.log()));
        let deadline = Instant::now() + timeout;
        while !self.stdout_reader.is_finished() {
            assert!(
                Instant::now() < deadline,
                "leasegate's stdout stayed open after it exited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        status
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `leasegate check` on config text; returns (exit code, stdout, stderr).
pub fn check(config: &str) -> (i32, String, String, TempDir) {
    let dir = TempDir::new();
    let path = dir.write("gateway.toml", config);
    let (code, stdout, stderr) = check_path(&path);
    (code, stdout, stderr, dir)
}

/// Runs `leasegate check` on a config file; returns (exit code, stdout, stderr).
pub fn check_path(path: &Path) -> (i32, String, String) {
    let out = Command::new(binary())
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of the metric sample whose line starts with `name` (labels
/// included, with the trailing space), or 0 when there is none.
pub fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// A port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Fails clearly when a tool the test needs is missing, never skips.
pub fn require_tool(tool: &str, install: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{tool}`: install it with `{install}` (scripts/test.sh checks this too)"
    );
}
