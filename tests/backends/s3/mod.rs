//! The S3 backend: the whole contract against moto in server mode, plus what only S3 can get
//! wrong: the token counter kept in the lock object across releases, expiries and
//! `release --force`, ETags that must never repeat, lost races, servers that ignore
//! conditional writes, clocks that are off, what a run costs in requests, and the settings.
//!
//! Waiters are not served in arrival order on S3 (they poll), so the FIFO cases are not run.
//! Its test server is `server`, which every test reaches through `crate::support`.

pub(super) mod server;

use crate::support::*;

crate::contract_tests!(s3_contract, S3Server::shared());
crate::scale_test!("s3", S3Server::start());
crate::handoff_test!("s3", S3Server::start());
