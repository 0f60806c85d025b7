//! The Redis backend: the whole contract against a real `redis-server`, plus what only Redis
//! can get wrong (issue: Redis backend).

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::*;

crate::contract_tests!(redis_contract, RedisServer::start());
crate::lease_contract_tests!(redis_lease_contract, RedisServer::start());

fn name() -> String {
    format!("r-{}", unique())
}

/// Start `dlock run` in the background; its command appends `label` to `log` and exits.
#[test]
fn waiters_acquire_in_arrival_order() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let log = env.path("order");
    let (holder, started) = crate::contract::queue_five_waiters(&env, &lock, &log);
    crate::contract::release_and_expect_arrival_order(holder, started, &log);
}

#[test]
fn restart_without_persistence_stops_the_holder_and_tokens_keep_increasing() {
    let mut server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let before = env.token(&lock);
    let mut holder = env.hold(&lock, &[]);
    server.restart();
    let status = holder.wait();
    assert_eq!(
        status.code(),
        Some(124),
        "holder must notice the lost entry: {}",
        holder.stderr()
    );
    let after = env.token(&lock);
    assert!(
        after > before,
        "token went backwards after a restart: {after} <= {before}"
    );
}

#[test]
fn tokens_keep_increasing_when_a_crash_loses_recent_writes() {
    // With AOF `everysec` (the default) or snapshots, a crash loses the last writes, counter
    // increments included: the counter comes back older than tokens already handed out.
    let mut server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let first = env.token(&lock);
    assert_eq!(server.command("SAVE"), "+OK");
    let second = env.token(&lock);
    assert!(second > first, "{second} <= {first}");
    // SIGKILL, then start again from the snapshot taken before `second`.
    server.restart();
    let third = env.token(&lock);
    assert!(
        third > second,
        "token repeated after a crash that lost writes: {first}, {second}, then {third}"
    );
}

#[test]
fn deleting_the_entry_by_hand_stops_the_holder() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let deleted = server.command(&format!("DEL dlock:{{{lock}}}:holders"));
    assert_eq!(deleted, ":1");
    assert_eq!(holder.wait().code(), Some(124));
}

#[test]
fn wrong_password_is_77_without_running_the_command() {
    let server = RedisServer::start_with(&["--requirepass", "right"]);
    let env = TestEnv::new(&server);
    let url = format!("redis://:hunter-wrong-42@127.0.0.1:{}/0", server.port);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 77, "authentication");
    assert!(
        !stderr_of(&out).contains("hunter-wrong-42"),
        "password leaked: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
    // No password at all against a server that wants one is refused the same way.
    let out = env.run(["run", "x", "true"]);
    assert_fails(&out, 77, "authentication");
    // The right one from DLOCK_PASSWORD works and is not passed to the command.
    let out = output_within(
        {
            let mut c = env.dlock(["run", "x", "env"]);
            c.env("DLOCK_PASSWORD", "right");
            c
        },
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        !stdout_of(&out).contains("right"),
        "the password reached the command"
    );
}

#[test]
fn password_file_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let env = TestEnv::new(&server);
    let secret = env.path("password");
    std::fs::write(&secret, "s3cret\n").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let config = env.path("config.toml");
    std::fs::write(
        &config,
        format!("[redis]\npassword_file = \"{}\"\n", secret.display()),
    )
    .expect("write");
    let config = config.to_str().expect("utf-8");
    let out = env.run(["--config", config, "run", "x", "true"]);
    assert_fails(&out, 78, "chmod 600");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = env.run(["--config", config, "run", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn nothing_listening_is_69() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let url = format!("redis://127.0.0.1:{}/0", free_port());
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 69, "cannot reach");
    assert!(!env.path("ran").exists());
}

#[test]
fn tls_against_a_plaintext_port_fails_and_never_falls_back() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let url = format!("rediss://127.0.0.1:{}/0", server.port);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(
        !env.path("ran").exists(),
        "the command ran over a connection that is not TLS"
    );
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &["--limit", "2"]);
    let out = env.run(["run", "--no-wait", "--limit", "3", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
}

/// A config file with a `[redis]` table.
fn redis_config(env: &TestEnv, body: &str) -> String {
    let path = env.path("config.toml");
    std::fs::write(&path, format!("[redis]\n{body}")).expect("write config");
    path.display().to_string()
}

#[test]
fn tls_with_the_configured_ca_and_client_certificate() {
    let certs = TestCerts::make();
    let port = free_port();
    let server = RedisServer::start_on(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &certs.path("server.crt"),
            "--tls-key-file",
            &certs.path("server.key"),
            "--tls-ca-cert-file",
            &certs.path("ca.crt"),
            "--tls-auth-clients",
            "yes",
        ],
    );
    let env = TestEnv::new(&server);
    let url = format!("rediss://127.0.0.1:{port}/0");
    let good = redis_config(
        &env,
        &format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            certs.path("ca.crt"),
            certs.path("client.crt"),
            certs.path("client.key")
        ),
    );
    let out = env.run([
        "--config",
        &good,
        "run",
        "--url",
        &url,
        "tls",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "rediss\n");

    // An unknown CA, and a missing client certificate, are configuration errors.
    let wrong_ca = redis_config(
        &env,
        &format!("ca_file = \"{}\"\n", certs.path("other.crt")),
    );
    let out = env.run([
        "--config", &wrong_ca, "run", "--url", &url, "tls", "touch", "ran",
    ]);
    assert_fails(&out, 78, "TLS");
    let no_client = redis_config(&env, &format!("ca_file = \"{}\"\n", certs.path("ca.crt")));
    let out = env.run([
        "--config", &no_client, "run", "--url", &url, "tls", "touch", "ran",
    ]);
    assert_fails(&out, 78, "TLS");
    // Plain text to the TLS port fails; nothing falls back.
    let out = env.run([
        "run",
        "--url",
        &format!("redis://127.0.0.1:{port}/0"),
        "tls",
        "touch",
        "ran",
    ]);
    assert!(
        matches!(out.status.code(), Some(69 | 78)),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
}

#[test]
fn bad_tls_files_are_78_before_connecting() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let not_pem = env.path("not-a-cert.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let config = redis_config(&env, &format!("ca_file = \"{}\"\n", not_pem.display()));
    let out = env.run([
        "--config",
        &config,
        "run",
        "--url",
        "rediss://127.0.0.1:1/0",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "no PEM certificate");
    let config = redis_config(&env, &format!("cert_file = \"{}\"\n", not_pem.display()));
    let out = env.run([
        "--config",
        &config,
        "run",
        "--url",
        "rediss://127.0.0.1:1/0",
        "x",
        "true",
    ]);
    assert_fails(&out, 78, "both cert_file and key_file");
}

#[test]
fn a_read_only_replica_is_refused_with_78() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let env = TestEnv::new(&replica);
    let out = env.run(["run", "x", "touch", "ran"]);
    assert_fails(&out, 78, "replica");
    assert!(!env.path("ran").exists());
    let out = env.run(["check"]);
    assert_fails(&out, 78, "replica");
}

#[test]
fn an_acl_that_forbids_scripts_is_77() {
    let server = RedisServer::start_with(&[
        "--user", "limited", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval",
    ]);
    let env = TestEnv::new(&server);
    let url = format!("redis://limited:pw@127.0.0.1:{}/0", server.port);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 77, "ACL");
    assert!(!env.path("ran").exists());
}

#[test]
fn check_warns_when_lock_entries_could_be_evicted() {
    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let env = TestEnv::new(&server);
    let out = env.run(["check"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stdout_of(&out).contains("maxmemory-policy is allkeys-lru"),
        "{}",
        describe(&out)
    );
}

#[test]
fn a_retried_acquire_finds_its_own_hold() {
    // The acquire script is idempotent for one owner token: a retry after a lost reply gets
    // the same grant (same fence), not a second entry.
    let server = RedisServer::start();
    let script = include_str!("../src/backend/redis/acquire.lua");
    let base = "dlock:{retry}";
    let keys =
        ["fence", "holders", "queue", "qdl", "h:tok1", "w:tok1"].map(|k| format!("{base}:{k}"));
    let mut args: Vec<&str> = vec!["EVAL", script, "6"];
    args.extend(keys.iter().map(String::as_str));
    args.extend(["tok1", "1", "3000", "3000", "{}", "wait", "0"]);
    let first = redis_resp(server.port, &args).expect("first acquire");
    let second = redis_resp(server.port, &args).expect("retried acquire");
    let fence = |reply: &str| reply.lines().nth(2).map(str::to_owned);
    assert!(first.starts_with("*3\r\n:1\r\n"), "not granted: {first:?}");
    assert_eq!(
        fence(&first),
        fence(&second),
        "the retry was granted a second time: {first:?} {second:?}"
    );
    assert_eq!(server.command(&format!("SCARD {base}:holders")), ":1");
}

#[test]
fn a_dead_waiter_drops_out_of_the_queue() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    let mut dead = env
        .dlock(["run", &lock, "touch", "dead-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("first waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let entered = env.path("entered");
    let mut alive = env
        .dlock(["run", &lock, "touch", entered.to_str().expect("utf-8")])
        .spawn()
        .expect("spawn waiter");
    wait_until("second waiter queued", PATIENCE, || env.waiters(&lock) == 2);
    // The first waiter dies without leaving the queue; the release wakes it, in vain.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead.id() as i32),
        Signal::SIGKILL,
    )
    .expect("kill");
    let _ = dead.wait();
    let released = Instant::now();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    wait_until("live waiter entered", PATIENCE, || entered.exists());
    // Its heartbeat deadline is one TTL (3 s); the live waiter re-checks every TTL/3.
    assert!(
        released.elapsed() <= Duration::from_secs(3 + 2),
        "took {:?}",
        released.elapsed()
    );
    assert!(wait_within(&mut alive, PATIENCE).success());
    assert!(!env.path("dead-ran").exists());
}

#[test]
fn a_unix_socket_url_works() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().expect("utf-8");
    let server = RedisServer::start_with(&["--unixsocket", socket, "--unixsocketperm", "700"]);
    let env = TestEnv::new(&server);
    let out = env.run([
        "run",
        "--url",
        &format!("redis+unix://{socket}?db=1"),
        "unix",
        "sh",
        "-c",
        "echo $DLOCK_BACKEND",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stdout_of(&out), "redis+unix\n");
}
