//! Tokens are the revisions of the slots' keys: the stream's sequence, which only grows,
//! across releases, expiries, `release --force` and a restart of the server with its store;
//! a bucket dlock creates starts it at the clock in µs, so that a bucket deleted and created
//! again does not start again below old tokens.

use nix::sys::signal::Signal;

use crate::support::*;

/// The token of the holder of `lock`, as `status --json` shows it.
fn held_token(env: &TestEnv, lock: &str) -> u64 {
    env.status_json(lock)["holders"][0]["token"]
        .as_u64()
        .expect("a holder's token")
}

#[test]
fn tokens_increase_across_release_expiry_release_force_and_a_restart() {
    let mut server = NatsServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("tokens");
    let first = env.token(&lock);
    let second = env.token(&lock);
    assert!(second > first, "{second} after {first}");

    // release --force
    let holder = env.hold(&lock, &[]);
    let forced = held_token(&env, &lock);
    assert!(forced > second, "{forced} after {second}");
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    drop(holder);
    let third = env.token(&lock);
    assert!(third > forced, "{third} after {forced}");

    // expiry: a killed holder's key expires on the server.
    let mut killed = env.hold(&lock, &[]);
    let dead = held_token(&env, &lock);
    killed.signal(Signal::SIGKILL);
    killed.wait();
    let out = env.run(["run", "--wait", "30s", &lock, "sh", "-c", "echo $DLOCK_FENCING_TOKEN"]);
    assert!(out.status.success(), "{}", describe(&out));
    let expired: u64 = stdout_of(&out).trim().parse().expect("a token");
    assert!(expired > dead, "{expired} after the expired {dead}");

    // a restart with the store
    server.restart();
    let restarted = env.token(&lock);
    assert!(restarted > expired, "{restarted} after the restart, {expired} before it");
}

/// A bucket dlock creates starts its revisions at the clock in µs: deleted and created again,
/// it hands out tokens above the old ones.
#[test]
fn a_bucket_created_again_gives_tokens_above_the_old_ones() {
    let server = NatsServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("again");
    let before = env.token(&lock);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    assert!(
        before > now_us - 600_000_000,
        "the first token {before} is not from the clock ({now_us} µs)"
    );
    let deleted = js_api(server.port, "$JS.API.STREAM.DELETE.KV_dlock", "").expect("a reply");
    assert!(deleted.contains("\"success\":true"), "{deleted}");
    let after = env.token(&lock);
    assert!(after > before, "{after} in the new bucket, {before} in the old one");
}

/// The holder of a lock keeps it across a restart of the server with its store (its key is
/// in the store), or stops its command as any lost lock: never a command running on without
/// the key; and the next token is above the one granted before.
#[test]
fn a_restart_during_a_hold_keeps_the_hold_or_stops_the_holder() {
    let mut server = NatsServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("restart");
    let mut holder = env.hold(&lock, &[]);
    let granted = held_token(&env, &lock);
    server.restart();
    // Two writes after the restart (renewals), or the holder's end.
    let last_seq = || server.stream_info("dlock")["state"]["last_seq"].as_u64().unwrap_or(0);
    let restarted_at = last_seq();
    wait_until("two renewals after the restart, or the holder's end", PATIENCE, || {
        last_seq() >= restarted_at + 2 || matches!(holder.child.try_wait(), Ok(Some(_)))
    });
    let status = env.status_json(&lock);
    let still = status["holders"][0]["token"].as_u64();
    match holder.child.try_wait().expect("the holder's state") {
        None => assert_eq!(still, Some(granted), "a live holder without its key: {status}"),
        Some(exit) => assert_eq!(exit.code(), Some(124), "{}", holder.stderr()),
    }
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let after = env.token(&lock);
    assert!(after > granted, "{after} after {granted}");
}

#[test]
fn tokens_of_a_burst_of_grants_keep_increasing_across_a_crash() {
    crate::contract::tokens_of_a_burst_of_grants_keep_increasing_across_a_crash(
        &mut NatsServer::start(),
    );
}

/// `release --force` stops the holder's command at once (124), not at its next renewal: the
/// holder watches its own key. At --ttl 60s the first renewal is 20 s after the grant.
#[test]
fn release_force_stops_the_holder_before_its_next_renewal() {
    let server = NatsServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("forced");
    let mut holder = env.hold(&lock, &["--ttl", "60s"]);
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    let forced = std::time::Instant::now();
    let status = wait_within(&mut holder.child, PATIENCE);
    assert_eq!(status.code(), Some(124), "{}", holder.stderr());
    assert!(
        forced.elapsed() < std::time::Duration::from_secs(15),
        "the holder ran on for {:?} after release --force",
        forced.elapsed()
    );
}
