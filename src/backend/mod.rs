//! The backends, and the one registry that knows them all.
//!
//! Each backend lives in `backend/<name>/` and implements [`crate::lock::Backend`]. Nothing
//! outside this folder names a backend's types: settings hand a URL to [`Target::parse`] and
//! get a [`Target`] back, and [`with_backend!`](crate::with_backend) runs a subcommand generically over the
//! backend a target selects.
//!
//! # Adding a backend
//!
//! 1. `backend/<name>/target.rs`: the target type (what the URL and the config table say:
//!    hosts, credentials, TLS files), `parse` for its URL, `complete` to fill in passwords and
//!    TLS files from the config file ([`crate::secrets::credentials`]), `identity` (the same
//!    server whatever the spelling, for reentrancy) and its tests.
//! 2. `backend/<name>/mod.rs`: the backend type and its [`crate::lock::Backend`] impl; the
//!    lease renews through [`crate::keeper`] where the backend has a lease.
//! 3. Here: a [`Target`] variant, its schemes in [`Target::parse`], its arms in the `match`es
//!    of [`Target`]'s methods (scheme, identity, minimum TTL, prefix rules, completion), its
//!    config table in [`CONFIG_TABLES`], and its arm in [`with_backend!`](crate::with_backend),
//!    wrapped in [`local_queue::LocalQueued`] if it has a server (the host-local queue and
//!    the waiting out of capacity refusals come with that one line; the backend's error
//!    classification returns [`capacity::refused`] for its server's "too many connections").
//! 4. Tests: `contract_tests!(<name>, <Server>::start())` runs the whole contract against a
//!    real server that the test harness starts; what is particular to the backend goes in its
//!    own test file. `.ci/run` installs the server's Debian package.
//! 5. README (its section, the backends table, the `--url` help), and `dlock generate`.

pub mod capacity;
pub mod etcd;
pub mod file;
pub mod local_queue;
pub mod memcached;
pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod url;
pub mod zk;

use std::time::Duration;

use crate::clock::BootInstant;
use crate::config::FileConfig;
use crate::error::Error;
use crate::lock::{Holder, LockName, LockStatus};

pub use etcd::EtcdTarget;
pub use file::FileTarget;
pub use memcached::MemcachedTarget;
pub use mysql::MysqlTarget;
pub use postgres::PgTarget;
pub use redis::RedisTarget;
pub use zk::ZkTarget;

/// The shortest lease a remote backend accepts (see [`Target::minimum_ttl`]).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// The shortest `--ttl` on memcached (see [`Target::minimum_ttl`]).
pub const MIN_MEMCACHED_TTL: Duration = Duration::from_secs(3);

/// The config file's per-backend tables (secrets and TLS material).
pub const CONFIG_TABLES: &[&str] = &[
    "redis",
    "etcd",
    "zookeeper",
    "postgres",
    "mysql",
    redis::sentinel::target::CONFIG_TABLE,
];

/// Every backend of this build with its URL schemes, the backend's own name first: what
/// `dlock --version` lists (`crate::version`). A new backend adds its line here; tests check
/// it against [`Target::parse`] and its unknown-scheme message.
pub const SCHEMES: &[&[&str]] = &[
    &["file"],
    &["redis", "rediss", "redis+unix"],
    &["redis-sentinel", "rediss-sentinel"],
    &["etcd", "etcds"],
    &["zk"],
    &["postgres", "postgresql"],
    &["mysql", "mariadb"],
    &["memcached", "memcached+unix"],
];

/// Where the locks live: a backend and everything needed to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `file:///dir`, or the default directory.
    File(FileTarget),
    /// `redis://`, `rediss://`, `redis+unix://`; `redis-sentinel://`, `rediss-sentinel://`.
    Redis(RedisTarget),
    /// `etcd://h:p[,h:p…]`, `etcds://…`.
    Etcd(EtcdTarget),
    /// `postgres://…`, `postgresql://…`, or libpq's `key=value …` form.
    Postgres(PgTarget),
    /// `zk://h:p[,h:p…][/chroot]`.
    Zk(ZkTarget),
    /// `mysql://…`, `mariadb://…`.
    Mysql(MysqlTarget),
    /// `memcached://h:p[,h:p…]`, `memcached+unix:///path`.
    Memcached(MemcachedTarget),
}

impl Target {
    /// The file backend in its default directory (no URL given).
    pub fn default_file() -> Target {
        Target::File(FileTarget::default_dir())
    }

    /// Parse a `--url`. Messages never quote text that may be part of a password.
    pub fn parse(url: &str) -> Result<Target, String> {
        if postgres::target::is_key_value(url) {
            return postgres::target::parse_key_value(url).map(Target::Postgres);
        }
        let Some((scheme, rest)) = url.split_once(':') else {
            // Never echo text that is not a URL: it may be a password pasted in the wrong place.
            return Err("this is not a URL; expected e.g. file:///var/lock/dlock".into());
        };
        match scheme.to_ascii_lowercase().as_str() {
            "file" => file::target::parse(rest).map(Target::File),
            "redis" | "rediss" | "redis+unix" => {
                redis::target::parse(&scheme.to_ascii_lowercase(), rest).map(Target::Redis)
            }
            "redis-sentinel" | "rediss-sentinel" => {
                redis::sentinel::target::parse(&scheme.to_ascii_lowercase(), rest)
                    .map(Target::Redis)
            }
            "etcd" | "etcds" => {
                etcd::target::parse(&scheme.to_ascii_lowercase(), rest).map(Target::Etcd)
            }
            "postgres" | "postgresql" => postgres::target::parse_url(url).map(Target::Postgres),
            "zk" => zk::target::parse(rest).map(Target::Zk),
            "mysql" | "mariadb" => mysql::target::parse(rest).map(Target::Mysql),
            "memcached" | "memcached+unix" => {
                memcached::target::parse(&scheme.to_ascii_lowercase(), rest).map(Target::Memcached)
            }
            "http" | "https" => Err(url::http_hint(&scheme.to_ascii_lowercase())),
            _ => {
                // A scheme is letters, digits, `+`, `-` and `.`; anything else before the first `:`
                // is part of something else (perhaps `user:password@host` without a scheme).
                let shown = if !scheme.is_empty()
                    && scheme
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
                {
                    format!(" '{scheme}'")
                } else {
                    String::new()
                };
                Err(format!(
                    "unknown URL scheme{shown}; expected file, redis, rediss, redis-sentinel, rediss-sentinel, etcd, etcds, zk, postgres, postgresql, mysql, mariadb or memcached"
                ))
            }
        }
    }

    /// Fill in what the URL did not say from the config file and the environment: passwords,
    /// TLS files (checked here, before any backend is contacted).
    pub fn complete(&mut self, file: &FileConfig) -> Result<(), Error> {
        match self {
            Target::File(_) | Target::Memcached(_) => Ok(()),
            Target::Redis(target) => redis::target::complete(target, file),
            Target::Etcd(target) => etcd::target::complete(target, file),
            Target::Postgres(target) => postgres::target::complete(target, file),
            Target::Zk(target) => zk::target::complete(target, file),
            Target::Mysql(target) => mysql::target::complete(target, file),
        }
    }

    /// The scheme name shown in DLOCK_BACKEND.
    pub fn scheme(&self) -> &'static str {
        match self {
            Target::File(_) => "file",
            Target::Redis(target) => target.scheme(),
            Target::Etcd(target) => target.scheme(),
            Target::Postgres(_) => "postgres",
            Target::Zk(_) => "zk",
            Target::Mysql(_) => "mysql",
            Target::Memcached(target) => target.scheme(),
        }
    }

    /// The same server (and database or chroot) however the URL spelled it.
    pub fn identity(&self) -> String {
        match self {
            Target::File(target) => target.identity(),
            Target::Redis(target) => target.identity(),
            Target::Etcd(target) => target.identity(),
            Target::Postgres(target) => target.identity(),
            Target::Zk(target) => target.identity(),
            Target::Mysql(target) => target.identity(),
            Target::Memcached(target) => target.identity(),
        }
    }

    /// The shortest `--ttl` the backend can keep, where it has one.
    ///
    /// A lease is renewed at least every TTL/3 and the command is stopped a safety margin of
    /// at least 500 ms before the lease can expire (see `keeper`): below 2 s that leaves no
    /// time for one renewal and a retry, and etcd itself grants no lease under 2 s. PostgreSQL's holder
    /// heartbeat follows the same schedule. The file backend has no lease, so any TTL does.
    pub fn minimum_ttl(&self) -> Option<Duration> {
        match self {
            Target::File(_) => None,
            Target::Redis(_) | Target::Etcd(_) | Target::Zk(_) | Target::Postgres(_) => {
                Some(MIN_LEASE_TTL)
            }
            // The heartbeat schedule of PostgreSQL's, over a server TTL in whole seconds.
            Target::Mysql(_) => Some(MIN_LEASE_TTL),
            // Whole-second expiry that may tick one second early: 3 s leaves a 2 s lease.
            Target::Memcached(_) => Some(MIN_MEMCACHED_TTL),
        }
    }

    /// Whether `prefix` can name this backend's namespace.
    pub fn check_prefix(&self, prefix: &str) -> Result<(), String> {
        match self {
            Target::Redis(target) => target.check_prefix(prefix),
            Target::Memcached(target) => target.check_prefix(prefix),
            Target::File(_) | Target::Etcd(_) | Target::Postgres(_) | Target::Zk(_) => Ok(()),
            Target::Mysql(_) => Ok(()),
        }
    }
}

/// The held locks among `names` (sorted, each once), as `list` shows them: `status` is asked
/// for each, and an error ends the listing. (A backend that can tell a lock with bad data from
/// a failing server reports the bad lock and answers "free" for it, so that one bad lock
/// never hides the others.)
pub async fn list_held(
    mut names: Vec<LockName>,
    mut status: impl AsyncFnMut(&LockName) -> Result<LockStatus, Error>,
) -> Result<Vec<LockStatus>, Error> {
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    let mut held = Vec::new();
    for name in &names {
        let lock = status(name).await?;
        if lock.held {
            held.push(lock);
        }
    }
    Ok(held)
}

/// Why a lock cannot be had, for the not-acquired message, from the queue ahead of the
/// waiter: `holders` (who holds it) and `waiting` (waiters ahead that do not hold it yet).
/// The words are [`crate::wording::busy_state`]'s, the same on every backend.
pub fn busy_reason(holders: Vec<Holder>, waiting: usize) -> String {
    crate::wording::busy_state(&holders, waiting)
}

/// The median of `count` timed round trips of `probe` (for `check`).
pub async fn median_round_trip(
    count: usize,
    mut probe: impl AsyncFnMut() -> Result<(), Error>,
) -> Result<Duration, Error> {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let sent = BootInstant::now();
        probe().await?;
        times.push(BootInstant::now().saturating_since(sent));
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Make ring rustls's crypto provider: the Redis and etcd clients pick none, and without one
/// the first TLS connection panics. Installing it twice is harmless.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Expand `$body` once per backend, with `$backend` bound to the backend `$common`
/// (the settings' `Common`) selects. A remote backend is wrapped in
/// [`local_queue::LocalQueued`] (the host-local queue and the waiting out of capacity
/// refusals): `LocalQueued::new(<Backend>::new(…), &$common)`.
#[macro_export]
macro_rules! with_backend {
    ($common:expr, $backend:ident => $body:expr) => {
        match &$common.target {
            $crate::backend::Target::File(target) => {
                let $backend = $crate::backend::file::FileBackend::new(
                    &target.dir,
                    target.default,
                    &$common.prefix,
                );
                $body
            }
            $crate::backend::Target::Redis(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::redis::RedisBackend::new(
                        target,
                        &$common.prefix,
                        &$common.display_url,
                    ),
                    &$common,
                );
                $body
            }
            $crate::backend::Target::Etcd(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::etcd::EtcdBackend::new(
                        target,
                        &$common.prefix,
                        &$common.display_url,
                    ),
                    &$common,
                );
                $body
            }
            $crate::backend::Target::Postgres(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::postgres::PgBackend::new(
                        target,
                        &$common.prefix,
                        &$common.display_url,
                    ),
                    &$common,
                );
                $body
            }
            $crate::backend::Target::Zk(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::zk::ZkBackend::new(
                        target,
                        &$common.prefix,
                        &$common.display_url,
                        $common.ttl,
                    ),
                    &$common,
                );
                $body
            }
            $crate::backend::Target::Mysql(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::mysql::MysqlBackend::new(
                        target,
                        &$common.prefix,
                        &$common.display_url,
                    ),
                    &$common,
                );
                $body
            }
            $crate::backend::Target::Memcached(target) => {
                let $backend = $crate::backend::local_queue::LocalQueued::new(
                    $crate::backend::memcached::MemcachedBackend::new(target, &$common.prefix),
                    &$common,
                );
                $body
            }
        }
    };
}
