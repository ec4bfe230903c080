//! Real `redis-server` processes on ephemeral ports: one node, a Redis
//! Cluster of three masters made with `redis-cli --cluster create`, or a
//! master with a replica watched by three sentinels. Killed on drop;
//! nothing is kept on disk.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{require_tool, Gateway, TempDir};

impl Gateway {
    /// Starts a gateway on a Redis store and waits until it has reached
    /// Redis, so no request meets the store before it is connected.
    pub fn start_connected(config: &str) -> Gateway {
        let gw = Gateway::start(config);
        assert!(
            // The store's own line (`...redis::node: connected to Redis`,
            // `...redis: connected to Redis Cluster`): errors quoting
            // "not connected to Redis yet" must not pass for it.
            gw.wait_for_log(": connected to Redis", Duration::from_secs(20)),
            "the gateway never reached Redis:\n{}",
            gw.log()
        );
        gw
    }
}

/// One `redis-server`.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    cluster: bool,
    /// The master's port, for a replica.
    replica_of: Option<u16>,
    /// A TLS port too (the plain one stays, for `cli`), with its
    /// certificate and key files in `dir`.
    pub tls_port: Option<u16>,
    /// TLS only, as a managed Redis is: `port` is its TLS port, replication
    /// and the cluster bus are TLS too, and `cli` speaks TLS
    /// (`redis-cli --tls`).
    tls_only: bool,
}

/// A port that is free, and (for cluster nodes) whose bus port +10000 is too.
fn free_port(cluster: bool) -> u16 {
    for _ in 0..200 {
        let port = fastrand::u16(20_000..50_000);
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && (!cluster || free(port + 10_000)) {
            return port;
        }
    }
    panic!("no free port for redis-server");
}

impl Redis {
    pub fn start() -> Redis {
        Self::start_node(false)
    }

    /// A node on a given port (e.g. one a gateway already points at).
    pub fn start_on(port: u16) -> Redis {
        Self::start_at(port, false)
    }

    /// A replica of `master`, once its link to the master is up and the
    /// first sync is done.
    pub fn start_replica_of(master: &Redis) -> Redis {
        require_tool("redis-server", "apt-get install -y redis-server");
        let mut r = Redis {
            child: None,
            port: free_port(false),
            dir: TempDir::new(),
            cluster: false,
            replica_of: Some(master.port),
            tls_port: None,
            tls_only: false,
        };
        r.spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !r.cli(&["INFO", "replication"]).contains("master_link_status:up") {
            assert!(Instant::now() < deadline, "the replica on {} never synced", r.port);
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    fn start_node(cluster: bool) -> Redis {
        Self::start_at(free_port(cluster), cluster)
    }

    fn start_at(port: u16, cluster: bool) -> Redis {
        require_tool("redis-server", "apt-get install -y redis-server");
        require_tool("redis-cli", "apt-get install -y redis-tools");
        let mut r = Redis {
            child: None,
            port,
            dir: TempDir::new(),
            cluster,
            replica_of: None,
            tls_port: None,
            tls_only: false,
        };
        r.spawn();
        r
    }

    /// A node that also serves TLS (`rediss://`) with a certificate `ca`
    /// signed, and asks no client certificate.
    pub fn start_tls(ca: &super::TestCa) -> Redis {
        require_tool("redis-server", "apt-get install -y redis-server");
        let dir = TempDir::new();
        let cert = ca.issue("redis.test");
        dir.write("redis.pem", &cert.cert_pem);
        dir.write("redis.key", &cert.key_pem);
        dir.write("ca.pem", &ca.cert_pem);
        let mut r = Redis {
            child: None,
            port: free_port(false),
            dir,
            cluster: false,
            replica_of: None,
            tls_port: Some(free_port(false)),
            tls_only: false,
        };
        r.spawn();
        r
    }

    /// A node that serves TLS only, as a managed Redis does, with a
    /// certificate `ca` signed: a cluster node (the bus over TLS too), or a
    /// replica of `replica_of` (replication over TLS).
    pub fn start_tls_only(ca: &super::TestCa, cluster: bool, replica_of: Option<&Redis>) -> Redis {
        require_tool("redis-server", "apt-get install -y redis-server");
        require_tool("redis-cli", "apt-get install -y redis-tools");
        let dir = TempDir::new();
        let cert = ca.issue("redis.test");
        dir.write("redis.pem", &cert.cert_pem);
        dir.write("redis.key", &cert.key_pem);
        dir.write("ca.pem", &ca.cert_pem);
        let port = free_port(cluster);
        let mut r = Redis {
            child: None,
            port,
            dir,
            cluster,
            replica_of: replica_of.map(|m| m.port),
            tls_port: Some(port),
            tls_only: true,
        };
        r.spawn();
        if replica_of.is_some() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !r.cli(&["INFO", "replication"]).contains("master_link_status:up") {
                assert!(Instant::now() < deadline, "the TLS replica on {} never synced", r.port);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        r
    }

    /// `redis-cli`'s arguments that reach this node (over TLS when it
    /// serves TLS only).
    fn cli_args(&self) -> Vec<String> {
        let mut args = vec!["-h".to_string(), "127.0.0.1".into(), "-p".into(), self.port.to_string()];
        if self.tls_only {
            args.extend(["--tls".to_string(), "--cacert".into()]);
            args.push(self.dir.path().join("ca.pem").display().to_string());
        }
        args
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        let plain = if self.tls_only { 0 } else { self.port };
        cmd.args(["--port", &plain.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path());
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-port", &(self.port + 10_000).to_string()])
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"));
        }
        if self.tls_only {
            cmd.args(["--tls-replication", "yes"]);
            if self.cluster {
                cmd.args(["--tls-cluster", "yes"]);
            }
        }
        if let Some(master) = self.replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        if let Some(tls) = self.tls_port {
            let file = |name: &str| self.dir.path().join(name);
            cmd.args(["--tls-port", &tls.to_string(), "--tls-auth-clients", "no"])
                .arg("--tls-cert-file")
                .arg(file("redis.pem"))
                .arg("--tls-key-file")
                .arg(file("redis.key"))
                .arg("--tls-ca-cert-file")
                .arg(file("ca.pem"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cli(&["PING"]).trim() != "PONG" {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not answer PING",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls_only { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this node; returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(self.cli_args())
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Calls of `cmd` (e.g. `evalsha`) this node has served, from
    /// `INFO commandstats`.
    pub fn calls(&self, cmd: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{cmd}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Every script call (EVALSHA and EVAL) so far.
    pub fn script_calls(&self) -> u64 {
        self.calls("evalsha") + self.calls("eval")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server runs").id()
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -s {name} redis-server failed");
    }

    /// SIGKILL: the server dies with everything in it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a fresh, empty server on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server keeps its connections but answers nothing.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    pub fn thaw(&self) {
        self.signal("CONT");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = Command::new("kill")
                .args(["-s", "CONT", &self.pid().to_string()])
                .status();
        }
        self.kill();
    }
}

/// A Redis Cluster of three masters, no replicas.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::create((0..3).map(|_| Redis::start_node(true)).collect())
    }

    /// Three TLS-only masters, their bus over TLS too.
    pub fn start_tls(ca: &super::TestCa) -> Cluster {
        Cluster::create((0..3).map(|_| Redis::start_tls_only(ca, true, None)).collect())
    }

    fn create(nodes: Vec<Redis>) -> Cluster {
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let tls = nodes[0].cli_args().split_off(4);
        let out = Command::new("redis-cli")
            .args(tls)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the cluster did not reach state ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster { nodes }
    }

    /// TOML list of seed URLs.
    pub fn seeds_toml(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(|n| format!("\"{}\"", n.url())).collect();
        format!("[{}]", urls.join(", "))
    }

    /// Keys stored on each master (DBSIZE).
    /// Limit keys (`rl:*`) per master: the fleet's heartbeats (`lg:fleet`)
    /// are not a limit's.
    pub fn key_counts(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.cli(&["--scan", "--pattern", "rl:*"]).lines().count() as u64)
            .collect()
    }
}

/// One `redis-server --sentinel`, monitoring `mymaster`.
pub struct Sentinel {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    /// Serves TLS only (its `port`), and reaches the master over TLS.
    tls: bool,
}

/// The master name every [`Sentinels`] set monitors.
pub const MASTER_NAME: &str = "mymaster";

impl Sentinel {
    fn start(master: u16, ca: Option<&super::TestCa>) -> Sentinel {
        let port = free_port(false);
        let dir = TempDir::new();
        let listen = match ca {
            None => format!("port {port}\n"),
            Some(ca) => {
                let issued = ca.issue("sentinel.test");
                let cert = dir.write("sentinel.pem", &issued.cert_pem);
                let key = dir.write("sentinel.key", &issued.key_pem);
                let ca_file = dir.write("ca.pem", &ca.cert_pem);
                format!(
                    "port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                     tls-auth-clients no\ntls-replication yes\n",
                    cert = cert.display(),
                    key = key.display(),
                    ca = ca_file.display()
                )
            }
        };
        // A sentinel rewrites its config file: it lives in its own dir.
        let conf = dir.write(
            "sentinel.conf",
            &format!(
                "{listen}bind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.path().display()
            ),
        );
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let s = Sentinel {
            child: Some(child),
            port,
            dir,
            tls: ca.is_some(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "the sentinel on {port} did not answer PING");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let mut tls = Vec::new();
        if self.tls {
            tls = vec!["--tls".to_string(), "--cacert".into()];
            tls.push(self.dir.path().join("ca.pem").display().to_string());
        }
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(tls)
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of the master this sentinel names now.
    pub fn master_port(&self) -> Option<u16> {
        let out = self.cli(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// A field of `SENTINEL master mymaster` (e.g. `num-other-sentinels`).
    pub fn master_field(&self, field: &str) -> Option<String> {
        let out = self.cli(&["SENTINEL", "master", MASTER_NAME]);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        lines
            .iter()
            .position(|l| *l == field)
            .and_then(|i| lines.get(i + 1))
            .map(|v| v.to_string())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A master, one replica, and three sentinels (quorum 2) that have found
/// the replica and each other, so a failover can happen.
pub struct Sentinels {
    pub master: Redis,
    pub replica: Redis,
    pub sentinels: Vec<Sentinel>,
}

impl Sentinels {
    pub fn start() -> Sentinels {
        let master = Redis::start();
        let replica = Redis::start_replica_of(&master);
        Sentinels::watch(master, replica, None)
    }

    /// The same over TLS only: the master, the replica (replicating over
    /// TLS) and the sentinels (reaching them over TLS) serve `rediss://`.
    pub fn start_tls(ca: &super::TestCa) -> Sentinels {
        let master = Redis::start_tls_only(ca, false, None);
        let replica = Redis::start_tls_only(ca, false, Some(&master));
        Sentinels::watch(master, replica, Some(ca))
    }

    fn watch(master: Redis, replica: Redis, ca: Option<&super::TestCa>) -> Sentinels {
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(master.port, ca)).collect();
        // Sentinels learn of each other through the master's hello channel
        // (every 2 s), and of the replica from the master's INFO.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sentinels.iter().all(|s| {
            s.master_field("num-other-sentinels").as_deref() == Some("2")
                && s.master_field("num-slaves").as_deref() == Some("1")
        }) {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not find each other and the replica"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Sentinels {
            master,
            replica,
            sentinels,
        }
    }

    /// TOML list of the sentinels' URLs.
    pub fn urls_toml(&self) -> String {
        let urls: Vec<String> = self.sentinels.iter().map(|s| format!("\"{}\"", s.url())).collect();
        format!("[{}]", urls.join(", "))
    }

    /// The master's port as most sentinels name it now.
    pub fn master_port(&self) -> Option<u16> {
        let ports: Vec<u16> = self.sentinels.iter().filter_map(Sentinel::master_port).collect();
        ports
            .iter()
            .copied()
            .max_by_key(|p| ports.iter().filter(|q| *q == p).count())
    }
}
