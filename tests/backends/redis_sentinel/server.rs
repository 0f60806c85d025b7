//! Redis behind Sentinel for the tests: a master, one replica and three `redis-sentinel`s on
//! free loopback ports in a temp dir (as `../shared/bench/servers.py`'s `RedisSentinelServer`
//! does), ready when the replica is in sync and every sentinel knows the master, the replica
//! and the other sentinels. Every process is killed by pid on drop.
//!
//! [`SentinelServer::start_tls`] makes every process speak TLS only (clients, replication, the
//! sentinels' links to the data nodes and to each other), as Redis documents it: `port 0`,
//! `tls-port`, and `tls-replication yes`, which also turns the sentinels' own links to TLS.
//!
//! The sentinels listen on `127.0.0.1` and, where the host has it, `::1`: one sentinel that a
//! URL can name at two addresses.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The master's name in the sentinels' configuration.
pub const MASTER_NAME: &str = "mymaster";

/// A master, a replica and three sentinels.
pub struct SentinelServer {
    /// The two data nodes: `nodes[0]` starts as the master.
    pub nodes: [RedisServer; 2],
    pub sentinel_ports: [u16; 3],
    /// The sentinels' `requirepass`, if any.
    pub password: Option<String>,
    /// With TLS only: the certificates (the servers want a client certificate).
    tls: Option<TestCerts>,
    sentinels: Vec<Child>,
    dir: tempfile::TempDir,
}

impl SentinelServer {
    /// A Sentinel group (master, replica, three sentinels) shared by every test of the run that calls this (see
    /// `shared`), as [`SentinelServer::start`] starts it.
    pub fn shared() -> Shared<SentinelServer> {
        static SERVER: std::sync::OnceLock<SentinelServer> = std::sync::OnceLock::new();
        shared(&SERVER, SentinelServer::start)
    }

    pub fn start() -> SentinelServer {
        SentinelServer::start_with(None)
    }

    /// With `requirepass <password>` on the sentinels (not on the data nodes).
    pub fn start_with(password: Option<&str>) -> SentinelServer {
        SentinelServer::start_full(password, None)
    }

    /// Every process speaks TLS only, to clients and to each other, and wants a client
    /// certificate signed by the test CA (`certs()`: `ca.crt`, `client.crt`, `client.key`).
    pub fn start_tls() -> SentinelServer {
        SentinelServer::start_full(None, Some(TestCerts::make()))
    }

    /// The test certificates of a TLS set-up.
    pub fn certs(&self) -> &TestCerts {
        self.tls.as_ref().expect("a TLS set-up")
    }

    fn start_full(password: Option<&str>, tls: Option<TestCerts>) -> SentinelServer {
        let settings = tls.as_ref().map(tls_settings).unwrap_or_default();
        // A data node: with TLS, on a TLS port only (later arguments win over the harness's
        // `--port`).
        let node = |extra: &[&str]| {
            if tls.is_none() {
                return RedisServer::start_with(extra);
            }
            let port = free_port();
            let mut args: Vec<String> = vec!["--port".into(), "0".into()];
            args.extend(["--tls-port".into(), port.to_string()]);
            for (key, value) in &settings {
                args.extend([format!("--{key}"), value.clone()]);
            }
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            RedisServer::start_on(port, &args.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let master = node(&[]);
        let master_port = master.port.to_string();
        let replica = node(&["--replicaof", "127.0.0.1", &master_port]);
        let dir = server_dir();
        let sentinel_ports = [free_port(), free_port(), free_port()];
        let mut sentinels = Vec::new();
        for port in sentinel_ports {
            let config = dir.path().join(format!("sentinel-{port}.conf"));
            let mut text = if tls.is_some() {
                format!("port 0\ntls-port {port}\n")
            } else {
                format!("port {port}\n")
            };
            for (key, value) in &settings {
                text.push_str(&format!("{key} {value}\n"));
            }
            // Over TLS a sentinel's new link to a just-promoted master can take long enough
            // that with 1 s all three flagged it down about 1 s after the switch and failed
            // back (seen once in three failovers on a loaded machine, Redis 7.0.15): a second
            // failover the test did not ask for. Failovers here are asked for (SENTINEL
            // FAILOVER), so a longer bound costs nothing.
            let down_after = if tls.is_some() { 5000 } else { 1000 };
            text.push_str(&format!(
                "bind 127.0.0.1 -::1\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down_after}\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.path().display()
            ));
            if let Some(password) = password {
                text.push_str(&format!("requirepass {password}\n"));
            }
            std::fs::write(&config, text).expect("sentinel config");
            sentinels.push(spawn_sentinel(dir.path(), port));
        }
        let server = SentinelServer {
            nodes: [master, replica],
            sentinel_ports,
            password: password.map(str::to_owned),
            tls,
            sentinels,
            dir,
        };
        wait_until("the replica and the sentinels ready", PATIENCE, || {
            server.pace();
            server.is_ready()
        });
        server
    }

    fn is_ready(&self) -> bool {
        let replica = self.node_text(self.nodes[1].port, &["INFO", "replication"]);
        if !replica.contains("master_link_status:up") {
            return false;
        }
        let master = self.nodes[0].port.to_string();
        for port in self.sentinel_ports {
            if !self
                .ask(port, &["SENTINEL", "get-master-addr-by-name", MASTER_NAME])
                .contains(&master)
            {
                return false;
            }
        }
        let info = self.ask(self.sentinel_ports[0], &["INFO", "sentinel"]);
        info.contains("sentinels=3") && info.contains("slaves=1")
    }

    /// One command to the sentinel on `port` (authenticating first when it wants a password);
    /// the raw reply, empty when it did not answer.
    pub fn ask(&self, port: u16, args: &[&str]) -> String {
        self.ask_reply(port, args).unwrap_or_default()
    }

    /// As [`SentinelServer::ask`], with the error when the sentinel could not be asked.
    fn ask_reply(&self, port: u16, args: &[&str]) -> std::io::Result<String> {
        if let Some(certs) = &self.tls {
            return Ok(tls_cli(certs, port, self.password.as_deref(), args));
        }
        match &self.password {
            // Two commands in one request: AUTH, then the command, whose reply follows
            // AUTH's +OK (dropped, so that callers see the command's reply).
            Some(password) => redis_pipeline(port, &[&["AUTH", password], args]).map(|text| {
                text.strip_prefix("+OK\r\n")
                    .map(str::to_owned)
                    .unwrap_or(text)
            }),
            None => redis_resp(port, args),
        }
    }

    /// One command to the data node on `port` (over TLS with redis-cli when the set-up is
    /// TLS, then the reply as redis-cli prints it); the reply, empty when it did not answer.
    pub fn node_text(&self, port: u16, args: &[&str]) -> String {
        match &self.tls {
            Some(certs) => tls_cli(certs, port, None, args),
            None => redis_resp(port, args).unwrap_or_default(),
        }
    }

    /// Between polls: with TLS each question starts a redis-cli, so not every 5 ms.
    fn pace(&self) {
        if self.tls.is_some() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `--url`: all three sentinels.
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("{}://{}/0#{MASTER_NAME}", self.scheme(), hosts.join(","))
    }

    /// The port of the master the sentinels name now. A sentinel slow to answer on a busy
    /// machine is asked again (bounded by [`PATIENCE`]); the panic names what it last said.
    pub fn master_port(&self) -> u16 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let reply = self.ask_reply(
                self.sentinel_ports[0],
                &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
            );
            // RESP (*2 $9 127.0.0.1 $5 port) or redis-cli's lines (127.0.0.1, port).
            let port = reply.as_ref().ok().and_then(|reply| {
                reply
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.starts_with(['*', '$']))
                    .nth(1)
                    .and_then(|p| p.trim().parse().ok())
            });
            match port {
                Some(port) => return port,
                None if Instant::now() < deadline => {
                    self.pace();
                    std::thread::sleep(Duration::from_millis(20));
                }
                None => panic!(
                    "no master address from sentinel {} within {PATIENCE:?}: {reply:?}",
                    self.sentinel_ports[0]
                ),
            }
        }
    }

    /// The data node the sentinels name master now.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the master is one of the nodes")
    }

    /// Ask the sentinels to promote the replica; returns when they name the new master.
    pub fn failover(&self) {
        let old = self.master_port();
        let deadline = Instant::now() + PATIENCE;
        // Right after start-up the sentinels may not rate the replica promotable yet.
        // The reply is "+OK" in RESP, "OK" from redis-cli.
        while self
            .ask(
                self.sentinel_ports[0],
                &["SENTINEL", "FAILOVER", MASTER_NAME],
            )
            .trim()
            .trim_start_matches('+')
            != "OK"
        {
            assert!(
                Instant::now() < deadline,
                "the sentinels refused to fail over"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        wait_until("the sentinels name the new master", PATIENCE, || {
            self.pace();
            self.master_port() != old
        });
    }

    /// Send `signal` to sentinel `i` (SIGSTOP: it stops answering, as behind a partition;
    /// SIGCONT: it goes on from where it was, with the view it had).
    pub fn signal_sentinel(&self, i: usize, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.sentinels[i].id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal a sentinel");
    }

    /// Kill sentinel `i` and start it again from its configuration file, which holds what
    /// it knew when it last wrote it (the master, the epoch, the other sentinels); returns
    /// when it answers.
    pub fn restart_sentinel(&mut self, i: usize) {
        let _ = self.sentinels[i].kill();
        let _ = self.sentinels[i].wait();
        let port = self.sentinel_ports[i];
        self.sentinels[i] = spawn_sentinel(self.dir.path(), port);
        wait_until("the sentinel answers again", PATIENCE, || {
            self.pace();
            self.ask(port, &["PING"]).contains("PONG")
        });
    }

    /// The pid of the data node on `port`, as the server itself reports it (for SIGSTOP /
    /// SIGCONT with [`signal_pid`]; asked while it still answers).
    pub fn node_pid(&self, port: u16) -> i32 {
        assert!(
            self.nodes.iter().any(|n| n.port == port),
            "not one of our data nodes"
        );
        let info = self.node_text(port, &["INFO", "server"]);
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no process_id in {info:?}"))
    }

    /// A URL naming `hosts` (`host:port` each) as the sentinels.
    pub fn url_of(&self, hosts: &[String]) -> String {
        format!("{}://{}/0#{MASTER_NAME}", self.scheme(), hosts.join(","))
    }

    /// Kill every sentinel (the data nodes keep running).
    pub fn stop_sentinels(&mut self) {
        for mut child in self.sentinels.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.stop_sentinels();
    }
}

impl LockServer for SentinelServer {
    fn url(&self) -> String {
        self.sentinel_url()
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss-sentinel"
        } else {
            "redis-sentinel"
        }
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn stored_text(&self) -> Option<String> {
        // The raw reader speaks plain text only.
        if self.tls.is_some() {
            return None;
        }
        self.master().stored_text()
    }
}

impl LeaseServer for SentinelServer {
    /// The first sentinel: [`LeaseServer::url_via`] lists it with one other of the three, so
    /// that without it no majority answers and the holder cannot renew.
    fn port(&self) -> u16 {
        self.sentinel_ports[0]
    }

    fn url_via(&self, port: u16) -> String {
        format!(
            "redis-sentinel://127.0.0.1:{port},127.0.0.1:{}/0#{MASTER_NAME}",
            self.sentinel_ports[1]
        )
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}

/// Send `signal` to `pid` (a process the harness started).
pub fn signal_pid(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal a process");
}

/// Start `redis-sentinel` with the configuration file for `port` in `dir` (its log appended
/// to `sentinel-<port>.log` there).
fn spawn_sentinel(dir: &std::path::Path, port: u16) -> Child {
    let config = dir.join(format!("sentinel-{port}.conf"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("sentinel-{port}.log")))
        .expect("log file");
    let mut command = Command::new(server_binary("redis-sentinel", "redis-sentinel"));
    command
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    spawn_server(&mut command, "redis-sentinel")
}

/// The TLS settings of every process, as `redis.conf` directives (`--directive value` on the
/// command line): its certificate, the client certificate it shows to the others, the CA, and
/// TLS for replication (and, in a sentinel, to the data nodes and the other sentinels).
fn tls_settings(certs: &TestCerts) -> Vec<(&'static str, String)> {
    vec![
        ("tls-cert-file", certs.path("server.crt")),
        ("tls-key-file", certs.path("server.key")),
        ("tls-client-cert-file", certs.path("client.crt")),
        ("tls-client-key-file", certs.path("client.key")),
        ("tls-ca-cert-file", certs.path("ca.crt")),
        ("tls-auth-clients", "yes".into()),
        ("tls-replication", "yes".into()),
    ]
}

/// `redis-cli --tls` with the test client certificate: one command to the server on `port`,
/// its reply as redis-cli prints it to a pipe (empty when it did not answer).
fn tls_cli(certs: &TestCerts, port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut command = Command::new(server_binary("redis-cli", "redis-tools"));
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls"])
        .args(["--cacert", &certs.path("ca.crt")])
        .args(["--cert", &certs.path("client.crt")])
        .args(["--key", &certs.path("client.key")]);
    if let Some(password) = password {
        command.args(["--no-auth-warning", "-a", password]);
    }
    command.args(args).stdin(Stdio::null());
    let out = output_within(command, Duration::from_secs(10));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
