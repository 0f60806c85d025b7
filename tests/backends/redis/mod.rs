//! The Redis backend: the whole contract against a real `redis-server`, plus what only Redis
//! can get wrong: its keys and tokens (`keys`), waiting (`waiting`), shared locks (`shared`),
//! connecting and authentication (`connect`), TLS (`tls`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod connect;
mod declared;
mod keys;
pub(super) mod server;
mod shared;
mod tls;
mod waiting;

use nix::sys::signal::Signal;

use crate::support::*;

crate::contract_tests!(redis_contract, RedisServer::shared());
crate::shared_contract_tests!(redis_shared_contract, RedisServer::shared());
crate::lease_contract_tests!(redis_lease_contract, RedisServer::shared());
crate::shared_lease_contract_tests!(redis_shared_lease_contract, RedisServer::shared());
crate::crash_contract_tests!(redis_crash_contract, RedisServer::start());
crate::slow_link_contract_tests!(redis_slow_link_contract, RedisServer::shared());
crate::scale_test!("redis", RedisServer::start());
crate::handoff_test!("redis", RedisServer::start());

/// Start `dlock run` in the background; its command appends `label` to `log` and exits.
#[test]
fn waiters_acquire_in_arrival_order() {
    let server = RedisServer::shared();
    let env = TestEnv::new(&server);
    let lock = lock_name("r");
    let log = env.path("order");
    let (holder, started) = crate::contract::queue_five_waiters(&env, &lock, &log);
    crate::contract::release_and_expect_arrival_order(holder, started, &log);
}

/// The key `dlock:{<lock>}:<suffix>` (names from [`lock_name`] need no encoding).
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
