//! Integration tests against the real `dlock` binary, in one test binary.
//!
//! - `support`: the harness and one test server per backend;
//! - `contract`: the promises every backend keeps, expanded per backend by `contract_tests!`;
//! - `backends`: what is particular to each backend;
//! - `cli`, `docs`, `safety`, `terminal`: what does not depend on a backend;
//! - `local_queue`: many waiters on one host (the host-local queue, capacity refusals);
//! - `scale`: the many-clients test on every backend, at shipped server limits.
//! - `handoff`: where a hand-off's time goes, part by part, on every backend.
//! - `packaging`: `--version` and the builds (README "Install").
//! - `cleanup`: an interrupted run leaves no server behind.
//! - `faults`: the fault harness's smoke (scripts/faults --smoke: etcd in namespaces, a partition).
//! - `registry`: every list of backends names every registered backend; capabilities.

mod support;
#[macro_use]
mod contract;

mod backends;
mod cleanup;
mod cli;
mod docs;
mod faults;
mod handoff;
mod local_queue;
mod packaging;
mod registry;
mod safety;
mod scale;
mod terminal;
