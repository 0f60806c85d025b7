//! The memcached backend: the whole contract against a real `memcached` (started with `-M`),
//! plus what only memcached can get wrong: servers that evict
//! (`evictions`), the fencing counter and restarts (`tokens`), its keys, several servers and
//! polling (`keys`), `list` (`listing`), and servers it cannot use or that stop answering
//! (`odd_servers`).
//!
//! Waiters are not served in arrival order on memcached (they poll), so the FIFO test other
//! backends run is not run here; `keys::waiters_poll_and_hand_off_quickly` checks what is
//! promised instead.
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod evictions;
mod keys;
mod listing;
pub(super) mod server;
mod odd_servers;
mod tokens;

use crate::support::*;

crate::contract_tests!(memcached_contract, MemcachedServer::shared());
crate::lease_contract_tests!(memcached_lease_contract, MemcachedServer::shared());
crate::crash_contract_tests!(memcached_crash_contract, MemcachedServer::start());
// No slow_link_contract_tests!: over its 0.6 s round trip the hold's renewals outlast their
// bound (TTL/6), and the run ends with the lock lost (124).
crate::scale_test!("memcached", MemcachedServer::start());
crate::handoff_test!("memcached", MemcachedServer::start());

/// `--min-hold`'s finish writes nothing once the lock was taken over
/// (a deleted or replaced item is noticed at the next renewal).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &MemcachedServer::shared(),
        false,
    );
}
