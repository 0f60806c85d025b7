//! The contract on a loaded machine: with every core kept busy ([`Busy`]), contention and
//! hand-offs still fail no run (no 69, no 70: a grant is never thrown away because an answer
//! came late by a fixed constant while the lease had time left) and never overlap.

use std::time::Duration;

use super::contention;
use crate::support::*;

/// The spinners stop by then whatever happens, so a slow run cannot keep the machine busy
/// for the rest of the suite.
const BUSY_FOR: Duration = Duration::from_secs(300);

pub fn a_busy_machine_fails_no_run_and_overlaps_none(server: &dyn LockServer) {
    let busy = Busy::every_core(BUSY_FOR);
    // Every run must succeed and no two commands may be inside at once. Half the clients of
    // the quiet contention case, each with half its runs (80 runs, and 40 hand-offs below):
    // every one of them has its grant and renewals starved of the CPU, and this case runs
    // alone, after the rest of the suite, once per backend, so its length is the suite's.
    contention(server, 8, 10);
    crate::handoff::hand_offs_succeed_without_overlap(server);
    if busy.elapsed() >= BUSY_FOR {
        eprintln!(
            "the spinners stopped before the runs ended: part of this ran on an idle machine"
        );
    }
}
