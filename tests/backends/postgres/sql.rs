//! The documented SQL formula for a lock's key names the key dlock holds, for any name.

use proptest::prelude::*;

use crate::support::*;

/// The documented SQL formula for a lock's key, run by psql inside the lock: it must name the
/// key dlock holds, for any name.
fn sql_takes_the_same_lock(server: &PgServer, env: &TestEnv, lock: &str) -> Result<(), String> {
    let script = env.path("key.sql");
    std::fs::write(
        &script,
        "SELECT pg_try_advisory_lock(('x' || encode(substr(sha256('\\x646c6f636b00763100'::bytea \
         || convert_to(:'prefix', 'UTF8') || '\\x00'::bytea || convert_to(:'name', 'UTF8')), 1, 8), \
         'hex'))::bit(64)::bigint);\n",
    )
    .map_err(|e| e.to_string())?;
    let port = server.port.to_string();
    let name_var = format!("name={lock}");
    let mut args: Vec<&std::ffi::OsStr> = vec!["run".as_ref(), lock.as_ref(), "--".as_ref()];
    let psql = psql_binary();
    args.push(psql.as_os_str());
    for arg in [
        "-X",
        "-At",
        "-U",
        "postgres",
        "-d",
        "postgres",
        "-v",
        "prefix=dlock",
        "-p",
    ] {
        args.push(arg.as_ref());
    }
    args.extend([
        port.as_ref(),
        "-h".as_ref(),
        server.dir().as_os_str(),
        "-v".as_ref(),
    ]);
    args.extend([name_var.as_ref(), "-f".as_ref(), script.as_os_str()]);
    let out = env.run(args);
    if !out.status.success() {
        return Err(describe(&out));
    }
    match stdout_of(&out).trim() {
        "f" => Ok(()),
        other => Err(format!(
            "SQL took the lock dlock holds ({other:?}) for {lock:?}"
        )),
    }
}

#[test]
fn documented_sql_formula_names_the_same_key() {
    use proptest::test_runner::{Config, TestRunner};
    let server = PgServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let names = "[^\\p{Cc}-][^\\p{Cc}]{0,39}";
    let result = runner.run(&names, |lock| {
        sql_takes_the_same_lock(&server, &env, &lock).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // And a fixed name, so the formula is pinned even if the generator changes.
    assert_eq!(
        sql_takes_the_same_lock(&server, &env, "deploy-prod"),
        Ok(())
    );
}

/// The documented SQL for a lock's key, with psql variables `prefix` and `name`.
pub(super) const KEY_SQL: &str = "('x' || encode(substr(sha256('\\x646c6f636b00763100'::bytea \
     || convert_to(:'prefix', 'UTF8') || '\\x00'::bytea || convert_to(:'name', 'UTF8')), 1, 8), \
     'hex'))::bit(64)::bigint";

/// The SQL for a lock's others' key (`\0others` after the name): the key every holder with
/// `--limit N > 1` holds in shared mode, which tells `--limit 1` runs to read `pg_locks`.
pub(super) const OTHERS_KEY_SQL: &str =
    "('x' || encode(substr(sha256('\\x646c6f636b00763100'::bytea \
     || convert_to(:'prefix', 'UTF8') || '\\x00'::bytea || convert_to(:'name', 'UTF8') \
     || '\\x006f7468657273'::bytea), 1, 8), 'hex'))::bit(64)::bigint";

/// Any session may hold a lock's key and name itself like a dlock holder; `status` reads its
/// `application_name` as data, so a start time no clock can show is not believed, never a
/// panic.
#[test]
fn a_holder_with_an_impossible_start_time_is_shown_not_fatal() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let mut sql = server.psql_session(
        &["prefix=dlock", &format!("name={lock}")],
        &format!(
            "SET application_name = 'dlock 4242 18446744073709551615 t7 elsewhere';\n\
             SELECT pg_advisory_lock({KEY_SQL});"
        ),
    );
    wait_until("psql holds the key", PATIENCE, || {
        server.granted_advisory_locks() == 1
    });
    let out = env.run(["status", &lock]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "status of a held lock; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("4242"),
        "the holder's pid is shown: {stdout}"
    );
    drop(sql.stdin.take());
    let _ = wait_within(&mut sql, PATIENCE);
}
