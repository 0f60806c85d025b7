//! The Redis backend: the whole contract against a real `redis-server`, plus what only Redis
//! can get wrong (issue: Redis backend).

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    // {1, "<fence>", ttl}: the fence is a bulk string (exact beyond 2^53)
    let fence = |reply: &str| reply.lines().nth(3).map(str::to_owned);
    assert!(first.starts_with("*3\r\n:1\r\n$"), "not granted: {first:?}");
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
    // Its place in line lasts 2 s after its last heartbeat; the live waiter heartbeats (and
    // re-checks) every 0.5 s.
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

/// The key `dlock:{<lock>}:<suffix>` (names from [`name`] need no encoding).
fn key(lock: &str, suffix: &str) -> String {
    format!("dlock:{{{lock}}}:{suffix}")
}

fn sigkill(child: &mut std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGKILL,
    )
    .expect("kill");
    let _ = wait_within(child, PATIENCE);
}

#[test]
fn tokens_stay_exact_and_increasing_beyond_2_pow_53() {
    // Lua numbers are doubles: 2^53 + 1 == 2^53 there, so the counter must never pass
    // through one.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let at = 9_007_199_254_740_992_u64; // 2^53
    assert_eq!(
        server.command(&format!("SET {} {at}", key(&lock, "fence"))),
        "+OK"
    );
    let tokens: Vec<u64> = (0..3).map(|_| env.token(&lock)).collect();
    assert_eq!(
        tokens,
        [at + 1, at + 2, at + 3],
        "tokens repeated or skipped"
    );
    let out = env.run(["status", "--json", &lock]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(json["last_token"].as_u64(), Some(at + 3), "{json}");
}

#[test]
fn a_fencing_counter_at_its_maximum_refuses_rather_than_repeat_or_wrap() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let fence = key(&lock, "fence");
    assert_eq!(
        server.command(&format!("SET {fence} 9223372036854775806")),
        "+OK"
    );
    assert_eq!(env.token(&lock), 9_223_372_036_854_775_807);
    for _ in 0..2 {
        let out = env.run(["run", &lock, "touch", "ran"]);
        assert_fails(&out, 69, &fence);
        assert!(stderr_of(&out).contains("maximum"), "{}", describe(&out));
        assert!(
            !env.path("ran").exists(),
            "the command ran: {}",
            describe(&out)
        );
    }
    // Nothing was left behind: no holder, no waiter, and the counter is where it was.
    assert_eq!(
        redis_resp(server.port, &["GET", &fence]).expect("GET"),
        "$19\r\n9223372036854775807\r\n",
        "the counter changed"
    );
    assert_eq!(
        server.command(&format!("EXISTS {}", key(&lock, "holders"))),
        ":0"
    );
    assert_eq!(
        server.command(&format!("EXISTS {}", key(&lock, "queue"))),
        ":0"
    );
}

#[test]
fn a_killed_waiter_holds_up_a_freed_lock_only_briefly_whatever_its_ttl() {
    // CI runners cancel jobs with SIGKILL: a waiter that never leaves the queue must not keep
    // a freed lock from others for its whole --ttl.
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &["--ttl", "60s"]);
    let mut waiter = env
        .dlock(["run", "--ttl", "7days", &lock, "touch", "waiter-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    sigkill(&mut waiter);
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let freed = Instant::now();
    let out = output_within(
        env.dlock([
            "run", "--ttl", "60s", "--wait", "30s", &lock, "touch", "ran",
        ]),
        Duration::from_secs(40),
    );
    let took = freed.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    assert!(
        took < Duration::from_secs(15),
        "a dead waiter held up the freed lock for {took:?}"
    );
    assert!(!env.path("waiter-ran").exists());
}

#[test]
fn a_killed_waiter_is_not_counted_for_long_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let _holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock(["run", "--ttl", "7days", &lock, "true"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    sigkill(&mut waiter);
    // Its heartbeat stopped: within a few seconds `status` no longer counts it, and its
    // entries expire with it (not a --ttl later).
    wait_until(
        "dead waiter no longer counted",
        Duration::from_secs(10),
        || env.waiters(&lock) == 0,
    );
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    wait_until(
        "dead waiter's entries gone",
        Duration::from_secs(10),
        || server.command(&format!("EXISTS {queue} {qdl}")) == ":0",
    );
}

#[test]
fn release_force_clears_waiter_entries_no_live_dlock_keeps() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    // What an older dlock left when its waiter with --ttl 7days was killed: a place in line
    // whose heartbeat deadline is a week ahead.
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    assert_eq!(server.command(&format!("ZADD {queue} 1 gone")), ":1");
    assert_eq!(
        server.command(&format!("ZADD {qdl} 99999999999999 gone")),
        ":1"
    );
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr_of(&out).contains("released"), "{}", describe(&out));
    assert!(
        stderr_of(&out).contains("removed 1 waiter"),
        "{}",
        describe(&out)
    );
    assert_eq!(server.command(&format!("ZCARD {queue}")), ":0");
    assert_eq!(holder.wait().code(), Some(124));
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
}

#[test]
fn not_acquired_tells_a_queue_ahead_from_a_holder() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    // A waiter's place in line as a live waiter keeps it (heartbeat deadline far ahead).
    let queue = key(&lock, "queue");
    let qdl = key(&lock, "qdl");
    assert_eq!(server.command(&format!("ZADD {queue} 1 someone")), ":1");
    assert_eq!(
        server.command(&format!("ZADD {qdl} 99999999999999 someone")),
        ":1"
    );
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, but 1 waiter is ahead in the queue");
    assert!(!stderr_of(&out).contains("is held"), "{}", describe(&out));
    let out = env.run(["run", "--wait", "300ms", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is free, but 1 waiter is ahead in the queue");
    assert!(stderr_of(&out).contains("300ms"), "{}", describe(&out));
    // A holder is reported as one.
    assert_eq!(server.command(&format!("DEL {queue} {qdl}")), ":2");
    let holder = env.hold(&lock, &[]);
    let out = env.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 75, "is held by pid");
    assert!(stderr_of(&out).contains(&holder.pid().to_string()));
    assert!(!stderr_of(&out).contains("ahead"), "{}", describe(&out));
    assert!(!env.path("ran").exists());
}

/// A TCP port that accepts connections and never answers (kept open until dropped).
struct SilentServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentServer {
    fn start() -> SilentServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut accepted: Vec<TcpStream> = Vec::new();
            let deadline = Instant::now() + 3 * PATIENCE;
            while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => accepted.push(stream),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => break,
                }
            }
        });
        SilentServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn wait_bounds_a_server_that_accepts_and_never_answers() {
    let silent = SilentServer::start();
    let env = TestEnv::new(&FileServer::start());
    let url = format!("redis://127.0.0.1:{}/0", silent.port);
    let started = Instant::now();
    let out = env.run(["run", "--wait", "2s", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "no answer from");
    assert!(stderr_of(&out).contains("--wait 2s"), "{}", describe(&out));
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(!env.path("ran").exists());
    // --no-wait is bounded too.
    let started = Instant::now();
    let out = env.run(["run", "--no-wait", "--url", &url, "x", "touch", "ran"]);
    let took = started.elapsed();
    assert_fails(&out, 69, "no answer from");
    assert!(took < Duration::from_secs(12), "took {took:?}");
    assert!(!env.path("ran").exists());
}

#[test]
fn a_fencing_counter_of_the_wrong_type_or_content_is_69_naming_the_key() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let listed = name();
    let fence = key(&listed, "fence");
    assert_eq!(server.command(&format!("RPUSH {fence} x")), ":1");
    let out = env.run(["run", &listed, "touch", "ran"]);
    assert_fails(&out, 69, &fence);
    assert!(stderr_of(&out).contains("a list"), "{}", describe(&out));
    let out = env.run(["status", &listed]);
    assert_fails(&out, 69, &fence);

    let text = name();
    let fence = key(&text, "fence");
    assert_eq!(server.command(&format!("SET {fence} abc")), "+OK");
    let out = env.run(["run", &text, "touch", "ran"]);
    assert_fails(&out, 69, &fence);
    assert!(stderr_of(&out).contains("\"abc\""), "{}", describe(&out));
    assert!(!env.path("ran").exists());
}

#[test]
fn a_holders_key_of_the_wrong_type_is_69_and_does_not_break_list() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let bad = name();
    let holders = key(&bad, "holders");
    assert_eq!(server.command(&format!("RPUSH {holders} x")), ":1");
    let out = env.run(["run", &bad, "touch", "ran"]);
    assert_fails(&out, 69, &holders);
    assert!(!env.path("ran").exists());
    let out = env.run(["release", "--force", &bad]);
    assert_fails(&out, 69, &holders);

    let good = name();
    let _holder = env.hold(&good, &[]);
    let out = env.run(["list"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains(&good), "{}", describe(&out));
    assert!(stderr_of(&out).contains(&holders), "{}", describe(&out));
}

#[test]
fn holder_metadata_that_is_not_utf8_is_shown_and_released() {
    let server = RedisServer::start();
    let env = TestEnv::new(&server);
    let lock = name();
    let mut holder = env.hold(&lock, &[]);
    // Put a byte that is not UTF-8 into the holder's host name.
    let script = r#"local n = 0
for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local k = string.sub(KEYS[1], 1, -8) .. 'h:' .. h
  local m = string.gsub(redis.call('HGET', k, 'meta'), '"host":"', '"host":"\255')
  redis.call('HSET', k, 'meta', m)
  n = n + 1
end
return n"#;
    let holders = key(&lock, "holders");
    let reply = redis_resp(server.port, &["EVAL", script, "1", &holders]).expect("EVAL");
    assert_eq!(reply, ":1\r\n");
    let out = env.run(["status", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stdout_of(&out).contains('\u{FFFD}'), "{}", describe(&out));
    assert!(
        stdout_of(&out).contains(&holder.pid().to_string()),
        "{}",
        describe(&out)
    );
    let out = env.run(["release", "--force", &lock]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr_of(&out).contains("released"), "{}", describe(&out));
    assert_eq!(holder.wait().code(), Some(124));
}
