//! The contract, once, for every backend.
//!
//! Each function checks one promise against a [`LockServer`](crate::support::LockServer).
//! [`contract_tests!`] turns the whole list into `#[test]`s for one backend:
//! `contract_tests!(file_contract, FileServer::start());`, and [`lease_contract_tests!`] adds
//! the promises of backends whose server expires a silent holder's lease. A backend adds a
//! launcher and its own special cases (under `tests/backends/`), never a copy of this suite.
//!
//! The promises, by theme: `exit` (exit statuses, giving up), `signals` (forwarding,
//! escalation, losing the lock), `exclusion` (one holder, `--limit`, tokens, names),
//! `command` (what the command sees, reentrancy), `status` (`status`, `list`, `check`),
//! `lease` (lease backends), `queue` (arrival order, for backends with a queue), `wording`
//! (what a user reads, the same everywhere; `--min-hold`), `busy` (contention and hand-offs
//! on a machine whose cores are kept busy), `report` (the outcome record, waits in CI logs),
//! `several` (`--also`: several names in one run), `shared` (`--shared`, expanded by
//! `shared_contract_tests!` for backends that offer it), `hold` (`dlock hold` and
//! `dlock release`),
//! `crash` (a server that crashes and comes back, `crash_contract_tests!`, for test servers
//! that can; a slow link, `slow_link_contract_tests!`).

mod busy;
mod command;
mod crash;
mod exclusion;
mod exit;
mod hold;
mod lease;
mod min_hold;
mod queue;
mod report;
mod several;
mod shared;
mod signals;
mod status;
mod wording;

pub use self::busy::*;
pub use self::command::*;
pub use self::crash::*;
pub use self::exclusion::*;
pub use self::exit::*;
pub use self::hold::*;
pub use self::lease::*;
pub use self::min_hold::*;
pub use self::queue::*;
pub use self::report::*;
pub use self::several::*;
pub use self::shared::*;
pub use self::signals::*;
pub use self::status::*;
pub use self::wording::*;

/// What the backend behind `server` can honour, as dlock's registry declares it: a case that
/// depends on a capability asks here, never a list of schemes.
pub fn capabilities(server: &dyn crate::support::LockServer) -> dlock::backend::Capabilities {
    match dlock::backend::kind_of_scheme(server.scheme()) {
        Some(kind) => kind.capabilities,
        None => panic!("{} is no registered scheme", server.scheme()),
    }
}

/// Expand every promise into `#[test]`s for one backend, in a module `$module`, each
/// starting its own server with `$start`.
#[macro_export]
macro_rules! contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                command_exit_status_passes_through,
                command_killed_by_signal_exits_128_plus_signal,
                held_lock_with_no_wait_exits_75,
                conflict_exit_code_changes_the_not_acquired_status,
                wait_gives_up_after_the_duration_and_leaves_nothing_behind,
                lock_is_free_at_once_after_the_command_exits,
                each_forwarded_signal_reaches_the_command_once,
                signal_while_waiting_exits_128_plus_n_without_running,
                second_terminating_signal_kills_at_once,
                kill_after_escalates_to_sigkill,
                lock_loss_kills_the_whole_process_group_and_exits_124,
                a_lost_lock_is_reported_once,
                on_lost_ignore_lets_the_command_finish,
                sigkill_of_dlock_takes_the_command_down,
                mutual_exclusion_under_contention_with_increasing_tokens,
                limit_allows_exactly_n_holders,
                all_holders_must_agree_on_the_limit,
                names_are_opaque_and_isolated,
                command_sees_lock_variables_and_no_credentials,
                nested_run_of_a_held_lock_is_reentrant,
                nested_runs_reach_the_server_with_the_outer_credentials,
                a_copied_held_environment_is_not_reentrant,
                an_orphan_of_a_past_holder_acquires_normally,
                holder_metadata_reaches_terminals_escaped,
                passwords_in_the_holders_command_line_are_not_stored,
                secrets_in_the_holders_command_line_are_masked_or_not_recorded,
                stdin_and_stdout_pass_through_untouched,
                status_reports_holder_and_exits_0_held_1_free,
                json_shows_each_token_exactly_for_every_json_tool,
                status_shows_since_when_each_waiter_of_this_host_waits,
                since_counts_from_the_grant_not_from_the_wait,
                status_shows_each_waiter_once,
                a_holder_released_by_force_is_never_shown_waiting,
                waiters_command_lines_are_masked_or_not_shown,
                list_shows_held_locks,
                every_list_shows_every_held_lock,
                check_reports_ok,
                check_aligns_its_values_and_types_its_json,
                list_shows_age_user_and_token_and_says_when_nothing_is_held,
                conflict_line_reads_the_same_on_every_backend,
                waiting_at_a_terminal_names_the_holder,
                waiting_is_silent_when_not_at_a_terminal,
                min_hold_keeps_the_lock_after_the_command_ends,
                a_huge_min_hold_is_refused_before_anything_runs,
                a_busy_machine_fails_no_run_and_overlaps_none,
                report_records_a_run_that_ran,
                report_records_a_busy_run_with_its_holder,
                report_records_an_error,
                report_records_a_signalled_run,
                report_records_the_signal_that_stopped_a_holding_run,
                report_records_a_lost_lock,
                report_lines_of_concurrent_runs_never_mix,
                waiting_shows_in_ci_logs_but_not_in_cron_mail,
                offered_or_refused_as_the_registry_says,
                a_shared_hold_around_it_never_makes_a_nested_run_shared,
                a_host_queues_its_waiters_as_the_registry_says,
                a_semaphore_says_how_many_of_its_slots_are_taken,
                a_url_at_another_kind_of_server_names_what_answers_there,
                a_unix_socket_that_does_not_exist_is_named,
                a_hold_belongs_to_its_shell_and_ends_when_the_shell_is_killed,
                a_killed_keeper_leaves_the_lock_to_its_lease,
                a_lost_hold_signals_its_shell_and_is_recorded,
                release_ends_your_own_hold_and_refuses_anothers,
                max_hold_ends_a_forgotten_hold,
                several_names_each_have_their_token_in_dlock_fencing_tokens,
                several_names_are_taken_all_or_none_within_the_wait,
                several_names_are_lost_when_any_one_is_lost,
                several_names_in_opposite_orders_never_deadlock,
                several_names_let_a_nested_run_of_any_of_them_reenter,
                several_names_say_which_one_they_wait_for,
            );
        }
    };
    (@mut_tests $start:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let mut server = $start;
                $crate::contract::$test(&mut server);
            }
        )*
    };
    (@tests $start:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let server = $start;
                $crate::contract::$test(&server);
            }
        )*
    };
}

/// Expand the lease-backend promises into `#[test]`s for one backend.
#[macro_export]
macro_rules! lease_contract_tests {
    ($module:ident, $start:expr) => {
        mod $module {
            use super::*;
            $crate::contract_tests!(@tests $start;
                blackholed_holder_is_stopped_before_a_contender_gets_the_lock,
                killed_holder_frees_the_lock_within_ttl_plus_one_second,
                a_command_that_ended_while_its_dlock_was_stopped_past_the_lease_counts_as_lost,
            );
        }
    };
}
