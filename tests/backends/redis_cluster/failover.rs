//! A held lock while the cluster changes under it: its slot migrated to another master
//! (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT … NODE`, what
//! `redis-cli --cluster reshard` does), and its master killed with SIGKILL and replaced by its
//! replica. The holder keeps its hold (or stops its command, 124); the waiter keeps waiting
//! and then gets a larger token.

use std::process::Child;
use std::time::{Duration, Instant};

use super::*;

/// Move `slot` from the master on `from` to the one on `to`, staying half-way (MIGRATING /
/// IMPORTING, some keys moved) for a moment so that the holder and the waiter meet it.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: u16, to: u16) {
    begin_migration(cluster, slot, from, to);
    end_migration(cluster, slot, to);
}

/// `redis-cli` on `port`, which must succeed.
fn cli_ok(cluster: &RedisCluster, port: u16, args: &[&str]) -> String {
    let out = cluster.cli(port, args);
    assert!(
        out.status.success() && !stdout_of(&out).contains("ERR"),
        "{args:?} on {port}: {}",
        describe(&out)
    );
    stdout_of(&out)
}

/// The first half of a migration: `slot` MIGRATING on `from`, IMPORTING on `to`, and every
/// key moved one at a time, with pauses (calls meet a half-moved lock: TRYAGAIN, ASK). The
/// slot stays half-way until [`end_migration`].
fn begin_migration(cluster: &RedisCluster, slot: u16, from: u16, to: u16) {
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    let slot = slot.to_string();
    cli_ok(
        cluster,
        to,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id],
    );
    cli_ok(
        cluster,
        from,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id],
    );
    let keys = cli_ok(cluster, from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
    let keys: Vec<&str> = keys
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    assert!(!keys.is_empty(), "the held lock has no keys in slot {slot}");
    for key in keys {
        let port = to.to_string();
        cli_ok(
            cluster,
            from,
            &["MIGRATE", "127.0.0.1", &port, key, "0", "5000"],
        );
        std::thread::sleep(Duration::from_millis(150));
    }
}

/// The end of a migration: every node says `slot` is served by the master on `to`.
fn end_migration(cluster: &RedisCluster, slot: u16, to: u16) {
    let to_id = cluster.node_id(to);
    let slot = slot.to_string();
    for port in cluster.ports() {
        cli_ok(
            cluster,
            port,
            &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id],
        );
    }
}

/// The token `child`'s command wrote to `path`; a `child` that exits first fails the test
/// with what it said.
fn token_of(child: &mut Child, path: &std::path::Path) -> u64 {
    wait_until("the command's token", PATIENCE * 3, || {
        if let Some(status) = child.try_wait().expect("try_wait") {
            if !path.exists() {
                panic!(
                    "dlock ended with {status} before its command ran: {}",
                    stderr_left(child)
                );
            }
        }
        path.exists()
    });
    read_token(path)
}

/// Another master than `from` (one of the first three nodes).
fn other_master(cluster: &RedisCluster, from: u16) -> u16 {
    cluster
        .ports()
        .into_iter()
        .take(3)
        .find(|&p| p != from)
        .expect("another master")
}

#[test]
fn a_held_and_waited_lock_survives_the_migration_of_its_slot() {
    let cluster = RedisCluster::start();
    let env = TestEnv::new(&cluster);
    let name = lock_name("moving");
    let slot = cluster.slot_of(&name);
    let from = cluster.master_of(&name);
    let to = other_master(&cluster, from);
    let (mut first, first_token, stop) = holder(&env, &name, &[]);
    let first_token = read_token(&first_token);
    let (mut second, second_token, second_stop) = holder(&env, &name, &["--wait", "60s"]);
    wait_until("the waiter queued", PATIENCE, || env.waiters(&name) >= 1);

    migrate_slot(&cluster, slot, from, to);
    assert_eq!(cluster.master_of(&name), to);

    // Still held by the first holder, still waited on.
    let out = env.run(["status", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        !second_token.exists(),
        "the waiter got the lock while it was held"
    );
    std::fs::write(&stop, "").expect("stop file");
    let status = wait_within(&mut first, PATIENCE);
    assert_eq!(
        status.code(),
        Some(0),
        "the holder lost its hold during the migration"
    );
    let token = token_of(&mut second, &second_token);
    assert!(token > first_token, "token {token} after {first_token}");
    std::fs::write(&second_stop, "").expect("stop file");
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(0));
}

#[test]
fn a_waiter_keeps_its_place_through_a_slow_migration_and_gets_the_lock() {
    // A big slot takes seconds to move: every call of the lock meets TRYAGAIN or ASK all that
    // time. The waiter keeps waiting (no "kept redirecting"), the holder's release gets through
    // once the slot has moved, and the waiter is woken and gets the lock.
    let cluster = RedisCluster::start();
    let env = TestEnv::new(&cluster);
    let name = lock_name("slow");
    let slot = cluster.slot_of(&name);
    let from = cluster.master_of(&name);
    let to = other_master(&cluster, from);
    let (mut first, first_token, stop) = holder(&env, &name, &[]);
    let first_token = read_token(&first_token);
    let (mut second, second_token, second_stop) = holder(&env, &name, &["--wait", "120s"]);
    wait_until("the waiter queued", PATIENCE, || env.waiters(&name) >= 1);

    begin_migration(&cluster, slot, from, to);
    // The holder's command ends while the slot is half-way; the slot stays so for 3 s (the
    // fault under test: its length is the point, not a wait for something to happen).
    std::fs::write(&stop, "").expect("stop file");
    let open = Instant::now();
    while open.elapsed() < Duration::from_secs(3) {
        if let Some(status) = second.try_wait().expect("try_wait") {
            panic!(
                "the waiter gave up during the migration ({status}): {}",
                stderr_left(&mut second)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !second_token.exists(),
        "the waiter got the lock while it was held"
    );
    end_migration(&cluster, slot, to);
    assert_eq!(cluster.master_of(&name), to);

    let status = wait_within(&mut first, PATIENCE * 2);
    assert_eq!(status.code(), Some(0), "{}", stderr_left(&mut first));
    let token = token_of(&mut second, &second_token);
    assert!(token > first_token, "token {token} after {first_token}");
    std::fs::write(&second_stop, "").expect("stop file");
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(0));
}

#[test]
fn a_master_killed_during_a_hold_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start_with(1);
    let env = TestEnv::new(&cluster);
    let name = lock_name("failover");
    let master = cluster.master_of(&name);
    let (mut first, first_token, stop) = holder(&env, &name, &["--ttl", "10s"]);
    let first_token = read_token(&first_token);
    let (mut second, second_token, second_stop) =
        holder(&env, &name, &["--ttl", "10s", "--wait", "90s"]);
    wait_until("the waiter queued", PATIENCE, || env.waiters(&name) >= 1);
    // The replica has what the master has (replication is asynchronous).
    let synced = redis_resp(master, &["WAIT", "1", "5000"]).unwrap_or_default();
    assert!(synced.starts_with(":1"), "replica not in sync: {synced}");

    cluster.kill(master);
    let rest: Vec<u16> = cluster
        .ports()
        .into_iter()
        .filter(|&p| p != master)
        .collect();
    let slot = cluster.slot_of(&name);
    wait_until("a replica promoted", PATIENCE, || {
        cluster
            .try_master_of_slot(slot)
            .is_some_and(|m| m != master)
    });
    cluster.wait_ok(&rest);

    // The holder kept its hold, or stopped its command (124); never two holders.
    std::fs::write(&stop, "").expect("stop file");
    let status = wait_within(&mut first, PATIENCE);
    assert!(
        matches!(status.code(), Some(0 | 124)),
        "holder ended with {status}"
    );
    let token = read_token(&second_token);
    assert!(token > first_token, "token {token} after {first_token}");
    std::fs::write(&second_stop, "").expect("stop file");
    assert_eq!(wait_within(&mut second, PATIENCE).code(), Some(0));
    let after = env.token(&name);
    assert!(after > token, "token {after} after {token}");
}
