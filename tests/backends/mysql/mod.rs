//! The MySQL / MariaDB backend (issue: MySQL / MariaDB backend): the whole contract against a
//! real MariaDB, the lease contract, and what is particular to `GET_LOCK`: losing the session
//! (`session`: killed holder, `KILL`, `release --force`, a server crash, and tokens across
//! databases and a reset table), waiting (`waiting`: arrival order, a restart while
//! waiting, a wait of 1 ns), access and names
//! (`access`: privileges, read-only, passwords, long/unicode/case-differing names), and TLS
//! (`tls`: every `ssl-mode` against a MariaDB with a test CA's certificate); a crash and a slow
//! link are the contract's (`crash_contract_tests!`, `slow_link_contract_tests!`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod access;
pub(super) mod server;
mod session;
mod tls;
mod waiting;

use crate::support::*;

crate::contract_tests!(mysql_contract, MysqlServer::shared());
crate::lease_contract_tests!(mysql_lease, MysqlServer::shared());
// InnoDB writes its log once a second: a SIGKILL loses every commit of the last second, the
// token counter's latest bumps among them.
crate::crash_contract_tests!(
    mysql_crash_contract,
    MysqlServer::start_with(&["--innodb-flush-log-at-trx-commit=0"])
);
crate::slow_link_contract_tests!(mysql_slow_link_contract, MysqlServer::shared());
crate::scale_test!("mysql", MysqlServer::start());
crate::handoff_test!("mysql", MysqlServer::start());

/// `--min-hold`'s finish writes nothing once the lock was taken over
/// (a killed connection is noticed at once, by the lease's watcher).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &MysqlServer::shared(),
        true,
    );
}

#[test]
fn status_shows_the_holders_connection_and_the_last_token() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let token = env.token(&lock);
    let holder = env.hold(&lock, &[]);
    let out = env.run(["status", "--json", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let first = &json["holders"][0];
    assert_eq!(
        first["pid"].as_i64(),
        Some(i64::from(holder.pid())),
        "{json}"
    );
    let held = first["token"].as_u64().unwrap_or(0);
    assert!(held > token, "{json}");
    assert_eq!(json["last_token"].as_u64(), Some(held), "{json}");
    let session = first["session"].as_str().unwrap_or_default();
    assert!(
        session.starts_with("connection id ") && session.contains("127.0.0.1"),
        "{json}"
    );
    let out = env.run(["list"]);
    assert!(stdout_of(&out).contains(&lock), "{}", describe(&out));
}

#[test]
fn check_reports_the_server_and_its_settings() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout_of(&out);
    assert!(text.contains("MariaDB"), "{text}");
    assert!(text.contains("dlock_locks"), "{text}");
}
