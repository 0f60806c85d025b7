//! Waiting on PostgreSQL: a killed or cancelled waiter leaves no lock request behind, a
//! semaphore waiter is woken, and holders must agree on `--limit`.

use std::process::Stdio;

use nix::sys::signal::Signal;

use crate::support::*;

use super::sql::{KEY_SQL, OTHERS_KEY_SQL};

#[test]
fn killed_waiter_leaves_the_queue() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let _holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    waiter.kill().expect("kill waiter");
    let _ = waiter.wait();
    // client_connection_check_interval: the server notices the dead client within ~1s.
    wait_until("queue empty", PATIENCE, || server.pending_requests() == 0);
}

#[test]
fn cancelled_waits_leave_no_lock_request_behind() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--wait", "300ms", &lock, "true"]);
    assert_fails(&out, 75, "held");
    assert_eq!(server.pending_requests(), 0, "--wait expiry left a request");

    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal waiter");
    assert_eq!(wait_within(&mut waiter, PATIENCE).code(), Some(128 + 15));
    // The cancel was acknowledged before dlock exited: nothing is queued any more.
    assert_eq!(server.pending_requests(), 0, "SIGTERM left a request");
}

#[test]
fn semaphore_waiter_is_woken_by_a_release() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let mut first = env.hold(&lock, &["--limit", "2"]);
    let _second = env.hold(&lock, &["--limit", "2"]);
    let entered = env.path("entered");
    let mut third = env
        .dlock([
            "run",
            "--limit",
            "2",
            &lock,
            "touch",
            entered.to_str().expect("utf-8"),
        ])
        .spawn()
        .expect("spawn third");
    wait_until("third queued", PATIENCE, || env.waiters(&lock) == 1);
    assert!(!entered.exists());
    first.signal(Signal::SIGTERM);
    first.wait();
    assert!(wait_within(&mut third, PATIENCE).success());
    assert!(entered.exists());
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let _holder = env.hold(&lock, &["--limit", "2"]);
    // Slot 1 is free, so without the check `--limit 3` would run beside the holder, and a
    // `--limit 1` would queue behind it.
    for extra in [
        &["--no-wait", "--limit", "3"][..],
        &["--limit", "1"],
        &["--no-wait"],
    ] {
        let mut args = vec!["run"];
        args.extend(extra);
        args.extend([lock.as_str(), "touch", "ran"]);
        let out = env.run(&args);
        assert_fails(&out, 64, "--limit 2");
        assert!(!env.path("ran").exists(), "{extra:?}: the command ran");
    }
    assert_eq!(server.pending_requests(), 0, "a refused run stayed queued");

    // And the other way round: a `--limit 1` holder refuses `--limit 2`.
    let other = lock_name("p");
    let _single = env.hold(&other, &[]);
    let out = env.run(["run", "--no-wait", "--limit", "2", &other, "touch", "ran"]);
    assert_fails(&out, 64, "--limit 1");
    assert!(!env.path("ran").exists(), "the command ran");
}

#[test]
fn a_waiter_that_gets_the_lock_beside_another_limit_refuses() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    // SQL (no recorded limit) holds the key that is slot 0 of every limit.
    let mut sql = server.psql_session(
        &["prefix=dlock", &format!("name={lock}")],
        &format!("SELECT pg_advisory_lock({KEY_SQL});"),
    );
    wait_until("psql holds the key", PATIENCE, || {
        server.granted_advisory_locks() == 1
    });
    // A `--limit 1` waiter queues behind it (nobody records another limit yet)…
    let mut waiter = env
        .dlock(["run", "--limit", "1", &lock, "touch", "waiter-ran"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    // …and a `--limit 2` holder takes slot 1 meanwhile: the waiter holds no slot yet.
    let _pair = env.hold(&lock, &["--limit", "2"]);
    // The SQL session ends: the waiter is granted slot 0 beside a --limit 2 holder.
    drop(sql.stdin.take());
    let _ = wait_within(&mut sql, PATIENCE);
    let status = wait_within(&mut waiter, PATIENCE);
    let stderr = stderr_left(&mut waiter);
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--limit 2"), "{stderr}");
    assert!(!env.path("waiter-ran").exists(), "the waiter's command ran");
}

/// A `--limit 1` run that finds the name's others' key held (here by SQL; in life by a
/// `--limit N` run, or by another `--limit 1` run trying the key at that instant) reads
/// `pg_locks` instead, and with nobody recording another `--limit`, takes the lock, waiting
/// or not; beside a `--limit 2` holder it is refused as before.
#[test]
fn a_run_that_finds_the_others_key_held_looks_and_then_locks() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let mut sql = server.psql_session(
        &["prefix=dlock", &format!("name={lock}")],
        &format!("SELECT pg_advisory_lock_shared({OTHERS_KEY_SQL});"),
    );
    wait_until("psql holds the others' key", PATIENCE, || {
        server.granted_advisory_locks() == 1
    });
    let out = env.run(["run", "--no-wait", &lock, "touch", "tried"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "waited"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("tried").exists() && env.path("waited").exists());
    let _pair = env.hold(&lock, &["--limit", "2"]);
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "beside"]);
    assert_fails(&out, 64, "--limit 2");
    assert!(
        !env.path("beside").exists(),
        "the command ran beside --limit 2"
    );
    drop(sql.stdin.take());
    let _ = wait_within(&mut sql, PATIENCE);
}
