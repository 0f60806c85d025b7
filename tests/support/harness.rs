//! One test's world: `TestEnv` runs the real `dlock` binary in a scratch directory with a
//! clean environment, and `Holding` is a running holder that is killed when dropped.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::*;

pub const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Generous bound for anything that should take milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How long past `--wait` a test lets a run that gives up take: dlock's own allowance for a
/// last answer (at most 0.5 s), starting and ending a process, and a woken process waiting
/// for a core on a loaded machine. It stays below the 5 s exchange timeouts of the backends,
/// so a run that ignored `--wait` and waited for one of them still fails the test.
pub const PAST_WAIT: Duration = Duration::from_secs(2);

/// One test's world: a scratch directory, no inherited DLOCK_* settings, no config file,
/// and the backend under test.
pub struct TestEnv {
    pub scratch: tempfile::TempDir,
    pub url: String,
    pub ttl: Option<&'static str>,
    pub prefix: Option<String>,
    /// The server's environment for dlock ([`LockServer::env`]).
    pub env: Vec<(&'static str, String)>,
}

impl TestEnv {
    pub fn new(server: &dyn LockServer) -> TestEnv {
        TestEnv {
            scratch: tempfile::tempdir().expect("temp dir"),
            url: server.url(),
            ttl: server.ttl(),
            prefix: server.prefix(),
            env: server.env(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// Write a config file with one `[table]` of `body` into the scratch directory (a new
    /// file each time) and return its path, for `--config`.
    pub fn config_file(&self, table: &str, body: &str) -> String {
        let path = self.path(&format!("config-{}.toml", unique()));
        std::fs::write(&path, format!("[{table}]\n{body}")).expect("write config");
        path.display().to_string()
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
            // Nor an object store's account from the machine: a test's is its server's.
            let key_text = key.to_string_lossy();
            if key_text.starts_with("DLOCK_") || key_text.starts_with("AZURE_STORAGE_") {
                command.env_remove(key);
            }
        }
        // Whether a wait prints lines depends on CI (set where the suite runs in CI): a test
        // that wants it says so.
        command.env_remove("CI");
        command
            .env("DLOCK_URL", &self.url)
            .env("XDG_CONFIG_HOME", self.path("no-config"))
            .env("XDG_RUNTIME_DIR", self.path("runtime"))
            // dlock's own directory (file locks without --url, host-local queues), one per test.
            .env("DLOCK_DIR", self.path("runtime").join("dlock"))
            .stdin(Stdio::null());
        if let Some(ttl) = self.ttl {
            command.env("DLOCK_TTL", ttl);
        }
        if let Some(prefix) = &self.prefix {
            command.env("DLOCK_PREFIX", prefix);
        }
        command.envs(self.env.iter().map(|(key, value)| (key, value)));
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

    /// `dlock ARGS` in the background, its stderr kept for a failure message
    /// ([`stderr_left`]).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.dlock(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dlock")
    }

    /// `sh -c SCRIPT` in the environment [`TestEnv::dlock`] gives dlock, in the background,
    /// its stderr kept; `$DLOCK` in the script is the dlock under test. Killed when dropped.
    pub fn shell(&self, script: &str) -> Shell {
        let template = self.dlock(std::iter::empty::<&str>());
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("DLOCK='{DLOCK}'; {script}"))
            .current_dir(self.scratch.path())
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        for (key, value) in template.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        Shell(command.spawn().expect("spawn sh"))
    }

    /// `status --json NAME`, parsed.
    pub fn status_json(&self, name: &str) -> serde_json::Value {
        let out = self.run(["status", "--json", name]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)))
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
        self.stoppable_holder_with(url, name, &[])
    }

    /// [`TestEnv::stoppable_holder`] with more options for `dlock run` (`--shared`).
    pub fn stoppable_holder_with(&self, url: &str, name: &str, extra: &[&str]) -> (Child, PathBuf) {
        let log = self.path("log");
        let ready = self.path("ready");
        let script = format!(
            "trap 'echo holder-stopped >> {log}; exit 0' TERM; echo ok > {ready}; while :; do sleep 0.05; done",
            log = log.display(),
            ready = ready.display()
        );
        let holder = self
            .dlock(
                ["run", "--url", url, "--kill-after", "5s"]
                    .into_iter()
                    .chain(extra.iter().copied())
                    .chain([name, "sh", "-c", &script]),
            )
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn holder");
        wait_until("holder ready", PATIENCE, || ready.exists());
        (holder, log)
    }

    /// The fencing token a command wrote to `file` in the scratch directory (whole: by a
    /// rename, `echo $DLOCK_FENCING_TOKEN > F.tmp && mv F.tmp F`).
    pub fn recorded_token(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.path(file))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no token recorded in {file}"))
    }

    /// The modes (`shared`, `exclusive`) of a list in `status --json` of `name`: `holders`
    /// or `queue`.
    pub fn modes(&self, name: &str, list: &str) -> Vec<String> {
        modes_in(&self.status_json(name), list)
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

/// The modes of a list (`holders`, `queue`) of a `status --json` or `list --json` entry.
pub fn modes_in(status: &serde_json::Value, list: &str) -> Vec<String> {
    status[list]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| e["mode"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A `TestEnv` on the file backend in a private directory, for tests that need no server;
/// keep the `FileServer` as long as the env is used.
pub fn file_env() -> (FileServer, TestEnv) {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    (server, env)
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

/// A shell started by [`TestEnv::shell`].
pub struct Shell(pub Child);

impl Shell {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Wait (bounded) for the shell to exit.
    pub fn wait(&mut self) -> ExitStatus {
        wait_within(&mut self.0, PATIENCE)
    }

    pub fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.0.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
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
