//! What `status`, `list` and `check` learn from a backend: each holder with its lease time
//! left and session, a lock's holders, waiters and newest token, this host's waiters, and
//! what `check` found; and how they read as JSON (the mode always named, every token also as
//! exact digits).

use serde::Serialize;

use super::{Holder, Mode};

/// One holder as `status` and `list` report it (as JSON with its `mode` always named).
#[derive(Clone, Debug, Serialize)]
#[serde(into = "HolderView")]
pub struct HolderStatus {
    #[serde(flatten)]
    pub holder: Holder,
    /// Lease time left in milliseconds, where the backend knows it.
    pub ttl_left_ms: Option<u64>,
    /// The holder's server session, where the backend has one to show (PostgreSQL: backend
    /// pid, client address, application_name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// [`HolderStatus`] as JSON: the holder's fields, the token in decimal too, then its mode,
/// whether shared or not.
#[derive(Serialize)]
struct HolderView {
    #[serde(flatten)]
    holder: Holder,
    /// `token` as a string ([`token_str`]).
    token_str: String,
    mode: Mode,
    ttl_left_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<String>,
}

impl From<HolderStatus> for HolderView {
    fn from(status: HolderStatus) -> HolderView {
        let mode = status.holder.mode;
        HolderView {
            token_str: token_str(status.holder.token),
            // Named once, below.
            holder: Holder {
                mode: Mode::Exclusive,
                ..status.holder
            },
            mode,
            ttl_left_ms: status.ttl_left_ms,
            session: status.session,
        }
    }
}

/// A fencing token as JSON shows it beside the number: its decimal digits in a string. JSON
/// tools that read numbers as doubles (jq 1.6, JavaScript) round integers above 2^53, as
/// PostgreSQL's tokens are, and two tokens could then read as equal; scripts compare the
/// string form (the same digits as `DLOCK_FENCING_TOKEN`).
pub fn token_str(token: u64) -> String {
    token.to_string()
}

/// The state of one lock.
#[derive(Clone, Debug, Serialize)]
#[serde(into = "LockStatusView")]
pub struct LockStatus {
    pub name: String,
    pub held: bool,
    pub holders: Vec<HolderStatus>,
    /// Number of waiters, where the backend can tell.
    pub waiters: Option<u64>,
    /// The waiters in the order they will get the lock, where the backend keeps one.
    pub queue: Vec<HolderStatus>,
    /// The newest fencing token handed out, where the backend keeps one.
    pub last_token: Option<u64>,
    /// The processes of this host that wait for the lock, longest-waiting first, where dlock
    /// can see them: the file backend's waiters and the host-local queue's tickets.
    pub waiting_here: Vec<Waiter>,
    /// Where the lock lives, where that is not the same for every user: the file backend's
    /// default directory is each user's own (`locks of uid 1000 in /run/lock/dlock-1000`).
    pub location: Option<String>,
}

/// [`LockStatus`] as JSON: its fields, and `last_token` in decimal too ([`token_str`]).
#[derive(Serialize)]
struct LockStatusView {
    name: String,
    held: bool,
    holders: Vec<HolderStatus>,
    waiters: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queue: Vec<HolderStatus>,
    last_token: Option<u64>,
    last_token_str: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    waiting_here: Vec<Waiter>,
    #[serde(skip_serializing_if = "Option::is_none")]
    location: Option<String>,
}

impl From<LockStatus> for LockStatusView {
    fn from(status: LockStatus) -> LockStatusView {
        LockStatusView {
            last_token_str: status.last_token.map(token_str),
            name: status.name,
            held: status.held,
            holders: status.holders,
            waiters: status.waiters,
            queue: status.queue,
            last_token: status.last_token,
            waiting_here: status.waiting_here,
            location: status.location,
        }
    }
}

/// A process of this host waiting for a lock, as `status` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Waiter {
    pub pid: u32,
    pub user: String,
    pub command: String,
    /// When it started waiting, RFC 3339 UTC.
    pub since: String,
    /// How long it has waited, in milliseconds, when `status` looked.
    pub waited_ms: u64,
    /// Where it waits: `lock file` (the file backend), `host queue` (this host's queue, not at
    /// the server yet) or `server` (its ticket let it through to the server's queue).
    pub stage: &'static str,
}

impl Waiter {
    /// Process `pid`, waiting since `since`, at `stage`, with its command line as
    /// [`crate::secrets::command_line_of`] shows it.
    pub fn new(pid: u32, since: std::time::SystemTime, stage: &'static str) -> Waiter {
        let waited = std::time::SystemTime::now()
            .duration_since(since)
            .unwrap_or_default();
        Waiter {
            pid,
            user: crate::process::user_of(pid).unwrap_or_default(),
            command: crate::secrets::command_line_of(pid, Holder::MAX_COMMAND),
            since: humantime::format_rfc3339_seconds(since).to_string(),
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            stage,
        }
    }
}

impl LockStatus {
    /// Add `holder` to the held lock `name` in `locks`, creating its entry on first sight
    /// (for backends whose `list` finds holders one at a time).
    pub fn add_holder(locks: &mut Vec<LockStatus>, name: String, holder: HolderStatus) {
        match locks.iter_mut().find(|l| l.name == name) {
            Some(lock) => lock.holders.push(holder),
            None => locks.push(LockStatus {
                name,
                held: true,
                holders: vec![holder],
                waiters: None,
                queue: Vec::new(),
                last_token: None,
                waiting_here: Vec::new(),
                location: None,
            }),
        }
    }
}

/// What `check` found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub backend: String,
    pub location: String,
    pub version: String,
    pub round_trip_us: u64,
    /// Observations worth a user's attention (they do not fail the check).
    pub warnings: Vec<String>,
    /// Facts about the backend and the effective settings, as `key: value` lines.
    pub details: Vec<(String, String)>,
}
