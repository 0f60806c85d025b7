//! Shared test support: a per-test environment around the real `dlock` binary, lock servers
//! to run the contract against, readiness waits with bounds, and process helpers.
//!
//! Every wait here is bounded in time and synchronises on something observable (a file, an
//! exit), never on a fixed sleep.
//!
//! - `harness`: `TestEnv` (one test's world) and `Holding` (a running holder);
//! - `server`: the `LockServer` and `LeaseServer` traits, and `FileServer`;
//! - `shared`: one server of each kind for the whole run (`Shared`), torn down by a watchdog;
//! - `process`: bounded waits, output helpers, `assert_fails`, unique names, server binaries;
//! - `net`: free ports, a `Proxy` that black-holes or slows a link, a `SilentServer`;
//! - `busy`: every core kept busy for a bounded time (a loaded machine);
//! - `report`: reading `--report` files, a URL that reaches no server, another user's
//!   directories, a small disk to fill;
//! - `certs`: throw-away certificates for the TLS tests;
//! - one file per test server: `redis`, `redis_cluster`, `sentinel`, `etcd`, `zk`, `postgres`, `mysql`, `memcached`.
//!
//! Tests use all of it through `use crate::support::*;`.

mod busy;
mod certs;
mod etcd;
mod harness;
mod memcached;
mod mysql;
mod net;
mod postgres;
mod process;
mod redis;
mod redis_cluster;
mod report;
mod sentinel;
mod server;
mod shared;
mod zk;

pub use self::busy::*;
pub use self::certs::*;
pub use self::etcd::*;
pub use self::harness::*;
pub use self::memcached::*;
pub use self::mysql::*;
pub use self::net::*;
pub use self::postgres::*;
pub use self::process::*;
pub use self::redis::*;
pub use self::redis_cluster::*;
pub use self::report::*;
pub use self::sentinel::*;
pub use self::server::*;
pub use self::shared::*;
pub use self::zk::*;
