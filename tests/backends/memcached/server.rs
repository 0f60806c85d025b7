//! A private `memcached` per test (Debian's package), as the benchmark's `MemcachedServer`
//! starts it: on a free loopback port, TCP only, with `-M` (no evictions) unless a test asks
//! for an evicting one; ready when it answers `version`; killed by pid on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// Send raw protocol text and read until `until` appears at the end of the answer (bounded).
pub fn memcached_request(port: u16, request: &str, until: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline && !reply.ends_with(until.as_bytes()) {
        match stream.read(&mut buf)? {
            0 => break,
            n => reply.extend_from_slice(&buf[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// A private `memcached` on a free loopback port; killed on drop.
pub struct MemcachedServer {
    pub port: u16,
    evictions: bool,
    /// Listening on this Unix socket instead of TCP (`-s`).
    socket: Option<(tempfile::TempDir, std::path::PathBuf)>,
    /// More `memcached` arguments.
    extra: Vec<String>,
    child: Option<Child>,
}

impl MemcachedServer {
    /// A memcached shared by every test of the run that calls this (see
    /// `shared`), as [`MemcachedServer::start`] starts it.
    pub fn shared() -> Shared<MemcachedServer> {
        static SERVER: std::sync::OnceLock<MemcachedServer> = std::sync::OnceLock::new();
        shared(&SERVER, MemcachedServer::start)
    }

    /// With `-M`: memcached answers "out of memory" instead of evicting.
    pub fn start() -> MemcachedServer {
        MemcachedServer::launch_new(false, &[])
    }

    /// Without `-M`: memcached evicts items when its memory is full (dlock refuses it).
    pub fn start_evicting() -> MemcachedServer {
        MemcachedServer::launch_new(true, &[])
    }

    /// On a Unix socket in a private directory (no TCP); see [`MemcachedServer::socket_path`].
    pub fn start_unix() -> MemcachedServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("memcached.sock");
        let mut server = MemcachedServer {
            port: 0,
            evictions: false,
            socket: Some((dir, path)),
            extra: Vec::new(),
            child: None,
        };
        server.launch();
        server
    }

    pub fn socket_path(&self) -> Option<&std::path::Path> {
        self.socket.as_ref().map(|(_, path)| path.as_path())
    }

    /// With `-M` and extra `memcached` arguments, e.g. `["-o", "no_lru_crawler"]`.
    pub fn start_with(extra: &[&str]) -> MemcachedServer {
        MemcachedServer::launch_new(false, extra)
    }

    fn launch_new(evictions: bool, extra: &[&str]) -> MemcachedServer {
        let mut server = MemcachedServer {
            port: free_port(),
            evictions,
            socket: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = server_binary("memcached", "memcached");
        let user = nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map_or_else(|| "root".to_owned(), |u| u.name);
        let mut command = Command::new(binary);
        match &self.socket {
            Some((_, path)) => command.args(["-s", &path.display().to_string(), "-a", "0700"]),
            None => command.args(["-p", &self.port.to_string(), "-l", "127.0.0.1", "-U", "0"]),
        };
        command.args(["-u", &user, "-m", "64", "-c", "4096"]);
        if !self.evictions {
            command.arg("-M");
        }
        command.args(&self.extra);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(spawn_server(&mut command, "memcached"));
        let port = self.port;
        // A binary-only (`-B binary`) or authenticating (`-Y`) server never answers `version`
        // in text: ready when it accepts connections.
        let silent = self.extra.iter().any(|a| a == "-B" || a == "-Y");
        match self.socket_path() {
            Some(path) => wait_until("memcached socket ready", PATIENCE, || {
                std::os::unix::net::UnixStream::connect(path).is_ok()
            }),
            None if silent => wait_until("memcached listening", PATIENCE, || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            }),
            None => wait_until("memcached ready", PATIENCE, || {
                memcached_request(port, "version\r\n", "\r\n")
                    .is_ok_and(|r| r.starts_with("VERSION"))
            }),
        }
    }

    /// The server's pid (to stop it with SIGSTOP).
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Kill the server (everything it held is gone) and start a fresh one on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Raw protocol text to the server; the answer up to `until`.
    pub fn request(&self, request: &str, until: &str) -> String {
        memcached_request(self.port, request, until).expect("memcached request")
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for MemcachedServer {
    fn crash_and_restart(&mut self) -> bool {
        self.restart();
        true
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((format!("memcached://{addr}"), "a memcached server"))
    }

    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        let socket = dir.join("no-memcached.sock");
        Some((format!("memcached+unix://{}", socket.display()), socket))
    }

    fn url(&self) -> String {
        match self.socket_path() {
            Some(path) => format!("memcached+unix://{}", path.display()),
            None => format!("memcached://127.0.0.1:{}", self.port),
        }
    }

    fn scheme(&self) -> &'static str {
        if self.socket.is_some() {
            "memcached+unix"
        } else {
            "memcached"
        }
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    /// Every item's key and value (the LRU crawler lists the keys).
    fn stored_text(&self) -> Option<String> {
        let listing = self.request("lru_crawler metadump all\r\n", "END\r\n");
        let mut text = String::new();
        for key in listing
            .lines()
            .filter_map(|l| l.split(' ').next()?.strip_prefix("key="))
            .take(10_000)
        {
            let key = percent_decode(key);
            text.push_str(&key);
            // `mn` (no-op) answers `MN` after the item: the end of the answer.
            text.push_str(&self.request(&format!("mg {key} v\r\nmn\r\n"), "MN\r\n"));
        }
        Some(text)
    }
}

impl LeaseServer for MemcachedServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("memcached://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}

/// Undo the percent-encoding of keys in `lru_crawler metadump` output.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = text
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
