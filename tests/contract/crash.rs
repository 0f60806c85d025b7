//! The contract of a server that crashes and comes back (`crash_contract_tests!`, for test
//! servers that can: [`LockServer::crash_and_restart`]): the holder of a lock the crash took
//! stops its command and exits 124, the lock is free afterwards, and no token is ever handed
//! out twice, not the one granted just before the crash, nor any of a burst of grants whose
//! latest writes the crash lost. And of a slow link (`slow_link_contract_tests!`): a grant
//! confirmed more slowly than a renewal attempt may take still starts the command.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

fn crash(server: &mut dyn LockServer) {
    assert!(
        server.crash_and_restart(),
        "this test server cannot crash: it has no place in crash_contract_tests!"
    );
}

/// A crash right after a grant, before or after the server wrote the token's counter down:
/// the holder stops its command (SIGTERM, which it notes) and exits 124, the lock is free,
/// and the next token is larger than the one granted before the crash.
pub fn a_crash_during_a_hold_stops_the_holder_and_tokens_keep_increasing(
    server: &mut dyn LockServer,
) {
    let env = TestEnv::new(server);
    let lock = lock_name("crash");
    let before = env.token(&lock);
    let (log, token) = (env.path("log"), env.path("token"));
    let script = format!(
        "trap 'echo holder-stopped >> {log}; exit 0' TERM; \
         echo $DLOCK_FENCING_TOKEN > {token}.tmp && mv {token}.tmp {token}; \
         while :; do sleep 0.05; done",
        log = log.display(),
        token = token.display()
    );
    let mut holder = env.spawn(&["run", "--kill-after", "5s", &lock, "sh", "-c", &script]);
    wait_until("the holder has its token", PATIENCE, || token.exists());
    crash(server);
    let granted = env.recorded_token("token");
    assert!(granted > before, "{granted} after {before}");
    let status = wait_within(&mut holder, PATIENCE);
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must notice the lost hold: {}",
        stderr_left(&mut holder)
    );
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock), "the crash left the lock held");
    let after = env.token(&lock);
    assert!(
        after > granted,
        "token {after} after the crash is not above {granted}, granted before it"
    );
}

/// Clients taking one lock at once, and grants each.
const CLIENTS: usize = 4;
const GRANTS: usize = 5;

/// A burst of grants from several clients at once, each token larger than the one before
/// in the order the commands ran, then a crash that loses the server's latest writes (its
/// launcher keeps them in memory for a while): the next token is above every one of them.
pub fn tokens_of_a_burst_of_grants_keep_increasing_across_a_crash(server: &mut dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("burst");
    let log = env.path("tokens");
    let script = format!("echo $DLOCK_FENCING_TOKEN >> '{}'", log.display());
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                for _ in 0..GRANTS {
                    let out = env.run(["run", &lock, "sh", "-c", &script]);
                    assert!(out.status.success(), "{}", describe(&out));
                }
            });
        }
    });
    let text = std::fs::read_to_string(&log).expect("token log");
    let seen: Vec<u64> = text
        .lines()
        .map(|t| t.parse().expect("a numeric token"))
        .collect();
    assert_eq!(seen.len(), CLIENTS * GRANTS, "{text}");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens did not increase in grant order: {seen:?}"
    );
    crash(server);
    let highest = seen.iter().copied().max().unwrap_or(0);
    let next = env.token(&lock);
    assert!(
        next > highest,
        "token {next} after the crash is not above {highest}, handed out before it ({seen:?})"
    );
}

/// A waiter granted over a link that delays every chunk 300 ms each way confirms its grant
/// in a round trip of 0.6 s: more than a renewal attempt of a running command may take
/// (TTL/6: 0.5 s at `--ttl 3s`), well within what the lease allows a grant's check before
/// the command starts (the keeper's give-up point for the hold it proves), so the command
/// runs.
pub fn a_grant_confirmed_slower_than_a_renewal_attempt_still_starts_the_command(
    server: &dyn LeaseServer,
) {
    let env = TestEnv::new(server.as_lock_server());
    let lock = lock_name("slow");
    let mut holder = env.hold(&lock, &[]);
    let proxy = Proxy::with_delay(server.port(), Duration::from_millis(300));
    let url = server.url_via(proxy.port);
    let mut waiter = env.spawn(&[
        "run",
        "--url",
        &url,
        "--ttl",
        "3s",
        &lock,
        "sh",
        "-c",
        "echo ok > ran",
    ]);
    wait_until("the waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let status = wait_within(&mut waiter, PATIENCE);
    let stderr = stderr_left(&mut waiter);
    assert!(status.success(), "{stderr}");
    assert!(env.path("ran").exists(), "{stderr}");
}

/// Expand the crash promises into `#[test]`s for one backend whose test server can crash
/// and restart, in a module `$module`, each on a private server from `$start` (a launcher
/// that keeps recent writes in memory makes a crash lose them).
#[macro_export]
macro_rules! crash_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@mut_tests $start;
                a_crash_during_a_hold_stops_the_holder_and_tokens_keep_increasing,
                tokens_of_a_burst_of_grants_keep_increasing_across_a_crash,
            );
        }
    };
}

/// Expand the slow-link promises into `#[test]`s for one backend whose test server can be
/// reached through a delaying proxy ([`LeaseServer`]).
#[macro_export]
macro_rules! slow_link_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                a_grant_confirmed_slower_than_a_renewal_attempt_still_starts_the_command,
            );
        }
    };
}
