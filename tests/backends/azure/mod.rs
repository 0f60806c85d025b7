//! The Azure Blob backend: the whole contract against a real Azurite (the Azure Storage
//! emulator), plus what only Azure can get wrong: the lease's bounds, the token counter kept
//! in the blob's metadata, a break by `release --force`, the service's clock, the requests an
//! uncontended run costs, the settings and their secrets (`leases`, `settings`).
//!
//! Waiters poll (the service has no notification), so they are not served in arrival order.
//!
//! Its test server is `server`, which every test reaches through `crate::support`.

mod leases;
pub(super) mod server;
mod settings;

use crate::support::*;

crate::contract_tests!(azure_contract, AzuriteServer::shared());
crate::scale_test!("azure", AzuriteServer::start());
crate::handoff_test!("azure", AzuriteServer::start());

/// `--min-hold`'s finish writes nothing once the lock was taken over (a broken lease is
/// noticed at the next renewal, and a write needs the lease).
#[test]
fn a_finish_after_the_lock_was_taken_over_writes_nothing() {
    crate::contract::a_finish_after_the_lock_was_taken_over_writes_nothing(
        &AzuriteServer::shared(),
        false,
    );
}

/// The lease contract, with the lease the service grants at the least (15 s; the macro's
/// case for a killed holder assumes 3 s).
mod azure_lease_contract {
    use super::*;

    #[test]
    fn blackholed_holder_is_stopped_before_a_contender_gets_the_lock() {
        crate::contract::blackholed_holder_is_stopped_before_a_contender_gets_the_lock(
            &AzuriteServer::shared(),
        );
    }

    /// Within the 15 s lease, one poll (at most 1 s) and a second.
    #[test]
    fn killed_holder_frees_the_lock_within_ttl_plus_a_poll_and_one_second() {
        crate::contract::killed_holder_frees_the_lock_within(
            &AzuriteServer::shared(),
            std::time::Duration::from_secs(15 + 1 + 1),
        );
    }

    #[test]
    fn a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost() {
        crate::contract::a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost(
            &AzuriteServer::shared(),
        );
    }
}
