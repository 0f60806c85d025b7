//! Waiting on Redis: dead waiters drop out of the queue, `release --force` clears what none
//! keeps, the busy message tells a queue from a holder, and a silent server is bounded.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

use super::{key, sigkill};

#[test]
fn a_release_wakes_the_waiter_that_was_next_at_the_grant_in_the_same_script() {
    // B takes the lock from A while C waits behind it: B's grant names C as next in line, so
    // B's release wakes C inside the release script ("woke-next") instead of with a second
    // call ("wake-sent"), one round trip less on the hand-off's path.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut a = env.hold(&lock, &[]);
    let mut b = env
        .dlock(["run", &lock, "sh", "-c", "touch b-ran; exec sleep 1000"])
        .env("DLOCK_LOG", "dlock::handoff=debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn B");
    wait_until("B queued", PATIENCE, || env.waiters(&lock) == 1);
    let mut c = env
        .dlock(["run", &lock, "touch", "c-ran"])
        .spawn()
        .expect("spawn C");
    wait_until("C queued", PATIENCE, || env.waiters(&lock) == 2);
    a.signal(Signal::SIGTERM);
    a.wait();
    wait_until("B runs", PATIENCE, || env.path("b-ran").exists());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(b.id() as i32), Signal::SIGTERM)
        .expect("signal B");
    wait_within(&mut b, PATIENCE);
    assert!(wait_within(&mut c, PATIENCE).success());
    assert!(env.path("c-ran").exists());
    let said = stderr_left(&mut b);
    let ends = |event: &str| said.lines().any(|l| l.ends_with(&format!(" {event}")));
    assert!(
        ends("woke-next") && !ends("wake-sent"),
        "B's release should wake C in the release script:\n{said}"
    );
}

#[test]
fn a_dead_waiter_drops_out_of_the_queue() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut holder = env.hold(&lock, &[]);
    let mut dead = env
        .dlock(["run", &lock, "touch", "dead-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("first waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let entered = env.path("entered");
    let mut alive = env
        .dlock(["run", &lock, "touch", entered.to_str().expect("utf-8")])
        .spawn()
        .expect("spawn waiter");
    wait_until("second waiter queued", PATIENCE, || env.waiters(&lock) == 2);
    // The first waiter dies without leaving the queue; the release wakes it, in vain.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead.id() as i32),
        Signal::SIGKILL,
    )
    .expect("kill");
    let _ = dead.wait();
    let released = Instant::now();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    wait_until("live waiter entered", PATIENCE, || entered.exists());
    // Its place in line lasts 2 s after its last heartbeat; the live waiter heartbeats (and
    // re-checks) every 0.5 s.
    assert!(
        released.elapsed() <= Duration::from_secs(3 + 2),
        "took {:?}",
        released.elapsed()
    );
    assert!(wait_within(&mut alive, PATIENCE).success());
    assert!(!env.path("dead-ran").exists());
}

#[test]
fn a_killed_waiter_holds_up_a_freed_lock_only_briefly_whatever_its_ttl() {
    // CI runners cancel jobs with SIGKILL: a waiter that never leaves the queue must not keep
    // a freed lock from others for its whole --ttl.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut holder = env.hold(&lock, &["--ttl", "60s"]);
    let mut waiter = env
        .dlock(["run", "--ttl", "7days", &lock, "touch", "waiter-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    sigkill(&mut waiter);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let freed = Instant::now();
    let out = output_within(
        env.dlock([
            "run", "--ttl", "60s", "--wait", "30s", &lock, "touch", "ran",
        ]),
        Duration::from_secs(40),
    );
    let took = freed.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    assert!(
        took < Duration::from_secs(15),
        "a dead waiter held up the freed lock for {took:?}"
    );
    assert!(!env.path("waiter-ran").exists());
}

#[test]
fn a_killed_waiter_is_not_counted_for_long_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let _holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", "--ttl", "7days", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    sigkill(&mut waiter);
    // Its heartbeat stopped: within a few seconds `status` no longer counts it, and its
    // entries expire with it (not a --ttl later).
    wait_until(
        "dead waiter no longer counted",
        Duration::from_secs(10),
        || env.waiters(&lock) == 0,
    );
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    wait_until(
        "dead waiter's entries gone",
        Duration::from_secs(10),
        || server.command(&format!("EXISTS {queue} {qdl}")) == ":0",
    );
}

#[test]
fn release_force_clears_waiter_entries_no_live_dlock_keeps() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let mut holder = env.hold(&lock, &[]);
    // A place in line no live dlock keeps: its heartbeat deadline is a week ahead (a live
    // waiter's is at most 2 s ahead).
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    assert_eq!(server.command(&format!("ZADD {queue} 1 gone")), ":1");
    assert_eq!(
        server.command(&format!("ZADD {qdl} 99999999999999 gone")),
        ":1"
    );
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr_of(&out).contains("released"), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("removed 1 waiter"),
        "{}",
        describe(&out)
    );
    assert_eq!(server.command(&format!("ZCARD {queue}")), ":0");
    assert_eq!(holder.wait().code(), Some(124));
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
}

#[test]
fn not_acquired_tells_a_queue_ahead_from_a_holder() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    // A waiter's place in line as a live waiter keeps it (heartbeat deadline far ahead).
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    assert_eq!(server.command(&format!("ZADD {queue} 1 someone")), ":1");
    assert_eq!(
        server.command(&format!("ZADD {qdl} 99999999999999 someone")),
        ":1"
    );
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, but 1 waiter is ahead in the queue");
    assert!(!stderr_of(&out).contains("is held"), "{}", describe(&out));
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, but 1 waiter is ahead in the queue");
    assert!(stderr_of(&out).contains("300ms"), "{}", describe(&out));
    // A holder is reported as one.
    assert_eq!(server.command(&format!("DEL {queue} {qdl}")), ":2");
    let holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held by pid");
    assert!(stderr_of(&out).contains(&holder.pid().to_string()));
    assert!(!stderr_of(&out).contains("ahead"), "{}", describe(&out));
    assert!(!env.path("ran").exists());
}

#[test]
fn wait_bounds_a_server_that_accepts_and_never_answers() {
    let silent = SilentServer::start();
    let env = TestEnv::new(&FileServer::start());
    let url = format!("redis://127.0.0.1:{}/0", silent.port);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "2s", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "no answer from");
    assert!(stderr_of(&out).contains("--wait 2s"), "{}", describe(&out));
    assert!(took < Duration::from_secs(2) + PAST_WAIT, "took {took:?}");
    assert!(!env.path("ran").exists());
    // --no-wait is bounded too.
    let started = Instant::now();
    let out = env.run(["run", "--no-wait", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "no answer from");
    assert!(took < Duration::from_secs(12), "took {took:?}");
    assert!(!env.path("ran").exists());
}

#[test]
fn a_short_wait_still_gives_a_silent_server_two_seconds_to_answer() {
    // As on every backend, a --wait shorter than 2 s bounds the lock's wait, not the
    // server's time to answer: no answer is 69 after 2 s, and the message says both.
    let silent = SilentServer::start();
    let env = TestEnv::new(&FileServer::start());
    let url = format!("redis://127.0.0.1:{}/0", silent.port);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "100ms", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "no answer from");
    assert!(
        stderr_of(&out).contains("within 2s (--wait 100ms)"),
        "{}",
        describe(&out)
    );
    assert!(took >= Duration::from_secs(2), "took {took:?}");
    assert!(took < Duration::from_secs(2) + PAST_WAIT, "took {took:?}");
    assert!(!env.path("ran").exists());
}

#[test]
fn a_place_in_line_without_a_heartbeat_does_not_hold_up_the_lock() {
    // Written by hand (or half of it lost): a queue entry with no heartbeat deadline at all
    // would never lapse; it is dropped like a dead waiter.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let queue = key(&lock, "queue");
    assert_eq!(server.command(&format!("ZADD {queue} 1 ghost")), ":1");
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    // Behind a holder too: the release admits the live waiter, not the ghost before it.
    let mut holder = env.hold(&lock, &[]);
    assert_eq!(server.command(&format!("ZADD {queue} 1 ghost")), ":1");
    let mut waiter = env
        .dlock(["run", "--wait", "60s", &lock, "touch", "waited"])
        .spawn()
        .expect("spawn waiter");
    wait_until("the waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    assert!(wait_within(&mut waiter, PATIENCE).success());
    assert!(env.path("waited").exists());
    assert_eq!(server.command(&format!("ZSCORE {queue} ghost")), "$-1");
}

#[test]
fn wait_bounds_a_server_that_stops_answering_while_we_wait() {
    // A waiter queued behind a holder when the server freezes (SIGSTOP): the last check at
    // the --wait deadline, the reason and leaving the queue all fit in the 0.5 s after it.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let _holder = env.hold(&lock, &["--ttl", "60s"]);
    let started = Instant::now();
    let mut waiter = env
        .dlock(["run", "--wait", "2s", &lock, "touch", "ran"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("the waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let pid = nix::unistd::Pid::from_raw(server.pid());
    nix::sys::signal::kill(pid, Signal::SIGSTOP).expect("stop the server");
    let status = wait_within(&mut waiter, PATIENCE);
    let took = started.elapsed();
    nix::sys::signal::kill(pid, Signal::SIGCONT).expect("continue the server");
    let said = stderr_left(&mut waiter);
    assert!(matches!(status.code(), Some(69 | 75)), "{status}: {said}");
    assert!(
        took < Duration::from_secs(2) + PAST_WAIT,
        "took {took:?}: {said}"
    );
    assert!(!env.path("ran").exists());
}
