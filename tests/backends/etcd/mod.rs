//! The etcd backend: the whole contract against a real `etcd`, plus FIFO, `etcdctl lock`
//! interop, lease loss, and a three-member cluster: the waiting
//! protocol (`waiting`), the leases of holders and waiters (`leases`), connecting and
//! authentication (`connect`), TLS (`tls`), failover (`failover`), `etcdctl` (`interop`),
//! shared locks (`shared`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod connect;
mod failover;
mod interop;
mod leases;
pub(super) mod server;
mod shared;
mod tls;
mod waiting;

use crate::support::*;

crate::contract_tests!(etcd_contract, EtcdServer::shared());
crate::lease_contract_tests!(etcd_lease_contract, EtcdServer::shared());
crate::shared_contract_tests!(etcd_shared_contract, EtcdServer::shared());
crate::shared_lease_contract_tests!(etcd_shared_lease_contract, EtcdServer::shared());
// No slow_link_contract_tests!: a waiter keeps a lease of its own alive while it waits, and
// over its 0.6 s round trip every renewal outlasts its bound (TTL/6), so the wait is lost.
crate::scale_test!("etcd", EtcdServer::start());
crate::handoff_test!("etcd", EtcdServer::start());

#[test]
fn waiters_acquire_in_arrival_order() {
    crate::contract::waiters_acquire_in_arrival_order(&EtcdServer::shared());
}

/// Keys under `prefix` (etcdctl, keys only).
fn keys(server: &EtcdServer, prefix: &str) -> Vec<String> {
    let out = server.etcdctl(&["get", "--prefix", "--keys-only", prefix]);
    assert!(out.status.success(), "{}", describe(&out));
    stdout_of(&out)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `dlock run LOCK touch FILE`, returned once it is the `place`-th waiter in the queue.
fn queue_toucher(env: &TestEnv, lock: &str, file: &str, place: u64) -> std::process::Child {
    let waiter = env
        .dlock(["run", lock, "touch", file])
        .spawn()
        .expect("spawn waiter");
    wait_until("waiter queued", PATIENCE, || env.waiters(lock) == place);
    waiter
}

fn leases(server: &EtcdServer) -> Vec<String> {
    let out = server.etcdctl(&["lease", "list"]);
    assert!(out.status.success(), "{}", describe(&out));
    stdout_of(&out).lines().skip(1).map(str::to_owned).collect()
}

#[test]
fn a_ttl_below_the_minimum_is_a_usage_error() {
    // etcd would raise a 1 s lease to its own minimum; dlock refuses it instead of changing it,
    // before it contacts a server (none listens at this URL).
    let (_dir, env) = file_env();
    let url = format!("etcd://127.0.0.1:{}", free_port());
    let out = env.run(["run", "--url", &url, "--ttl", "1s", "short", "touch", "ran"]);
    assert_fails(&out, 64, "the minimum is 2s");
    assert!(!env.path("ran").exists());
}

#[test]
fn holders_must_agree_on_the_limit() {
    let server = EtcdServer::shared().unprefixed();
    let env = TestEnv::new(&server);
    let lock = lock_name("e");
    let _holder = env.hold(&lock, &["--limit", "2"]);
    let out = env.run(["run", "--no-wait", "--limit", "3", &lock, "true"]);
    assert_fails(&out, 64, "--limit 2");
    assert_eq!(
        keys(&server, &format!("dlock/{lock}/")).len(),
        1,
        "the refused waiter left its key"
    );
}
