//! Curator interop: Apache Curator's `InterProcessMutex` (tests/java/CuratorLock.java) and
//! dlock take the same lock, each waiting for the other. `Curator` also runs
//! tests/java/CuratorReadWriteLock.java for the shared-lock interop (`shared.rs`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

const CURATOR_JARS: &[&str] = &[
    "/usr/share/java/curator-recipes.jar",
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/zookeeper-jute.jar",
    "/usr/share/java/guava.jar",
    "/usr/share/java/slf4j-api.jar",
    "/usr/share/java/slf4j-nop.jar",
];

/// Compile the programs in tests/java once per test run; returns their classpath.
fn curator_classpath() -> String {
    static COMPILED: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    let (_, classpath) = COMPILED.get_or_init(|| {
        for jar in CURATOR_JARS {
            assert!(
                std::path::Path::new(jar).is_file(),
                "{jar} is missing: run `apt-get install -y libcurator-recipes-java zookeeper libslf4j-java openjdk-17-jdk-headless` \
                 (or `bash .ci/run`)"
            );
        }
        let javac = server_binary("javac", "openjdk-17-jdk-headless");
        let dir = tempfile::tempdir().expect("temp dir");
        let jars = CURATOR_JARS.join(":");
        let sources = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java");
        let mut command = Command::new(javac);
        command
            .args(["-cp", &jars, "-d"])
            .arg(dir.path())
            .arg(sources.join("CuratorLock.java"))
            .arg(sources.join("CuratorReadWriteLock.java"))
            .stdin(Stdio::null());
        let out = output_within(command, Duration::from_secs(120));
        assert!(out.status.success(), "javac: {}", describe(&out));
        let classpath = format!("{}:{jars}", dir.path().display());
        (dir, classpath)
    });
    classpath.clone()
}

/// A running Curator program; its stdout lines arrive on `lines`. Killed by pid when dropped.
pub(super) struct Curator {
    child: Child,
    pub(super) lines: mpsc::Receiver<String>,
}

impl Curator {
    /// `InterProcessMutex` on `path`, waiting `timeout_ms` (negative: for ever).
    fn start(server: &ZkServer, path: &str, timeout_ms: i64) -> Curator {
        Curator::launch(
            "CuratorLock",
            &[&server.endpoints(), path, &timeout_ms.to_string()],
        )
    }

    /// `InterProcessReadWriteLock` on `path`: its read lock for `side` "read", its write lock
    /// for "write", waiting `timeout_ms` (negative: for ever).
    pub(super) fn read_write(
        server: &ZkServer,
        path: &str,
        side: &str,
        timeout_ms: i64,
    ) -> Curator {
        Curator::launch(
            "CuratorReadWriteLock",
            &[&server.endpoints(), path, side, &timeout_ms.to_string()],
        )
    }

    fn launch(class: &str, args: &[&str]) -> Curator {
        let java = server_binary("java", "openjdk-17-jre-headless");
        let mut child = Command::new(java)
            .args([
                "-XX:TieredStopAtLevel=1",
                "-Xmx64m",
                "-cp",
                &curator_classpath(),
                class,
            ])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start java");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Curator { child, lines }
    }

    pub(super) fn expect_line(&self, want: &str) {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no {want} from Curator: {e}"));
        assert_eq!(line, want);
    }

    pub(super) fn release(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"release\n").expect("write");
        stdin.flush().expect("flush");
        self.expect_line("RELEASED");
        assert!(wait_within(&mut self.child, PATIENCE).success());
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn curator_holds_and_dlock_waits_for_it() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let mut curator = Curator::start(&server, &dir, -1);
    curator.expect_line("ACQUIRED");
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    assert!(!env.path("ran").exists());
    let status = env.run(["status", &lock]);
    assert_eq!(status.status.code(), Some(0), "{}", describe(&status));
    assert!(
        stdout_of(&status).contains("foreign holder"),
        "{}",
        describe(&status)
    );
    let entered = env.path("entered");
    let mut waiter = env
        .dlock(["run", &lock, "touch", entered.to_str().expect("utf-8")])
        .spawn()
        .expect("spawn waiter");
    wait_until("dlock queued behind Curator", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    assert!(!entered.exists(), "dlock ran while Curator held the lock");
    curator.release();
    assert!(wait_within(&mut waiter, PATIENCE).success());
    assert!(entered.exists());
}

#[test]
fn dlock_holds_and_curator_waits_for_it() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let mut holder = env.hold(&lock, &[]);
    let busy = Curator::start(&server, &dir, 300);
    busy.expect_line("BUSY");
    let mut curator = Curator::start(&server, &dir, 60_000);
    wait_until("Curator queued behind dlock", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    assert!(
        curator.lines.try_recv().is_err(),
        "Curator acquired while dlock held the lock"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    curator.expect_line("ACQUIRED");
    curator.release();
}
