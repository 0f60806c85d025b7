//! The NATS backend: the whole contract against a real `nats-server` with JetStream, plus
//! what only NATS can get wrong: tokens from the stream's revisions across releases,
//! expiries, `release --force` and a restart (`tokens`), and the buckets and servers it
//! refuses (`buckets`).
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod buckets;
mod cluster;
pub(super) mod server;
mod tls;
mod tokens;

use crate::support::*;

crate::contract_tests!(nats_contract, NatsServer::shared());
crate::lease_contract_tests!(nats_lease_contract, NatsServer::shared());
// No crash_contract_tests!: its first case expects the crash to take the lock, and NATS keeps
// a holder's key in its store across a restart (`tokens` holds what a restart must keep).
crate::scale_test!("nats", NatsServer::start());
crate::handoff_test!("nats", NatsServer::start());

#[test]
fn waiters_acquire_in_arrival_order() {
    crate::contract::waiters_acquire_in_arrival_order(&NatsServer::shared());
}
