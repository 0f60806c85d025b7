//! A private etcd cluster per test (one member, three, or one serving TLS), with `etcdctl`
//! against it and a way to find its leader.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// `GET /health` of an etcd member: healthy when it answers `"health":"true"`.
pub fn etcd_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.contains("\"health\":\"true\"")
}

/// One etcd member started by a test; killed (by pid) when dropped.
pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
}

impl EtcdMember {
    fn launch(&mut self) {
        let binary = server_binary("etcd", "etcd-server");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log");
        let mut command = Command::new(binary);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = Some(spawn_server(&mut command, "etcd"));
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Wait until the member serves clients (bounded by `deadline`); when it exits first or
    /// the deadline passes, say so with the end of its log.
    fn wait_serving(&mut self, tls: bool, deadline: Instant) -> Result<(), String> {
        let port = self.client_port;
        let log = self.log.clone();
        let serving = || {
            if tls {
                std::fs::read_to_string(&log)
                    .is_ok_and(|l| l.contains("serving client traffic securely"))
            } else {
                etcd_healthy(port)
            }
        };
        while !serving() {
            if self.exited() || Instant::now() >= deadline {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!(
                    "member {} (client port {port}) is not serving; its log ends:\n{}",
                    self.name,
                    tail.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Whether the member's process has ended by itself.
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))))
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private etcd cluster (one or three members) on free loopback ports.
pub struct EtcdServer {
    pub members: Vec<EtcdMember>,
    _dir: tempfile::TempDir,
    tls: bool,
}

impl EtcdServer {
    /// A one-member etcd shared by every test of the run that calls this (see
    /// `shared`), as [`EtcdServer::start`] starts it.
    pub fn shared() -> Shared<EtcdServer> {
        static SERVER: std::sync::OnceLock<EtcdServer> = std::sync::OnceLock::new();
        shared(&SERVER, EtcdServer::start)
    }

    pub fn start() -> EtcdServer {
        EtcdServer::cluster(1, &[])
    }

    /// `size` members; `extra` arguments go to every member.
    pub fn cluster(size: usize, extra: &[&str]) -> EtcdServer {
        EtcdServer::build(size, extra, None)
    }

    /// One member serving clients over TLS only, requiring a client certificate from `certs`'
    /// CA.
    pub fn start_tls(certs: &TestCerts) -> EtcdServer {
        let extra = [
            "--cert-file".to_owned(),
            certs.path("server.crt"),
            "--key-file".to_owned(),
            certs.path("server.key"),
            "--trusted-ca-file".to_owned(),
            certs.path("ca.crt"),
            "--client-cert-auth".to_owned(),
        ];
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        EtcdServer::build(1, &extra, Some(()))
    }

    /// Start the members; when one of them exits before serving (a port taken by someone
    /// else between `free_port` and etcd's bind), start over on new ports, up to three times.
    fn build(size: usize, extra: &[&str], tls: Option<()>) -> EtcdServer {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match EtcdServer::try_build(size, extra, tls) {
                Ok(server) => return server,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("etcd did not start:\n{}", failures.join("\n---\n"));
    }

    fn try_build(size: usize, extra: &[&str], tls: Option<()>) -> Result<EtcdServer, String> {
        let client_scheme = if tls.is_some() { "https" } else { "http" };
        // Data on tmpfs when there is one: etcd fsyncs every write.
        let dir = fast_server_dir();
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let token = format!("dlock-test-{}", unique());
        let mut members: Vec<EtcdMember> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let name = format!("m{i}");
                let mut args: Vec<String> = [
                    "--name",
                    &name,
                    "--data-dir",
                    &dir.path().join(&name).display().to_string(),
                    "--listen-client-urls",
                    &format!("{client_scheme}://127.0.0.1:{client}"),
                    "--advertise-client-urls",
                    &format!("{client_scheme}://127.0.0.1:{client}"),
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                    "--initial-cluster",
                    &cluster.join(","),
                    "--initial-cluster-token",
                    &token,
                    "--initial-cluster-state",
                    "new",
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                args.extend(extra.iter().map(|s| s.to_string()));
                EtcdMember {
                    name,
                    client_port: client,
                    args,
                    child: None,
                    log: dir.path().join(format!("m{i}.log")),
                }
            })
            .collect();
        for member in &mut members {
            member.launch();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for member in &mut members {
            member.wait_serving(tls.is_some(), deadline)?;
        }
        Ok(EtcdServer {
            members,
            _dir: dir,
            tls: tls.is_some(),
        })
    }

    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Run `etcdctl` (API v3) against the running members; returns its output.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let endpoints = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut command = Command::new(server_binary("etcdctl", "etcd-client"));
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(args)
            .stdin(Stdio::null());
        output_within(command, PATIENCE)
    }
}

impl EtcdServer {
    /// Index of the member that is the raft leader now.
    pub fn leader(&self) -> usize {
        let out = self.etcdctl(&["endpoint", "status", "-w", "json"]);
        assert!(out.status.success(), "{}", describe(&out));
        let statuses: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("endpoint status JSON");
        for status in statuses.as_array().expect("array") {
            let member = &status["Status"]["header"]["member_id"];
            if member == &status["Status"]["leader"] {
                let endpoint = status["Endpoint"].as_str().unwrap_or_default();
                if let Some(i) = self
                    .members
                    .iter()
                    .position(|m| endpoint.ends_with(&format!(":{}", m.client_port)))
                {
                    return i;
                }
            }
        }
        panic!("no leader among {statuses}");
    }
}

impl LockServer for EtcdServer {
    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((format!("etcd://{addr}"), "an etcd server"))
    }

    fn url(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints())
    }

    fn scheme(&self) -> &'static str {
        if self.tls {
            "etcds"
        } else {
            "etcd"
        }
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }
}

impl LeaseServer for EtcdServer {
    fn port(&self) -> u16 {
        self.members[0].client_port
    }

    fn url_via(&self, port: u16) -> String {
        format!("etcd://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
