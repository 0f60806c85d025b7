//! The PostgreSQL backend: the whole contract against a real server, plus FIFO order, loss of
//! the session (terminated, black-holed, server restart), clean cancellation, the key's SQL
//! formula, TLS and authentication (issue: PostgreSQL backend).

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use proptest::prelude::*;

use crate::common::*;
use crate::pg_server::*;

crate::contract_tests!(pg_contract, PgServer::start());

#[test]
fn waiters_acquire_in_arrival_order() {
    crate::contract::waiters_acquire_in_arrival_order(&PgServer::start());
}

fn name() -> String {
    format!("p-{}", unique())
}

#[test]
fn terminated_session_stops_the_command_within_a_heartbeat() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let (mut holder, log) = env.stoppable_holder(&server.url(), &lock);
    let terminated = Instant::now();
    let ended = server.psql(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'dlock % t%') AS t",
    );
    assert_eq!(ended, "1", "exactly the holder's session is a dlock holder");
    let status = wait_within(&mut holder, PATIENCE);
    let took = terminated.elapsed();
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    // TTL 3s: one heartbeat interval is 1s; allow it plus 1s.
    assert!(took <= Duration::from_secs(2), "stopped after {took:?}");
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock));
}

#[test]
fn blackholed_holder_stops_its_command_within_the_heartbeat_bound() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let proxy = Proxy::start(server.port);
    let url = server.url_via(proxy.port);
    let (mut holder, log) = env.stoppable_holder(&url, &lock);
    let mut contender = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!("echo contender-started >> {}", log.display()),
        ])
        .spawn()
        .expect("spawn contender");
    wait_until("contender queued", PATIENCE, || env.waiters(&lock) == 1);
    let cut = Instant::now();
    proxy.blackhole();
    let status = wait_within(&mut holder, PATIENCE);
    let took = cut.elapsed();
    assert_eq!(
        status.code(),
        Some(124),
        "the holder must report the lost lock"
    );
    // TTL 3s: the hold is given up before 0.99·TTL − 0.5s after the last heartbeat, and the
    // unlock that cannot get through is abandoned quickly.
    assert!(took <= Duration::from_secs(4), "stopped after {took:?}");
    // The proxy keeps the server's side of the connection open (and acknowledges its
    // keepalives), so the session lives on until the link really goes away.
    drop(proxy);
    assert!(wait_within(&mut contender, PATIENCE).success());
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\ncontender-started\n",
        "the contender got in before the holder stopped"
    );
}

#[test]
fn server_crash_restart_stops_the_command_and_frees_the_lock() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let (mut holder, log) = env.stoppable_holder(&server.url(), &lock);
    server.restart_immediate();
    assert_eq!(wait_within(&mut holder, PATIENCE).code(), Some(124));
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "holder-stopped\n"
    );
    assert!(env.is_free(&lock));
}

#[test]
fn tokens_keep_increasing_across_a_crash_right_after_the_grant() {
    // PostgreSQL flushes a commit at once only if the transaction wrote WAL; an XID that
    // never reached the disk can be handed out again after a crash. The token must not be.
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let first = env.path("first");
    let mut holder = env
        .dlock([
            "run",
            &lock,
            "sh",
            "-c",
            &format!(
                "echo $DLOCK_FENCING_TOKEN > {0}.tmp && mv {0}.tmp {0}; exec sleep 600",
                first.display()
            ),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    wait_until("holder has its token", PATIENCE, || first.exists());
    server.restart_immediate();
    let _ = wait_within(&mut holder, PATIENCE);
    let first: u64 = std::fs::read_to_string(&first)
        .expect("first token")
        .trim()
        .parse()
        .expect("a number");
    let second = env.token(&lock);
    assert!(
        second > first,
        "token went from {first} to {second} across the crash"
    );
}

#[test]
fn a_role_that_may_not_make_the_token_durable_is_77_without_running_the_command() {
    // The token's transaction writes a logical message so that its commit is flushed; a role
    // that may not call the function cannot take the lock (README, PostgreSQL).
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    server.psql(
        "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC",
    );
    let url = server.url_as("app", Some(APP_PASSWORD));
    let lock = name();
    let out = env.run(["run", "--url", &url, &lock, "touch", "ran"]);
    assert_fails(&out, 77, "pg_logical_emit_message");
    assert!(!env.path("ran").exists(), "the command ran");
    assert!(env.is_free(&lock), "the refused run left the lock held");
}

#[test]
fn killed_holder_frees_the_lock_within_one_second() {
    crate::contract::killed_holder_frees_the_lock_within(
        &PgServer::start(),
        Duration::from_secs(1),
    );
}

#[test]
fn killed_waiter_leaves_the_queue() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    waiter.kill().expect("kill waiter");
    let _ = waiter.wait();
    // client_connection_check_interval: the server notices the dead client within ~1s.
    wait_until("queue empty", PATIENCE, || server.pending_requests() == 0);
}

#[test]
fn cancelled_waits_leave_no_lock_request_behind() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--wait", "300ms", &lock, "true"]);
    assert_fails(&out, 75, "held");
    assert_eq!(server.pending_requests(), 0, "--wait expiry left a request");

    let mut waiter = env
        .dlock(["run", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal waiter");
    assert_eq!(wait_within(&mut waiter, PATIENCE).code(), Some(128 + 15));
    // The cancel was acknowledged before dlock exited: nothing is queued any more.
    assert_eq!(server.pending_requests(), 0, "SIGTERM left a request");
}

#[test]
fn semaphore_waiter_is_woken_by_a_release() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut first = env.hold(&lock, &["--limit", "2"]);
    let _second = env.hold(&lock, &["--limit", "2"]);
    let entered = env.path("entered");
    let mut third = env
        .dlock([
            "run",
            "--limit",
            "2",
            &lock,
            "touch",
            entered.to_str().expect("utf-8"),
        ])
        .spawn()
        .expect("spawn third");
    wait_until("third queued", PATIENCE, || env.waiters(&lock) == 1);
    assert!(!entered.exists());
    first.signal(Signal::SIGTERM);
    first.wait();
    assert!(wait_within(&mut third, PATIENCE).success());
    assert!(entered.exists());
}

#[test]
fn wrong_password_is_77_and_nothing_listening_is_69() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        &server.url_as("app", Some("wrong")),
        &name(),
        "true",
    ]);
    assert_fails(&out, 77, "password");
    assert!(
        !stderr_of(&out).contains("wrong"),
        "the password leaked: {}",
        describe(&out)
    );
    let out = env.run([
        "run",
        "--url",
        &server.url_as("app", Some(APP_PASSWORD)),
        &name(),
        "true",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let closed = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let out = env.run(["run", "--url", &closed, &name(), "true"]);
    assert_fails(&out, 69, "cannot reach");
}

#[test]
fn password_comes_from_pgpassfile_and_never_reaches_the_command() {
    let server = PgServer::start();
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
            let mut command =
                env.dlock(["run", "--url", &server.url_as("app", None), &name(), "env"]);
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
            let mut command =
                env.dlock(["run", "--url", &server.url_as("app", None), &name(), "true"]);
            command.env("PGPASSFILE", &pgpass);
            command
        },
        PATIENCE,
    );
    assert_fails(&out, 78, "readable by group or others");
}

#[test]
fn force_release_without_the_privilege_is_77() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
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
    let server = PgServer::start();
    let pooler = Pooler::start(&server);
    let env = TestEnv::new(&server);
    let lock = name();
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
    let lock = name();
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
    let lock = name();
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
    let server = PgServer::start();
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
        &name(),
        "sh",
        "-c",
        "echo \"$DLOCK_BACKEND\"",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out).trim(), "postgres");
}

#[test]
fn tls_require_never_falls_back_to_plaintext() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        server.port
    );
    let out = env.run(["run", "--url", &url, &name(), "true"]);
    assert_fails(&out, 78, "TLS");
}

#[test]
fn tls_verify_full_works_and_a_wrong_ca_is_78() {
    let certs = TestCerts::make();
    // The server's key must belong to the server's user and be private.
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["server.crt", "server.key"] {
        let to = dir.path().join(file);
        std::fs::copy(certs.path(file), &to).expect("copy cert");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("postgres user");
            nix::unistd::chown(&to, Some(user.uid), Some(user.gid)).expect("chown");
        }
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let cert = dir.path().join("server.crt").display().to_string();
    let key = dir.path().join("server.key").display().to_string();
    let server = PgServer::start_with(&[
        "-c",
        "ssl=on",
        "-c",
        &format!("ssl_cert_file={cert}"),
        "-c",
        &format!("ssl_key_file={key}"),
    ]);
    let env = TestEnv::new(&server);
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        certs.path("ca.crt")
    );
    let out = env.run(["run", "--url", &url, &name(), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["check", "--url", &url]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains("TLSv1"), "{}", describe(&out));
    // A CA that did not sign the server's certificate.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        certs.path("other.crt")
    );
    let out = env.run(["run", "--url", &url, &name(), "true"]);
    assert_fails(&out, 78, "TLS");
}

#[test]
fn status_shows_the_holders_session() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
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
    let server = PgServer::start();
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
const KEY_SQL: &str = "('x' || encode(substr(sha256('\\x646c6f636b00763100'::bytea \
     || convert_to(:'prefix', 'UTF8') || '\\x00'::bytea || convert_to(:'name', 'UTF8')), 1, 8), \
     'hex'))::bit(64)::bigint";

#[test]
fn holders_must_agree_on_the_limit() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &["--limit", "2"]);
    // Slot 1 is free, so without the check `--limit 3` would run beside the holder, and a
    // `--limit 1` would queue behind it.
    for extra in [
        &["--no-wait", "--limit", "3"][..],
        &["--limit", "1"],
        &["--no-wait"],
    ] {
        let mut args = vec!["run"];
        args.extend(extra);
        args.extend([lock.as_str(), "touch", "ran"]);
        let out = env.run(&args);
        assert_fails(&out, 64, "--limit 2");
        assert!(!env.path("ran").exists(), "{extra:?}: the command ran");
    }
    assert_eq!(server.pending_requests(), 0, "a refused run stayed queued");

    // And the other way round: a `--limit 1` holder refuses `--limit 2`.
    let other = name();
    let _single = env.hold(&other, &[]);
    let out = env.run(["run", "--no-wait", "--limit", "2", &other, "touch", "ran"]);
    assert_fails(&out, 64, "--limit 1");
    assert!(!env.path("ran").exists(), "the command ran");
}

#[test]
fn a_waiter_that_gets_the_lock_beside_another_limit_refuses() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    // SQL (no recorded limit) holds the key that is slot 0 of every limit.
    let mut sql = server.psql_session(&["prefix=dlock", &format!("name={lock}")]);
    {
        use std::io::Write;
        let stdin = sql.stdin.as_mut().expect("psql stdin");
        writeln!(stdin, "SELECT pg_advisory_lock({KEY_SQL});").expect("write to psql");
        stdin.flush().expect("flush psql");
    }
    wait_until("psql holds the key", PATIENCE, || {
        server.granted_advisory_locks() == 1
    });
    // A `--limit 1` waiter queues behind it (nobody records another limit yet)…
    let mut waiter = env
        .dlock(["run", "--limit", "1", &lock, "touch", "waiter-ran"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    // …and a `--limit 2` holder takes slot 1 meanwhile: the waiter holds no slot yet.
    let _pair = env.hold(&lock, &["--limit", "2"]);
    // The SQL session ends: the waiter is granted slot 0 beside a --limit 2 holder.
    drop(sql.stdin.take());
    let _ = wait_within(&mut sql, PATIENCE);
    let status = wait_within(&mut waiter, PATIENCE);
    let mut stderr = String::new();
    if let Some(mut err) = waiter.stderr.take() {
        use std::io::Read;
        let _ = err.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--limit 2"), "{stderr}");
    assert!(!env.path("waiter-ran").exists(), "the waiter's command ran");
}

#[test]
fn a_stopped_holder_loses_the_lock_within_the_ttl() {
    // A holder that sends nothing behind a live connection (here: dlock itself stopped; the
    // kernel still acknowledges keepalives) must not keep the lock for ever.
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &["--ttl", "3s"]);
    holder.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "second-ran"]);
    let took = stopped.elapsed();
    // Resume it before any assertion, so a failure does not leave a stopped process behind.
    holder.signal(Signal::SIGCONT);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("second-ran").exists());
    // TTL 3s: the server ends the silent session ~3s after its last heartbeat.
    assert!(
        took < Duration::from_secs(15),
        "the second run got the lock after {took:?}"
    );
    // Resumed, the old holder finds its hold gone and stops its command.
    let status = holder.wait();
    assert_eq!(
        status.code(),
        Some(124),
        "the resumed holder must report the lost lock: {}",
        holder.stderr()
    );
    assert!(
        !is_alive(holder.command_pid()),
        "the resumed holder's command still runs"
    );
}

#[test]
fn a_stopped_waiter_granted_while_stopped_frees_the_lock_and_never_runs() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &["--ttl", "3s"]);
    let mut waiter = env
        .dlock(["run", "--ttl", "3s", &lock, "touch", "waiter-ran"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || server.pending_requests() == 1);
    let waiter_pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
    nix::sys::signal::kill(waiter_pid, Signal::SIGSTOP).expect("stop waiter");
    holder.signal(Signal::SIGTERM);
    holder.wait();
    // Granted while stopped, its session goes idle: the server ends it after the TTL.
    let stopped = Instant::now();
    let mut freed = false;
    for _ in 0..1000 {
        if freed || stopped.elapsed() >= PATIENCE {
            break;
        }
        freed = env.is_free(&lock);
    }
    // Resume it before any assertion, so a failure does not leave a stopped process behind.
    nix::sys::signal::kill(waiter_pid, Signal::SIGCONT).expect("resume waiter");
    assert!(freed, "the stopped waiter kept the lock for {PATIENCE:?}");
    let status = wait_within(&mut waiter, PATIENCE);
    let mut stderr = String::new();
    if let Some(mut err) = waiter.stderr.take() {
        use std::io::Read;
        let _ = err.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(!env.path("waiter-ran").exists(), "the waiter's command ran");
}

#[test]
fn server_idle_timeouts_do_not_end_a_live_holder() {
    // dlock's own session settings win over the server's (and the role's, and the
    // database's): a holder whose heartbeat interval exceeds them keeps its lock.
    let server = PgServer::start_with(&[
        "-c",
        "idle_session_timeout=500",
        "-c",
        "idle_in_transaction_session_timeout=500",
    ]);
    let env = TestEnv::new(&server);
    let lock = name();
    let out = env.run(["run", "--ttl", "3s", &lock, "sleep", "3"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.is_free(&lock));
}

#[test]
fn long_ttls_give_the_server_keepalives_it_accepts() {
    let server = PgServer::start();
    let env = TestEnv::new(&server);
    for ttl in ["10m", "2days", "7days"] {
        let out = env.run(["run", "--ttl", ttl, &name(), "true"]);
        assert!(out.status.success(), "--ttl {ttl}: {}", describe(&out));
    }
    // A keepalive setting out of the kernel's range is only logged by the server, which then
    // keeps the OS default (2 hours of silence).
    let log = server.log();
    assert!(!log.contains("setsockopt"), "{log}");
}

#[test]
fn wait_bounds_connecting_to_a_server_that_never_answers() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    // Accept and hold connections open, never answering; the last connection (ours, below)
    // only wakes the thread to end it.
    let silent = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(8) {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            held.extend(stream.ok());
        }
        held.len()
    });
    let server = PgServer::start();
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
        &name(),
        "touch",
        "ran",
    ]);
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = std::net::TcpStream::connect(("127.0.0.1", port));
    let accepted = silent.join().expect("silent server thread");
    assert!(accepted >= 1, "dlock never connected");
    assert_fails(&out, 69, "within --wait 2s");
    assert!(!env.path("ran").exists(), "the command ran");
    assert!(took < Duration::from_secs(10), "gave up after {took:?}");
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
}
