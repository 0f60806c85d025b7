//! Leases on the server's clock: a holder and a waiter whose wall clocks are ten minutes off
//! in opposite directions (only the wall clock: `scripts/faultlib/skew.c` under
//! `LD_PRELOAD`, timers untouched) neither take a live lock nor keep a dead one; and a host
//! further off than S3 takes signatures from is told so in one line.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::fake::FakeS3;
use super::FREED_WITHIN;
use crate::support::*;

#[test]
fn a_holder_ten_minutes_slow_and_a_waiter_ten_minutes_fast_keep_to_the_servers_clock() {
    let server = S3Server::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("skew");
    let ready = env.path("ready");
    let script = format!("echo $DLOCK_FENCING_TOKEN > '{}'; exec sleep 1000", ready.display());
    let mut holder = Holding {
        child: env.skewed(&["run", &lock, "sh", "-c", &script], -600)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the holder"),
        ready: ready.clone(),
    };
    wait_until("the holder's command started", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|t| t.ends_with('\n'))
    });
    let held: u64 = std::fs::read_to_string(&ready)
        .expect("the holder's token")
        .trim()
        .parse()
        .expect("a token");
    let entered = env.path("entered");
    let waiter_script = format!("echo $DLOCK_FENCING_TOKEN > '{}'", entered.display());
    let mut waiter = env.skewed(&["run", "--wait", "60s", &lock, "sh", "-c", &waiter_script],
        600,
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn the waiter");
    wait_until("the waiter polls", PATIENCE, || env.waiters(&lock) == 1);
    // Longer than the TTL and the server's two seconds, with the holder renewing: a waiter
    // that judged by its own clock (ten minutes ahead) would have taken the lock at once.
    let watch_until = Instant::now() + Duration::from_secs(5 + 2 + 2);
    while Instant::now() < watch_until {
        assert!(!entered.exists(), "the waiter took a live lock");
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = Instant::now();
    holder.signal(nix::sys::signal::Signal::SIGKILL);
    holder.wait();
    wait_until("the waiter took the dead holder's lock", PATIENCE, || {
        std::fs::read_to_string(&entered).is_ok_and(|t| t.ends_with('\n'))
    });
    let took = killed.elapsed();
    assert!(took <= FREED_WITHIN, "the waiter took {took:?} after the holder died");
    assert!(wait_within(&mut waiter, PATIENCE).success());
    let token: u64 = std::fs::read_to_string(&entered)
        .expect("the waiter's token")
        .trim()
        .parse()
        .expect("a token");
    assert!(token > held, "{token} after {held}");
}

/// moto checks no signatures (a dlock twenty minutes ahead is served there), so the message
/// is checked against a server that refuses the request as S3 does for a date more than 15
/// minutes from its own.
#[test]
fn a_clock_too_far_off_for_signatures_is_named_with_the_skew() {
    let fake = FakeS3::start(|_, _| {
        (
            403,
            vec![("Content-Type".into(), "application/xml".into())],
            "<Error><Code>RequestTimeTooSkewed</Code><Message>The difference between the \
             request time and the current time is too large.</Message></Error>"
                .into(),
        )
    });
    let env = TestEnv::new(&fake);
    let out = output_within(
        env.skewed(&["run", "--url", &fake.url(), &lock_name("s"), "touch", "ran"], 1200),
        PATIENCE,
    );
    assert_fails(&out, 78, "this host's clock is 20m ahead of the server's (RequestTimeTooSkewed");
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", describe(&out));
    assert!(!env.path("ran").exists());
}
