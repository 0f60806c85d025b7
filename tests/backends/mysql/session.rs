//! Losing the session: a SIGKILLed holder frees the lock at once, `KILL` of the holder's
//! connection stops its command (124), and fencing tokens keep increasing across a server
//! crash right after a grant.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

#[test]
fn killed_holder_frees_the_lock_within_one_second() {
    crate::contract::killed_holder_frees_the_lock_within(
        &MysqlServer::start(),
        Duration::from_secs(1),
    );
}

/// The holder's connection id, from `status`.
fn holder_connection(env: &TestEnv, lock: &str) -> u64 {
    let out = env.run(["status", "--json", lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {}", describe(&out)));
    json["holders"][0]["session"]
        .as_str()
        .and_then(|s| s.strip_prefix("connection id "))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no connection id in {json}"))
}

#[test]
fn kill_of_the_holders_connection_exits_124() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let (mut holder, log) = env.stoppable_holder(&server.url(), &lock);
    let id = holder_connection(&env, &lock);
    server.sql(&format!("KILL {id}"));
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock));
}

#[test]
fn tokens_increase_across_a_server_crash_right_after_a_grant() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let before = env.token(&lock);
    let seen = env.path("token");
    let mut holder = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!(
                "echo $DLOCK_FENCING_TOKEN > {}; exec sleep 1000",
                seen.display()
            ),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder granted", PATIENCE, || {
        std::fs::read_to_string(&seen).is_ok_and(|t| t.ends_with('\n'))
    });
    // SIGKILL right after the grant: the token must have been on disk before the command ran.
    server.restart_after_crash();
    let granted: u64 = std::fs::read_to_string(&seen)
        .expect("token")
        .trim()
        .parse()
        .expect("numeric token");
    assert!(granted > before);
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(status.code(), Some(124), "the crash ends the hold");
    let after = env.token(&lock);
    assert!(
        after > granted,
        "token {after} after the crash is not above {granted}, granted before it"
    );
}
