//! Waiting on MySQL / MariaDB: waiters are granted in arrival order (one `GET_LOCK` call
//! for the whole wait keeps each one's place in the server's queue), a waiter without
//! `--wait` survives a server restart, and the shortest `--wait` still tries the lock.

use std::process::{Child, Stdio};

use nix::sys::signal::Signal;

use crate::support::*;

/// Sessions of dlock waiters (not the holder's watcher) that have been in one lock call
/// for `seconds` or more.
fn waiting_for_at_least(server: &MysqlServer, seconds: u32) -> u64 {
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE '%user%lock%' \
             AND INFO LIKE '%@dlock_granted%' AND TIME >= {seconds}"
        ))
        .parse()
        .unwrap_or(0)
}

#[test]
fn waiters_are_granted_in_arrival_order() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let order = env.path("order");
    let mut holder = env.hold(&lock, &[]);
    let mut waiters: Vec<Child> = Vec::new();
    for i in 0..6u64 {
        let waiter = env
            .dlock([
                "run",
                &lock,
                "sh",
                "-c",
                &format!("echo {i} >> {}", order.display()),
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn waiter");
        waiters.push(waiter);
        wait_until("the waiter queued", PATIENCE, || {
            env.waiters(&lock) == i + 1
        });
    }
    // Longer than a waiter that queued again every few seconds would stay in one call.
    wait_until("every waiter in one long call", PATIENCE, || {
        waiting_for_at_least(&server, 3) == 6
    });
    holder.signal(Signal::SIGTERM);
    holder.wait();
    for waiter in &mut waiters {
        let status = wait_within(waiter, PATIENCE);
        let stderr = stderr_left(waiter);
        assert!(status.success(), "{stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(&order).expect("order"),
        "0\n1\n2\n3\n4\n5\n"
    );
}

#[test]
fn a_waiter_without_wait_survives_a_server_restart() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let ran = env.path("ran");
    let mut holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo ok > {}", ran.display()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("the waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    server.restart_after_crash();
    assert_eq!(holder.wait().code(), Some(124), "{}", holder.stderr());
    let status = wait_within(&mut waiter, PATIENCE);
    let stderr = stderr_left(&mut waiter);
    assert!(status.success(), "the waiter gave up: {stderr}");
    assert!(ran.exists(), "{stderr}");
}

#[test]
fn the_shortest_wait_still_tries_the_lock() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let out = env.run(["run", "--wait", "1ns", &lock, "true"]);
    assert!(out.status.success(), "free: {}", describe(&out));
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--wait", "1ns", &lock, "true"]);
    assert_eq!(out.status.code(), Some(75), "held: {}", describe(&out));
}
