//! The contract on a loaded machine: with every core kept busy ([`Busy`]), contention and
//! hand-offs still fail no run (no 69, no 70: a grant is never thrown away because an answer
//! came late by a fixed constant while the lease had time left) and never overlap.

use std::time::Duration;

use super::mutual_exclusion_under_contention_with_increasing_tokens;
use crate::support::*;

/// The spinners stop by then whatever happens, so a slow run cannot keep the machine busy
/// for the rest of the suite.
const BUSY_FOR: Duration = Duration::from_secs(300);

pub fn a_busy_machine_fails_no_run_and_overlaps_none(server: &dyn LockServer) {
    let busy = Busy::every_core(BUSY_FOR);
    // Every run must succeed and no two commands may be inside at once.
    mutual_exclusion_under_contention_with_increasing_tokens(server);
    crate::handoff::hand_offs_succeed_without_overlap(server);
    if busy.elapsed() >= BUSY_FOR {
        eprintln!(
            "the spinners stopped before the runs ended: part of this ran on an idle machine"
        );
    }
}
