//! Shared test support: a per-test environment around the real `dlock` binary, lock servers
//! to run the contract against, readiness waits with bounds, and process helpers.
//!
//! Every wait here is bounded in time and synchronises on something observable (a file, an
//! exit), never on a fixed sleep.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Generous bound for anything that should take milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A lock service the contract tests can run against.
pub trait LockServer: Send + Sync {
    /// The `--url` of this server.
    fn url(&self) -> String;
    /// DLOCK_BACKEND as the command sees it.
    fn scheme(&self) -> &'static str;
    /// Take the lock away from its current holder behind dlock's back (the holder must then
    /// detect the loss). By default `dlock release --force`.
    fn break_hold(&self, env: &TestEnv, name: &str) {
        let out = env.run(["release", "--force", name]);
        assert!(
            out.status.success(),
            "release --force failed: {}",
            describe(&out)
        );
    }
    /// The `--ttl` the tests use (short, so that renewals and loss detection are quick).
    fn ttl(&self) -> Option<&'static str> {
        None
    }
    /// Everything the backend stores, as text, where a test can read it raw (lock files,
    /// Redis keys); `None` where only dlock's own `status` can show it.
    fn stored_text(&self) -> Option<String> {
        None
    }
    /// Fail if `needle` is stored anywhere [`LockServer::stored_text`] can see.
    fn assert_nothing_stored_contains(&self, needle: &str) {
        if let Some(text) = self.stored_text() {
            assert!(
                !text.contains(needle),
                "'{needle}' is stored on the backend: {text}"
            );
        }
    }
}

/// A server that expires the lease of a holder that goes silent (Redis, etcd).
pub trait LeaseServer: LockServer {
    /// The client port of the (first) server, for a proxy in front of it.
    fn port(&self) -> u16;
    /// The URL of this server reached through `port` instead.
    fn url_via(&self, port: u16) -> String;
    fn as_lock_server(&self) -> &dyn LockServer;
}

/// The file backend in a private directory.
pub struct FileServer {
    pub dir: tempfile::TempDir,
}

impl FileServer {
    pub fn start() -> FileServer {
        FileServer {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
}

impl LockServer for FileServer {
    fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    fn scheme(&self) -> &'static str {
        "file"
    }

    fn stored_text(&self) -> Option<String> {
        let mut text = String::new();
        let mut dirs = vec![self.dir.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read lock dir").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(bytes) = std::fs::read(&path) {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                }
            }
        }
        Some(text)
    }

    /// Replace the lock file with a new one, as a careless admin would.
    fn break_hold(&self, env: &TestEnv, name: &str) {
        let path = self.dir.path().join(format!("{name}.lock"));
        assert!(path.exists(), "no lock file at {}", path.display());
        let replacement = env.path("replacement.lock");
        std::fs::write(&replacement, b"").expect("write replacement");
        std::fs::rename(&replacement, &path).expect("replace lock file");
    }
}

/// One test's world: a scratch directory, no inherited DLOCK_* settings, no config file,
/// and the backend under test.
pub struct TestEnv {
    pub scratch: tempfile::TempDir,
    pub url: String,
    pub ttl: Option<&'static str>,
}

impl TestEnv {
    pub fn new(server: &dyn LockServer) -> TestEnv {
        TestEnv {
            scratch: tempfile::tempdir().expect("temp dir"),
            url: server.url(),
            ttl: server.ttl(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// `dlock ARGS` with a clean environment, run in the scratch directory.
    pub fn dlock<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(DLOCK);
        command.args(args).current_dir(self.scratch.path());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("DLOCK_") {
                command.env_remove(key);
            }
        }
        command
            .env("DLOCK_URL", &self.url)
            .env("XDG_CONFIG_HOME", self.path("no-config"))
            .env("XDG_RUNTIME_DIR", self.path("runtime"))
            .stdin(Stdio::null());
        if let Some(ttl) = self.ttl {
            command.env("DLOCK_TTL", ttl);
        }
        command
    }

    /// Run dlock to completion (bounded) and return its output.
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_within(self.dlock(args), PATIENCE)
    }

    /// Take `name` once and return the fencing token the command saw.
    pub fn token(&self, name: &str) -> u64 {
        let out = self.run(["run", name, "sh", "-c", "echo $DLOCK_FENCING_TOKEN"]);
        assert!(out.status.success(), "{}", describe(&out));
        stdout_of(&out).trim().parse().expect("a numeric token")
    }

    /// Start a holder of `name` whose command signals readiness and then sleeps.
    pub fn hold(&self, name: &str, extra: &[&str]) -> Holding {
        let ready = self.path(&format!("ready-{}", unique()));
        let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([name.to_owned(), "sh".into(), "-c".into(), script]);
        let child = self
            .dlock(&args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dlock");
        let mut holding = Holding { child, ready };
        holding.wait_ready();
        holding
    }

    /// Number of waiters `status` reports for `name` (0 when unknown).
    pub fn waiters(&self, name: &str) -> u64 {
        let out = self.run(["status", "--json", name]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        json["waiters"].as_u64().unwrap_or(0)
    }

    /// Start `dlock run --url URL NAME` whose command records a SIGTERM in the returned log
    /// (`holder-stopped`) and otherwise loops; returns once the command runs.
    pub fn stoppable_holder(&self, url: &str, name: &str) -> (Child, PathBuf) {
        let log = self.path("log");
        let ready = self.path("ready");
        let script = format!(
            "trap 'echo holder-stopped >> {log}; exit 0' TERM; echo ok > {ready}; while :; do sleep 0.05; done",
            log = log.display(),
            ready = ready.display()
        );
        let holder = self
            .dlock([
                "run",
                "--url",
                url,
                "--kill-after",
                "5s",
                name,
                "sh",
                "-c",
                &script,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn holder");
        wait_until("holder ready", PATIENCE, || ready.exists());
        (holder, log)
    }

    /// Whether `name` can be taken right now (a `--no-wait` run succeeds).
    pub fn is_free(&self, name: &str) -> bool {
        let out = self.run(["run", "--no-wait", name, "true"]);
        match out.status.code() {
            Some(0) => true,
            Some(75) => false,
            _ => panic!("unexpected result of a --no-wait probe: {}", describe(&out)),
        }
    }
}

/// A running `dlock run` holding a lock; killed (SIGKILL, by pid) when dropped.
pub struct Holding {
    pub child: Child,
    pub ready: PathBuf,
}

impl Holding {
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if std::fs::read_to_string(&self.ready).is_ok_and(|s| s.ends_with('\n')) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut err) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = err.read_to_string(&mut stderr);
                }
                panic!("holder exited before it was ready: {status}: {stderr}");
            }
            assert!(
                Instant::now() < deadline,
                "holder not ready within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The pid of the command (not of dlock).
    pub fn command_pid(&self) -> i32 {
        read_pid(&self.ready)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal holder");
    }

    /// Wait (bounded) for dlock to exit.
    pub fn wait(&mut self) -> ExitStatus {
        wait_within(&mut self.child, PATIENCE)
    }

    pub fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid")
}

/// Wait for `child` to exit within `limit`; kill it and fail otherwise.
pub fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process {} did not exit within {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run `command` to completion within `limit`, capturing stdout and stderr.
pub fn output_within(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Drain the pipes on threads so a chatty child cannot block.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let status = wait_within(&mut child, limit);
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Poll until `condition` holds (bounded).
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `pid` is a live process (zombies count as dead).
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X") | None)
        }
        Err(_) => false,
    }
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status.code(),
        stdout_of(out),
        stderr_of(out)
    )
}

/// A short unique suffix for names and files within one test process.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Assert that dlock failed with `code` and one `dlock:` line mentioning `needle`.
pub fn assert_fails(out: &Output, code: i32, needle: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", describe(out));
    let stderr = stderr_of(out);
    let dlock_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("dlock: "))
        .collect();
    assert!(
        !dlock_lines.is_empty(),
        "no 'dlock:' line: {}",
        describe(out)
    );
    assert!(
        stderr.contains(needle),
        "stderr does not mention {needle:?}: {}",
        describe(out)
    );
    assert!(!stderr.contains("panicked"), "panic: {}", describe(out));
}

/// Find a server binary or fail with how to install it (never skip).
pub fn server_binary(name: &str, package: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")]);
    for dir in candidates {
        let path = dir.join(name);
        if path.is_file() {
            return path;
        }
    }
    panic!("{name} is not installed: run `apt-get install -y {package}` (or `bash .ci/run`, which installs every test server)");
}

/// A free TCP port on 127.0.0.1 (the OS picks it; tiny reuse race accepted).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

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
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let binary = server_binary("redis-server", "redis-server");
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("log file");
        let child = Command::new(binary)
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
            .stderr(log)
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        // Ready when it says so (works for TLS-only servers too).
        let log = self.dir.path().join("redis.log");
        wait_until("redis-server ready", PATIENCE, || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Ready to accept connections"))
        });
    }

    /// Where the server keeps its files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LockServer for RedisServer {
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
        Some(text)
    }
}

/// A TCP proxy on a free loopback port that can stop forwarding without closing anything
/// (a black hole, like a network partition), or forward everything late (a slow link). Its
/// threads end when it is dropped.
pub struct Proxy {
    pub port: u16,
    blackholed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        Proxy::with_delay(target_port, Duration::ZERO)
    }

    /// A proxy that holds every chunk it reads for `delay` before passing it on.
    pub fn with_delay(target_port: u16, delay: Duration) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let blackholed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (blackholed.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target_port))
                        else {
                            continue;
                        };
                        for (from, to) in [
                            (
                                client.try_clone().expect("clone"),
                                server.try_clone().expect("clone"),
                            ),
                            (server, client),
                        ] {
                            let (b, s) = (b.clone(), s.clone());
                            std::thread::spawn(move || pump(from, to, delay, &b, &s));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            blackholed,
            stop,
        }
    }

    /// From now on, swallow every byte in both directions; connections stay open.
    pub fn blackhole(&self) {
        self.blackholed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A server on a free loopback port that accepts connections and never answers (keeps them
/// open, reads nothing), until dropped or for at most two minutes.
pub struct SilentServer {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentServer {
    pub fn start() -> SilentServer {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(120);
            let mut open = Vec::new();
            while !s.load(Ordering::SeqCst) && Instant::now() < until {
                match listener.accept() {
                    Ok((connection, _)) if open.len() < 1000 => open.push(connection),
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SilentServer { port, stop }
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    delay: Duration,
    blackholed: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                std::thread::sleep(delay);
                if !blackholed.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    if !blackholed.load(Ordering::SeqCst) {
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
}

/// Send one command as a RESP array and return the raw reply (bounded read).
pub fn redis_resp(port: u16, args: &[&str]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    // Read until the server has been quiet for a moment (replies here are small).
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

/// A throw-away CA with a server certificate (localhost, 127.0.0.1), a client certificate,
/// and a second, unrelated CA; made with the `openssl` command.
pub struct TestCerts {
    pub dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn make() -> TestCerts {
        let openssl = server_binary("openssl", "openssl");
        let dir = tempfile::tempdir().expect("temp dir");
        let run = |args: &[&str]| {
            let out = Command::new(&openssl)
                .args(args)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .expect("write");
        for ca in ["ca", "other"] {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN=dlock test {ca}"),
            ]);
        }
        for leaf in ["server", "client"] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{leaf}.key"),
                "-out",
                &format!("{leaf}.csr"),
                "-subj",
                "/CN=localhost",
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{leaf}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{leaf}.crt"),
                "-days",
                "2",
                "-extfile",
                &format!("{leaf}.ext"),
            ]);
        }
        TestCerts { dir }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }
}

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
    pub peer_port: u16,
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
        let child = Command::new(binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
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
        let base = if Path::new("/dev/shm").is_dir() {
            Some("/dev/shm")
        } else {
            None
        };
        let dir = match base {
            Some(base) => tempfile::tempdir_in(base).expect("temp dir"),
            None => tempfile::tempdir().expect("temp dir"),
        };
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
                    peer_port: peer,
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
            let port = member.client_port;
            let log = member.log.clone();
            let serving = || {
                if tls.is_some() {
                    std::fs::read_to_string(&log)
                        .is_ok_and(|l| l.contains("serving client traffic securely"))
                } else {
                    etcd_healthy(port)
                }
            };
            while !serving() {
                if member.exited() || Instant::now() >= deadline {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(15).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    return Err(format!(
                        "member {} (client port {port}) is not serving; its log ends:\n{}",
                        member.name,
                        tail.join("\n")
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
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

// ---- ZooKeeper ----------------------------------------------------------------------------

/// The jars a ZooKeeper server needs, from Debian's `zookeeper` package.
pub fn zookeeper_classpath() -> String {
    let jars = [
        "/usr/share/java/zookeeper.jar",
        "/usr/share/java/zookeeper-jute.jar",
        "/usr/share/java/slf4j-simple.jar",
    ];
    for jar in jars {
        assert!(
            Path::new(jar).is_file(),
            "{jar} is missing: run `apt-get install -y zookeeper` (or `bash .ci/run`, which installs every test server)"
        );
    }
    jars.join(":")
}

/// Send a four-letter word to a ZooKeeper server and return its answer (bounded).
pub fn zk_four_letter(port: u16, word: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// The `Mode:` a ZooKeeper server reports (`standalone`, `leader`, `follower`), if it serves.
pub fn zk_mode(port: u16) -> Option<String> {
    zk_four_letter(port, "srvr")?
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

/// One ZooKeeper server started by a test; killed (by pid) when dropped.
pub struct ZkMember {
    pub client_port: u16,
    config: PathBuf,
    main_class: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

impl ZkMember {
    fn launch(&mut self) {
        let java = server_binary("java", "openjdk-17-jre-headless");
        let classpath = zookeeper_classpath();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("zookeeper log");
        let log_dir = self.log.parent().expect("log dir").display().to_string();
        // `java` itself, not a wrapper script, so that killing the child kills the server.
        let child = Command::new(java)
            .args([
                "-Xms32m",
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.admin.enableServer=false",
                // Empty container parents go away quickly, so tests see them recreated.
                "-Dznode.container.checkIntervalMs=500",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                &format!("-Dzookeeper.log.dir={log_dir}"),
                "-cp",
                &classpath,
                self.main_class,
            ])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start java");
        self.child = Some(child);
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

    pub fn mode(&self) -> Option<String> {
        zk_mode(self.client_port)
    }
}

impl Drop for ZkMember {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private ZooKeeper (standalone, or an ensemble of three) on free loopback ports, with a
/// short tickTime so that session timeouts can be small (bounds 2 and 20 ticks).
pub struct ZkServer {
    pub members: Vec<ZkMember>,
    pub tick_ms: u64,
    dir: tempfile::TempDir,
}

impl ZkServer {
    /// One standalone server, tickTime 200 ms: session timeouts 0.4 s to 4 s.
    pub fn start() -> ZkServer {
        ZkServer::build(1, 200)
    }

    /// `size` members forming one ensemble.
    pub fn ensemble(size: usize, tick_ms: u64) -> ZkServer {
        ZkServer::build(size, tick_ms)
    }

    fn build(size: usize, tick_ms: u64) -> ZkServer {
        let dir = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm").expect("temp dir")
        } else {
            tempfile::tempdir().expect("temp dir")
        };
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let mut members = Vec::new();
        for (i, &(client, peer, election)) in ports.iter().enumerate() {
            let home = dir.path().join(format!("m{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            let mut config = format!(
                "tickTime={tick_ms}\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n\
                 maxClientCnxns=0\nadmin.enableServer=false\nautopurge.purgeInterval=0\n\
                 4lw.commands.whitelist=srvr,mntr,wchc,wchs,cons,ruok\n",
                data.display()
            );
            let main_class = if size > 1 {
                config.push_str("initLimit=10\nsyncLimit=5\n");
                for (j, &(_, peer, election)) in ports.iter().enumerate() {
                    config.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                }
                std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
                "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            } else {
                "org.apache.zookeeper.server.ZooKeeperServerMain"
            };
            let _ = (peer, election);
            let config_path = home.join("zoo.cfg");
            std::fs::write(&config_path, config).expect("zoo.cfg");
            members.push(ZkMember {
                client_port: client,
                config: config_path,
                main_class,
                log: home.join("zookeeper.log"),
                child: None,
            });
        }
        for member in &mut members {
            member.launch();
        }
        for member in &members {
            let port = member.client_port;
            let log = member.log.clone();
            let deadline = Instant::now() + Duration::from_secs(60);
            while zk_mode(port).is_none_or(|m| m == "unknown") {
                assert!(
                    Instant::now() < deadline,
                    "ZooKeeper on port {port} not serving within 60s: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        ZkServer {
            members,
            tick_ms,
            dir,
        }
    }

    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Index of the member that leads the ensemble now.
    pub fn leader(&self) -> usize {
        self.members
            .iter()
            .position(|m| m.mode().as_deref() == Some("leader"))
            .expect("no leader")
    }

    /// Run `f` with a fresh session to the running members (the crate dlock uses).
    pub fn with_client<T>(
        &self,
        auth: Option<&str>,
        f: impl AsyncFnOnce(&zookeeper_client::Client) -> T,
    ) -> T {
        let hosts = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut connector = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(4))
                .with_fail_eagerly();
            if let Some(auth) = auth {
                connector = connector.with_auth("digest", auth.as_bytes());
            }
            let client = tokio::time::timeout(PATIENCE, connector.connect(&hosts))
                .await
                .expect("connect in time")
                .expect("connect to ZooKeeper");
            f(&client).await
        })
    }

    /// The children of `path` (empty when it does not exist).
    pub fn children(&self, path: &str) -> Vec<String> {
        let path = path.to_owned();
        self.with_client(None, async move |client| {
            match client.list_children(&path).await {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => Vec::new(),
                Err(e) => panic!("list {path}: {e}"),
            }
        })
    }
}

impl LockServer for ZkServer {
    fn url(&self) -> String {
        format!("zk://{}", self.endpoints())
    }

    fn scheme(&self) -> &'static str {
        "zk"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }
}

impl LeaseServer for ZkServer {
    fn port(&self) -> u16 {
        self.members[0].client_port
    }

    fn url_via(&self, port: u16) -> String {
        format!("zk://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
