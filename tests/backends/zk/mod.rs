//! The ZooKeeper backend: the whole contract against a real ZooKeeper, plus FIFO, Curator
//! interop, cleanup of cancelled waiters, and a three-member ensemble: waiting
//! (`waiting`), connecting and authentication (`connect`), failover (`failover`), Curator
//! (`curator`), shared locks and Curator's read-write lock (`shared`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod connect;
mod curator;
mod failover;
pub(super) mod server;
mod shared;
mod waiting;

use std::collections::{HashMap, HashSet};

use crate::support::*;

crate::contract_tests!(zk_contract, ZkServer::shared());
crate::lease_contract_tests!(zk_lease_contract, ZkServer::shared());
crate::shared_contract_tests!(zk_shared_contract, ZkServer::shared());
crate::shared_lease_contract_tests!(zk_shared_lease_contract, ZkServer::shared());
crate::slow_link_contract_tests!(zk_slow_link_contract, ZkServer::shared());
crate::scale_test!("zookeeper", ZkServer::with_max_client_cnxns(None));
crate::handoff_test!("zookeeper", ZkServer::start());

/// `--min-hold`'s finish writes nothing once the lock was taken over
/// (the watch on our node notices the deletion at once).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &ZkServer::shared(),
        true,
    );
}

#[test]
fn a_waiter_whose_predecessor_takes_the_lock_watches_it_again_without_listing() {
    // --limit 1: B waits behind the holder A, C behind B. When A leaves, B takes the lock and
    // drops its waiting mark: a data change on B's node, which C watches. C watches B again
    // instead of listing the queue, so it lists once, after B's release, not twice.
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let dir = format!("/dlock/{lock}");
    let mut a = env.hold(&lock, &[]);
    let mut b = env
        .dlock(["run", &lock, "sh", "-c", "touch b-ran; exec sleep 1000"])
        .spawn()
        .expect("spawn B");
    wait_until("B queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut c = env
        .dlock(["run", &lock, "touch", "c-ran"])
        .env("DLOCK_LOG", "dlock::handoff=debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn C");
    // C watches the node ahead of its own: B's, the second in the queue.
    wait_until("C watching B", PATIENCE, || {
        let mut queue: Vec<String> = owners(&server, &dir).into_keys().collect();
        queue.sort_by_key(|path| path.rsplit('-').next().map(str::to_owned));
        queue.len() == 3
            && watches_by_session(&server)
                .values()
                .flatten()
                .any(|path| *path == queue[1])
    });
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait();
    wait_until("B runs", PATIENCE, || env.path("b-ran").exists());
    assert!(!env.path("c-ran").exists(), "C ran while B held the lock");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal B");
    wait_within(&mut b, PATIENCE);
    assert!(wait_within(&mut c, PATIENCE).success());
    assert!(env.path("c-ran").exists());
    let said = stderr_left(&mut c);
    let listings = said
        .lines()
        .filter(|l| l.ends_with(" children-read"))
        .count();
    assert_eq!(listings, 1, "C listed the queue {listings} times:\n{said}");
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
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
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
fn the_negotiated_session_timeout_is_used_and_reported() {
    let server = ZkServer::shared();
    let env = TestEnv::new(&server);
    // tickTime 200 ms: the server grants at most 20 ticks.
    let out = env.run(["run", "--ttl", "10s", &lock_name("z"), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("negotiated a 4s session timeout for --ttl 10s; using 4s"),
        "{}",
        describe(&out)
    );
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = ZkServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
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
fn the_reserved_zookeeper_prefix_is_refused_with_64() {
    let server = ZkServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--prefix",
        "zookeeper/x",
        &lock_name("z"),
        "touch",
        "ran",
    ]);
    assert_fails(&out, 64, "reserves");
    assert!(!env.path("ran").exists());
}
