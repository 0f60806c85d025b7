//! The Redis backend (Redis ≥ 6): one server-side script per step, owner tokens, a fencing
//! counter, and a FIFO queue of waiters that are woken one at a time.
//!
//! Key layout — every key of a lock shares the hash tag `{<encoded name>}`, so one lock lives in
//! one Cluster slot and distinct names never share a key (`B = <prefix>:{<encoded name>}`):
//!
//! | key | type | content |
//! |---|---|---|
//! | `B:fence` | string, no TTL | fencing counter: one more than before (`INCR`, exact up to 2^63-1), never less than the server's `TIME` in µs |
//! | `B:holders` | set | owner tokens of the holders (an index; the truth is `B:h:<tok>`) |
//! | `B:h:<tok>` | hash, TTL = lease | `fence`, `meta` (holder JSON), `since`, `ttl`, `limit` |
//! | `B:queue` | sorted set | waiter token → ticket (arrival order) |
//! | `B:qdl` | sorted set | waiter token → heartbeat deadline (server ms); stale waiters are purged |
//! | `B:w:<tok>` | list | a waiter's private wake-up mailbox (`BLPOP` target) |
//!
//! Protocol: `acquire.lua` grants when `live holders + my rank < limit` (no overtaking), else
//! queues the caller with a ticket. The waiter blocks in `BLPOP` on its own mailbox; a release
//! (`release.lua`) pushes into exactly the mailbox of the waiter its leaving admits, so one
//! release wakes one waiter. The `BLPOP` times out every [`WAITER_HEARTBEAT`] (at most TTL/3):
//! a heartbeat that keeps the waiter's place, and a re-check that covers a missed wake-up. A
//! waiter that stops heartbeating (killed) drops out [`WAITER_LEASE`] after its last one,
//! whatever `--ttl` is. The head of the queue also re-checks when the holder's lease would
//! expire (a crashed holder). The owner token is random per acquisition, so a retry after a
//! lost reply finds its own hold, and renew/release only ever touch keys named by their own
//! token. Renewal (`renew.lua`) goes through [`Keeper`], which owns the deadline arithmetic.
//!
//! Every script first checks that the lock's keys hold what dlock keeps there; a key someone
//! else overwrote is reported by name (exit 69), never as an internal error, and `list` skips
//! (and names) such a lock instead of failing for all of them.

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

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/status.lua")));
static FORCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/force.lua")));

/// Bound for connecting (TCP, TLS handshake, AUTH, SELECT).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound for one script call outside the lease keeper.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of an acquire step after a lost reply or a dropped connection.
const ACQUIRE_ATTEMPTS: u32 = 3;
/// How long a waiter keeps its place in line after its last heartbeat: a waiter killed with
/// SIGKILL holds up a freed lock at most this long, whatever `--ttl` is.
const WAITER_LEASE: Duration = Duration::from_secs(2);
/// How often a waiter heartbeats (and re-checks); well inside [`WAITER_LEASE`].
const WAITER_HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a wake-up waits in a waiter's mailbox (a live waiter takes it within a heartbeat).
const WAKE_TTL: Duration = Duration::from_secs(10);
/// `release --force` removes waiter entries whose heartbeat deadline is further ahead than
/// this: no live dlock of this version writes one (older ones heartbeat once per TTL).
const STALE_WAITER: Duration = Duration::from_secs(60);
/// With `--no-wait`, the server must have answered within this (connecting included).
const NO_WAIT_BOUND: Duration = OP_TIMEOUT;
/// The least time an acquire call gets, also for the last check at the `--wait` deadline.
const MIN_CALL: Duration = Duration::from_millis(500);
/// Bound for leaving the queue, connecting included (after a failure, a timeout or a cancel).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest fencing token: Redis counters are signed 64-bit.
const FENCE_MAX: i64 = i64::MAX;

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

    /// The status of `name`, or (in the inner result) why the server's data for it is unusable.
    async fn status_with(
        &self,
        conn: &mut Conn,
        name: &LockName,
        budget: Duration,
    ) -> Result<Result<LockStatus, Error>, Error> {
        let keys = self.keys(name, "");
        let mut invocation = STATUS.prepare_invoke();
        invocation
            .key(&keys.fence)
            .key(&keys.holders)
            .key(&keys.qdl);
        let reply: Value = conn
            .invoke(&invocation, budget)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        parse_status(name, reply, &self.display)
    }

    /// " by pid N on host since T" for messages about a held lock (bounded: this only
    /// decorates a message).
    async fn describe_holders(&self, conn: &mut Conn, name: &LockName) -> String {
        match self.status_with(conn, name, MIN_CALL).await {
            Ok(Ok(status)) => status.held_by(),
            _ => String::new(),
        }
    }

    /// Why the lock was not ours, from the last acquire reply: held, or free (or not full)
    /// with waiters ahead of us in line.
    async fn busy_reason(
        &self,
        conn: &mut Conn,
        request: &AcquireRequest,
        live: i64,
        ahead: i64,
    ) -> String {
        let name = &request.name;
        let limit = i64::from(request.limit);
        let holders = if live > 0 {
            self.describe_holders(conn, name).await
        } else {
            String::new()
        };
        if live >= limit {
            let queue = match ahead {
                0 => String::new(),
                1 => ", 1 waiter queued".to_owned(),
                n => format!(", {n} waiters queued"),
            };
            return format!("lock '{name}' is held{holders}{queue}");
        }
        let state = if live == 0 {
            "free".to_owned()
        } else {
            format!("not full ({live} of --limit {limit} held{holders})")
        };
        let ahead = match ahead {
            n if n <= 1 => "1 waiter is".to_owned(),
            n => format!("{n} waiters are"),
        };
        format!(
            "lock '{name}' is {state}, but {ahead} ahead in the queue (a waiter that was killed \
             drops out within {})",
            humantime::format_duration(WAITER_LEASE)
        )
    }

    /// Leave the queue (and give back a grant whose reply we may have missed). Bounded by
    /// [`LEAVE_TIMEOUT`]: a failure only costs a waiter slot until its heartbeat deadline
    /// passes (a lost grant: until its lease runs out).
    async fn leave(&self, keys: &Keys, request: &AcquireRequest) {
        let attempt = async {
            let mut conn = Conn::new(&self.target, &self.display)?;
            match release_call(&mut conn, keys, request.limit, "holder", LEAVE_TIMEOUT).await {
                Ok(Released::BadData { key, what }) => Err(bad_data(&self.display, &key, &what)),
                Ok(Released::Done { .. }) => Ok(()),
                Err(f) => Err(f.into_error(&self.display)),
            }
        };
        match attempt.await {
            Ok(()) => {}
            // The server is not answering: that is the error the caller reports anyway, and
            // what was left behind expires by itself.
            Err(e @ Error::Unavailable(_)) => tracing::info!(
                "could not withdraw from '{}' (a place in line expires within {}, a grant \
                 whose reply was lost within --ttl): {e}",
                request.name,
                humantime::format_duration(WAITER_LEASE)
            ),
            Err(e) => tracing::warn!("could not withdraw from '{}': {e}", request.name),
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

/// What `release.lua` did.
enum Released {
    /// `held`: my hold entry still existed.
    Done { held: bool },
    /// A key of the lock holds data dlock did not write (my own entries are gone anyway).
    BadData { key: String, what: String },
}

async fn release_call(
    conn: &mut Conn,
    keys: &Keys,
    limit: u32,
    role: &str,
    budget: Duration,
) -> Result<Released, Failure> {
    let mut invocation = RELEASE.prepare_invoke();
    invocation
        .key(&keys.holders)
        .key(&keys.queue)
        .key(&keys.qdl)
        .key(&keys.hold)
        .key(&keys.wake)
        .arg(owner_token(keys))
        .arg(limit)
        .arg(millis(WAKE_TTL))
        .arg(role);
    let reply: Vec<Value> = conn.invoke(&invocation, budget).await?;
    Ok(match reply.first().and_then(int_of) {
        Some(-2) => Released::BadData {
            key: reply.get(1).and_then(text_of).unwrap_or_default(),
            what: reply.get(2).and_then(text_of).unwrap_or_default(),
        },
        held => Released::Done {
            held: held == Some(1),
        },
    })
}

/// The owner token is the last component of the hold key.
fn owner_token(keys: &Keys) -> &str {
    keys.hold.rsplit(':').next().unwrap_or_default()
}

/// A key of a lock holds something dlock did not put there (another program, a hand-made
/// `SET`): dlock cannot use the lock and says which key it is. Exit 69, like any server whose
/// answers dlock cannot use.
fn bad_data(display: &str, key: &str, what: &str) -> Error {
    let remedy = if key.ends_with(":fence") {
        "repair or delete that key (a deleted fencing counter restarts from the server's clock \
         in microseconds)"
    } else {
        "repair or delete that key (dlock recreates it)"
    };
    Error::Unavailable(format!(
        "{display}: the key '{key}' holds {what}: data dlock did not write; {remedy}"
    ))
}

/// The fencing counter reached the largest token: refuse rather than repeat or wrap.
fn fence_exhausted(display: &str, key: &str) -> Error {
    Error::Unavailable(format!(
        "{display}: the fencing counter '{key}' is at its maximum ({FENCE_MAX}); dlock cannot \
         hand out a larger token and does not take the lock (use another lock name or --prefix; \
         lowering the counter would let tokens repeat)"
    ))
}

/// An integer in a script reply (Lua numbers arrive as integers, counters as strings).
fn int_of(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A string in a script reply; bytes that are not UTF-8 become U+FFFD (data from the server
/// is shown, never trusted to be text).
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The holder metadata as stored (JSON), as far as it can be read.
fn holder_of(meta: Option<&Value>, fence: Option<&Value>) -> Holder {
    let mut holder: Holder = meta
        .and_then(text_of)
        .and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default();
    holder.token = fence
        .and_then(text_of)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    holder
}

/// What one call of `acquire.lua` said.
enum Step {
    Granted {
        fence: String,
        ttl_ms: i64,
    },
    OtherLimit(i64),
    Waiting {
        hint: i64,
        ahead: i64,
        ticket: i64,
        live: i64,
    },
    BadData {
        key: String,
        what: String,
    },
    Exhausted {
        key: String,
    },
}

impl Step {
    fn parse(reply: &[Value]) -> Option<Step> {
        let int = |i: usize| reply.get(i).and_then(int_of);
        let text = |i: usize| reply.get(i).and_then(text_of);
        Some(match int(0)? {
            1 => Step::Granted {
                fence: text(1)?,
                ttl_ms: int(2).unwrap_or(0),
            },
            -1 => Step::OtherLimit(int(1).unwrap_or(0)),
            0 => Step::Waiting {
                hint: int(1).unwrap_or(-1),
                ahead: int(2).unwrap_or(0),
                ticket: int(3).unwrap_or(0),
                live: int(4).unwrap_or(0),
            },
            -2 => Step::BadData {
                key: text(1)?,
                what: text(2).unwrap_or_default(),
            },
            -3 => Step::Exhausted { key: text(1)? },
            _ => return None,
        })
    }
}

/// The time an acquire call may take: up to [`OP_TIMEOUT`], and not past `answer_by` (but at
/// least [`MIN_CALL`], so the last check at a `--wait` deadline can still be answered).
fn call_budget(answer_by: Option<BootInstant>) -> Duration {
    answer_by.map_or(OP_TIMEOUT, |by| by.remaining().clamp(MIN_CALL, OP_TIMEOUT))
}

fn passed(by: Option<BootInstant>) -> bool {
    by.is_some_and(|by| by.remaining().is_zero())
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
        let started = BootInstant::now();
        // `deadline` ends the wait for the lock (75); `answer_by` bounds how long dlock waits
        // for the server itself, connecting included (69).
        let (deadline, answer_by, within) = match request.wait {
            Wait::For(d) => (
                Some(started + d),
                Some(started + d),
                format!("--wait {}", humantime::format_duration(d)),
            ),
            Wait::No => (
                None,
                Some(started + NO_WAIT_BOUND),
                format!("{} (--no-wait)", humantime::format_duration(NO_WAIT_BOUND)),
            ),
            Wait::Forever => (None, None, String::new()),
        };
        // Connects on the first call, within that call's budget.
        let mut conn = Conn::new(&self.target, &self.display)?;
        let mode = if request.wait == Wait::No {
            "try"
        } else {
            "wait"
        };
        let meta =
            serde_json::to_string(&request.holder).map_err(|e| Error::Internal(e.to_string()))?;
        let ttl_ms = millis(request.ttl);
        // Waiters heartbeat (and re-check) often, whatever the TTL: a killed waiter drops out
        // of the queue WAITER_LEASE after its last heartbeat.
        let heartbeat = (request.ttl / 3)
            .min(WAITER_HEARTBEAT)
            .max(Duration::from_millis(10));
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
                .arg(millis(WAITER_LEASE))
                .arg(&meta)
                .arg(mode)
                .arg(ticket);
            let sent = BootInstant::now();
            let mut attempt = 0;
            let reply: Vec<Value> = loop {
                attempt += 1;
                let call = conn.invoke(&invocation, call_budget(answer_by));
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
                    Err(failure)
                        if failure.is_transient()
                            && attempt < ACQUIRE_ATTEMPTS
                            && !passed(answer_by) =>
                    {
                        tracing::debug!(
                            "acquire attempt {attempt} failed: {}; retrying",
                            failure.describe()
                        );
                        tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    }
                    Err(failure) => {
                        let error = if failure.is_timeout() && passed(answer_by) {
                            Error::Unavailable(format!(
                                "no answer from {} within {within}",
                                self.display
                            ))
                        } else {
                            failure.into_error(&self.display)
                        };
                        // The script may have run without us seeing the reply: take back
                        // whatever it created for our token (a place in line or a grant).
                        if failure_may_have_run(&error) || ticket != 0 {
                            self.leave(&keys, request).await;
                        }
                        return Err(error);
                    }
                }
            };
            let Some(step) = Step::parse(&reply) else {
                if ticket != 0 {
                    self.leave(&keys, request).await;
                }
                return Err(Error::Internal(format!(
                    "unexpected reply from the acquire script: {reply:?}"
                )));
            };
            let (hint, ahead, live) = match step {
                Step::Granted {
                    fence,
                    ttl_ms: granted_ms,
                } => {
                    let token = match fence.parse::<u64>() {
                        Ok(token) if token > 0 => token,
                        _ => {
                            self.leave(&keys, request).await;
                            return Err(bad_data(
                                &self.display,
                                &keys.hold,
                                &format!("the fencing token \"{fence}\""),
                            ));
                        }
                    };
                    let granted = Duration::from_millis(granted_ms.max(0) as u64);
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
                        token,
                        keys,
                        limit: request.limit,
                        display: self.display.clone(),
                    });
                }
                Step::OtherLimit(theirs) => {
                    if ticket != 0 {
                        self.leave(&keys, request).await;
                    }
                    return Err(Error::Usage(format!(
                        "lock '{}' is held with --limit {theirs}; all holders must use the same --limit",
                        request.name,
                    )));
                }
                Step::BadData { key, what } => {
                    if ticket != 0 {
                        self.leave(&keys, request).await;
                    }
                    return Err(bad_data(&self.display, &key, &what));
                }
                Step::Exhausted { key } => {
                    if ticket != 0 {
                        self.leave(&keys, request).await;
                    }
                    return Err(fence_exhausted(&self.display, &key));
                }
                Step::Waiting {
                    hint,
                    ahead,
                    ticket: theirs,
                    live,
                } => {
                    if theirs != 0 {
                        ticket = theirs;
                    }
                    (hint, ahead, live)
                }
            };
            if request.wait == Wait::No {
                let reason = self.busy_reason(&mut conn, request, live, ahead).await;
                return Err(Error::Busy(format!("{reason}; not waiting (--no-wait)")));
            }
            let mut block = heartbeat;
            if hint >= 0 {
                // The head of the queue re-checks when a holder's lease would run out.
                block = block.min(Duration::from_millis(hint as u64 + 5));
            }
            if let Some(deadline) = deadline {
                let left = deadline.remaining();
                if left.is_zero() {
                    let reason = self.busy_reason(&mut conn, request, live, ahead).await;
                    self.leave(&keys, request).await;
                    return Err(Error::Busy(format!(
                        "{reason}; gave up after waiting {} (--wait)",
                        within.trim_start_matches("--wait ")
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
        self.status_with(&mut conn, name, OP_TIMEOUT).await?
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
            let (next, keys): (u64, Vec<Vec<u8>>) = conn
                .query(&command, OP_TIMEOUT)
                .await
                .map_err(|f| f.into_error(&self.display))?;
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
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut held = Vec::new();
        for name in names {
            // One lock with unusable data must not hide all the others.
            match self.status_with(&mut conn, &name, OP_TIMEOUT).await? {
                Ok(status) if status.held => held.push(status),
                Ok(_) => {}
                Err(bad) => tracing::warn!("skipping lock '{name}': {bad}"),
            }
        }
        Ok(held)
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        let mut conn = self.connect().await?;
        let keys = self.keys(name, "");
        let mut invocation = FORCE.prepare_invoke();
        invocation
            .key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.qdl)
            .arg(millis(WAKE_TTL))
            .arg(millis(STALE_WAITER));
        let reply: Vec<Value> = conn
            .invoke(&invocation, OP_TIMEOUT)
            .await
            .map_err(|f| f.into_error(&self.display))?;
        let int = |i: usize| reply.get(i).and_then(int_of);
        let text = |i: usize| reply.get(i).and_then(text_of).unwrap_or_default();
        match int(0) {
            Some(1) => {}
            Some(-2) => return Err(bad_data(&self.display, &text(1), &text(2))),
            _ => {
                return Err(Error::Internal(format!(
                    "unexpected reply from the force-release script: {reply:?}"
                )))
            }
        }
        match int(2).unwrap_or(0) {
            0 => {}
            n => tracing::warn!(
                "removed {n} waiter{} of '{name}' that no live dlock keeps (killed, or left by an \
                 older dlock); a live one rejoins in its place",
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
                Value::Array(fields) => holder_of(fields.get(2), fields.get(1)),
                _ => Holder::default(),
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

/// The status script's reply; the inner error when a key of the lock holds data dlock did not
/// write.
fn parse_status(
    name: &LockName,
    reply: Value,
    display: &str,
) -> Result<Result<LockStatus, Error>, Error> {
    let bad = || {
        Error::Internal(format!(
            "unexpected reply from the status script for '{name}': {reply:?}"
        ))
    };
    let Value::Array(fields) = &reply else {
        return Err(bad());
    };
    let int = |i: usize| fields.get(i).and_then(int_of);
    let text = |i: usize| fields.get(i).and_then(text_of);
    match int(0) {
        Some(1) => {}
        Some(-2) => {
            return Ok(Err(bad_data(
                display,
                &text(1).unwrap_or_default(),
                &text(2).unwrap_or_default(),
            )))
        }
        _ => return Err(bad()),
    }
    let entries = match fields.get(3) {
        Some(Value::Array(entries)) => entries.as_slice(),
        _ => return Err(bad()),
    };
    let holders: Vec<HolderStatus> = entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(f) => Some(f),
            _ => None,
        })
        .map(|f| {
            let mut holder = holder_of(f.get(3), f.get(2));
            if holder.name.is_empty() {
                holder.name = name.to_string();
            }
            HolderStatus {
                holder,
                ttl_left_ms: f
                    .get(1)
                    .and_then(int_of)
                    .and_then(|p| u64::try_from(p).ok()),
                session: None,
            }
        })
        .collect();
    Ok(Ok(LockStatus {
        name: name.to_string(),
        held: !holders.is_empty(),
        holders,
        waiters: Some(int(2).and_then(|w| u64::try_from(w).ok()).unwrap_or(0)),
        queue: Vec::new(),
        last_token: text(1).and_then(|f| f.parse().ok()),
    }))
}

/// A held Redis lock: the keeper renews it; release gives it back and wakes the next waiter.
pub struct RedisLease {
    keeper: Keeper<Renewer>,
    token: u64,
    keys: Keys,
    limit: u32,
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
                "holder",
                OP_TIMEOUT,
            )
            .await
            {
                Ok(Released::Done { held }) => {
                    if !held {
                        tracing::warn!(
                            "the lock had already expired or been removed before it was released"
                        );
                    }
                    return Ok(());
                }
                Ok(Released::BadData { key, what }) => {
                    return Err(bad_data(&self.display, &key, &what));
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
            Ok(-3) => Err(RenewError::Gone(format!(
                "a key of the lock ('{}' or '{}') was overwritten with data dlock did not write",
                self.keys.holders, self.keys.hold
            ))),
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

    /// The call got no answer in time (ours or the client's timeout).
    fn is_timeout(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => e.is_timeout(),
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
    fn script_replies_keep_big_tokens_exact_and_bytes_readable() {
        let reply = [
            Value::Int(1),
            Value::BulkString(b"9223372036854775807".to_vec()),
            Value::Int(3000),
        ];
        match Step::parse(&reply) {
            Some(Step::Granted { fence, ttl_ms }) => {
                assert_eq!(fence.parse::<u64>().ok(), Some(9_223_372_036_854_775_807));
                assert_eq!(ttl_ms, 3000);
            }
            _ => panic!("not a grant"),
        }
        let reply = [
            Value::Int(-3),
            Value::BulkString(b"dlock:{a}:fence".to_vec()),
        ];
        assert!(
            matches!(Step::parse(&reply), Some(Step::Exhausted { key }) if key == "dlock:{a}:fence")
        );
        assert!(Step::parse(&[Value::Int(7)]).is_none());
        assert_eq!(
            text_of(&Value::BulkString(b"a\xffb".to_vec())).as_deref(),
            Some("a\u{FFFD}b")
        );
        // A host name with a byte that is not UTF-8 in otherwise valid JSON.
        let meta = [
            br#"{"name":"n","host":"h"#.as_slice(),
            &[0xff],
            br#"","pid":7,"user":"u","command":"c","since":"s","ttl_ms":1,"token":0,"version":"v"}"#,
        ]
        .concat();
        let meta = Value::BulkString(meta);
        let holder = holder_of(Some(&meta), Some(&Value::BulkString(b"42".to_vec())));
        assert_eq!((holder.pid, holder.token), (7, 42));
        assert_eq!(holder.host, "h\u{FFFD}");
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
