//! Fencing tokens without a flush: no reply waits for the commit of the token's counter, so
//! a crash can lose its latest bumps; the server's clock keeps the tokens increasing.

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
    // With innodb_flush_log_at_trx_commit=0 InnoDB writes its log once a second: a SIGKILL
    // loses every commit of the last second, the counter's latest bumps among them.
    let server = MysqlServer::start_with(&["--innodb-flush-log-at-trx-commit=0"]);
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let seen = burst(&env, &lock);
    server.restart_after_crash();
    let highest = seen.iter().copied().max().unwrap_or(0);
    let next = env.token(&lock);
    assert!(
        next > highest,
        "token {next} after the crash is not above {highest}, handed out before it ({seen:?})"
    );
}
