//! What `status`, `list`, `release --force` and `check` ask of Redis.
//!
//! `list` finds the locks by SCAN, and a lock whose keys hold data dlock did not write is
//! skipped (and named) instead of failing the listing for all of them.

use std::time::Duration;

use redis::Value;

use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::held::list_held;
use crate::kit::round_trip::median_round_trip;
use crate::lock::{CheckReport, Holder, LockName, LockStatus};

use super::cluster;
use super::conn::Conn;
use super::role;
use super::scripts::{
    bad_data, holder_of, int_of, millis, parse_status, text_of, tokens_at, wake_call, LockScript,
    FORCE, STATUS,
};
use super::RedisBackend;
use crate::kit::timeouts::OP_TIMEOUT;

/// `release --force` removes waiter entries whose heartbeat deadline is further ahead than
/// this: a live waiter's is at most its waiter lease (2 s) ahead, so such an entry is nobody's.
const STALE_WAITER: Duration = Duration::from_secs(60);

impl RedisBackend {
    /// The status of `name`, or (in the inner result) why the server's data for it is unusable.
    pub(super) async fn status_with(
        &self,
        conn: &mut Conn,
        name: &LockName,
        budget: Duration,
    ) -> Result<Result<LockStatus, Error>, Error> {
        let keys = self.keys(name, "");
        let mut invocation = STATUS.prepare_invoke();
        invocation
            .key(&keys.fence)
            .key(&keys.owners)
            .key(&keys.hold)
            .key(&keys.qdl);
        let reply: Value = conn
            .invoke(&invocation, budget)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        parse_status(name, reply, &self.display)
    }
}

pub(super) async fn status(backend: &RedisBackend, name: &LockName) -> Result<LockStatus, Error> {
    let mut conn = backend.connect().await?;
    backend.status_with(&mut conn, name, OP_TIMEOUT).await?
}

pub(super) async fn list(backend: &RedisBackend) -> Result<Vec<LockStatus>, Error> {
    let mut conn = backend.connect().await?;
    let names = lock_names(backend, &mut conn).await?;
    list_held(names, async |name: &LockName| {
        // One lock with unusable data must not hide all the others.
        match backend.status_with(&mut conn, name, OP_TIMEOUT).await? {
            Ok(status) => Ok(status),
            Err(bad) => {
                tracing::warn!("skipping lock '{name}': {bad}");
                Ok(free(name))
            }
        }
    })
    .await
}

/// The names of the locks that have a holder set under the prefix (SCAN; on a cluster, of
/// every master).
async fn lock_names(backend: &RedisBackend, conn: &mut Conn) -> Result<Vec<LockName>, Error> {
    let masters = cluster::masters(conn, OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(&backend.display))?;
    let mut names = Vec::new();
    for node in masters.map_or(vec![None], |m| m.into_iter().map(Some).collect()) {
        names.extend(lock_names_on(backend, conn, node).await?);
    }
    Ok(names)
}

/// The lock names on one node (`None`: the node at hand).
async fn lock_names_on(
    backend: &RedisBackend,
    conn: &mut Conn,
    node: Option<usize>,
) -> Result<Vec<LockName>, Error> {
    let mut names = Vec::new();
    let pattern = format!("{}:{{*}}:owners", glob_escape(&backend.prefix));
    scan_names(backend, conn, node, &pattern, &mut names).await?;
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup_by(|a, b| a.as_str() == b.as_str());
    Ok(names)
}

/// The lock names of the keys matching `pattern` on one node.
async fn scan_names(
    backend: &RedisBackend,
    conn: &mut Conn,
    node: Option<usize>,
    pattern: &str,
    names: &mut Vec<LockName>,
) -> Result<(), Error> {
    let mut cursor: u64 = 0;
    // Bounded: a SCAN over any keyspace ends; the cap guards against a misbehaving server.
    for _ in 0..100_000 {
        let mut command = redis::cmd("SCAN");
        command
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = match node {
            Some(node) => conn.query_on(node, &command, OP_TIMEOUT).await,
            None => conn.query(&command, OP_TIMEOUT).await,
        };
        let (next, keys): (u64, Vec<Vec<u8>>) =
            reply.map_err(|f| f.into_error(&backend.display))?;
        for key in keys {
            // A key name that is not UTF-8 is not one of dlock's.
            let Ok(key) = String::from_utf8(key) else {
                continue;
            };
            let encoded = key
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(n, _)| n);
            if let Some(name) = encoded.and_then(crate::lock::decode_component) {
                if let Ok(name) = LockName::new(&name) {
                    names.push(name);
                }
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(())
}

/// A lock that `list` leaves out.
fn free(name: &LockName) -> LockStatus {
    LockStatus {
        name: name.to_string(),
        held: false,
        holders: Vec::new(),
        waiters: None,
        queue: Vec::new(),
        last_token: None,
        waiting_here: Vec::new(),
        location: None,
    }
}

pub(super) async fn force_release(
    backend: &RedisBackend,
    name: &LockName,
) -> Result<Vec<Holder>, Error> {
    let mut conn = backend.connect().await?;
    let keys = backend.keys(name, "");
    let mut invocation = FORCE.prepare_invoke();
    invocation
        .key(&keys.owners)
        .key(&keys.hold)
        .key(&keys.queue)
        .key(&keys.qdl)
        .arg(millis(STALE_WAITER));
    let reply: Vec<Value> = conn
        .invoke(&invocation, OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(&backend.display))?;
    let int = |i: usize| reply.get(i).and_then(int_of);
    let text = |i: usize| reply.get(i).and_then(text_of).unwrap_or_default();
    match int(0) {
        Some(1) => {}
        Some(-2) => return Err(bad_data(&backend.display, &text(1), &text(2))),
        _ => {
            return Err(Error::Internal(format!(
                "unexpected reply from the force-release script: {reply:?}"
            )))
        }
    }
    wake_call(&mut conn, &keys, &tokens_at(&reply, 3), OP_TIMEOUT).await;
    match int(2).unwrap_or(0) {
        0 => {}
        n => tracing::warn!(
            "removed {n} waiter{} of '{name}' that no live dlock keeps (killed, or left by an \
             written by something else); a live one rejoins in its place",
            if n == 1 { "" } else { "s" }
        ),
    }
    let removed = match reply.get(1) {
        Some(Value::Array(entries)) => entries.as_slice(),
        _ => &[],
    };
    Ok(removed
        .iter()
        .map(|entry| match entry {
            Value::Array(fields) => holder_of(fields.first(), fields.get(2), fields.get(1)),
            _ => Holder::default(),
        })
        .collect())
}

pub(super) async fn check(backend: &RedisBackend) -> Result<CheckReport, Error> {
    let display = &backend.display;
    let started = BootInstant::now();
    let mut conn = backend.connect().await?;
    let connect_time = BootInstant::now().saturating_since(started);
    let mut cluster_details = Vec::new();
    let clustered =
        cluster::check_details(&mut conn, display, OP_TIMEOUT, &mut cluster_details).await?;
    let (version, mode) = server_info(&mut conn, display, clustered).await?;
    let median = median_round_trip(5, async || {
        conn.query::<String>(&redis::cmd("PING"), OP_TIMEOUT)
            .await
            .map(drop)
            .map_err(|f| f.into_error(display))
    })
    .await?;
    // Can we run scripts that write? Create and delete a test entry (no hash tag: it can
    // never collide with a lock's keys).
    let probe_key = format!("{}:check:{}", backend.prefix, uuid::Uuid::new_v4().simple());
    let probe = LockScript::new(
        "redis.call('SET', KEYS[1], '1', 'PX', 5000) return redis.call('DEL', KEYS[1])",
    );
    let deleted: i64 = conn
        .invoke(&probe.key(&probe_key), OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(display))?;
    if deleted != 1 {
        return Err(Error::Internal(
            "the test entry could not be deleted".into(),
        ));
    }
    let mut warnings = Vec::new();
    let mut details = vec![
        ("server".to_owned(), format!("Redis {version} ({mode})")),
        (
            "connect".to_owned(),
            humantime::format_duration(Duration::from_micros(connect_time.as_micros() as u64))
                .to_string(),
        ),
    ];
    details.extend(cluster_details);
    check_config(&mut conn, &mut warnings, &mut details).await;
    let mut report = CheckReport {
        backend: "redis".into(),
        location: display.clone(),
        version,
        round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
        warnings,
        details,
    };
    // Behind Sentinel: the sentinels, the master they name, its replicas.
    super::sentinel::check::report(&mut conn, &mut report).await;
    Ok(report)
}

/// The server's version and mode; refused unless it is a master that takes writes (any node
/// of a cluster will do: calls go to the masters).
async fn server_info(
    conn: &mut Conn,
    display: &str,
    clustered: bool,
) -> Result<(String, String), Error> {
    let info: String = conn
        .query(redis::cmd("INFO").arg("server"), OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(display))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let version = field("redis_version");
    let mode = field("redis_mode");
    if mode == "sentinel" {
        let names = conn.sentinel_names(OP_TIMEOUT).await.unwrap_or_default();
        let addr = conn
            .nodes
            .get(conn.home)
            .and_then(|n| n.addr.as_ref())
            .map_or_else(
                || "HOST:PORT".to_owned(),
                |(h, p)| crate::kit::url::join_host_port(h, *p),
            );
        return Err(role::sentinel_given(
            display,
            &addr,
            conn.setup.tls(),
            &names,
        ));
    }
    if clustered {
        return Ok((version, mode));
    }
    let role: Vec<Value> = conn
        .query(&redis::cmd("ROLE"), OP_TIMEOUT)
        .await
        .map_err(|f| f.into_error(display))?;
    if let Some(Value::BulkString(kind)) = role.first() {
        if kind != b"master" {
            let master = match (role.get(1), role.get(2)) {
                (Some(Value::BulkString(host)), Some(Value::Int(port))) => {
                    crate::kit::url::join_host_port(
                        &String::from_utf8_lossy(host),
                        u16::try_from(*port).unwrap_or(0),
                    )
                }
                _ => "its master".to_owned(),
            };
            return Err(role::replica_of(display, &master));
        }
    }
    Ok((version, mode))
}

/// Warn about a configuration that can lose locks (eviction, no persistence). A server that
/// does not show its configuration (CONFIG disabled by the ACL) only earns a warning.
async fn check_config(
    conn: &mut Conn,
    warnings: &mut Vec<String>,
    details: &mut Vec<(String, String)>,
) {
    match conn
        .query::<Vec<String>>(
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .arg("maxmemory")
                .arg("appendonly")
                .arg("appendfsync"),
            OP_TIMEOUT,
        )
        .await
    {
        Ok(pairs) => {
            let get = |k: &str| {
                pairs
                    .chunks(2)
                    .find(|c| c.first().map(String::as_str) == Some(k))
                    .and_then(|c| c.get(1).cloned())
                    .unwrap_or_default()
            };
            let policy = get("maxmemory-policy");
            if get("maxmemory") != "0" && policy != "noeviction" {
                warnings.push(format!(
                    "maxmemory-policy is {policy}: Redis may evict lock entries under memory pressure \
                     (set it to noeviction)"
                ));
            }
            if get("appendonly") != "yes" || get("appendfsync") != "always" {
                warnings.push(
                    "without appendonly yes + appendfsync always, a Redis restart frees held locks \
                     (holders notice at their next renewal and stop their commands)"
                        .to_owned(),
                );
            }
            details.push(("maxmemory-policy".to_owned(), policy));
        }
        Err(f) => warnings.push(format!(
            "cannot read the server configuration: {}",
            f.describe()
        )),
    }
}

/// Escape `*?[]\` for SCAN's MATCH.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
