//! A private `redis-server` per test, and raw commands to it (inline and RESP) for looking at
//! or tampering with what dlock stores.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// Send one inline command to a Redis server and return the first reply line.
pub fn redis_command(port: u16, command: &str) -> std::io::Result<String> {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    (&stream).write_all(format!("{command}\r\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

/// A private `redis-server` on a free loopback port, without persistence; killed on drop.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// A private `redis-server` shared by every test of the run that calls this (see
    /// `shared`), as [`RedisServer::start`] starts it.
    pub fn shared() -> Shared<RedisServer> {
        static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
        shared(&SERVER, RedisServer::start)
    }

    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// With extra `redis-server` arguments, e.g. `["--requirepass", "pw"]`.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_on(free_port(), extra)
    }

    /// On `port`; for TLS pass `["--port", "0", "--tls-port", <port>, …]` in `extra` (later
    /// arguments win).
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port,
            dir: server_dir(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = server_binary("redis-server", "redis-server");
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("log file");
        let mut command = Command::new(binary);
        command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--dir",
                &self.dir.path().display().to_string(),
                "--daemonize",
                "no",
            ])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = spawn_server(&mut command, "redis-server");
        let pid = child.id() as i32;
        self.child = Some(child);
        // Ready when it says so (works for TLS-only servers too); one that exited says why.
        let log = self.dir.path().join("redis.log");
        wait_until("redis-server ready", PATIENCE, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(is_alive(pid), "redis-server exited: {text}");
            text.contains("Ready to accept connections")
        });
    }

    /// Kill the server (SIGKILL, so nothing is saved) and start a fresh one on the same port.
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

    pub fn command(&self, command: &str) -> String {
        redis_command(self.port, command).expect("redis command")
    }

    /// The server's pid (to stop and continue it).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for RedisServer {
    fn crash_and_restart(&mut self) -> bool {
        self.restart();
        true
    }

    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((format!("redis://{addr}/0"), "a Redis server"))
    }

    fn missing_socket_url(&self, dir: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
        let socket = dir.join("no-redis.sock");
        Some((format!("redis+unix://{}", socket.display()), socket))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn scheme(&self) -> &'static str {
        "redis"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }

    fn stored_text(&self) -> Option<String> {
        let cli = |args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--no-raw"])
                .args(args)
                .output()
                .expect("redis-cli (apt-get install redis-tools)");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        Some(stored_keys(cli))
    }
}

impl LeaseServer for RedisServer {
    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}/0")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}

/// Send one command as a RESP array and return the raw reply (bounded read).
pub fn redis_resp(port: u16, args: &[&str]) -> std::io::Result<String> {
    redis_pipeline(port, &[args])
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
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Every key of a Redis node with its value, as `redis-cli --no-raw` prints them, through
/// `cli` (which runs redis-cli with the node's address): what `stored_text` shows.
pub fn stored_keys(cli: impl Fn(&[&str]) -> String) -> String {
    let mut text = String::new();
    for key in cli(&["--scan"]).lines().take(10_000) {
        let key = key.trim().trim_matches('"');
        let read: &[&str] = match cli(&["TYPE", key]).trim() {
            "string" => &["GET"],
            "hash" => &["HGETALL"],
            "list" => &["LRANGE"],
            "zset" => &["ZRANGE"],
            "set" => &["SMEMBERS"],
            _ => continue,
        };
        let mut args = vec![read[0], key];
        if matches!(read[0], "LRANGE" | "ZRANGE") {
            args.extend(["0", "-1"]);
        }
        text.push_str(key);
        text.push_str(&cli(&args));
    }
    text
}

/// One `redis-server --sentinel` on a free loopback port, watching a master called `name`
/// at `master_port` (it need not be up); killed on drop. For what dlock says when it is given
/// a sentinel as if it were a Redis server.
pub struct LoneSentinel {
    pub port: u16,
    _dir: tempfile::TempDir,
    child: Child,
}

impl LoneSentinel {
    pub fn start(name: &str, master_port: u16) -> LoneSentinel {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!("sentinel monitor {name} 127.0.0.1 {master_port} 1\n"),
        )
        .expect("sentinel.conf");
        let port = free_port();
        let log = dir.path().join("sentinel.log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(server_binary("redis-server", "redis-server"));
        command
            .arg(&config)
            .arg("--sentinel")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", &dir.path().display().to_string()])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        let child = spawn_server(&mut command, "redis-server --sentinel");
        let sentinel = LoneSentinel {
            port,
            _dir: dir,
            child,
        };
        wait_until("the sentinel ready", PATIENCE, || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("+monitor master"))
        });
        sentinel
    }
}

impl Drop for LoneSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
