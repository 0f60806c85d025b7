//! The ZooKeeper backend: the whole contract against a real ZooKeeper, plus FIFO, Curator
//! interop, cleanup of cancelled waiters, and a three-member ensemble (issue #5).

use crate::common::*;

crate::contract_tests!(zk_contract, ZkServer::start());
crate::lease_contract_tests!(zk_lease_contract, ZkServer::start());

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

fn name() -> String {
    format!("z-{}", unique())
}

/// `wchc`: the paths each session watches.
fn watches_by_session(server: &ZkServer) -> HashMap<String, Vec<String>> {
    let text = zk_four_letter(server.members[0].client_port, "wchc").expect("wchc");
    let mut watches: HashMap<String, Vec<String>> = HashMap::new();
    let mut session = String::new();
    for line in text.lines() {
        if let Some(path) = line.strip_prefix('\t') {
            watches
                .entry(session.clone())
                .or_default()
                .push(path.trim().to_owned());
        } else if !line.trim().is_empty() {
            session = line.trim().trim_start_matches("0x").to_ascii_lowercase();
        }
    }
    watches
}

/// The session that owns each ephemeral node under `dir`.
fn owners(server: &ZkServer, dir: &str) -> HashMap<String, String> {
    let dir = dir.to_owned();
    server.with_client(None, async move |client| {
        let mut owners = HashMap::new();
        let children = client.list_children(&dir).await.unwrap_or_default();
        for child in children {
            let path = format!("{dir}/{child}");
            if let Ok(Some(stat)) = client.check_stat(&path).await {
                owners.insert(path, format!("{:x}", stat.ephemeral_owner));
            }
        }
        owners
    })
}

#[test]
fn waiters_acquire_in_arrival_order_and_each_watches_only_its_predecessor() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let dir = format!("/dlock/{lock}");
    let log = env.path("order");
    let (holder, started) = crate::contract::queue_five_waiters(&env, &lock, &log);
    // No herd: apart from a node's owner (which watches its own node once it holds the
    // lock), each node is watched by at most one session, and each session watches at most
    // one node it does not own.
    let owners = owners(&server, &dir);
    assert_eq!(owners.len(), 6, "{owners:?}");
    let mut watchers_of: HashMap<&str, HashSet<&str>> = HashMap::new();
    wait_until("every waiter's watch is set", PATIENCE, || {
        let watches = watches_by_session(&server);
        watches
            .values()
            .flatten()
            .filter(|p| p.starts_with(&dir))
            .count()
            >= 6
    });
    let watches = watches_by_session(&server);
    for (session, paths) in &watches {
        let foreign: Vec<&String> = paths
            .iter()
            .filter(|p| p.starts_with(&dir) && owners.get(*p) != Some(session))
            .collect();
        assert!(foreign.len() <= 1, "session {session} watches {foreign:?}");
        for path in foreign {
            watchers_of.entry(path).or_default().insert(session);
        }
    }
    for (path, sessions) in &watchers_of {
        assert_eq!(sessions.len(), 1, "{path} is watched by {sessions:?}");
    }
    assert!(
        !watches.values().flatten().any(|p| *p == dir),
        "a children watch on {dir} (herd): {watches:?}"
    );
    crate::contract::release_and_expect_arrival_order(holder, started, &log);
}

#[test]
fn a_signal_or_an_expired_wait_leaves_no_node_behind() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let dir = format!("/dlock/{lock}");
    let _holder = env.hold(&lock, &[]);
    assert_eq!(server.children(&dir).len(), 1);
    let mut waiter = env
        .dlock(["run", &lock, "touch", "ran"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("waiter queued", PATIENCE, || {
        server.children(&dir).len() == 2
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("kill");
    assert_eq!(wait_within(&mut waiter, PATIENCE).code(), Some(128 + 15));
    // dlock deleted its node before it exited: nothing to wait for.
    assert_eq!(server.children(&dir).len(), 1, "the waiter's node is left");
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "300ms");
    assert_eq!(server.children(&dir).len(), 1, "the --wait node is left");
    assert!(!env.path("ran").exists());
}

#[test]
fn an_emptied_lock_node_is_removed_and_made_again() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    // The lock's node is a container: ZooKeeper removes it once it is empty.
    wait_until("container removed", PATIENCE, || {
        !server.children("/dlock").contains(&lock)
    });
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn the_negotiated_session_timeout_is_used_and_reported() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    // tickTime 200 ms: the server grants at most 20 ticks.
    let out = env.run(["run", "--ttl", "10s", &name(), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("negotiated a 4s session timeout for --ttl 10s; using 4s"),
        "{}",
        describe(&out)
    );
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &["--limit", "2"]);
    let _second = env.hold(&lock, &["--limit", "2"]);
    let out = env.run(["run", "--limit", "3", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
    // A --limit 1 waiter finds out from its predecessor's data.
    let out = env.run(["run", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
}

#[test]
fn wrong_password_is_77() {
    let server = ZkServer::start();
    // The prefix node belongs to digest user u (password "right").
    server.with_client(Some("u:right"), async |client| {
        let options = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::creator_all());
        client
            .create("/dlock", b"", &options)
            .await
            .expect("create /dlock");
    });
    let port = server.members[0].client_port;
    let mut env = TestEnv::new(&server);
    env.url = format!("zk://u:wrong@127.0.0.1:{port}");
    let out = env.run(["run", &name(), "true"]);
    assert_fails(&out, 77, "refused access");
    assert!(
        !stderr_of(&out).contains("wrong"),
        "password shown: {}",
        describe(&out)
    );
    env.url = format!("zk://u:right@127.0.0.1:{port}");
    let out = env.run(["run", &name(), "env"]);
    assert!(out.status.success(), "{}", describe(&out));
    // The command sees the URL without its password.
    let seen = stdout_of(&out);
    assert!(
        seen.contains(&format!("DLOCK_URL=zk://u:***@127.0.0.1:{port}\n"))
            && !seen.contains("right"),
        "{seen}"
    );
    // From the environment instead of the URL.
    env.url = format!("zk://u@127.0.0.1:{port}");
    let out = output_within(
        {
            let mut c = env.dlock(["run", &name(), "true"]);
            c.env("DLOCK_PASSWORD", "right");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn the_reserved_zookeeper_prefix_is_refused_with_64() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let out = env.run(["run", "--prefix", "zookeeper/x", &name(), "touch", "ran"]);
    assert_fails(&out, 64, "reserves");
    assert!(!env.path("ran").exists());
}

#[test]
fn nothing_listening_is_69() {
    let port = free_port();
    let env = TestEnv {
        scratch: tempfile::tempdir().expect("temp dir"),
        url: format!("zk://127.0.0.1:{port}"),
        ttl: Some("3s"),
    };
    let started = Instant::now();
    let out = env.run(["run", &name(), "touch", "ran"]);
    assert_fails(&out, 69, &format!("127.0.0.1:{port}"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!env.path("ran").exists());
}

#[test]
fn a_three_member_ensemble_keeps_the_hold_through_one_failure_and_stops_at_quorum_loss() {
    // tickTime 500 ms: sessions up to 10 s; --ttl 8s leaves about 4 s for a leader election
    // and the reconnection before the keeper would give up.
    let mut server = ZkServer::ensemble(3, 500);
    let mut env = TestEnv::new(&server);
    env.ttl = Some("8s");
    let lock = name();
    let ready = env.path("ready");
    let mut holder = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 1000", ready.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder ready", PATIENCE, || ready.exists());
    let leader = server.leader();
    server.members[leader].stop();
    wait_until("a new leader", Duration::from_secs(60), || {
        server
            .members
            .iter()
            .filter(|m| m.is_running())
            .any(|m| m.mode().as_deref() == Some("leader"))
    });
    let survivors: Vec<String> = server
        .members
        .iter()
        .filter(|m| m.is_running())
        .map(|m| format!("127.0.0.1:{}", m.client_port))
        .collect();
    let out = env.run([
        "run",
        "--url",
        &format!("zk://{}", survivors.join(",")),
        "--no-wait",
        &lock,
        "true",
    ]);
    assert_fails(&out, 75, "is held");
    assert!(
        holder.try_wait().expect("try_wait").is_none(),
        "the hold broke when one member of three stopped"
    );
    // Without a quorum the session cannot be kept: the command is stopped.
    let second = (0..3)
        .find(|&i| server.members[i].is_running())
        .expect("running member");
    server.members[second].stop();
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124));
}

// ---- Curator interop ----------------------------------------------------------------------

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

/// Compile tests/java/CuratorLock.java once per test run; returns its classpath.
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
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/CuratorLock.java");
        let mut command = Command::new(javac);
        command
            .args(["-cp", &jars, "-d"])
            .arg(dir.path())
            .arg(source)
            .stdin(Stdio::null());
        let out = output_within(command, Duration::from_secs(120));
        assert!(out.status.success(), "javac: {}", describe(&out));
        let classpath = format!("{}:{jars}", dir.path().display());
        (dir, classpath)
    });
    classpath.clone()
}

/// A running CuratorLock; its stdout lines arrive on `lines`. Killed by pid when dropped.
struct Curator {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Curator {
    fn start(server: &ZkServer, path: &str, timeout_ms: i64) -> Curator {
        let java = server_binary("java", "openjdk-17-jre-headless");
        let mut child = Command::new(java)
            .args([
                "-XX:TieredStopAtLevel=1",
                "-Xmx64m",
                "-cp",
                &curator_classpath(),
                "CuratorLock",
            ])
            .arg(server.endpoints())
            .arg(path)
            .arg(timeout_ms.to_string())
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

    fn expect_line(&self, want: &str) {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no {want} from Curator: {e}"));
        assert_eq!(line, want);
    }

    fn release(&mut self) {
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
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
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
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
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

/// The data of each child of `dir`, in queue order.
fn queue_data(server: &ZkServer, dir: &str) -> Vec<String> {
    let dir = dir.to_owned();
    server.with_client(None, async move |client| {
        let mut children = client.list_children(&dir).await.unwrap_or_default();
        children.sort_by_key(|c| c.rsplit("lock-").next().unwrap_or_default().to_owned());
        let mut data = Vec::new();
        for child in children {
            if let Ok((bytes, _)) = client.get_data(&format!("{dir}/{child}")).await {
                data.push(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        data
    })
}

#[test]
fn a_killed_waiter_at_the_head_is_a_waiter_not_a_holder_until_its_session_expires() {
    // A waiter killed with SIGKILL cannot delete its node: it stays until the server expires
    // the session (the negotiated session timeout, 4 s at most on this server). When the
    // holder leaves, that node is at the head of the queue: the lock is free, with one
    // waiting ahead, and is taken once the session has expired.
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let dir = format!("/dlock/{lock}");
    let mut holder = env.hold(&lock, &[]);
    let mut killed = env
        .dlock(["run", "--ttl", "60s", &lock, "touch", "killed-ran"])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued and marked", PATIENCE, || {
        queue_data(&server, &dir)
            .get(1)
            .is_some_and(|d| d.contains("\"waiting\":true"))
    });
    killed.kill().expect("SIGKILL the waiter");
    let _ = killed.wait();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, 1 waiting ahead");
    let started = Instant::now();
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "ran"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        took < Duration::from_secs(15),
        "the lock was free only after {took:?}"
    );
    assert!(!env.path("killed-ran").exists());
}

#[test]
fn busy_messages_name_the_holder_of_a_held_lock() {
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held by pid");
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held by pid");
    assert!(!env.path("ran").exists());
    let out = env.run(["status", "--json", &lock]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["held"], true, "{}", describe(&out));
}

#[test]
fn an_unanswering_server_ends_at_the_wait_deadline() {
    // It accepts connections and never answers: --wait bounds connecting too.
    let silent = SilentServer::start();
    let env = TestEnv::new(&FileServer::start());
    let url = format!("zk://127.0.0.1:{}", silent.port);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "2s", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "within --wait 2s");
    assert!(!env.path("ran").exists());
    // Before: 5 s (the connect timeout).
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(3500),
        "gave up after {took:?} with --wait 2s"
    );
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    // --wait bounds waiting, not a healthy server's answers: each of them takes 100 ms here.
    let server = ZkServer::start();
    let env = TestEnv::new(&server);
    let proxy = Proxy::with_delay(server.port(), Duration::from_millis(50));
    let url = format!("zk://127.0.0.1:{}", proxy.port);
    let out = env.run([
        "run",
        "--wait",
        "1ms",
        "--url",
        &url,
        &name(),
        "touch",
        "ran",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
}
