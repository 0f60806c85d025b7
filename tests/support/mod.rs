//! Shared test support: a per-test environment around the real `dlock` binary, lock servers
//! to run the contract against, readiness waits with bounds, and process helpers.
//!
//! Every wait here is bounded in time and synchronises on something observable (a file, an
//! exit), never on a fixed sleep.
//!
//! - `harness`: `TestEnv` (one test's world) and `Holding` (a running holder);
//! - `server`: the `LockServer` and `LeaseServer` traits;
//! - `shared`: one server of each kind for the whole run (`Shared`), torn down by a watchdog;
//! - `process`: bounded waits, output helpers, `assert_fails`, unique names, server binaries;
//! - `net`: free ports, a `Proxy` that black-holes or slows a link, a `SilentServer`;
//! - `busy`: every core kept busy for a bounded time (a loaded machine);
//! - `report`: reading `--report` files, a URL that reaches no server, another user's
//!   directories, a small disk to fill;
//! - `certs`: throw-away certificates for the TLS tests;
//! - every backend's test server, which lives in its folder (`tests/backends/NAME/server.rs`)
//!   and is re-exported here from `crate::backends::servers`.
//!
//! Tests use all of it through `use crate::support::*;`.

mod busy;
mod certs;
mod clock;
mod harness;
mod net;
mod process;
mod report;
mod server;
mod shared;

pub use self::busy::*;
pub use self::certs::*;
pub use self::harness::*;
pub use self::net::*;
pub use self::process::*;
pub use self::report::*;
pub use self::server::*;
pub use self::shared::*;
pub use crate::backends::servers::*;
