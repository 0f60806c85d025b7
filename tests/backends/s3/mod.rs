//! The S3 backend: the whole contract against moto in server mode, plus what only S3 can get
//! wrong: the token counter kept in the lock object across releases, expiries and
//! `release --force` (`tokens`), servers that ignore conditional writes and clocks that are
//! off (`servers`, `clocks`), what a run costs in requests and the settings (`settings`).
//!
//! Waiters are not served in arrival order on S3 (they poll), so the FIFO cases are not run.
//! Expiry is judged in the server's whole seconds: a dead holder's lock is free between
//! TTL + 1 s and TTL + 2 s after its last write, and a waiter notices it at its next poll,
//! so the lease contract's "TTL + 1 s" is run with that bound instead ([`FREED_WITHIN`]).
//! Its test server is `server`, which every test reaches through `crate::support`.

mod clocks;
mod fake;
pub(super) mod server;
mod servers;
mod settings;
mod tokens;

use std::time::Duration;

use crate::support::*;

crate::contract_tests!(s3_contract, S3Server::shared());
crate::scale_test!("s3", S3Server::start());
crate::handoff_test!("s3", S3Server::start());

/// The test TTL (5 s, S3's least) + 2 s of the server's whole seconds + one poll at its
/// longest (2 s) + 1 s for the processes: when a killed holder's lock has been taken again.
const FREED_WITHIN: Duration = Duration::from_secs(5 + 2 + 2 + 1);

#[test]
fn killed_holder_frees_the_lock_within_ttl_plus_the_servers_seconds_and_a_poll() {
    crate::contract::killed_holder_frees_the_lock_within(&S3Server::shared(), FREED_WITHIN);
}

#[test]
fn blackholed_holder_is_stopped_before_a_contender_gets_the_lock() {
    crate::contract::blackholed_holder_is_stopped_before_a_contender_gets_the_lock(
        &S3Server::shared(),
    );
}

#[test]
fn a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost() {
    crate::contract::a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost(
        &S3Server::shared(),
    );
}

/// The cases an emulator's own race could hide a race of dlock's in, on SeaweedFS, whose
/// conditional writes are atomic.
mod seaweedfs {
    use crate::support::*;

    #[test]
    fn mutual_exclusion_under_contention_with_increasing_tokens() {
        crate::contract::mutual_exclusion_under_contention_with_increasing_tokens(
            &S3Server::start_seaweedfs(),
        );
    }

    crate::scale_test!("s3-seaweedfs", S3Server::start_seaweedfs());
}

/// `--min-hold`'s finish writes nothing once the lock was taken over (noticed at the next
/// renewal, whose `If-Match` fails).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &S3Server::shared(),
        false,
    );
}
