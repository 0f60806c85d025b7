//! The PostgreSQL backend: the whole contract against a real server, plus FIFO order, loss of
//! the session (terminated, black-holed, server restart), clean cancellation, the key's SQL
//! formula, TLS and authentication (issue: PostgreSQL backend): losing the session
//! (`session`), waiting and `--limit` (`waiting`), connecting, authentication and poolers
//! (`connect`), TLS (`tls`), the documented SQL (`sql`), shared locks (`shared`); a crash and a
//! slow link are the contract's (`crash_contract_tests!`, `slow_link_contract_tests!`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod connect;
pub(super) mod server;
mod session;
mod shared;
mod sql;
mod tls;
mod waiting;

use std::time::Duration;

use crate::support::*;

crate::contract_tests!(pg_contract, PgServer::shared());
crate::shared_contract_tests!(pg_shared_contract, PgServer::shared());
crate::shared_lease_contract_tests!(pg_shared_lease_contract, PgServer::shared());
// The WAL writer writes an unfinished WAL page only every wal_writer_delay: commits that do
// not wait for the disk stay in the server's memory until then, and a crash loses them, with
// the transaction ids they used.
crate::crash_contract_tests!(
    pg_crash_contract,
    PgServer::start_with(&["-c", "wal_writer_delay=10s"])
);
crate::slow_link_contract_tests!(pg_slow_link_contract, PgServer::shared());
crate::scale_test!(
    "postgres",
    PgServer::start_with(&["-c", "max_connections=100"])
);
crate::handoff_test!("postgres", PgServer::start());

/// `--min-hold`'s finish writes nothing once the lock was taken over
/// (the end of the session is noticed at once).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &PgServer::shared(),
        true,
    );
}

#[test]
fn waiters_acquire_in_arrival_order() {
    crate::contract::waiters_acquire_in_arrival_order(&PgServer::shared());
}

#[test]
fn killed_holder_frees_the_lock_within_one_second() {
    crate::contract::killed_holder_frees_the_lock_within(
        &PgServer::shared(),
        Duration::from_secs(1),
    );
}

#[test]
fn status_shows_the_holders_session() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let holder = env.hold(&lock, &[]);
    let out = env.run(["status", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains(&format!("pid {}", holder.pid())), "{text}");
    assert!(text.contains("backend pid"), "{text}");
    assert!(text.contains("127.0.0.1"), "{text}");
    let out = env.run(["list"]);
    assert!(stdout_of(&out).contains(&lock), "{}", describe(&out));
}
