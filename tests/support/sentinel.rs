//! Redis behind Sentinel for the tests: a master, one replica and three `redis-sentinel`s on
//! free loopback ports in a temp dir (as `../shared/bench/servers.py`'s `RedisSentinelServer`
//! does), ready when the replica is in sync and every sentinel knows the master, the replica
//! and the other sentinels. Every process is killed by pid on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The master's name in the sentinels' configuration.
pub const MASTER_NAME: &str = "mymaster";

/// A master, a replica and three sentinels.
pub struct SentinelServer {
    /// The two data nodes: `nodes[0]` starts as the master.
    pub nodes: [RedisServer; 2],
    pub sentinel_ports: [u16; 3],
    /// The sentinels' `requirepass`, if any.
    pub password: Option<String>,
    sentinels: Vec<Child>,
    dir: tempfile::TempDir,
}

impl SentinelServer {
    pub fn start() -> SentinelServer {
        SentinelServer::start_with(None)
    }

    /// With `requirepass <password>` on the sentinels (not on the data nodes).
    pub fn start_with(password: Option<&str>) -> SentinelServer {
        let binary = server_binary("redis-sentinel", "redis-sentinel");
        let master = RedisServer::start();
        let master_port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]);
        let dir = tempfile::tempdir().expect("temp dir");
        let sentinel_ports = [free_port(), free_port(), free_port()];
        let mut sentinels = Vec::new();
        for port in sentinel_ports {
            let config = dir.path().join(format!("sentinel-{port}.conf"));
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.path().display()
            );
            if let Some(password) = password {
                text.push_str(&format!("requirepass {password}\n"));
            }
            std::fs::write(&config, text).expect("sentinel config");
            let log = std::fs::File::create(dir.path().join(format!("sentinel-{port}.log")))
                .expect("log file");
            sentinels.push(
                Command::new(&binary)
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().expect("log"))
                    .stderr(log)
                    .spawn()
                    .expect("start redis-sentinel"),
            );
        }
        let server = SentinelServer {
            nodes: [master, replica],
            sentinel_ports,
            password: password.map(str::to_owned),
            sentinels,
            dir,
        };
        wait_until("the replica and the sentinels ready", PATIENCE, || {
            server.is_ready()
        });
        server
    }

    fn is_ready(&self) -> bool {
        let replica = redis_resp(self.nodes[1].port, &["INFO", "replication"]).unwrap_or_default();
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
        let reply = match &self.password {
            // Two commands in one request: AUTH, then the command.
            Some(password) => redis_pipeline(port, &[&["AUTH", password], args]),
            None => redis_resp(port, args),
        };
        reply.unwrap_or_default()
    }

    /// The `--url`: all three sentinels.
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-sentinel://{}/0#{MASTER_NAME}", hosts.join(","))
    }

    /// The port of the master the sentinels name now.
    pub fn master_port(&self) -> u16 {
        let reply = self.ask(
            self.sentinel_ports[0],
            &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
        );
        // *2 $9 127.0.0.1 $5 port
        reply
            .lines()
            .nth(4)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no master address in {reply:?}"))
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
        while !self
            .ask(
                self.sentinel_ports[0],
                &["SENTINEL", "FAILOVER", MASTER_NAME],
            )
            .starts_with("+OK")
        {
            assert!(
                Instant::now() < deadline,
                "the sentinels refused to fail over"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        wait_until("the sentinels name the new master", PATIENCE, || {
            self.master_port() != old
        });
    }

    /// Kill every sentinel (the data nodes keep running).
    pub fn stop_sentinels(&mut self) {
        for mut child in self.sentinels.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
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
        "redis-sentinel"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn stored_text(&self) -> Option<String> {
        self.master().stored_text()
    }
}

impl LeaseServer for SentinelServer {
    /// The first sentinel: a holder that cannot reach the sentinels cannot renew.
    fn port(&self) -> u16 {
        self.sentinel_ports[0]
    }

    fn url_via(&self, port: u16) -> String {
        format!("redis-sentinel://127.0.0.1:{port}/0#{MASTER_NAME}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}

/// Several commands in one request (RESP arrays); the raw replies (bounded read).
pub fn redis_pipeline(port: u16, commands: &[&[&str]]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut request = String::new();
    for args in commands {
        request.push_str(&format!("*{}\r\n", args.len()));
        for arg in *args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !reply.is_empty() {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    // Drop the +OK of AUTH, so that callers see the command's reply.
    Ok(text
        .strip_prefix("+OK\r\n")
        .map(str::to_owned)
        .unwrap_or(text))
}
