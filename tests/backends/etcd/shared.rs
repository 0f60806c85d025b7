//! Shared locks on etcd (`--shared`): readers' keys in the one queue, a reader waiting for the
//! nearest older writer's key. Beyond the contract (`tests/contract/shared.rs`): a reader
//! whose lease is revoked stops while the other reader's share stays, `etcdctl lock` counts as
//! a writer both ways, and a reader behind more readers than one read returns still finds the
//! writer before them.

use std::process::{Child, Stdio};

use nix::sys::signal::Signal;

use crate::support::*;

use super::keys;

/// A run of `name` (with `extra`) whose command writes its token to `file` and sleeps;
/// `file` has a whole line once the command holds.
fn spawn_holder(env: &TestEnv, name: &str, extra: &[&str], file: &str) -> Child {
    let script = format!(
        "echo $DLOCK_FENCING_TOKEN > '{}'; exec sleep 1000",
        env.path(file).display()
    );
    let mut args = vec!["run"];
    args.extend(extra);
    args.extend([name, "sh", "-c", &script]);
    env.spawn(&args)
}

/// The token the command of [`spawn_holder`] wrote to `file`, once it holds.
fn token_in(env: &TestEnv, file: &str) -> Option<u64> {
    std::fs::read_to_string(env.path(file))
        .ok()
        .filter(|s| s.ends_with('\n'))
        .and_then(|s| s.trim().parse().ok())
}

fn stop(child: &mut Child) -> Option<i32> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal dlock");
    wait_within(child, PATIENCE).code()
}

/// The hold lease a key is named after (`<prefix>/<name>/<lease id in hex>`).
fn lease_of(key: &str) -> &str {
    key.rsplit('/').next().expect("a lease id")
}

#[test]
fn a_reader_whose_lease_is_revoked_stops_and_the_others_share_stays() {
    // Two readers hold, a writer waits. One reader's lease is revoked (by an admin, or by
    // etcd after a partition): it stops (124), and the writer still waits for the other.
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let prefix = format!("dlock/{lock}/");
    let mut revoked = spawn_holder(&env, &lock, &["--shared"], "revoked");
    wait_until("the first reader holds", PATIENCE, || {
        token_in(&env, "revoked").is_some()
    });
    let revoked_key = keys(&server, &prefix)
        .pop()
        .expect("the first reader's key");
    let mut other = spawn_holder(&env, &lock, &["--shared"], "other");
    wait_until("the other reader holds", PATIENCE, || {
        token_in(&env, "other").is_some()
    });
    let mut writer = spawn_holder(&env, &lock, &[], "writer");
    wait_until("the writer waits", PATIENCE, || env.waiters(&lock) == 1);
    let out = server.etcdctl(&["lease", "revoke", lease_of(&revoked_key)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        wait_within(&mut revoked, PATIENCE).code(),
        Some(124),
        "{}",
        stderr_left(&mut revoked)
    );
    assert_eq!(
        env.modes(&lock, "holders"),
        ["shared"],
        "one reader is left"
    );
    assert_eq!(env.waiters(&lock), 1, "the writer still waits");
    assert!(
        token_in(&env, "writer").is_none(),
        "the writer ran beside a reader"
    );
    assert_eq!(stop(&mut other), Some(143));
    wait_until("the writer holds", PATIENCE, || {
        token_in(&env, "writer").is_some()
    });
    assert_eq!(stop(&mut writer), Some(143));
    assert!(keys(&server, &prefix).is_empty(), "keys left behind");
}

/// `etcdctl lock NAME -- sh -c SCRIPT` against `server`.
fn etcdctl_lock(server: &EtcdServer, name: &str, script: &str) -> Child {
    std::process::Command::new(server_binary("etcdctl", "etcd-client"))
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{}", server.endpoints()))
        .args(["lock", name, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock")
}

#[test]
fn etcdctl_lock_is_a_writer_to_readers_and_waits_for_them() {
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let prefix = format!("dlock/{lock}/");
    let (ready, go) = (env.path("etcdctl-ready"), env.path("etcdctl-go"));
    let script = format!(
        "touch '{}'; n=0; while [ ! -e '{}' ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done",
        ready.display(),
        go.display()
    );
    // etcdctl holds: readers are refused or wait.
    let mut etcdctl = etcdctl_lock(&server, &format!("dlock/{lock}"), &script);
    wait_until("etcdctl holds", PATIENCE, || ready.exists());
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let mut reader = spawn_holder(&env, &lock, &["--shared"], "reader");
    wait_until("the reader waits", PATIENCE, || {
        keys(&server, &prefix).len() == 2
    });
    assert!(
        token_in(&env, "reader").is_none(),
        "a reader ran beside etcdctl lock"
    );
    std::fs::write(&go, b"").expect("go");
    assert!(wait_within(&mut etcdctl, PATIENCE).success());
    wait_until("the reader holds", PATIENCE, || {
        token_in(&env, "reader").is_some()
    });

    // Readers hold: etcdctl waits for every one of them, and a reader that comes after it
    // queues behind it.
    let mut second = env.hold(&lock, &["--shared"]);
    let (ready, go) = (env.path("etcdctl-ready-2"), env.path("etcdctl-go-2"));
    let script = format!(
        "touch '{}'; n=0; while [ ! -e '{}' ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done",
        ready.display(),
        go.display()
    );
    let mut etcdctl = etcdctl_lock(&server, &format!("dlock/{lock}"), &script);
    wait_until("etcdctl waits", PATIENCE, || {
        keys(&server, &prefix).len() == 3
    });
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    assert_eq!(stop(&mut reader), Some(143));
    assert_eq!(keys(&server, &prefix).len(), 2, "etcdctl and a reader");
    assert!(!ready.exists(), "etcdctl lock ran beside a reader");
    second.signal(Signal::SIGTERM);
    second.wait();
    wait_until("etcdctl holds", PATIENCE, || ready.exists());
    std::fs::write(&go, b"").expect("go");
    assert!(wait_within(&mut etcdctl, PATIENCE).success());
}

/// A reader's value as dlock writes it, for keys put by hand.
const READER_VALUE: &str = r#"{"name":"x","host":"h","pid":1,"user":"u","command":"c","since":"2026-01-01T00:00:00Z","ttl_ms":60000,"token":0,"version":"0","mode":"shared","limit":1}"#;

#[test]
fn a_reader_behind_many_readers_still_finds_the_writer_before_them() {
    // More readers' keys than one read returns (64) lie between a writer's key (empty, as
    // etcdctl's) and a new reader: it must look past them all, and hold once the writer's
    // key goes.
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let prefix = format!("dlock/{lock}/");
    let writer = format!("{prefix}0writer");
    let out = server.etcdctl(&["put", &writer, ""]);
    assert!(out.status.success(), "{}", describe(&out));
    for i in 0..70 {
        let out = server.etcdctl(&["put", &format!("{prefix}1reader{i:03}"), READER_VALUE]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    let mut reader = spawn_holder(&env, &lock, &["--shared"], "reader");
    wait_until("the reader waits", PATIENCE, || {
        keys(&server, &prefix).len() == 72
    });
    assert!(
        token_in(&env, "reader").is_none(),
        "a reader ran beside a writer"
    );
    let out = server.etcdctl(&["del", &writer]);
    assert!(out.status.success(), "{}", describe(&out));
    wait_until("the reader holds", PATIENCE, || {
        token_in(&env, "reader").is_some()
    });
    let out = env.run(["run", "--shared", "--no-wait", &lock, "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--no-wait", &lock, "true"]);
    assert_fails(&out, 75, "is held");
    assert_eq!(stop(&mut reader), Some(143));
    let out = server.etcdctl(&["del", "--prefix", &prefix]);
    assert!(out.status.success(), "{}", describe(&out));
}
