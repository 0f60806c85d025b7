//! Waiting on ZooKeeper: a cancelled waiter leaves no node, an emptied lock node goes and
//! comes back, a killed waiter at the head is a waiter, not a holder.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

#[test]
fn a_signal_or_an_expired_wait_leaves_no_node_behind() {
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
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
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    // The lock's node is a container: ZooKeeper removes it once it is empty.
    wait_until("container removed", PATIENCE, || {
        !server.children("/dlock").contains(&lock)
    });
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
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
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
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
    let server = ZkServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("z");
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
