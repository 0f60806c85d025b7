//! What the server at the URL is, when it is not a master that can keep locks: a replica
//! (read-only or not), or a Redis Sentinel given as `redis://`.
//!
//! A replica is found without a round trip of its own: the scripts that take, show and force
//! locks start with `scripts/master.lua`, which answers `DLOCKREPLICA <host> <port>` on a replica
//! (`INFO replication`, a few microseconds inside the script). A writable replica
//! (`replica-read-only no`) would otherwise keep a lock its master never sees, while another
//! client holds the same lock through the master. A Sentinel has no scripts at all: its
//! "unknown command" is explained (`ROLE`, `SENTINEL MASTERS`) only after it happened.

use std::time::Duration;

use redis::{RedisError, Value};

use crate::error::Error;
use crate::kit::url::join_host_port;

use super::conn::{Conn, Failure};

/// The error code `scripts/master.lua` answers with on a replica.
const REPLICA_CODE: &str = "DLOCKREPLICA";

/// `display` is a replica of `master` (`host:port`): 78, and where to point instead.
pub(super) fn replica_of(display: &str, master: &str) -> Error {
    Error::Config(format!(
        "{display} is a replica of {master}; locks must be taken on the master: point --url at \
         the master, or at its sentinels with redis-sentinel://HOST:PORT#MASTER"
    ))
}

/// `display` (at `addr`) is a Redis Sentinel: 78, and the URL to use (`names`: the masters it
/// watches, when it said).
pub(super) fn sentinel_given(display: &str, addr: &str, tls: bool, names: &[String]) -> Error {
    let scheme = if tls {
        "rediss-sentinel"
    } else {
        "redis-sentinel"
    };
    let known = match names {
        [] => String::new(),
        [_] => String::new(),
        names => format!(" (it watches {})", names.join(", ")),
    };
    let name = match names {
        [name] => name.as_str(),
        _ => "MASTER",
    };
    Error::Config(format!(
        "{display} is a Redis Sentinel, not a Redis server: give it as \
         {scheme}://{addr}#{name}{known}, with the other sentinels after a comma"
    ))
}

impl Conn {
    /// A failed call, explained when the server is no master: a replica (78, or behind
    /// Sentinel a master that was just demoted: ask the sentinels again), or a Sentinel
    /// (78). `left`: what is left of the call's budget for asking which.
    pub(super) async fn explain(&mut self, failure: Failure, left: Duration) -> Failure {
        if let Some(other) = self.not_redis(&failure, left).await {
            return Failure::Refused(other);
        }
        let Failure::Redis(e) = &failure else {
            return failure;
        };
        if e.code() == Some(REPLICA_CODE) {
            let master = master_in(e);
            if self.sentinel.is_some() {
                self.drop_connections();
                return Failure::Sentinel(Error::Unavailable(format!(
                    "{}: the master the sentinels named is a replica of {master} now (a \
                     failover in progress?); try again",
                    self.setup.display()
                )));
            }
            return Failure::Refused(replica_of(self.setup.display(), &master));
        }
        if self.sentinel.is_some() || !unknown_command(e) || left.is_zero() {
            return failure;
        }
        match self.sentinel_names(left).await {
            Some(names) => {
                let addr = self
                    .nodes
                    .get(self.home)
                    .and_then(|n| n.addr.as_ref())
                    .map_or_else(|| "HOST:PORT".to_owned(), |(h, p)| join_host_port(h, *p));
                Failure::Refused(sentinel_given(
                    self.setup.display(),
                    &addr,
                    self.setup.tls(),
                    &names,
                ))
            }
            None => failure,
        }
    }

    /// When the node at hand is a Sentinel (`ROLE` says so): the masters it watches (as many
    /// as it said within `budget`). `None` for anything else.
    pub(super) async fn sentinel_names(&mut self, budget: Duration) -> Option<Vec<String>> {
        let home = self.home;
        let role: Vec<Value> = self
            .query_on(home, &redis::cmd("ROLE"), budget)
            .await
            .ok()?;
        if !matches!(role.first(), Some(Value::BulkString(r)) if r == b"sentinel") {
            return None;
        }
        let names = match role.get(1) {
            Some(Value::Array(names)) => names
                .iter()
                .filter_map(|n| match n {
                    Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Some(names)
    }
}

/// `host:port` of the master named in a refusal of `scripts/master.lua`.
fn master_in(e: &RedisError) -> String {
    let detail = e.detail().unwrap_or_default();
    let mut parts = detail.split_whitespace();
    match (
        parts.next(),
        parts.next().and_then(|p| p.parse::<u16>().ok()),
    ) {
        (Some(host), Some(port)) => join_host_port(host, port),
        _ => "its master".to_owned(),
    }
}

/// The server does not know a command dlock sends (a Sentinel knows neither scripts nor
/// `SCAN`).
fn unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.to_string().contains("unknown command")
}
