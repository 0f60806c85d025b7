//! Redis behind Sentinel: the whole contract through `redis-sentinel://` (a master,
//! a replica and three sentinels), failovers while a lock is held and waited for
//! (`failover`), and reaching the sentinels: down, a wrong master name, passwords, `check`
//! (`connect`), a majority of the sentinels before a grant and every renewal (`majority`), a
//! stopped replica with `?replicas=N` (`replicas`), and `rediss-sentinel://` to TLS-only
//! servers (`tls`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod connect;
mod discovery;
mod failover;
mod majority;
mod replicas;
pub(super) mod server;
mod tls;

use crate::support::*;

crate::contract_tests!(redis_sentinel_contract, SentinelServer::shared());
crate::shared_contract_tests!(redis_sentinel_shared_contract, SentinelServer::shared());
crate::lease_contract_tests!(redis_sentinel_lease_contract, SentinelServer::shared());
crate::shared_lease_contract_tests!(
    redis_sentinel_shared_lease_contract,
    SentinelServer::shared()
);
