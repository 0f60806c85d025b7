//! Reaching PostgreSQL: passwords and privileges, poolers and hot standbys refused, the Unix
//! socket, and a server that never answers.

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn a_role_that_may_not_write_wal_messages_takes_the_lock() {
    // The token's transaction writes nothing and waits for no flush (its floor is the
    // server's clock): a role needs no function beyond what every role may call.
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    server.psql(
        "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC",
    );
    let url = server.url_as("app", Some(APP_PASSWORD));
    let lock = lock_name("p");
    let out = env.run(["run", "--url", &url, &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists(), "the command did not run");
    assert!(env.is_free(&lock), "the run left the lock held");
}

#[test]
fn wrong_password_is_77_and_nothing_listening_is_69() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        &server.url_as("app", Some("wrong")),
        &lock_name("p"),
        "true",
    ]);
    let endpoint = format!("127.0.0.1:{}", server.port);
    assert_fails(
        &out,
        77,
        &crate::backends::password_refused(&endpoint, "app"),
    );
    assert!(
        !stderr_of(&out).contains("wrong"),
        "the password leaked: {}",
        describe(&out)
    );
    let out = env.run([
        "run",
        "--url",
        &server.url_as("app", Some(APP_PASSWORD)),
        &lock_name("p"),
        "true",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    // No password at all: said so, in other words.
    let out = env.run([
        "run",
        "--url",
        &server.url_as("app", None),
        &lock_name("p"),
        "true",
    ]);
    assert_fails(
        &out,
        77,
        &crate::backends::password_missing(&endpoint, "app"),
    );
    let port = free_port();
    let closed = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let out = env.run(["run", "--url", &closed, &lock_name("p"), "true"]);
    assert_fails(
        &out,
        69,
        &format!("cannot connect to 127.0.0.1:{port}: connection refused"),
    );
}

#[test]
fn password_comes_from_pgpassfile_and_never_reaches_the_command() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let pgpass = env.path("pgpass");
    std::fs::write(
        &pgpass,
        format!("127.0.0.1:{}:*:app:{APP_PASSWORD}\n", server.port),
    )
    .expect("pgpass");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = output_within(
        {
            let mut command = env.dlock([
                "run",
                "--url",
                &server.url_as("app", None),
                &lock_name("p"),
                "env",
            ]);
            command.env("PGPASSFILE", &pgpass);
            command
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        !stdout_of(&out).contains(APP_PASSWORD),
        "password passed on"
    );
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = output_within(
        {
            let mut command = env.dlock([
                "run",
                "--url",
                &server.url_as("app", None),
                &lock_name("p"),
                "true",
            ]);
            command.env("PGPASSFILE", &pgpass);
            command
        },
        PATIENCE,
    );
    assert_fails(&out, 78, "readable by group or others");
}

#[test]
fn force_release_without_the_privilege_is_77() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let _holder = env.hold(&lock, &[]);
    let out = env.run([
        "release",
        "--force",
        "--url",
        &server.url_as("app", Some(APP_PASSWORD)),
        &lock,
    ]);
    assert_fails(&out, 77, "pg_signal_backend");
    assert!(!env.is_free(&lock));
}

#[test]
fn a_pooler_that_drops_the_session_settings_is_refused_with_78() {
    let server = PgServer::shared();
    let pooler = Pooler::start(&server);
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    // pgbouncer ignores the start-up options that carry dlock's keepalives and timeouts.
    let out = env.run(["run", "--url", &pooler.url(), &lock, "true"]);
    assert_fails(&out, 78, "did not reach the server");
    assert!(env.is_free(&lock));
}

#[test]
fn a_session_shared_through_a_transaction_pooler_is_refused_with_78() {
    let server = PgServer::start();
    // Stand in for a pooler that passes dlock's settings on: the database supplies them.
    server.psql("ALTER DATABASE postgres SET dlock.session = 'on'");
    let pooler = Pooler::start(&server);
    let env = TestEnv::new(&server);
    let lock = lock_name("p");
    let url = pooler.url();
    // One server session for everyone: the second client's statements run on the holder's
    // session, where the lock would simply be taken again.
    let mut holder = env
        .dlock([
            "run",
            "--url",
            &url,
            &lock,
            "sh",
            "-c",
            "echo $$ > held; while [ ! -e go ]; do sleep 0.02; done",
        ])
        .spawn()
        .expect("spawn holder");
    wait_until("holder holds", PATIENCE, || env.path("held").exists());
    let out = env.run(["run", "--url", &url, &lock, "true"]);
    assert_fails(&out, 78, "transaction-pooling proxy");
    std::fs::write(env.path("go"), b"").expect("go");
    assert!(
        wait_within(&mut holder, PATIENCE).success(),
        "the refused client must not disturb the holder"
    );
    assert!(env.is_free(&lock));
}

#[test]
fn hot_standby_is_refused_with_78() {
    let primary = PgServer::start();
    let standby = PgServer::standby_of(&primary);
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t");
    let env = TestEnv::new(&standby);
    let lock = lock_name("p");
    let out = env.run(["run", &lock, "true"]);
    assert_fails(&out, 78, "hot standby");
    let out = env.run(["check"]);
    assert_fails(&out, 78, "hot standby");
    // Nothing was left held on the standby.
    assert_eq!(
        standby.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
        "0"
    );
}

#[test]
fn key_value_form_over_the_unix_socket_where_sslmode_does_not_apply() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let url = format!(
        "host={} port={} user=postgres dbname=postgres sslmode=require",
        server.dir().display(),
        server.port
    );
    let out = env.run([
        "run",
        "--url",
        &url,
        &lock_name("p"),
        "sh",
        "-c",
        "echo \"$DLOCK_BACKEND\"",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "postgres");
}

#[test]
fn wait_bounds_connecting_to_a_server_that_never_answers() {
    // Accepts and holds connections open, never answering.
    let silent = SilentServer::start();
    let port = silent.port;
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    // connect_timeout=60: only --wait can end this in time.
    let url = format!("postgres://postgres@127.0.0.1:{port}/x?connect_timeout=60");
    let started = Instant::now();
    let out = env.run([
        "run",
        "--wait",
        "2s",
        "--url",
        &url,
        &lock_name("p"),
        "touch",
        "ran",
    ]);
    let took = started.elapsed();
    assert!(silent.accepted() >= 1, "dlock never connected");
    assert_fails(&out, 69, "within --wait 2s");
    assert!(!env.path("ran").exists(), "the command ran");
    assert!(took < Duration::from_secs(10), "gave up after {took:?}");
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
}

#[test]
fn a_database_the_server_does_not_have_is_78() {
    let server = PgServer::shared();
    let env = TestEnv::new(&server);
    let url = format!(
        "postgres://app:{APP_PASSWORD}@127.0.0.1:{}/no_such_db?sslmode=disable",
        server.port
    );
    let out = env.run(["run", "--url", &url, &lock_name("p"), "touch", "ran"]);
    assert_fails(
        &out,
        78,
        &crate::backends::no_database(&format!("127.0.0.1:{}", server.port), "no_such_db"),
    );
    assert!(!env.path("ran").exists());
}
