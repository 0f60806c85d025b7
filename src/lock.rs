//! What a lock is, independent of where it lives.
//!
//! - [`LockName`]: a validated name (1–255 bytes of UTF-8, no control characters) and its
//!   injective encoding into one path or key component.
//! - [`Holder`]: the metadata a holder records with its hold, shown by `status` and `list`.
//! - [`Backend`] and [`Lease`]: the interface every backend implements. Modelled on the etcd
//!   `concurrency` package: a backend *acquires* (waiting by notification, cancellable), the
//!   returned lease reports through [`Lease::lost`] when the hold is gone, and
//!   [`Lease::release`] gives it back. The supervisor knows nothing else about backends.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::BootInstant;
use crate::error::Error;

use crate::budget::WaitBudget;
pub use status::{token_str, CheckReport, HolderStatus, LockStatus, Waiter};

mod status;

/// The namespace of locks when `--prefix` is not given.
pub const DEFAULT_PREFIX: &str = "dlock";
/// The largest `--limit`.
pub const MAX_LIMIT: u32 = 1024;

/// Longest accepted name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// A lock name that passed validation. Names are opaque: `a`, `a/b`, `ab`, `a:fence` and
/// `../x` are unrelated locks, and [`LockName::encoded`] keeps them apart on every backend.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockName(String);

impl LockName {
    pub fn new(raw: &str) -> Result<LockName, Error> {
        if raw.is_empty() {
            return Err(Error::Usage("lock name must not be empty".into()));
        }
        if raw.len() > MAX_NAME_BYTES {
            return Err(Error::Usage(format!(
                "lock name is {} bytes long; the limit is {MAX_NAME_BYTES}",
                raw.len()
            )));
        }
        if let Some(c) = raw.chars().find(|c| c.is_control()) {
            return Err(Error::Usage(format!(
                "lock name must not contain control characters (found U+{:04X})",
                u32::from(c)
            )));
        }
        Ok(LockName(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as one path/key component: bytes of `[A-Za-z0-9._-]` stay as they are, every
    /// other byte becomes `%XX`. The mapping is injective (`%` itself is escaped), never
    /// contains `/`, and `.`/`..` only ever appear followed by a suffix the caller adds.
    pub fn encoded(&self) -> String {
        encode_component(&self.0)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Percent-encode everything but `[A-Za-z0-9._-]`.
pub fn encode_component(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Undo [`encode_component`]; `None` for anything it could not have produced.
pub fn decode_component(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = encoded.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What a holder records with its hold (docs/guide.md: "Looking at locks").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub name: String,
    pub host: String,
    pub pid: u32,
    pub user: String,
    /// The command line, truncated to [`Holder::MAX_COMMAND`] bytes.
    pub command: String,
    /// Start of the hold, RFC 3339 UTC.
    pub since: String,
    /// Lease length in milliseconds (0 where the backend has no lease).
    pub ttl_ms: u64,
    pub token: u64,
    pub version: String,
    /// `--min-hold` in milliseconds (0: none): the lock is kept at least this long.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_hold_ms: u64,
    /// Set once the command has finished while `--min-hold` keeps the lock: until when, RFC
    /// 3339 UTC (where the backend can update a holder's metadata, see [`Lease::finished`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kept_until: String,
    /// How it holds the lock: alone, or beside other shared holders (`--shared`). Stored
    /// only when shared, so an exclusive holder's record stays what every dlock wrote;
    /// `status` and `list` always show it ([`HolderStatus`]).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// The hold's `--limit`, so that `status` can say how many of a semaphore's slots are
    /// taken (0: not recorded: a record written by hand, by another program or by a dlock
    /// before it recorded this).
    #[serde(default, skip_serializing_if = "is_no_limit")]
    pub limit: u32,
}

/// How a lock is held: by one exclusive holder, or by any number of shared ones
/// (docs/guide.md: "Shared locks").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
}

impl Mode {
    pub fn is_shared(self) -> bool {
        self == Mode::Shared
    }

    fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// `shared` or `exclusive`, as `status` and `list` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Holder {
    pub const MAX_COMMAND: usize = 200;

    /// Mark the hold as granted now: `since` is when the lock was granted, not when this run
    /// started waiting for it (`status` and the busy line count a hold's age from it).
    pub fn granted_now(&mut self) {
        self.since = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    }

    /// Set `since` from a grant `age` old by the server's count, on this host's clock (a
    /// server's clock and ours may differ; an age does not).
    pub fn granted_ago(&mut self, age: Duration) {
        let at = std::time::SystemTime::now()
            .checked_sub(age)
            .unwrap_or(std::time::UNIX_EPOCH);
        self.since = humantime::format_rfc3339_seconds(at).to_string();
    }

    /// Whether this entry was left by a client that is not dlock (`etcdctl lock`, Curator):
    /// it carries no pid and no dlock version.
    pub fn is_foreign(&self) -> bool {
        self.pid == 0 && self.version.is_empty()
    }

    /// Metadata for this process running `command` (its display form, passwords already
    /// masked), to be completed with the token.
    pub fn for_this_process(name: &LockName, command: &[String], ttl: Duration) -> Holder {
        let mut line = command.join(" ");
        crate::process::cut_to(&mut line, Self::MAX_COMMAND);
        Holder {
            name: name.as_str().to_owned(),
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            pid: std::process::id(),
            user: user_name(),
            command: line,
            since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            token: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            min_hold_ms: 0,
            kept_until: String::new(),
            mode: Mode::Exclusive,
            limit: 0,
        }
    }
}

pub fn user_name() -> String {
    // $USER is what the login set up; looking the uid up in the user database costs a parse of
    // nsswitch.conf and /etc/passwd on every run, so it is only the fallback.
    if let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return user;
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

fn is_no_limit(limit: &u32) -> bool {
    *limit == 0
}

/// What a holder records with its hold where the backend stores JSON (a lock file, an etcd
/// value, a ZooKeeper node): its metadata and the `--limit` it holds with, as one object
/// (the holder's fields, `limit` among them, once).
#[derive(Clone, Debug)]
pub struct Record {
    pub holder: Holder,
    /// The `--limit` it holds with (0: not recorded: a record written by hand or by another
    /// program, which agrees with any `--limit`).
    pub limit: u32,
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Holder {
            limit: self.limit,
            ..self.holder.clone()
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Record, D::Error> {
        let holder = Holder::deserialize(deserializer)?;
        Ok(Record {
            limit: holder.limit,
            holder,
        })
    }
}

/// The refusal of a run whose `--limit` is not the holders' (all holders must agree).
pub fn limit_mismatch(name: &LockName, theirs: u32) -> Error {
    Error::Usage(format!(
        "lock '{name}' is held with --limit {theirs}; all holders must use the same --limit"
    ))
}

/// Everything a backend needs to take a lock.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    pub name: LockName,
    /// Semaphore size: up to `limit` holders at once.
    pub limit: u32,
    /// Shared or exclusive (`--shared`); `holder.mode` says the same. A backend without the
    /// `shared` capability never sees a shared request (`Kind::check_shared`).
    pub mode: Mode,
    pub ttl: Duration,
    /// How long to wait (`--wait`, `--no-wait`), counted from the start of the acquisition.
    pub budget: WaitBudget,
    /// Grace between SIGTERM and SIGKILL; a lease keeper declares loss early enough for it.
    pub kill_after: Duration,
    /// Metadata to record; the backend fills in the token.
    pub holder: Holder,
    /// Another process of this host is ahead of this one at the server (the host-local queue
    /// knows): the lock is most likely held, so a backend may skip its attempt to take a free
    /// lock and queue at once. Only a hint: the lock may still turn out to be free.
    pub likely_held: bool,
    /// Told when this request has reached the server's queue ([`queued`]); the host-local
    /// queue lets the next process of this host go to the server only then.
    pub on_queued: OnQueued,
}

/// What to do once an `acquire` has reached the server's queue (nothing by default).
#[derive(Clone, Default)]
pub struct OnQueued(Option<Arc<dyn Fn() + Send + Sync>>);

impl OnQueued {
    pub fn new(hook: impl Fn() + Send + Sync + 'static) -> OnQueued {
        OnQueued(Some(Arc::new(hook)))
    }
}

impl fmt::Debug for OnQueued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "OnQueued(hook)"
        } else {
            "OnQueued(none)"
        })
    }
}

/// A backend's waiter for `request` has its place in the server's queue: a request that
/// arrives at the server after this one is served after it. Every remote backend calls this
/// where it queues (once or more; repeats are harmless): the hand-off event `queued`, and the
/// request's [`OnQueued`] hook.
pub fn queued(request: &AcquireRequest) {
    tracing::debug!(target: crate::logging::HANDOFF, "queued");
    if let Some(hook) = &request.on_queued.0 {
        hook();
    }
}

/// Tells a waiting `acquire` to give up and clean up after itself.
#[derive(Clone, Debug)]
pub struct Cancel(watch::Receiver<bool>);

/// The sending side of [`Cancel`].
#[derive(Debug)]
pub struct Canceller(watch::Sender<bool>);

pub fn cancellation() -> (Canceller, Cancel) {
    let (tx, rx) = watch::channel(false);
    (Canceller(tx), Cancel(rx))
}

impl Canceller {
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }
}

impl Cancel {
    /// A cancel that never fires.
    pub fn never() -> Cancel {
        let (tx, rx) = watch::channel(false);
        // Keep the channel open for ever so `cancelled` stays pending.
        std::mem::forget(tx);
        Cancel(rx)
    }

    /// Resolves once cancellation was requested. Cancel-safe.
    pub async fn cancelled(&mut self) {
        if self.0.wait_for(|cancelled| *cancelled).await.is_err() {
            // The canceller is gone without cancelling: nobody can cancel any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Why a hold ended while the command ran. Built by the keeper's rule ([`Lost::gone`],
/// [`crate::keeper::Schedule::lost_after`], [`crate::keeper::Proof::lost`]), which owns the deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// One line for the user: what happened.
    pub reason: String,
    /// The instant by which the command must be dead because the server may hand the lock to
    /// someone else then (lease expiry minus the safety margin). `None` when the lock is
    /// already gone (nothing left to protect) or the backend has no expiry.
    pub kill_by: Option<BootInstant>,
}

/// A lock service, selected by URL scheme. All methods validate nothing the settings layer
/// already validated.
#[allow(async_fn_in_trait)]
pub trait Backend {
    type Lease: Lease;

    /// Take the lock, waiting as `request.budget` says. Returns [`Error::Busy`] when the lock
    /// stayed held, [`Error::Cancelled`] when `cancel` fired; in both cases every trace of
    /// this waiter (keys, nodes, leases) is gone before it returns.
    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel)
        -> Result<Self::Lease, Error>;

    /// The holders of `name` and its waiters.
    async fn status(&self, name: &LockName) -> Result<LockStatus, Error>;

    /// Every held lock under the namespace.
    async fn list(&self) -> Result<Vec<LockStatus>, Error>;

    /// Break the hold of whoever holds `name`. Returns the holders that were removed.
    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error>;

    /// Connect, measure, create and delete a test entry.
    async fn check(&self) -> Result<CheckReport, Error>;

    /// How long past the server's time to answer (`--wait`, at least [`crate::budget::MIN_ANSWER`]) an
    /// acquisition may take by this backend's own rules before it ends: the round trip in
    /// flight at that deadline, a grant that came by then being checked before the command
    /// may start, giving back what did not count. `run` cancels an acquisition only after
    /// [`crate::budget::overrun`] of it (the backstop for a server that accepted the
    /// connection and never answered), so it never cuts short a backend's honest deadline.
    /// This default covers a backend that ends by its time to answer.
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        let _ = request;
        Duration::ZERO
    }
}

/// A held lock.
#[allow(async_fn_in_trait)]
pub trait Lease {
    /// The fencing token of this acquisition (docs/guarantees.md).
    fn token(&self) -> u64;

    /// Resolves when the hold is gone (lease expiring, session lost, entry deleted, lock file
    /// replaced). Cancel-safe: it can sit in a `select!` loop.
    async fn lost(&mut self) -> Lost;

    /// Give the lock back promptly, so the next waiter does not wait for a TTL.
    async fn release(self) -> Result<(), Error>;

    /// Until when the hold is proven now: the instant the lease's keeper would give it up,
    /// counted from its last acknowledged renewal (`None`: no lease, as a kernel lock, or
    /// an ancestor's). A command seen to have ended after that instant may have run on
    /// without the lock (dlock was stopped or starved meanwhile), and the run counts as lost.
    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        None
    }

    /// Record in the hold's metadata that the command has finished and the lock is kept
    /// until `holder.kept_until` (`--min-hold`), so that `status` can say so. Returns
    /// whether it was recorded: a backend that cannot update its metadata cheaply keeps
    /// this default, and `status` then shows only the `--min-hold` recorded at the start.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let _ = holder;
        Ok(false)
    }
}

/// Whether this process has told the user that its hold was lost.
static LOSS_REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The user has been told that the hold was lost (the supervisor's or `--min-hold`'s warning).
pub fn loss_reported() {
    LOSS_REPORTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A release found the hold gone already: a warning, unless the loss was reported while the
/// command ran (one loss, one warning); then only at `-vv`.
pub fn warn_gone_at_release(message: std::fmt::Arguments<'_>) {
    if LOSS_REPORTED.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!("{message}");
    } else {
        tracing::warn!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_names_encode_distinctly() {
        let names = [
            "a", "a/b", "ab", "a:fence", "../x", ".", "..", "a%2Fb", "锁", "a b",
        ];
        let encoded: std::collections::HashSet<String> = names
            .iter()
            .map(|n| LockName::new(n).unwrap().encoded())
            .collect();
        assert_eq!(encoded.len(), names.len());
        for e in &encoded {
            assert!(!e.contains('/'), "{e} contains a slash");
        }
    }

    #[test]
    fn simple_names_map_to_themselves() {
        for n in ["deploy-prod", "nightly.backup", "a_b-C.9"] {
            assert_eq!(LockName::new(n).unwrap().encoded(), n);
        }
    }

    #[test]
    fn encoding_round_trips() {
        for n in ["a/b", "../x", "锁", "100%", "a b\u{202e}"] {
            let name = LockName::new(n).unwrap();
            assert_eq!(decode_component(&name.encoded()).as_deref(), Some(n));
        }
    }

    #[test]
    fn rejects_bad_names() {
        assert!(LockName::new("").is_err());
        assert!(LockName::new(&"x".repeat(256)).is_err());
        assert!(LockName::new(&"x".repeat(255)).is_ok());
        assert!(LockName::new("a\nb").is_err());
        assert!(LockName::new("a\u{7f}").is_err());
        assert!(LockName::new("a\u{85}").is_err());
    }

    #[test]
    fn long_commands_are_truncated_on_a_char_boundary() {
        let name = LockName::new("x").unwrap();
        let command = vec!["é".repeat(300)];
        let holder = Holder::for_this_process(&name, &command, Duration::from_secs(1));
        assert!(holder.command.len() <= Holder::MAX_COMMAND + '…'.len_utf8());
    }
}
