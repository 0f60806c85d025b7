//! Who may lock, where, and by which names: missing privileges (77, with the statement to
//! run), a read-only server (78), a wrong password (77), and names that MySQL's 64-character,
//! case-folding lock names would confuse.

use crate::support::*;

#[test]
fn missing_privileges_exit_77_with_the_statement_to_run() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let reader = server.url_as("reader", Some(READER_PASSWORD));
    // Before the table exists (it may not be created) and after (it may not be written).
    for _ in 0..2 {
        let out = env.run(["run", "--url", &reader, &lock, "touch", "ran"]);
        assert_fails(
            &out,
            77,
            "GRANT SELECT, INSERT, UPDATE ON `dlock`.dlock_locks TO 'reader'@'%'",
        );
        assert!(stderr_of(&out).contains("CREATE TABLE IF NOT EXISTS dlock_locks"));
        assert!(!env.path("ran").exists());
        assert!(env.is_free(&lock), "a refused run left the lock held");
    }
    let out = env.run(["check", "--url", &reader]);
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
}

#[test]
fn read_only_server_exits_78() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    env.token(&lock);
    server.sql("SET GLOBAL read_only = 1");
    let out = env.run(["run", &lock, "touch", "ran"]);
    assert_fails(&out, 78, "read-only");
    assert!(!env.path("ran").exists());
    let out = env.run(["check"]);
    assert_fails(&out, 78, "read-only");
    server.sql("SET GLOBAL read_only = 0");
    assert!(env.is_free(&lock));
}

#[test]
fn wrong_password_exits_77_and_the_right_one_from_anywhere_works() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("m");
    let url = server.url_as("app", Some("not-the-password"));
    let out = env.run(["run", "--url", &url, &lock, "true"]);
    let endpoint = format!("127.0.0.1:{}", server.port);
    assert_fails(
        &out,
        77,
        &crate::backends::password_refused(&endpoint, "app"),
    );
    assert!(!stderr_of(&out).contains("not-the-password"));
    // The password from DLOCK_PASSWORD, and from the [mysql] table's password_file.
    let bare = server.url_as("app", None);
    let out = output_within(
        {
            let mut command = env.dlock(["run", "--url", &bare, &lock, "true"]);
            command.env("DLOCK_PASSWORD", MYSQL_PASSWORD);
            command
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let file = env.path("password");
    std::fs::write(&file, MYSQL_PASSWORD).expect("password file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let config = env.config_file(
        "mysql",
        &format!("password_file = {:?}", file.display().to_string()),
    );
    let out = env.run(["--config", &config, "run", "--url", &bare, &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--url", &bare, &lock, "true"]);
    assert_fails(
        &out,
        77,
        &crate::backends::password_missing(&endpoint, "app"),
    );
}

#[test]
fn long_unicode_and_case_differing_names_are_distinct_locks() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let base = lock_name("m");
    let long = format!("{base}-{}", "x".repeat(255 - base.len() - 1));
    let mut long_other = long.clone();
    long_other.pop();
    long_other.push('y');
    let names = [
        format!("{base}-Case"),
        format!("{base}-case"),
        format!("{base}-CASE"),
        long,
        long_other,
        format!("{base}-锁"),
        format!("{base}-鎖"),
        format!("{base}-é"),
        format!("{base}-e\u{301}"),
    ];
    let holders: Vec<Holding> = names.iter().map(|n| env.hold(n, &["--no-wait"])).collect();
    for n in &names {
        let out = env.run(["status", "--json", n]);
        assert_eq!(out.status.code(), Some(0), "{n}: {}", describe(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(
            json["holders"].as_array().map(Vec::len),
            Some(1),
            "{n}: {json}"
        );
        assert_eq!(
            json["holders"][0]["name"].as_str(),
            Some(n.as_str()),
            "{json}"
        );
    }
    let out = env.run(["list"]);
    for n in &names {
        assert!(
            stdout_of(&out).contains(n.as_str()),
            "{n} not listed: {}",
            describe(&out)
        );
    }
    drop(holders);
}

/// The README's SQL takes the same lock as dlock (prefix `dlock`).
#[test]
fn the_documented_sql_names_the_same_lock() {
    let server = MysqlServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("deploy-prod");
    let sql = format!(
        "SELECT IS_USED_LOCK(CONCAT('dlock:', LEFT(SHA2(CONCAT('dlock', CHAR(0), 'mysql', CHAR(0), 'v1', \
         CHAR(0), 'dlock', CHAR(0), '{lock}'), 256), 40))) IS NOT NULL"
    );
    assert_eq!(server.sql(&sql), "0");
    let holder = env.hold(&lock, &[]);
    assert_eq!(server.sql(&sql), "1");
    drop(holder);
    wait_until("lock freed", PATIENCE, || server.sql(&sql) == "0");
}

#[test]
fn a_server_at_max_connections_is_waited_out_then_69_naming_the_setting() {
    let server = MysqlServer::start();
    let env = TestEnv::new(&server);
    // MariaDB's smallest max_connections is 10: fill them with sleeping sessions.
    server.sql("SET GLOBAL max_connections = 10");
    let mut sleepers: Vec<std::process::Child> = (0..10)
        .map(|_| server.sql_in_background("SELECT SLEEP(60)"))
        .collect();
    wait_until("10 sessions", PATIENCE, || {
        server
            .try_sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP%'",
            )
            .is_some_and(|count| count.trim() == "10")
    });
    // A user without CONNECTION ADMIN, which MariaDB would let past the limit.
    let app = server.url_as("app", Some(MYSQL_PASSWORD));
    // The refusal is retried until --wait runs out; the message names the limit.
    let out = env.run([
        "run",
        "--wait",
        "1s",
        "--url",
        &app,
        &lock_name("m"),
        "true",
    ]);
    assert_fails(&out, 69, "MySQL max_connections");
    // Within a longer --wait, room made after a refusal lets the run through. Root has
    // MariaDB's one extra connection, which a closing session may hold for a moment: every
    // root statement here is retried.
    let refusals = || {
        server
            .try_sql("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'CONNECTION_ERRORS_MAX_CONNECTIONS'")
            .map(|count| count.trim().to_owned())
    };
    let mut before = None;
    wait_until("the refusal count", PATIENCE, || {
        before = refusals();
        before.is_some()
    });
    let mut waiting = env
        .dlock([
            "run",
            "--wait",
            "60s",
            "--url",
            &app,
            &lock_name("m"),
            "true",
        ])
        .spawn()
        .expect("spawn dlock");
    wait_until("a refused connection", PATIENCE, || {
        refusals().is_some_and(|now| Some(now) != before)
    });
    wait_until("max_connections raised", PATIENCE, || {
        server.try_sql("SET GLOBAL max_connections = 151").is_some()
    });
    let status = waiting.wait().expect("wait for dlock");
    for sleeper in &mut sleepers {
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }
    assert_eq!(status.code(), Some(0), "the run after the refusal passed");
}

/// MariaDB answers "access denied" for a database that does not exist (as for one the user
/// may not use): a database the URL names wrongly is 78 as on every backend.
#[test]
fn a_database_the_server_does_not_have_is_78() {
    let server = MysqlServer::shared();
    let env = TestEnv::new(&server);
    let url = format!(
        "mysql://app:{MYSQL_PASSWORD}@127.0.0.1:{}/no_such_db?ssl-mode=DISABLED",
        server.port
    );
    let out = env.run(["run", "--url", &url, &lock_name("m"), "touch", "ran"]);
    assert_fails(
        &out,
        78,
        &crate::backends::no_database(&format!("127.0.0.1:{}", server.port), "no_such_db"),
    );
    assert!(!env.path("ran").exists());
}
