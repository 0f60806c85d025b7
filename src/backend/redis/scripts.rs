//! The server-side scripts (`scripts/*.lua`), one per step, and what their replies say.
//!
//! Every script first checks that the lock's keys hold what dlock keeps there; a key someone
//! else overwrote comes back by name and is reported as [`bad_data`] (exit 69), never as an
//! internal error. Data from the server is shown, never trusted to be text.
//!
//! Keys and Redis Cluster: every key a script touches is declared in its KEYS (Cluster
//! requires it), and the first one routes the call. Per-holder data are fields of the fixed
//! `B:hold`, with the lease deadlines in `B:owners`, so no script needs a key it cannot name.
//! The one per-token key others must touch is a waiter's mailbox `B:w:<tok>`: a script that
//! admits a waiter returns its token and the caller wakes it with `wake.lua`, naming the
//! mailbox ([`wake_call`]; one more round trip, only when there is someone to wake). While a
//! slot migrates, Redis checks exactly the declared keys, so a script never runs beside keys
//! that already moved: it gets `TRYAGAIN` (or `ASK`) and is asked again
//! (`tests/backends/redis/declared.rs` checks, with `MONITOR`, that every key a script
//! touched was one of its KEYS).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::error::Error;
use crate::lock::{Holder, HolderStatus, LockName, LockStatus};

use super::conn::{Conn, Failure};
pub(super) use super::invocation::{Invocation, LockScript};
use super::keys::{mode_of, Keys};

pub(super) static ACQUIRE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(concat!(
        include_str!("scripts/master.lua"),
        include_str!("scripts/modes.lua"),
        include_str!("scripts/acquire.lua")
    ))
});
pub(super) static RELEASE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(concat!(
        include_str!("scripts/modes.lua"),
        include_str!("scripts/release.lua")
    ))
});
pub(super) static RENEW: LazyLock<LockScript> =
    LazyLock::new(|| LockScript::new(include_str!("scripts/renew.lua")));
pub(super) static STATUS: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(concat!(
        include_str!("scripts/master.lua"),
        include_str!("scripts/status.lua")
    ))
});
pub(super) static FORCE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(concat!(
        include_str!("scripts/master.lua"),
        include_str!("scripts/modes.lua"),
        include_str!("scripts/force.lua")
    ))
});
pub(super) static WAKE: LazyLock<LockScript> =
    LazyLock::new(|| LockScript::new(include_str!("scripts/wake.lua")));
pub(super) static FINISH: LazyLock<LockScript> =
    LazyLock::new(|| LockScript::new(include_str!("scripts/finish.lua")));

/// How long a wake-up waits in a waiter's mailbox (a live waiter takes it within a heartbeat).
pub(super) const WAKE_TTL: Duration = Duration::from_secs(10);
/// The largest fencing token: Redis counters are signed 64-bit.
const FENCE_MAX: i64 = i64::MAX;

/// A duration as a script argument.
pub(super) fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

/// What `release.lua` did.
pub(super) enum Released {
    /// `held`: my hold was still live.
    Done { held: bool },
    /// A key of the lock holds data dlock did not write (my mailbox is gone anyway).
    BadData { key: String, what: String },
}

/// Leave: give back a hold (or a place in line) and wake the waiters that leaving admits (one
/// exclusive waiter, or the run of shared waiters at the head of the line).
/// `next`: the waiter that was first in line at our grant. When it is one to wake, the
/// script wakes it itself, one round trip instead of two on the hand-off's path.
pub(super) async fn release_call(
    conn: &mut Conn,
    keys: &Keys,
    limit: u32,
    role: &str,
    budget: Duration,
    next: Option<&str>,
) -> Result<Released, Failure> {
    let mut invocation = RELEASE.prepare_invoke();
    invocation
        .key(&keys.owners)
        .key(&keys.hold)
        .key(&keys.queue)
        .key(&keys.qdl)
        .key(&keys.wake)
        .arg(&keys.tok)
        .arg(limit)
        .arg(role);
    if let Some(next) = next {
        invocation
            .key(keys.mailbox(next))
            .arg(next)
            .arg(millis(WAKE_TTL));
    }
    let reply: Vec<Value> = conn.invoke(&invocation, budget).await?;
    tracing::debug!(target: crate::logging::HANDOFF, "unlocked");
    Ok(match reply.first().and_then(int_of) {
        Some(-2) => Released::BadData {
            key: reply.get(1).and_then(text_of).unwrap_or_default(),
            what: reply.get(2).and_then(text_of).unwrap_or_default(),
        },
        held => {
            let others = tokens_at(&reply, 2);
            if reply.get(1).and_then(int_of) == Some(2) {
                tracing::debug!(target: crate::logging::HANDOFF, "woke-next");
            }
            if !others.is_empty() {
                wake_call(conn, keys, &others, budget).await;
                tracing::debug!(target: crate::logging::HANDOFF, "wake-sent");
            }
            Released::Done {
                held: held == Some(1),
            }
        }
    })
}

/// The waiter tokens in a script reply's list (at `index`) of waiters to wake.
pub(super) fn tokens_at(reply: &[Value], index: usize) -> Vec<String> {
    match reply.get(index) {
        Some(Value::Array(tokens)) => tokens.iter().filter_map(text_of).collect(),
        _ => Vec::new(),
    }
}

/// Wake the waiters `tokens` (an entry in each one's mailbox). Best effort: a wake-up that
/// does not arrive costs that waiter at most a heartbeat, when it re-checks anyway.
pub(super) async fn wake_call(conn: &mut Conn, keys: &Keys, tokens: &[String], budget: Duration) {
    if tokens.is_empty() {
        return;
    }
    let mut invocation = WAKE.prepare_invoke();
    for tok in tokens {
        invocation.key(keys.mailbox(tok));
    }
    invocation.arg(millis(WAKE_TTL));
    if let Err(failure) = conn.invoke::<i64>(&invocation, budget).await {
        tracing::debug!(
            "waking {} waiter(s) failed: {}; they re-check at their next heartbeat",
            tokens.len(),
            failure.describe()
        );
    }
}

/// A key of a lock holds something dlock did not put there (another program, a hand-made
/// `SET`): dlock cannot use the lock and says which key it is. Exit 69, like any server whose
/// answers dlock cannot use.
pub(super) fn bad_data(display: &str, key: &str, what: &str) -> Error {
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
pub(super) fn fence_exhausted(display: &str, key: &str) -> Error {
    Error::Unavailable(format!(
        "{display}: the fencing counter '{key}' is at its maximum ({FENCE_MAX}); dlock cannot \
         hand out a larger token and does not take the lock (use another lock name or --prefix; \
         lowering the counter would let tokens repeat)"
    ))
}

/// An integer in a script reply (Lua numbers arrive as integers, counters as strings).
pub(super) fn int_of(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A string in a script reply; bytes that are not UTF-8 become U+FFFD (data from the server
/// is shown, never trusted to be text).
pub(super) fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The holder metadata as stored (JSON), as far as it can be read, with the mode its owner
/// token `owner` stands for (what the scripts go by).
pub(super) fn holder_of(
    owner: Option<&Value>,
    meta: Option<&Value>,
    fence: Option<&Value>,
) -> Holder {
    let mut holder: Holder = meta
        .and_then(text_of)
        .and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default();
    holder.token = fence
        .and_then(text_of)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    if let Some(owner) = owner.and_then(text_of) {
        holder.mode = mode_of(&owner);
    }
    holder
}

/// What one call of `acquire.lua` said.
pub(super) enum Step {
    Granted {
        fence: String,
        ttl_ms: i64,
        /// The waiter first in line at the grant, if any: most likely the one our release
        /// wakes.
        next: Option<String>,
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
    pub(super) fn parse(reply: &[Value]) -> Option<Step> {
        let int = |i: usize| reply.get(i).and_then(int_of);
        let text = |i: usize| reply.get(i).and_then(text_of);
        Some(match int(0)? {
            1 => Step::Granted {
                fence: text(1)?,
                ttl_ms: int(2).unwrap_or(0),
                next: text(3).filter(|next| !next.is_empty()),
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

/// The status script's reply; the inner error when a key of the lock holds data dlock did not
/// write.
pub(super) fn parse_status(
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
            let mut holder = holder_of(f.first(), f.get(3), f.get(2));
            if holder.name.is_empty() {
                holder.name = name.to_string();
            }
            // The grant's age by the server's clock: the metadata's `since` is when the run
            // started waiting.
            if let Some(held) = f
                .get(4)
                .and_then(int_of)
                .and_then(|ms| u64::try_from(ms).ok())
            {
                holder.granted_ago(std::time::Duration::from_millis(held));
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
        waiting_here: Vec::new(),
        location: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replies_keep_big_tokens_exact_and_bytes_readable() {
        let reply = [
            Value::Int(1),
            Value::BulkString(b"9223372036854775807".to_vec()),
            Value::Int(3000),
        ];
        match Step::parse(&reply) {
            Some(Step::Granted {
                fence,
                ttl_ms,
                next,
            }) => {
                assert_eq!(fence.parse::<u64>().ok(), Some(9_223_372_036_854_775_807));
                assert_eq!(ttl_ms, 3000);
                assert_eq!(next, None);
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
        let holder = holder_of(None, Some(&meta), Some(&Value::BulkString(b"42".to_vec())));
        assert_eq!((holder.pid, holder.token), (7, 42));
        assert_eq!(holder.host, "h\u{FFFD}");
        assert_eq!(holder.mode, crate::lock::Mode::Exclusive);
        // The owner token says the mode, whatever the metadata say.
        let owner = Value::BulkString(b"s:0123".to_vec());
        let holder = holder_of(Some(&owner), Some(&meta), None);
        assert_eq!((holder.mode, holder.token), (crate::lock::Mode::Shared, 0));
    }
}
