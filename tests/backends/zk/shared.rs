//! Shared locks on ZooKeeper (Curator's read-write lock recipe) beyond the contract
//! (`tests/contract/shared.rs`): the node names, what a shared waiter watches, and interop
//! with Curator's `InterProcessReadWriteLock` (tests/java/CuratorReadWriteLock.java).

use std::path::PathBuf;

use nix::sys::signal::Signal;

use super::curator::Curator;
use super::{owners, watches_by_session};
use crate::support::*;

/// A `dlock run` started by a test; killed (by pid) when dropped.
struct Run {
    child: std::process::Child,
    /// Where its command writes its fencing token once it runs.
    token_file: PathBuf,
}

impl Run {
    /// `dlock run EXTRA NAME` whose command writes its token to a file of its own, then
    /// sleeps (or, with `then`, runs that shell command instead).
    fn start(env: &TestEnv, name: &str, extra: &[&str], then: &str) -> Run {
        let token_file = env.path(&format!("token-{}", unique()));
        let script = format!(
            "echo $DLOCK_FENCING_TOKEN > '{0}.tmp'; mv '{0}.tmp' '{0}'; {then}",
            token_file.display()
        );
        let mut args: Vec<&str> = vec!["run"];
        args.extend(extra);
        args.extend([name, "sh", "-c", &script]);
        let child = env
            .dlock(&args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn dlock");
        Run { child, token_file }
    }

    fn holding(env: &TestEnv, name: &str, extra: &[&str]) -> Run {
        let run = Run::start(env, name, extra, "exec sleep 1000");
        wait_until("the holder runs", PATIENCE, || run.runs());
        run
    }

    /// An exclusive run that will hold `name` (sleeping) once it gets it.
    fn holding_later(env: &TestEnv, name: &str) -> Run {
        Run::start(env, name, &[], "exec sleep 1000")
    }

    /// Whether its command has started (it has a token).
    fn runs(&self) -> bool {
        self.token().is_some()
    }

    fn token(&self) -> Option<u64> {
        std::fs::read_to_string(&self.token_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal)
            .expect("signal dlock");
    }

    /// Stop it with SIGTERM and return its exit status.
    fn stop(&mut self) -> Option<i32> {
        self.signal(Signal::SIGTERM);
        self.finish()
    }

    fn finish(&mut self) -> Option<i32> {
        wait_within(&mut self.child, PATIENCE).code()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// (holders, waiters) as `status` counts them.
fn counts(env: &TestEnv, name: &str) -> (usize, u64) {
    let status = env.status_json(name);
    (
        status["holders"].as_array().map_or(0, Vec::len),
        status["waiters"].as_u64().unwrap_or(0),
    )
}

/// A shared run's node is Curator's read-lock node, `_c_<uuid>-__READ__<sequence>`; an
/// exclusive run's stays the mutex's `-lock-` node.
#[test]
fn shared_nodes_carry_curators_read_lock_name() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let reader = Run::holding(&env, &lock, &["--shared"]);
    let children = server.children(&dir);
    assert_eq!(children.len(), 1, "{children:?}");
    let (guid, sequence) = children[0]
        .split_once("-__READ__")
        .unwrap_or_else(|| panic!("not a read-lock node: {children:?}"));
    assert!(guid.starts_with("_c_") && guid.len() == 3 + 36, "{guid}");
    assert!(
        sequence.len() == 10 && sequence.bytes().all(|b| b.is_ascii_digit()),
        "{sequence}"
    );
    let mut writer = Run::start(&env, &lock, &[], "true");
    wait_until("the writer queued", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    assert!(
        server.children(&dir).iter().any(|c| c.contains("-lock-")),
        "{:?}",
        server.children(&dir)
    );
    assert!(!writer.runs(), "the writer ran beside a reader");
    drop(reader);
    assert_eq!(writer.finish(), Some(0));
}

/// A reader that arrives while a writer waits watches the writer's node: the nearest
/// exclusive node ahead of its own, not the reader holding (that it runs after the writer is
/// the contract's).
#[test]
fn a_late_reader_watches_the_waiting_writers_node() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let _first = Run::holding(&env, &lock, &["--shared"]);
    let _writer = Run::holding_later(&env, &lock);
    wait_until("the writer waits", PATIENCE, || {
        counts(&env, &lock) == (1, 1)
    });
    let late = Run::start(&env, &lock, &["--shared"], "exec sleep 1000");
    wait_until("the late reader waits", PATIENCE, || {
        counts(&env, &lock) == (1, 2)
    });
    let writer_node = server
        .children(&dir)
        .into_iter()
        .find(|c| c.contains("-lock-"))
        .map(|c| format!("{dir}/{c}"))
        .expect("the writer's node");
    let nodes = owners(&server, &dir);
    // The watches on nodes a session does not own: the writer's on the first reader's node
    // (the node just ahead of its own), the late reader's on the writer's node.
    let foreign = || -> Vec<String> {
        watches_by_session(&server)
            .iter()
            .flat_map(|(session, paths)| {
                paths
                    .iter()
                    .filter(|p| p.starts_with(&dir) && nodes.get(*p) != Some(session))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    wait_until("the writer and the late reader watch", PATIENCE, || {
        foreign().len() >= 2
    });
    let foreign = foreign();
    assert_eq!(foreign.len(), 2, "{foreign:?}");
    assert!(foreign.contains(&writer_node), "{foreign:?}");
    assert!(!late.runs(), "the late reader went ahead of the writer");
}

/// A dlock `--shared` run and a Curator read lock hold together; an exclusive dlock run
/// waits for both.
#[test]
fn dlock_shared_and_a_curator_read_lock_hold_together() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let mut curator = Curator::read_write(&server, &dir, "read", -1);
    curator.expect_line("ACQUIRED");
    let out = env.run(["run", "--shared", "--no-wait", &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let mut reader = Run::holding(&env, &lock, &["--shared"]);
    let status = env.status_json(&lock);
    let modes: Vec<&str> = status["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["mode"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(modes, ["shared", "shared"], "{status}");
    let mut second = Curator::read_write(&server, &dir, "read", 60_000);
    second.expect_line("ACQUIRED");
    second.release();
    curator.release();
    assert_eq!(reader.stop(), Some(143));
}

/// A Curator write lock excludes dlock readers (they wait, `--no-wait` gives up), and
/// dlock readers exclude a Curator write lock (it waits, a short wait gives up).
#[test]
fn a_curator_write_lock_and_dlock_readers_exclude_each_other() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let mut curator = Curator::read_write(&server, &dir, "write", -1);
    curator.expect_line("ACQUIRED");
    let out = env.run(["run", "--shared", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    let mut reader = Run::start(&env, &lock, &["--shared"], "true");
    wait_until("the reader queued behind Curator", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    assert!(!reader.runs(), "a dlock reader ran beside a Curator writer");
    curator.release();
    assert_eq!(
        reader.finish(),
        Some(0),
        "{}",
        stderr_left(&mut reader.child)
    );
    assert!(reader.runs());

    let mut reader = Run::holding(&env, &lock, &["--shared"]);
    let busy = Curator::read_write(&server, &dir, "write", 300);
    busy.expect_line("BUSY");
    let mut writer = Curator::read_write(&server, &dir, "write", 60_000);
    wait_until("Curator's writer queued behind dlock", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    assert!(
        writer.lines.try_recv().is_err(),
        "Curator's writer acquired while a dlock reader held the lock"
    );
    assert_eq!(reader.stop(), Some(143));
    writer.expect_line("ACQUIRED");
    writer.release();
}
