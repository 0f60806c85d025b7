//! The contract: exit statuses, giving up, and a lock free at once after its command.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

pub fn command_exit_status_passes_through(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    for code in [0, 3, 255] {
        let out = env.run([
            "run",
            &lock_name("lock"),
            "sh",
            "-c",
            &format!("exit {code}"),
        ]);
        assert_eq!(out.status.code(), Some(code), "{}", describe(&out));
        assert!(
            stderr_of(&out).is_empty(),
            "dlock wrote to stderr: {}",
            describe(&out)
        );
    }
}

pub fn command_killed_by_signal_exits_128_plus_signal(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let out = env.run(["run", &lock_name("lock"), "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", describe(&out));
}

pub fn held_lock_with_no_wait_exits_75(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held");
    assert!(
        stderr_of(&out).contains(&holder.pid().to_string()),
        "holder pid not named: {}",
        describe(&out)
    );
    assert!(
        !env.path("ran").exists(),
        "the command ran without the lock"
    );
}

pub fn conflict_exit_code_changes_the_not_acquired_status(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "-n", "-E", "0", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(!env.path("ran").exists());
    let out = env.run(["run", "-E", "9", "--wait", "100ms", &lock, "touch", "ran"]);
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
}

pub fn wait_gives_up_after_the_duration_and_leaves_nothing_behind(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let _holder = env.hold(&lock, &[]);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 75, "300ms");
    assert!(
        took >= Duration::from_millis(300),
        "gave up early, after {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "gave up late, after {took:?}"
    );
    assert!(!env.path("ran").exists());
    let status = env.run(["status", "--json", &lock]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(json["holders"].as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        json["waiters"].as_u64().unwrap_or(0),
        0,
        "a waiter was left behind: {json}"
    );
}

pub fn lock_is_free_at_once_after_the_command_exits(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let out = env.run(["run", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.is_free(&lock));
    // Also while another waiter is queued: it gets the lock when the holder exits.
    let mut holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", &lock, "touch", "waited"])
        .spawn()
        .expect("spawn waiter");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let status = wait_within(&mut waiter, PATIENCE);
    assert!(status.success());
    assert!(env.path("waited").exists());
}
