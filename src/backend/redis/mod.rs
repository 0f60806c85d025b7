//! The Redis backend (Redis ≥ 6): one server-side script per step, owner tokens, a fencing
//! counter, and a FIFO queue of waiters that are woken one at a time.
//!
//! Key layout — every key of a lock shares the hash tag `{<encoded name>}`, so one lock lives in
//! one Cluster slot and distinct names never share a key (`B = <prefix>:{<encoded name>}`):
//!
//! | key | type | content |
//! |---|---|---|
//! | `B:fence` | string, no TTL | fencing/ticket counter: one more than before, never less than the server's `TIME` in µs |
//! | `B:holders` | set | owner tokens of the holders (an index; the truth is `B:h:<tok>`) |
//! | `B:h:<tok>` | hash, TTL = lease | `fence`, `meta` (holder JSON), `since`, `ttl`, `limit` |
//! | `B:queue` | sorted set | waiter token → ticket (arrival order) |
//! | `B:qdl` | sorted set | waiter token → heartbeat deadline (server ms); stale waiters are purged |
//! | `B:w:<tok>` | list | a waiter's private wake-up mailbox (`BLPOP` target) |
//!
//! Protocol: `acquire.lua` grants when `live holders + my rank < limit` (no overtaking), else
//! queues the caller with a ticket. The waiter blocks in `BLPOP` on its own mailbox; a release
//! (`release.lua`) pushes into exactly the mailbox of the waiter its leaving admits, so one
//! release wakes one waiter. The `BLPOP` times out every TTL/3 (a heartbeat and a re-check that
//! covers a missed wake-up), and the head of the queue re-checks when the holder's lease would
//! expire (a crashed holder). The owner token is random per acquisition, so a retry after a lost
//! reply finds its own hold, and renew/release only ever touch keys named by their own token.
//! Renewal (`renew.lua`) goes through [`Keeper`], which owns the deadline arithmetic.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, Script, Value,
};

use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError};
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, HolderStatus, Lease, LockName,
    LockStatus, Lost, Wait,
};
pub mod target;

pub use target::{RedisAddr, RedisTarget};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("status.lua")));
static FORCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("force.lua")));

/// Bound for connecting (TCP, TLS handshake, AUTH, SELECT).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for one script call outside the lease keeper.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of an acquire step after a lost reply or a dropped connection.
const ACQUIRE_ATTEMPTS: u32 = 3;

pub struct RedisBackend {
    target: RedisTarget,
    prefix: String,
    display: String,
}

impl RedisBackend {
    pub fn new(target: &RedisTarget, prefix: &str, display: &str) -> RedisBackend {
        if matches!(target.addr, RedisAddr::Tls { .. }) {
            // redis-rs picks no crypto provider; without one the first TLS connect panics.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        RedisBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
        }
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let mut conn = Conn::new(&self.target, &self.display)?;
        conn.ensure()
            .await
            .map_err(|e| classify(&e, &self.display))?;
        Ok(conn)
    }

    fn keys(&self, name: &LockName, tok: &str) -> Keys {
        Keys::new(&self.prefix, name, tok)
    }

    async fn status_with(&self, conn: &mut Conn, name: &LockName) -> Result<LockStatus, Error> {
        let keys = self.keys(name, "");
        let mut invocation = STATUS.prepare_invoke();
        invocation
            .key(&keys.fence)
            .key(&keys.holders)
            .key(&keys.qdl);
        let reply: Value = conn
            .invoke(&invocation, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        parse_status(name, reply)
    }

    /// " by pid N on host since T" for messages about a held lock.
    async fn describe_holders(&self, conn: &mut Conn, name: &LockName) -> String {
        self.status_with(conn, name)
            .await
            .map(|status| status.held_by())
            .unwrap_or_default()
    }

    /// Leave the queue (and give back a grant whose reply we may have missed). A failure only
    /// costs a waiter slot until its heartbeat deadline passes.
    async fn leave(&self, keys: &Keys, request: &AcquireRequest) {
        let attempt = async {
            let mut conn = self.connect().await?;
            release_call(&mut conn, keys, request.limit, request.ttl, "holder")
                .await
                .map_err(|f| f.into_error(&self.display))
        };
        if let Err(e) = attempt.await {
            tracing::warn!("could not leave the queue of '{}': {e}", request.name);
        }
    }
}

/// The keys of one lock (and of one owner token).
#[derive(Clone, Debug)]
struct Keys {
    fence: String,
    holders: String,
    queue: String,
    qdl: String,
    hold: String,
    wake: String,
}

impl Keys {
    fn new(prefix: &str, name: &LockName, tok: &str) -> Keys {
        let base = format!("{prefix}:{{{}}}", name.encoded());
        Keys {
            fence: format!("{base}:fence"),
            holders: format!("{base}:holders"),
            queue: format!("{base}:queue"),
            qdl: format!("{base}:qdl"),
            hold: format!("{base}:h:{tok}"),
            wake: format!("{base}:w:{tok}"),
        }
    }
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

async fn release_call(
    conn: &mut Conn,
    keys: &Keys,
    limit: u32,
    ttl: Duration,
    role: &str,
) -> Result<(i64, i64), Failure> {
    let mut invocation = RELEASE.prepare_invoke();
    invocation
        .key(&keys.holders)
        .key(&keys.queue)
        .key(&keys.qdl)
        .key(&keys.hold)
        .key(&keys.wake)
        .arg(owner_token(keys))
        .arg(limit)
        .arg(millis(ttl))
        .arg(role);
    conn.invoke(&invocation, OP_TIMEOUT).await
}

/// The owner token is the last component of the hold key.
fn owner_token(keys: &Keys) -> &str {
    keys.hold.rsplit(':').next().unwrap_or_default()
}

impl Backend for RedisBackend {
    type Lease = RedisLease;

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<RedisLease, Error> {
        let tok = uuid::Uuid::new_v4().simple().to_string();
        let keys = self.keys(&request.name, &tok);
        let mut conn = self.connect().await?;
        let deadline = match request.wait {
            Wait::For(d) => Some(BootInstant::now() + d),
            Wait::No | Wait::Forever => None,
        };
        let mode = if request.wait == Wait::No {
            "try"
        } else {
            "wait"
        };
        let meta =
            serde_json::to_string(&request.holder).map_err(|e| Error::Internal(e.to_string()))?;
        let ttl_ms = millis(request.ttl);
        // Waiters heartbeat (and re-check) every TTL/3 and drop out after a TTL of silence.
        let recheck = (request.ttl / 3).max(Duration::from_millis(10));
        let mut ticket: i64 = 0;
        loop {
            let mut invocation = ACQUIRE.prepare_invoke();
            invocation
                .key(&keys.fence)
                .key(&keys.holders)
                .key(&keys.queue)
                .key(&keys.qdl)
                .key(&keys.hold)
                .key(&keys.wake)
                .arg(&tok)
                .arg(request.limit)
                .arg(&ttl_ms)
                .arg(&ttl_ms)
                .arg(&meta)
                .arg(mode)
                .arg(ticket);
            let sent = BootInstant::now();
            let mut attempt = 0;
            let reply: Vec<i64> = loop {
                attempt += 1;
                let call = conn.invoke(&invocation, OP_TIMEOUT);
                let result = tokio::select! {
                    result = call => result,
                    _ = cancel.cancelled() => {
                        drop(conn);
                        self.leave(&keys, request).await;
                        return Err(Error::Cancelled);
                    }
                };
                match result {
                    Ok(reply) => break reply,
                    // The script is idempotent for our token: after a lost reply, ask again.
                    // `sent` stays the first attempt's: a grant whose reply was lost dates from
                    // then, and the earlier time keeps the lease deadline conservative.
                    Err(failure) if failure.is_transient() && attempt < ACQUIRE_ATTEMPTS => {
                        tracing::debug!(
                            "acquire attempt {attempt} failed: {}; retrying",
                            failure.describe()
                        );
                        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    }
                    Err(failure) => {
                        let error = failure.into_error(&self.display);
                        // The script may have run without us seeing the reply: take back
                        // whatever it created for our token (a place in line or a grant).
                        if failure_may_have_run(&error) || ticket != 0 {
                            self.leave(&keys, request).await;
                        }
                        return Err(error);
                    }
                }
            };
            match reply.first().copied() {
                Some(1) => {
                    let fence = reply.get(1).copied().unwrap_or(0);
                    let granted =
                        Duration::from_millis(reply.get(2).copied().unwrap_or(0).max(0) as u64);
                    let granted = if granted.is_zero() {
                        request.ttl
                    } else {
                        granted
                    };
                    let renewer = Renewer {
                        conn,
                        keys: keys.clone(),
                        ttl_ms: ttl_ms.clone(),
                        display: self.display.clone(),
                    };
                    return Ok(RedisLease {
                        keeper: Keeper::start(renewer, sent, granted, request.kill_after),
                        token: u64::try_from(fence).unwrap_or(0),
                        keys,
                        limit: request.limit,
                        ttl: request.ttl,
                        display: self.display.clone(),
                    });
                }
                Some(-1) => {
                    if ticket != 0 {
                        self.leave(&keys, request).await;
                    }
                    return Err(Error::Usage(format!(
                        "lock '{}' is held with --limit {}; all holders must use the same --limit",
                        request.name,
                        reply.get(1).copied().unwrap_or(0)
                    )));
                }
                Some(0) => {}
                _ => {
                    return Err(Error::Internal(format!(
                        "unexpected reply from the acquire script: {reply:?}"
                    )))
                }
            }
            if request.wait == Wait::No {
                let holders = self.describe_holders(&mut conn, &request.name).await;
                return Err(Error::Busy(format!(
                    "lock '{}' is held{holders}; not waiting (--no-wait)",
                    request.name
                )));
            }
            ticket = reply.get(3).copied().unwrap_or(ticket);
            let hint = reply.get(1).copied().unwrap_or(-1);
            let mut block = recheck;
            if hint >= 0 {
                // The head of the queue re-checks when a holder's lease would run out.
                block = block.min(Duration::from_millis(hint as u64 + 5));
            }
            if let Some(deadline) = deadline {
                let left = deadline.remaining();
                if left.is_zero() {
                    let holders = self.describe_holders(&mut conn, &request.name).await;
                    self.leave(&keys, request).await;
                    let waited = match request.wait {
                        Wait::For(d) => humantime::format_duration(d).to_string(),
                        _ => String::new(),
                    };
                    return Err(Error::Busy(format!(
                        "lock '{}' is held{holders}; gave up after waiting {waited} (--wait)",
                        request.name
                    )));
                }
                block = block.min(left);
            }
            // Redis before 7.0.8 rounds sub-millisecond timeouts to 0, which blocks for ever.
            let block = block.max(Duration::from_millis(10));
            // Redis times BLPOP out at its own granularity (up to 100 ms late at hz 10), so
            // the --wait deadline is also kept by our own clock.
            tokio::select! {
                woken = conn.blpop(&keys.wake, block) => {
                    if let Err(failure) = woken {
                        tracing::debug!("waiting for a wake-up failed: {}; re-checking", failure.describe());
                    }
                }
                _ = crate::clock::sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {}
                _ = cancel.cancelled() => {
                    // Closing the connection ends the server-side BLPOP.
                    drop(conn);
                    self.leave(&keys, request).await;
                    return Err(Error::Cancelled);
                }
            }
        }
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let mut conn = self.connect().await?;
        self.status_with(&mut conn, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        let mut conn = self.connect().await?;
        let pattern = format!("{}:{{*}}:holders", glob_escape(&self.prefix));
        let mut names = Vec::new();
        let mut cursor: u64 = 0;
        // Bounded: a SCAN over any keyspace ends; the cap guards against a misbehaving server.
        for _ in 0..100_000 {
            let mut command = redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys): (u64, Vec<String>) = conn
                .query(&command, OP_TIMEOUT)
                .await
                .map_err(|f| f.into_error(&self.display))?;
            for key in keys {
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
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut held = Vec::new();
        for name in names {
            let status = self.status_with(&mut conn, &name).await?;
            if status.held {
                held.push(status);
            }
        }
        Ok(held)
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let mut conn = self.connect().await?;
        let keys = self.keys(name, "");
        let mut invocation = FORCE.prepare_invoke();
        invocation.key(&keys.holders).key(&keys.queue).arg(60_000);
        let removed: Vec<(String, Option<String>, Option<String>)> = conn
            .invoke(&invocation, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        Ok(removed
            .into_iter()
            .map(|(_, fence, meta)| {
                let mut holder: Holder = meta
                    .and_then(|m| serde_json::from_str(&m).ok())
                    .unwrap_or_default();
                holder.token = fence.and_then(|f| f.parse().ok()).unwrap_or(0);
                holder
            })
            .collect())
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        let started = BootInstant::now();
        let mut conn = self.connect().await?;
        let connect_time = BootInstant::now().saturating_since(started);
        let info: String = conn
            .query(redis::cmd("INFO").arg("server"), OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let version = field("redis_version");
        let mode = field("redis_mode");
        if mode == "sentinel" {
            return Err(Error::Config(format!(
                "{} is a Sentinel, not a Redis master; point --url at the master",
                self.display
            )));
        }
        let role: Vec<Value> = conn
            .query(&redis::cmd("ROLE"), OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        if let Some(Value::BulkString(role)) = role.first() {
            if role != b"master" {
                return Err(Error::Config(format!(
                    "{} is a read-only replica; locks must be taken on the master",
                    self.display
                )));
            }
        }
        let mut round_trips = Vec::new();
        for _ in 0..5 {
            let sent = BootInstant::now();
            let _: String = conn
                .query(&redis::cmd("PING"), OP_TIMEOUT)
                .await
                .map_err(|f| f.into_error(&self.display))?;
            round_trips.push(BootInstant::now().saturating_since(sent));
        }
        round_trips.sort();
        // Can we run scripts that write? Create and delete a test entry (no hash tag: it can
        // never collide with a lock's keys).
        let probe_key = format!("{}:check:{}", self.prefix, uuid::Uuid::new_v4().simple());
        let probe = Script::new(
            "redis.call('SET', KEYS[1], '1', 'PX', 5000) return redis.call('DEL', KEYS[1])",
        );
        let deleted: i64 = conn
            .invoke(&probe.key(&probe_key), OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
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
        let median = round_trips
            .get(round_trips.len() / 2)
            .copied()
            .unwrap_or_default();
        Ok(CheckReport {
            backend: "redis".into(),
            location: self.display.clone(),
            version,
            round_trip_us: u64::try_from(median.as_micros()).unwrap_or(u64::MAX),
            warnings,
            details,
        })
    }
}

/// After a failed acquire call, could the script still have run on the server? Not when
/// authentication, permissions or the configuration refused us.
fn failure_may_have_run(error: &Error) -> bool {
    matches!(error, Error::Unavailable(_) | Error::Internal(_))
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

fn parse_status(name: &LockName, reply: Value) -> Result<LockStatus, Error> {
    let bad = || {
        Error::Internal(format!(
            "unexpected reply from the status script for '{name}'"
        ))
    };
    type Entry = (String, i64, Option<String>, Option<String>, Option<String>);
    let (fence, waiters, entries): (Option<String>, i64, Vec<Entry>) =
        redis::from_redis_value(reply).map_err(|_| bad())?;
    let holders: Vec<HolderStatus> = entries
        .into_iter()
        .map(|(_, pttl, fence, meta, _)| {
            let mut holder: Holder = meta
                .and_then(|m| serde_json::from_str(&m).ok())
                .unwrap_or_default();
            holder.token = fence.and_then(|f| f.parse().ok()).unwrap_or(0);
            if holder.name.is_empty() {
                holder.name = name.to_string();
            }
            HolderStatus {
                holder,
                ttl_left_ms: u64::try_from(pttl).ok(),
                session: None,
            }
        })
        .collect();
    Ok(LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        holders,
        waiters: Some(u64::try_from(waiters).unwrap_or(0)),
        queue: Vec::new(),
        last_token: fence.and_then(|f| f.parse().ok()),
    })
}

/// A held Redis lock: the keeper renews it; release gives it back and wakes the next waiter.
pub struct RedisLease {
    keeper: Keeper<Renewer>,
    token: u64,
    keys: Keys,
    limit: u32,
    ttl: Duration,
    display: String,
}

impl Lease for RedisLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        self.keeper.lost().await
    }

    async fn release(self) -> Result<(), Error> {
        let Some(mut renewer) = self.keeper.stop().await else {
            return Err(Error::Internal(
                "the lease keeper ended unexpectedly".into(),
            ));
        };
        let mut last = None;
        // One retry on a fresh connection: a release that never arrives costs the next
        // waiter up to a TTL.
        for _ in 0..2 {
            match release_call(
                &mut renewer.conn,
                &self.keys,
                self.limit,
                self.ttl,
                "holder",
            )
            .await
            {
                Ok((held, _)) => {
                    if held == 0 {
                        tracing::warn!(
                            "the lock had already expired or been removed before it was released"
                        );
                    }
                    return Ok(());
                }
                Err(failure) => last = Some(failure),
            }
        }
        Err(last.map_or_else(
            || Error::Internal("release failed".into()),
            |f| f.into_error(&self.display),
        ))
    }
}

/// One compare-and-renew round trip, for the [`Keeper`].
struct Renewer {
    conn: Conn,
    keys: Keys,
    ttl_ms: String,
    display: String,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let mut invocation = RENEW.prepare_invoke();
        invocation
            .key(&self.keys.holders)
            .key(&self.keys.hold)
            .arg(owner_token(&self.keys))
            .arg(&self.ttl_ms);
        // The keeper bounds the call; no timeout of our own.
        match self.conn.invoke::<i64>(&invocation, Duration::from_secs(3600)).await {
            Ok(ms) if ms >= 0 => Ok(Duration::from_millis(ms as u64)),
            Ok(_) => Err(RenewError::Gone(
                "the lock entry is gone from Redis: it expired, was deleted (release --force, DEL, FLUSHALL), \
                 was evicted, or the server restarted without persistence"
                    .into(),
            )),
            Err(failure) => Err(RenewError::Failed(failure.into_error(&self.display).to_string())),
        }
    }
}

/// Why a call failed.
enum Failure {
    Redis(RedisError),
    Timeout(Duration),
}

impl Failure {
    /// Worth another attempt (the connection, not the request, was the problem).
    fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Failure::Timeout(d) => format!("no answer within {}", humantime::format_duration(*d)),
            Failure::Redis(e) => e.to_string(),
        }
    }

    fn into_error(self, display: &str) -> Error {
        match self {
            Failure::Timeout(d) => Error::Unavailable(format!(
                "{display} did not answer within {}",
                humantime::format_duration(d)
            )),
            Failure::Redis(e) => classify(&e, display),
        }
    }
}

/// Map a redis-rs error to dlock's error kinds (exit statuses).
fn classify(e: &RedisError, display: &str) -> Error {
    use redis::ErrorKind;
    let code = e.code().unwrap_or_default();
    let detail = e.detail().unwrap_or_default();
    let text = e.to_string();
    // A server that wants a password closes unauthenticated connections that send scripts
    // ("Protocol error: unauthenticated multibulk length").
    if e.kind() == ErrorKind::AuthenticationFailed
        || code == "NOAUTH"
        || code == "WRONGPASS"
        || text.contains("unauthenticated")
    {
        return Error::Permission(format!(
            "{display} refused authentication: wrong user or password, a missing password, or a password \
             where none is set (give it in the URL, DLOCK_PASSWORD or password_file)"
        ));
    }
    if code == "NOPERM"
        || detail.starts_with("The user executing the script can't")
        || text.contains("NOPERM")
    {
        return Error::Permission(format!(
            "{display}: the Redis ACL does not allow dlock's commands: {text}"
        ));
    }
    if code == "READONLY" {
        return Error::Config(format!(
            "{display} is a read-only replica; locks must be taken on the master"
        ));
    }
    if is_tls_error(e) {
        return Error::Config(format!("TLS with {display} failed: {text}"));
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return Error::Config(format!("cannot set up the connection to {display}: {text}"));
    }
    if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        return Error::Unavailable(format!("cannot reach {display}: {text}"));
    }
    if text.contains("refused to switch database") {
        return Error::Usage(format!(
            "{display}: the server has no such database ({text})"
        ));
    }
    if text.contains("user_script") {
        return Error::Internal(format!("a dlock script failed on {display}: {text}"));
    }
    Error::Unavailable(format!("{display}: {text}"))
}

fn is_tls_error(e: &RedisError) -> bool {
    crate::error::caused_by_tls(e)
}

/// Connect into `slot` unless a connection is there already.
async fn open<'a>(
    client: &Client,
    slot: &'a mut Option<MultiplexedConnection>,
) -> Result<&'a mut MultiplexedConnection, RedisError> {
    if slot.is_none() {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        *slot = Some(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    slot.as_mut()
        .ok_or_else(|| RedisError::from((redis::ErrorKind::Io, "no connection")))
}

/// One connection to Redis, re-opened after an error or an abandoned call.
///
/// No response timeout is configured on the connection itself: a `BLPOP` blocks for as long
/// as it was asked to, and every call is bounded here instead. A call abandoned by a timeout
/// leaves the connection "dirty" (its reply may still arrive, or never), so the next call
/// starts on a fresh socket rather than queueing behind it.
struct Conn {
    client: Client,
    connection: Option<MultiplexedConnection>,
    dirty: bool,
}

impl Conn {
    fn new(target: &RedisTarget, display: &str) -> Result<Conn, Error> {
        let addr = match &target.addr {
            RedisAddr::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
            RedisAddr::Tls { host, port } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            RedisAddr::Unix { path } => ConnectionAddr::Unix(path.clone()),
        };
        let mut redis = RedisConnectionInfo::default()
            .set_db(target.db)
            .set_skip_set_lib_name();
        if let Some(user) = &target.user {
            redis = redis.set_username(user);
        }
        if let Some(password) = &target.password {
            redis = redis.set_password(password.expose());
        }
        let setup = |e: RedisError| {
            Error::Config(format!("cannot set up the connection to {display}: {e}"))
        };
        let info = addr
            .into_connection_info()
            .map_err(setup)?
            .set_redis_settings(redis)
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = match &target.addr {
            RedisAddr::Tls { .. } => {
                let read = |path: &std::path::PathBuf| {
                    std::fs::read(path)
                        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))
                };
                let root_cert = target.tls.ca_file.as_ref().map(read).transpose()?;
                let client_tls = match (&target.tls.cert_file, &target.tls.key_file) {
                    (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                        client_cert: read(cert)?,
                        client_key: read(key)?,
                    }),
                    _ => None,
                };
                Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls,
                        root_cert,
                    },
                )
                .map_err(setup)?
            }
            _ => Client::open(info).map_err(setup)?,
        };
        Ok(Conn {
            client,
            connection: None,
            dirty: false,
        })
    }

    /// The open connection, (re)connecting first if needed.
    async fn ensure(&mut self) -> Result<&mut MultiplexedConnection, RedisError> {
        if std::mem::take(&mut self.dirty) {
            self.connection = None;
        }
        open(&self.client, &mut self.connection).await
    }

    /// Start a call: a connection left dirty by an abandoned call is replaced, and this one
    /// counts as dirty until its reply is in (the future may be dropped by a caller's timeout).
    fn begin(&mut self) {
        if std::mem::replace(&mut self.dirty, true) {
            self.connection = None;
        }
    }

    fn finish<T>(
        &mut self,
        outcome: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        budget: Duration,
    ) -> Result<T, Failure> {
        match outcome {
            Ok(Ok(value)) => {
                self.dirty = false;
                Ok(value)
            }
            Ok(Err(e)) => {
                // A server error leaves the connection usable; a transport error does not.
                self.dirty =
                    e.is_io_error() || e.is_unrecoverable_error() || e.is_connection_dropped();
                Err(Failure::Redis(e))
            }
            Err(_) => Err(Failure::Timeout(budget)),
        }
    }

    /// Run a script (EVALSHA, loading it on NOSCRIPT).
    async fn invoke<T: redis::FromRedisValue>(
        &mut self,
        invocation: &redis::ScriptInvocation<'_>,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.begin();
        let (client, slot) = (&self.client, &mut self.connection);
        let outcome = tokio::time::timeout(budget, async {
            let connection = open(client, slot).await?;
            invocation.invoke_async(connection).await
        })
        .await;
        self.finish(outcome, budget)
    }

    async fn query<T: redis::FromRedisValue>(
        &mut self,
        command: &redis::Cmd,
        budget: Duration,
    ) -> Result<T, Failure> {
        self.begin();
        let (client, slot) = (&self.client, &mut self.connection);
        let outcome = tokio::time::timeout(budget, async {
            let connection = open(client, slot).await?;
            command.query_async(connection).await
        })
        .await;
        self.finish(outcome, budget)
    }

    /// Block until our mailbox gets a wake-up or `block` passes.
    async fn blpop(&mut self, key: &str, block: Duration) -> Result<(), Failure> {
        let mut command = redis::cmd("BLPOP");
        command.arg(key).arg(format!("{:.3}", block.as_secs_f64()));
        self.query::<Option<(String, String)>>(&command, block + OP_TIMEOUT)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_and_names_never_collide() {
        let a = Keys::new("dlock", &LockName::new("a").unwrap(), "t");
        let b = Keys::new("dlock", &LockName::new("a:fence").unwrap(), "t");
        let c = Keys::new("dlock", &LockName::new("a}x{").unwrap(), "t");
        for keys in [&a, &b, &c] {
            let tags: std::collections::HashSet<&str> = [
                &keys.fence,
                &keys.holders,
                &keys.queue,
                &keys.qdl,
                &keys.hold,
                &keys.wake,
            ]
            .iter()
            .map(|k| k.split_once('{').unwrap().1.split_once('}').unwrap().0)
            .collect();
            assert_eq!(tags.len(), 1, "{keys:?}");
        }
        assert_ne!(a.fence, b.fence);
        assert_eq!(owner_token(&a), "t");
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
