//! Fencing tokens without a flush: the grant's commit does not wait for the disk, so a crash
//! can lose the last transaction ids; the server's clock keeps the tokens increasing.

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::support::*;

/// Clients taking one lock at once, and grants each.
const CLIENTS: usize = 4;
const GRANTS: usize = 5;

/// Every token a burst of grants handed out, in the order the commands ran (each command
/// appends its token to `log` under the lock), checked to increase.
fn burst(env: &TestEnv, lock: &str) -> Vec<u64> {
    let log = env.path("tokens");
    let script = format!("echo $DLOCK_FENCING_TOKEN >> '{}'", log.display());
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                for _ in 0..GRANTS {
                    let out = env.run(["run", lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            });
        }
    });
    let text = std::fs::read_to_string(&log).expect("token log");
    let tokens: Vec<u64> = text
        .lines()
        .map(|t| t.parse().expect("a numeric token"))
        .collect();
    assert_eq!(tokens.len(), CLIENTS * GRANTS, "{text}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not increase in grant order: {tokens:?}"
    );
    tokens
}

#[test]
fn tokens_of_a_burst_of_grants_keep_increasing_across_a_sigkill_of_the_server() {
    // The WAL writer writes an unfinished WAL page only every wal_writer_delay (10 s at
    // most): commits that do not wait for the disk stay in the server's memory until then,
    // and a SIGKILL of every server process loses them, with the transaction ids they used.
    let server = PgServer::start_with(&["-c", "wal_writer_delay=10s"]);
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let seen = burst(&env, &lock);
    let postmaster: i32 = std::fs::read_to_string(server.data().join("postmaster.pid"))
        .expect("postmaster.pid")
        .lines()
        .next()
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the postmaster's pid");
    // `pg_ctl` starts the postmaster in a process group of its own, with every child in it.
    killpg(Pid::from_raw(postmaster), Signal::SIGKILL).expect("SIGKILL the server");
    wait_until("every server process is gone", PATIENCE, || {
        killpg(Pid::from_raw(postmaster), None).is_err()
    });
    server.restart_immediate();
    let highest = seen.iter().copied().max().unwrap_or(0);
    let next = env.token(&lock);
    assert!(
        next > highest,
        "token {next} after the crash is not above {highest}, handed out before it ({seen:?})"
    );
}
