//! Integration tests against the real `dlock` binary, in one test binary.
//!
//! - `support`: the harness and one test server per backend;
//! - `contract`: the promises every backend keeps, expanded per backend by `contract_tests!`;
//! - `backends`: what is particular to each backend;
//! - `cli`, `docs`, `safety`, `terminal`: what does not depend on a backend;
//! - `packaging`: `--version` and the builds (README "Install").

mod support;
#[macro_use]
mod contract;

mod backends;
mod cli;
mod docs;
mod packaging;
mod safety;
mod terminal;
