//! Fencing tokens on memcached: a counter item advanced to max(last + 1, the taker's clock in
//! µs), followed when it is ahead of the clock and the clock when it is gone (a restart is the
//! contract's, `crash_contract_tests!`).

use crate::support::*;

fn fence_key(lock: &str) -> String {
    format!("dlock:{lock}:f")
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

#[test]
fn tokens_follow_the_counter_when_it_is_ahead_of_the_clock_and_the_clock_when_it_is_gone() {
    let server = MemcachedServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let first = env.token(&lock);
    assert!(
        first >= now_micros() - 60_000_000,
        "not clock-based: {first}"
    );
    // A counter far ahead of every clock: the next token is one more.
    let ahead = now_micros() + 3_600_000_000;
    let value = format!("{ahead} 1");
    let stored = server.request(
        &format!("ms {} {} T0\r\n{value}\r\n", fence_key(&lock), value.len()),
        "\r\n",
    );
    assert_eq!(stored, "HD\r\n");
    assert_eq!(env.token(&lock), ahead + 1);
    // The counter gone (as after a flush): the clock again, still above earlier tokens.
    let deleted = server.request(&format!("md {}\r\n", fence_key(&lock)), "\r\n");
    assert_eq!(deleted, "HD\r\n");
    let third = env.token(&lock);
    assert!(third > first, "{third} <= {first}");
}

#[test]
fn a_counter_holding_foreign_data_is_reported_not_overwritten() {
    let server = MemcachedServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let stored = server.request(
        &format!("ms {} 5 T0\r\nhello\r\n", fence_key(&lock)),
        "\r\n",
    );
    assert_eq!(stored, "HD\r\n");
    let out = env.run(["run", &lock, "touch", "ran"]);
    assert_fails(&out, 69, "did not write");
    assert!(!env.path("ran").exists());
    // Nothing is left held.
    let out = env.run(["status", &lock]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
}

#[test]
fn a_slot_holding_foreign_data_is_reported_not_waited_for() {
    let server = MemcachedServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("mc");
    let stored = server.request(&format!("ms dlock:{lock}:0 5 T0\r\nhello\r\n"), "\r\n");
    assert_eq!(stored, "HD\r\n");
    let out = env.run(["run", "--wait", "10s", &lock, "touch", "ran"]);
    assert_fails(&out, 69, "did not write");
    assert!(!env.path("ran").exists());
}
