//! Reaching Redis: passwords (from the URL, the environment, a private file), nothing
//! listening, a slow link with a short `--wait`, a replica, an ACL without scripts, eviction,
//! a Unix socket.

use crate::support::*;

#[test]
fn wrong_password_is_77_without_running_the_command() {
    let server = RedisServer::start_with(&["--requirepass", "right"]);
    let env = TestEnv::new(&server);
    let url = format!("redis://:hunter-wrong-42@127.0.0.1:{}/0", server.port);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    let endpoint = format!("127.0.0.1:{}", server.port);
    assert_fails(
        &out,
        77,
        &crate::backends::password_refused(&endpoint, "default"),
    );
    assert!(
        !stderr_of(&out).contains("hunter-wrong-42"),
        "password leaked: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
    // No password at all against a server that wants one: said so, in other words.
    let out = env.run(["run", "x", "true"]);
    assert_fails(
        &out,
        77,
        &crate::backends::password_missing(&endpoint, "default"),
    );
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
    let config = env.config_file(
        "redis",
        &format!("password_file = \"{}\"\n", secret.display()),
    );
    let out = env.run(["--config", &config, "run", "x", "true"]);
    assert_fails(&out, 78, "chmod 600");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = env.run(["--config", &config, "run", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn nothing_listening_is_69() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(
        &out,
        69,
        &format!("cannot connect to 127.0.0.1:{port}: connection refused"),
    );
    assert!(!env.path("ran").exists());
}

#[test]
fn a_short_wait_still_takes_a_free_lock_over_a_slow_link() {
    crate::contract::a_short_wait_still_takes_a_free_lock_over_a_slow_link(&RedisServer::shared());
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

#[test]
fn a_writable_replica_is_refused_with_78_naming_its_master() {
    // A replica that takes writes would keep a lock its master never sees: one client holds
    // through the master while another holds through the replica.
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master.port.to_string(),
        "--replica-read-only",
        "no",
    ]);
    let env = TestEnv::new(&master);
    let lock = lock_name("r");
    let _holder = env.hold(&lock, &[]);
    let via_replica = TestEnv::new(&replica);
    let named = format!("is a replica of 127.0.0.1:{}", master.port);
    let out = via_replica.run(["run", "--no-wait", &lock, "touch", "ran"]);
    assert_fails(&out, 78, &named);
    assert!(
        stderr_of(&out).contains("redis-sentinel://"),
        "{}",
        describe(&out)
    );
    assert!(!via_replica.path("ran").exists());
    for args in [
        vec!["status", lock.as_str()],
        vec!["release", "--force", lock.as_str()],
        vec!["check"],
    ] {
        let out = via_replica.run(&args);
        assert_fails(&out, 78, &named);
    }
    // The holder still holds on the master.
    assert_eq!(env.run(["status", &lock]).status.code(), Some(0));
}

#[test]
fn a_sentinel_given_as_a_redis_url_is_78_with_the_url_to_use() {
    let sentinel = LoneSentinel::start("themaster", free_port());
    let env = TestEnv::new(&FileServer::start());
    let url = format!("redis://127.0.0.1:{}", sentinel.port);
    let form = format!("redis-sentinel://127.0.0.1:{}#themaster", sentinel.port);
    for args in [
        vec!["run", "x", "touch", "ran"],
        vec!["status", "x"],
        vec!["list"],
        vec!["release", "--force", "x"],
        vec!["check"],
    ] {
        let mut all = vec![args[0], "--url", url.as_str()];
        all.extend(&args[1..]);
        let out = env.run(&all);
        assert_fails(&out, 78, &form);
    }
    assert!(!env.path("ran").exists());
}

#[test]
fn a_database_index_the_server_does_not_have_is_78() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let url = format!("redis://127.0.0.1:{}/99", server.port);
    let out = env.run(["run", "--url", &url, &lock_name("r"), "touch", "ran"]);
    assert_fails(
        &out,
        78,
        &crate::backends::no_database(&format!("127.0.0.1:{}", server.port), "99"),
    );
    assert!(
        !stderr_of(&out).contains("ResponseError"),
        "{}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
}
