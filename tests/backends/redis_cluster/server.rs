//! A private Redis Cluster per test: three (or six, with one replica per master)
//! `redis-server --cluster-enabled yes` nodes on free loopback ports in temp dirs, joined by
//! `redis-cli --cluster create`, ready when every node says `cluster_state:ok` (and every
//! replica has its master's data). Nodes are killed by pid on drop.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// A port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let port = free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair (port, port + 10000) for a cluster node");
}

/// One node of the cluster.
struct ClusterNode {
    port: u16,
    child: Option<Child>,
}

/// A Redis Cluster on loopback; killed on drop.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    dir: tempfile::TempDir,
    /// `requirepass` of every node (and `masterauth`), if any.
    password: Option<String>,
    /// With TLS only (clients, the cluster bus, replication): the certificates.
    tls: Option<TestCerts>,
}

impl RedisCluster {
    /// A three-master cluster shared by every test of the run that calls this (see
    /// `shared`), as [`RedisCluster::start`] starts it.
    pub fn shared() -> Shared<RedisCluster> {
        static SERVER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
        shared(&SERVER, RedisCluster::start)
    }

    /// A cluster whose first master serves every slot shared by every test of the run that calls this (see
    /// `shared`), as [`RedisCluster::start_one_master`] starts it.
    pub fn shared_one_master() -> Shared<RedisCluster> {
        static SERVER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
        shared(&SERVER, RedisCluster::start_one_master)
    }

    /// Three masters, no replicas.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(0)
    }

    /// Three masters, each with `replicas` replicas.
    pub fn start_with(replicas: usize) -> RedisCluster {
        RedisCluster::start_full(replicas, None, None)
    }

    /// Three masters whose nodes all want `password`.
    pub fn start_with_password(password: &str) -> RedisCluster {
        RedisCluster::start_full(0, Some(password), None)
    }

    /// Three masters that speak TLS only, to clients and to each other, and want a client
    /// certificate signed by the test CA.
    pub fn start_tls() -> RedisCluster {
        RedisCluster::start_full(0, None, Some(TestCerts::make()))
    }

    /// The test certificates of a TLS cluster.
    pub fn certs(&self) -> &TestCerts {
        self.tls.as_ref().expect("a TLS cluster")
    }

    /// Three nodes, one master serving every slot and two masters serving none: every call
    /// of every lock goes to the first node, so a proxy in front of it carries all of a
    /// holder's traffic (the lease contract's black hole).
    pub fn start_one_master() -> RedisCluster {
        let dir = server_dir();
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
            password: None,
            tls: None,
        };
        for _ in 0..3 {
            let port = free_cluster_port();
            let child = cluster.launch(port);
            cluster.nodes.push(ClusterNode {
                port,
                child: Some(child),
            });
        }
        let ports = cluster.ports();
        let reply = cluster.text(ports[0], &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        assert!(reply.contains("OK"), "CLUSTER ADDSLOTSRANGE: {reply:?}");
        for &port in &ports[1..] {
            let first = ports[0].to_string();
            let reply = cluster.text(port, &["CLUSTER", "MEET", "127.0.0.1", &first]);
            assert!(reply.contains("OK"), "CLUSTER MEET: {reply:?}");
        }
        wait_until("every node knows the others", PATIENCE, || {
            ports.iter().all(|&p| {
                cluster
                    .text(p, &["CLUSTER", "INFO"])
                    .contains("cluster_known_nodes:3")
            })
        });
        cluster.wait_ok(&ports);
        cluster
    }

    fn start_full(replicas: usize, password: Option<&str>, tls: Option<TestCerts>) -> RedisCluster {
        let dir = server_dir();
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
            password: password.map(str::to_owned),
            tls,
        };
        for _ in 0..3 * (1 + replicas) {
            let port = free_cluster_port();
            let child = cluster.launch(port);
            cluster.nodes.push(ClusterNode {
                port,
                child: Some(child),
            });
        }
        let hosts: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = cluster.cli(
            cluster.ports()[0],
            &[
                &["--cluster", "create"],
                &hosts.iter().map(String::as_str).collect::<Vec<_>>()[..],
                &["--cluster-replicas", &replicas.to_string(), "--cluster-yes"],
            ]
            .concat(),
        );
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            describe(&out)
        );
        cluster.wait_ok(&cluster.ports());
        if replicas > 0 {
            wait_until("every replica in sync", PATIENCE, || {
                cluster.ports().iter().all(|&p| {
                    let info = cluster.text(p, &["INFO", "replication"]);
                    info.contains("role:master") || info.contains("master_link_status:up")
                })
            });
        }
        cluster
    }

    fn launch(&self, port: u16) -> Child {
        let binary = server_binary("redis-server", "redis-server");
        let dir = self.dir.path().join(format!("n{port}"));
        std::fs::create_dir_all(&dir).expect("node dir");
        let log = std::fs::File::create(dir.join("redis.log")).expect("log file");
        let ports: Vec<String> = match &self.tls {
            None => vec!["--port".into(), port.to_string()],
            Some(certs) => [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-auth-clients",
                "yes",
                "--tls-cert-file",
                &certs.path("server.crt"),
                "--tls-key-file",
                &certs.path("server.key"),
                "--tls-client-cert-file",
                &certs.path("client.crt"),
                "--tls-client-key-file",
                &certs.path("client.key"),
                "--tls-ca-cert-file",
                &certs.path("ca.crt"),
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        let mut command = Command::new(binary);
        command
            .args(&ports)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &dir.display().to_string()])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args([
                "--cluster-config-file",
                &dir.join("nodes.conf").display().to_string(),
            ])
            .args(
                self.password
                    .iter()
                    .flat_map(|p| ["--requirepass", p, "--masterauth", p]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = spawn_server(&mut command, "redis-server");
        let log = dir.join("redis.log");
        wait_until("cluster node ready", PATIENCE, || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Ready to accept connections"))
        });
        child
    }

    /// Every node's port (masters first, as created).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Wait until every node in `ports` says `cluster_state:ok`.
    pub fn wait_ok(&self, ports: &[u16]) {
        wait_until("cluster_state:ok on every node", PATIENCE, || {
            ports.iter().all(|&p| {
                self.text(p, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            })
        });
    }

    /// The port of the master serving `key`'s slot (asked of a live node).
    pub fn master_of(&self, key: &str) -> u16 {
        self.master_of_slot(self.slot_of(key))
    }

    /// The slot of `key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        let reply = self.answer(self.live_port(), &["CLUSTER", "KEYSLOT", key]);
        reply
            .trim()
            .trim_start_matches(':')
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {reply:?}"))
    }

    /// The port of the master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.try_master_of_slot(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The port of the master serving `slot`, if one does (not during a failover).
    pub fn try_master_of_slot(&self, slot: u16) -> Option<u16> {
        let nodes = self.answer(self.live_port(), &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port: u16 = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .expect("node address");
            for range in &fields[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                    if (a..=b).contains(&slot) {
                        return Some(port);
                    }
                }
            }
        }
        None
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        self.text(port, &["CLUSTER", "MYID"])
            .lines()
            .find(|l| !l.starts_with('$'))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// A node that is running.
    fn live_port(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .expect("a live node")
    }

    /// SIGKILL the node on `port`.
    pub fn kill(&mut self, port: u16) {
        for node in &mut self.nodes {
            if node.port == port {
                if let Some(mut child) = node.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }

    /// `redis-cli -p PORT ARGS…` (with the password and the TLS certificates, if any).
    pub fn cli(&self, port: u16, args: &[&str]) -> Output {
        let mut all: Vec<String> = Vec::new();
        if let Some(password) = &self.password {
            all.extend(["--no-auth-warning".into(), "-a".into(), password.clone()]);
        }
        if let Some(certs) = &self.tls {
            all.extend([
                "--tls".into(),
                "--cacert".into(),
                certs.path("ca.crt"),
                "--cert".into(),
                certs.path("client.crt"),
                "--key".into(),
                certs.path("client.key"),
            ]);
        }
        all.extend(args.iter().map(|a| (*a).to_owned()));
        cli_output(port, &all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// [`RedisCluster::text`] of a live node, asked again while it gives no answer at all
    /// (a node slow to answer on a busy machine), bounded by [`PATIENCE`].
    pub fn answer(&self, port: u16, args: &[&str]) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let reply = self.text(port, args);
            if !reply.trim().is_empty() {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "node {port} gave no answer to {args:?} within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A command's reply as text (RESP when no password is needed, else redis-cli's).
    pub fn text(&self, port: u16, args: &[&str]) -> String {
        if self.password.is_some() || self.tls.is_some() {
            String::from_utf8_lossy(&self.cli(port, args).stdout).into_owned()
        } else {
            redis_resp(port, args).unwrap_or_default()
        }
    }
}

/// `redis-cli` against one node, bounded in time.
fn cli_output(port: u16, args: &[&str]) -> Output {
    let mut command = Command::new(server_binary("redis-cli", "redis-tools"));
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    output_within(command, Duration::from_secs(60))
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl LockServer for RedisCluster {
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .take(3)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}", hosts.join(","))
    }

    fn scheme(&self) -> &'static str {
        "redis"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn stored_text(&self) -> Option<String> {
        let mut text = String::new();
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let cli = |args: &[&str]| {
                let mut all = vec!["--no-raw"];
                all.extend_from_slice(args);
                String::from_utf8_lossy(&self.cli(node.port, &all).stdout).into_owned()
            };
            text.push_str(&stored_keys(cli));
        }
        Some(text)
    }
}

impl LeaseServer for RedisCluster {
    /// The first node (with [`RedisCluster::start_one_master`], the one that serves every slot).
    fn port(&self) -> u16 {
        self.ports()[0]
    }

    fn url_via(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
