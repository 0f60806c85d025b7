//! Shared locks on PostgreSQL (`--shared`: `pg_advisory_lock_shared` on the lock's key)
//! beyond the contract (`tests/contract/shared.rs`): the server's lock queue puts a shared
//! request behind a waiting exclusive one (SQL alone); what a role that cannot read the
//! holders' metadata sees; SQL's shared locks on the same key.

use std::process::Child;

use crate::support::*;

use super::sql::KEY_SQL;

/// `status --json` of `name`, with `extra` options (e.g. another `--url`).
fn status_json(env: &TestEnv, name: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["status", "--json"];
    args.extend(extra);
    args.push(name);
    let out = env.run(&args);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)))
}

/// The documented key of `name` in `env`'s namespace, as SQL without psql variables.
fn key_sql(env: &TestEnv, name: &str) -> String {
    let prefix = env.prefix.as_deref().unwrap_or("dlock");
    KEY_SQL
        .replace(":'prefix'", &format!("'{prefix}'"))
        .replace(":'name'", &format!("'{name}'"))
}

/// A psql session that runs `sql` and then stays connected until its stdin is dropped.
fn psql_holding(server: &PgServer, sql: &str) -> Child {
    server.psql_session(&[], sql)
}

/// End a [`psql_holding`] session (its lock goes with it).
fn end_psql(mut psql: Child) {
    drop(psql.stdin.take());
    let _ = wait_within(&mut psql, PATIENCE);
}

/// What the issue asks to verify on the real server, with SQL alone: a shared request that
/// arrives while an exclusive one waits is not granted beside the shared holder (a try
/// fails, a wait queues behind the exclusive request), and the release hands the lock to the
/// exclusive request first, then to the shared one.
#[test]
fn the_server_queues_a_shared_request_behind_a_waiting_exclusive_one() {
    let server = PgServer::start();
    let key = 4_200_000_029_i64;
    let reader = psql_holding(&server, &format!("SELECT pg_advisory_lock_shared({key});"));
    wait_until("the first reader holds", PATIENCE, || {
        server.granted_advisory_locks() == 1
    });
    let try_shared = format!("SELECT pg_try_advisory_lock_shared({key})");
    assert_eq!(server.psql(&try_shared), "t", "shared beside shared");
    let writer = psql_holding(&server, &format!("SELECT pg_advisory_lock({key});"));
    wait_until("the writer waits", PATIENCE, || {
        server.pending_requests() == 1
    });
    assert_eq!(
        server.psql(&try_shared),
        "f",
        "a shared try went ahead of the waiting exclusive request"
    );
    let late = psql_holding(&server, &format!("SELECT pg_advisory_lock_shared({key});"));
    wait_until("the late reader waits", PATIENCE, || {
        server.pending_requests() == 2
    });
    let granted_modes = || {
        server.psql(&format!(
            "SELECT string_agg(mode, ',' ORDER BY mode) FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND objid = ({key} & 4294967295)::oid"
        ))
    };
    assert_eq!(granted_modes(), "ShareLock", "only the first reader holds");
    end_psql(reader);
    wait_until("the writer holds", PATIENCE, || {
        server.pending_requests() == 1
    });
    assert_eq!(
        granted_modes(),
        "ExclusiveLock",
        "the writer, not the late reader"
    );
    end_psql(writer);
    wait_until("the late reader holds", PATIENCE, || {
        server.pending_requests() == 0
    });
    assert_eq!(granted_modes(), "ShareLock");
    end_psql(late);
}

/// A role that may not read the holders' statements (their metadata) still sees from
/// `pg_locks` every reader with its mode, in `status` and `list`, and no recorded `--limit`
/// listed as a lock.
#[test]
fn every_reader_and_its_mode_show_without_their_metadata() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    // Unlisted without metadata: a lock whose key looks like a recorded --limit 1 (1 in 2048).
    let lock = (0..20)
        .map(|_| lock_name("pg-shared"))
        .find(|name| server.psql(&format!("SELECT ({}) & 2047", key_sql(&env, name))) != "1")
        .expect("a name whose key does not end in 1");
    let other = lock_name("pg-shared");
    let a = env.hold(&lock, &["--shared"]);
    let b = env.hold(&lock, &["--shared"]);
    let _exclusive = env.hold(&other, &[]);
    let mut writer = env.spawn(&["run", &lock, "true"]);
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) == 1);
    let app = server.url_as("app", Some(APP_PASSWORD));
    let status = status_json(&env, &lock, &["--url", &app]);
    assert_eq!(
        modes_in(&status, "holders"),
        ["shared", "shared"],
        "{status}"
    );
    assert_eq!(modes_in(&status, "queue"), ["exclusive"], "{status}");
    for reader in [&a, &b] {
        assert!(
            status["holders"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| h["pid"] == reader.pid())),
            "reader {} not shown: {status}",
            reader.pid()
        );
    }
    let out = env.run(["status", "--url", &app, &lock]);
    let text = stdout_of(&out);
    // Several holders: the mode once, then a line for each holder.
    assert!(
        text.contains("state:      held by 2 holders") && text.contains("mode:       shared"),
        "{text}"
    );
    for holding in [&a, &b] {
        let line = format!("pid {} on ", holding.pid());
        assert_eq!(text.matches(&line).count(), 1, "{text}");
    }
    let out = env.run(["list", "--json", "--url", &app]);
    let listed: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    let locks = listed.as_array().expect("a list");
    assert!(
        locks
            .iter()
            .all(|l| l["name"].as_str().is_some_and(|n| n.starts_with("key:"))),
        "the metadata was readable after all: {listed}"
    );
    let mut seen: Vec<Vec<String>> = locks.iter().map(|l| modes_in(l, "holders")).collect();
    seen.sort();
    assert_eq!(
        seen,
        [vec!["exclusive"], vec!["shared", "shared"]],
        "{listed}"
    );
    // With the metadata, by name.
    let out = env.run(["list", "--json"]);
    let listed: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    let ours = listed
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == lock.as_str()))
        .unwrap_or_else(|| panic!("{lock} not listed: {listed}"));
    assert_eq!(modes_in(ours, "holders"), ["shared", "shared"], "{listed}");
    let _ = writer.kill();
    let _ = writer.wait();
}

/// SQL's `pg_advisory_lock_shared` on the documented key shares with dlock's readers and
/// excludes its writers, and the other way round.
#[test]
fn sql_shared_locks_on_the_key_share_with_readers_and_exclude_writers() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("pg-shared");
    let key = key_sql(&env, &lock);
    let sql = psql_holding(&server, &format!("SELECT pg_advisory_lock_shared({key});"));
    wait_until("SQL holds the key shared", PATIENCE, || {
        status_json(&env, &lock, &[])["held"] == true
    });
    let status = status_json(&env, &lock, &[]);
    assert_eq!(modes_in(&status, "holders"), ["shared"], "{status}");
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    end_psql(sql);

    let _reader = env.hold(&lock, &["--shared"]);
    assert_eq!(
        server.psql(&format!("SELECT pg_try_advisory_lock_shared({key})")),
        "t"
    );
    assert_eq!(
        server.psql(&format!("SELECT pg_try_advisory_lock({key})")),
        "f"
    );
}
