//! Failovers while a lock is held and waited for: never two commands at once (a shared
//! marker directory that each command creates and removes), the holder keeps its hold or
//! stops with 124, the waiter then runs on the new master with a larger fencing token, and a
//! run right after works. With `?replicas=1` the hold survives the failover; with more
//! replicas than there are, the command does not start.

use std::process::Child;
use std::time::Duration;

use crate::support::*;

/// A command that fails with 99 if another one is inside, records its token in `token`,
/// touches `started`, and stays until `go` exists (at most 30 s); SIGTERM leaves cleanly.
fn exclusive(env: &TestEnv, token: &str, started: &str, go: &str) -> String {
    let marker = env.path("inside");
    format!(
        "mkdir {m} || exit 99; trap 'rmdir {m}; exit 143' TERM; \
         echo $DLOCK_FENCING_TOKEN > {t}; touch {s}; i=0; \
         while [ ! -e {g} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; rmdir {m}",
        m = marker.display(),
        t = env.path(token).display(),
        s = env.path(started).display(),
        g = env.path(go).display(),
    )
}

fn spawn(env: &TestEnv, args: &[&str]) -> Child {
    env.dlock(args).spawn().expect("spawn dlock")
}

fn token_in(env: &TestEnv, file: &str) -> u64 {
    std::fs::read_to_string(env.path(file))
        .expect("token file")
        .trim()
        .parse()
        .expect("a numeric token")
}

/// A holder (through `url`) and a queued waiter (through `waiter_url`); fail over, hold on
/// for 5 s more (renewals on the new master), then let go.
fn fail_over_while_held(
    server: &SentinelServer,
    env: &TestEnv,
    url: &str,
    waiter_url: &str,
) -> (Child, Child) {
    let lock = "failover";
    let holder_script = exclusive(env, "t1", "started1", "go");
    let mut holder = spawn(
        env,
        &["run", "--url", url, lock, "sh", "-c", &holder_script],
    );
    wait_until("the holder runs", PATIENCE, || {
        env.path("started1").exists()
    });
    let waiter_script = exclusive(env, "t2", "started2", "go");
    let waiter = spawn(
        env,
        &["run", "--url", waiter_url, lock, "sh", "-c", &waiter_script],
    );
    wait_until("the waiter queued", PATIENCE, || env.waiters(lock) == 1);
    let before = server.master_port();
    server.failover();
    assert_ne!(server.master_port(), before);
    // Hold on for a while on the new master (the holder renews there, or stops with 124).
    let _ = wait_within_or_timeout(&mut holder, Duration::from_secs(5));
    std::fs::write(env.path("go"), b"").expect("go");
    (holder, waiter)
}

/// `child`'s status if it ends within `limit`, else `None` (it keeps running).
fn wait_within_or_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn failover_while_held_and_waited_for_never_runs_two_commands() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server);
    failover_never_runs_two_commands(&server, &env);
    // And the lock is on the new master.
    let keys = server.master().command("KEYS dlock:*fence");
    assert!(!keys.is_empty(), "no lock keys on the new master");
}

/// `SENTINEL FAILOVER` while a lock is held and waited for: the holder keeps its hold or
/// stops with 124, the waiter runs alone afterwards with a larger token, and a run right after
/// gets a larger one still.
pub(super) fn failover_never_runs_two_commands(server: &SentinelServer, env: &TestEnv) {
    let url = server.url();
    let (mut holder, mut waiter) = fail_over_while_held(server, env, &url, &url);
    let held = wait_within(&mut holder, PATIENCE);
    assert!(
        held.success() || held.code() == Some(124),
        "the holder must keep its hold or stop with 124: {held:?}"
    );
    let waited = wait_within(&mut waiter, PATIENCE);
    assert!(
        waited.success(),
        "the waiter must run alone on the new master (99: two commands at once): {waited:?}"
    );
    let (t1, t2) = (token_in(env, "t1"), token_in(env, "t2"));
    assert!(
        t2 > t1,
        "tokens must increase across the failover: {t1} then {t2}"
    );
    // A run right after works, with a larger token still.
    let t3 = env.token("failover");
    assert!(t3 > t2, "{t2} then {t3}");
}

#[test]
fn with_replicas_1_a_failover_during_a_hold_keeps_the_hold() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server);
    let url = server.url().replace("/0#", "/0?replicas=1#");
    // The waiter asks for no replica: the new master has none until the sentinels turn the
    // old one into its replica (about 10 s later), and replicas=1 would refuse it until then.
    let (mut holder, mut waiter) = fail_over_while_held(&server, &env, &url, &server.url());
    let held = wait_within(&mut holder, PATIENCE);
    assert!(
        held.success(),
        "the hold must survive the failover: {held:?}"
    );
    let waited = wait_within(&mut waiter, PATIENCE);
    assert!(waited.success(), "{waited:?}");
    assert!(token_in(&env, "t2") > token_in(&env, "t1"));
}

#[test]
fn more_replicas_than_acknowledge_refuse_to_start_and_give_the_lock_back() {
    let server = SentinelServer::shared();
    let env = TestEnv::new(&server);
    let url = server
        .url()
        .replace("/0#", "/0?replicas=2&replicas-timeout=200ms#");
    let out = env.run(["run", "--url", &url, "r", "touch", "ran"]);
    assert_fails(&out, 69, "only 1 of the 2 replicas");
    assert!(!env.path("ran").exists());
    // Given back at once: the next run gets it without waiting for a TTL.
    let out = env.run(["run", "--no-wait", "r", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Seconds since the epoch, as `date +%s.%N` wrote them into `file`.
fn time_in(env: &TestEnv, file: &str) -> f64 {
    std::fs::read_to_string(env.path(file))
        .expect("time file")
        .trim()
        .parse()
        .expect("a time")
}

#[test]
fn a_hold_the_failover_lost_stops_the_holder_with_124_within_the_window() {
    let server = SentinelServer::start();
    let env = TestEnv::new(&server); // TTL 3 s: renewals every 1 s
    let url = server.url();
    let lock = "lost";
    let holder_script = format!(
        "echo $DLOCK_FENCING_TOKEN > {t}; touch {s}; \
         trap 'date +%s.%N > {stopped}; exit 143' TERM; while :; do sleep 0.05; done",
        t = env.path("t1").display(),
        s = env.path("started1").display(),
        stopped = env.path("stopped").display(),
    );
    let mut holder = spawn(
        &env,
        &["run", "--url", &url, lock, "sh", "-c", &holder_script],
    );
    wait_until("the holder runs", PATIENCE, || {
        env.path("started1").exists()
    });
    let waiter_script = format!(
        "date +%s.%N > {started}; echo $DLOCK_FENCING_TOKEN > {t}",
        started = env.path("started2").display(),
        t = env.path("t2").display(),
    );
    let mut waiter = spawn(
        &env,
        &["run", "--url", &url, lock, "sh", "-c", &waiter_script],
    );
    wait_until("the waiter queued", PATIENCE, || env.waiters(lock) == 1);
    // The replica loses everything (the hold and the fencing counter), as if the hold had
    // never been replicated; then it is promoted.
    let replica = &server.nodes[1];
    assert_eq!(replica.command("CONFIG SET replica-read-only no"), "+OK");
    assert_eq!(replica.command("FLUSHALL"), "+OK");
    server.failover();
    let held = wait_within(&mut holder, PATIENCE);
    assert_eq!(held.code(), Some(124), "the holder must find its hold gone");
    assert!(wait_within(&mut waiter, PATIENCE).success());
    // The overlap is bounded by the documented window: TTL/3 + 1 s for the sentinels' answers
    // (+ the command's own SIGTERM handling, here immediate); generous slack for a loaded
    // machine.
    let overlap = time_in(&env, "stopped") - time_in(&env, "started2");
    eprintln!("overlap of the two commands: {overlap:.3} s (negative: none)");
    assert!(
        overlap < 1.0 + 1.0 + 1.5,
        "the two commands overlapped for {overlap:.2} s"
    );
    // Tokens still increase although the counter was lost: the new master's TIME in µs.
    let (t1, t2) = (token_in(&env, "t1"), token_in(&env, "t2"));
    assert!(t2 > t1, "{t1} then {t2}");
    assert!(env.token(lock) > t2);
}
