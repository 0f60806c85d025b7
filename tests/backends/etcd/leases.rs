//! Keys and leases on etcd: a deleted key or a revoked lease ends a hold or a wait at once, a
//! waiter's key sits on a short lease until the grant moves it to the `--ttl` lease.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

use super::{keys, leases};

#[test]
fn a_holder_whose_key_is_deleted_stops_its_command_at_once() {
    // The lease lives on, so keep-alives succeed: only the holder's watch on its own key can
    // tell. A 60 s TTL keeps renewals out of the test. Checked for a holder that got the
    // lock at once and for one that waited (whose waiting watch carries on).
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let prefix = format!("dlock/{lock}/");
    let ttl = ["--ttl", "60s"];
    let mut first = env.hold(&lock, &ttl);
    let ready = env.path("second-ready");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut second = env
        .dlock(["run", "--ttl", "60s", &lock, "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second");
    wait_until("second queued", PATIENCE, || env.waiters(&lock) == 1);
    let first_key = keys(&server, &prefix).into_iter().min().expect("two keys");
    let first_command = read_pid(&first.ready);
    let out = server.etcdctl(&["del", &first_key]);
    assert!(out.status.success(), "{}", describe(&out));
    let code = first.wait().code();
    let stderr = first.stderr();
    assert_eq!(code, Some(124), "{stderr}");
    assert!(stderr.contains("was deleted"), "{stderr}");
    assert!(
        !is_alive(first_command),
        "the first holder's command ran on"
    );
    // The deletion freed the lock: the second holds it now.
    wait_until("second holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let second_command = read_pid(&ready);
    let second_key = keys(&server, &prefix).pop().expect("the second's key");
    let out = server.etcdctl(&["del", &second_key]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(124));
    assert!(
        !is_alive(second_command),
        "the second holder's command ran on"
    );
}

#[test]
fn a_waiter_whose_lease_died_never_starts_its_command() {
    // The waiter lease holds its key: the key goes with it, and the waiter must never start.
    // The hold lease (named in its key) gone: the move at the grant fails. The command may
    // have started by then (the move runs beside its start, the key still on the waiter
    // lease, so nobody else can hold the lock); it is stopped as a lost lock (124), and the
    // lock is free afterwards.
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    for revoked in ["waiter", "hold"] {
        let lock = lock_name("e");
        let ran = env.path(&format!("ran-{revoked}"));
        let script = format!("touch '{}'; exec sleep 1000", ran.display());
        let mut holder = env.hold(&lock, &[]);
        let holder_keys = keys(&server, &format!("dlock/{lock}/"));
        let mut waiter = env
            .dlock(["run", &lock, "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn waiter");
        wait_until("waiter queued", PATIENCE, || {
            keys(&server, &format!("dlock/{lock}/")).len() == 2
        });
        let waiter_key = keys(&server, &format!("dlock/{lock}/"))
            .into_iter()
            .find(|k| !holder_keys.contains(k))
            .expect("the waiter's key");
        let lease = if revoked == "waiter" {
            format!("{:x}", key_info(&server, &waiter_key).lease)
        } else {
            waiter_key.rsplit('/').next().expect("lease id").to_owned()
        };
        let out = server.etcdctl(&["lease", "revoke", &lease]);
        assert!(out.status.success(), "{}", describe(&out));
        holder.signal(Signal::SIGTERM);
        holder.wait();
        let status = wait_within(&mut waiter, PATIENCE);
        let said = stderr_left(&mut waiter);
        if revoked == "waiter" {
            assert!(!status.success(), "the waiter must not report success");
            assert!(
                !ran.exists(),
                "a waiter without its waiter lease started its command"
            );
        } else {
            // 124: stopped as a lost lock (perhaps before the shell got to `touch`); 69:
            // the move failed before the command was started.
            let code = status.code();
            assert!(
                code == Some(124) || (code == Some(69) && !ran.exists()),
                "a waiter whose hold lease was revoked: 124, or 69 without starting; got \
                 {code:?}; it said: {said}"
            );
        }
        assert!(
            keys(&server, &format!("dlock/{lock}/")).is_empty(),
            "the lock is free afterwards ({revoked} lease revoked)"
        );
    }
}

/// A key's create revision and lease (`etcdctl get -w json`).
struct KeyInfo {
    create_revision: u64,
    lease: u64,
}

fn key_info(server: &EtcdServer, key: &str) -> KeyInfo {
    let out = server.etcdctl(&["get", key, "-w", "json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl JSON");
    let kv = &json["kvs"][0];
    KeyInfo {
        create_revision: kv["create_revision"].as_u64().expect("a key"),
        lease: kv["lease"].as_u64().expect("a lease"),
    }
}

/// The TTL a lease was granted with, in seconds.
fn granted_ttl(server: &EtcdServer, lease: u64) -> i64 {
    let out = server.etcdctl(&["lease", "timetolive", &format!("{lease:x}"), "-w", "json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl JSON");
    json["granted-ttl"].as_i64().expect("granted-ttl")
}

#[test]
fn a_waiters_key_is_on_a_short_lease_until_the_grant_moves_it_to_the_hold_lease() {
    // While it waits, a waiter's key is on its 2 s waiter lease, not on its --ttl lease; at
    // the grant the same key moves to the --ttl lease. A Put keeps the key's create revision:
    // the fencing token and the place in the queue stay what they were.
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let prefix = format!("dlock/{lock}/");
    let mut holder = env.hold(&lock, &[]);
    let holder_key = keys(&server, &prefix).pop().expect("the holder's key");
    let ready = env.path("waiter-ready");
    let script = format!(
        "echo $DLOCK_FENCING_TOKEN > '{}'; exec sleep 1000",
        ready.display()
    );
    let mut waiter = env
        .dlock(["run", "--ttl", "60s", &lock, "sh", "-c", &script])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    let waiter_key = keys(&server, &prefix)
        .into_iter()
        .find(|k| *k != holder_key)
        .expect("the waiter's key");
    let waiting = key_info(&server, &waiter_key);
    let waiting_ttl = granted_ttl(&server, waiting.lease);
    assert!(
        waiting_ttl < 10,
        "a waiter's key is on a {waiting_ttl}s lease (--ttl 60s); a killed waiter would block the lock that long"
    );
    holder.signal(Signal::SIGTERM);
    holder.wait();
    wait_until("waiter holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let token: u64 = std::fs::read_to_string(&ready)
        .expect("token")
        .trim()
        .parse()
        .expect("a numeric token");
    // The move runs beside the command's start: wait for it (an acquisition that never
    // moved its key would keep it on the short lease, and fail here).
    wait_until("key moved to the hold lease", PATIENCE, || {
        key_info(&server, &waiter_key).lease != waiting.lease
    });
    let holding = key_info(&server, &waiter_key);
    assert_eq!(
        holding.create_revision, waiting.create_revision,
        "the re-attach changed the key's create revision"
    );
    assert_eq!(token, holding.create_revision, "token != create revision");
    assert_ne!(holding.lease, waiting.lease);
    assert_eq!(granted_ttl(&server, holding.lease), 60);
    // The waiter lease, which holds no key any more, is no longer renewed and expires.
    let waiter_lease = format!("{:x}", waiting.lease);
    wait_until("waiter lease gone", PATIENCE, || {
        !leases(&server).contains(&waiter_lease)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("signal the waiter");
    wait_within(&mut waiter, PATIENCE);
}

#[test]
fn a_waiter_killed_while_waiting_does_not_hold_up_the_lock_for_its_ttl() {
    // CI runners cancel jobs with SIGKILL: a killed waiter cannot clean up. Its key is on its
    // short waiter lease, so once the holder is done the lock is free within seconds, not
    // after the killed waiter's --ttl (60 s here).
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let mut holder = env.hold(&lock, &[]);
    let mut killed = env
        .dlock(["run", "--ttl", "60s", &lock, "touch", "killed-ran"])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) == 1);
    killed.kill().expect("SIGKILL the waiter");
    let _ = killed.wait();
    holder.signal(Signal::SIGTERM);
    holder.wait();
    let started = Instant::now();
    let out = env.run(["run", "--wait", "30s", &lock, "touch", "ran"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    assert!(
        took < Duration::from_secs(15),
        "the lock was free only after {took:?}"
    );
    assert!(!env.path("killed-ran").exists());
}
