//! What a lock is, independent of where it lives.
//!
//! - [`LockName`]: a validated name (1–255 bytes of UTF-8, no control characters) and its
//!   injective encoding into one path or key component.
//! - [`Holder`]: the metadata a holder records with its hold, shown by `status` and `list`.
//! - [`Backend`] and [`Lease`]: the interface every backend implements. Modelled on the etcd
//!   `concurrency` package: a backend *acquires* (waiting by notification, cancellable), the
//!   returned lease reports through [`Lease::lost`] when the hold is gone, and
//!   [`Lease::release`] gives it back. The supervisor knows nothing else about backends.
//! - [`Several`]: a backend's names held as one lock (`--also`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::BootInstant;
use crate::error::Error;

use crate::budget::WaitBudget;
pub use holder::{limit_mismatch, user_name, Holder, Mode, Record};
pub use several::{Several, SeveralLease};
pub use status::{token_str, CheckReport, HolderStatus, LockStatus, Waiter};

mod holder;
mod several;
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

    /// The names held with the request's own (`--also`), each with its fencing token, in
    /// the order they were given; none for the lease of one name.
    fn also_held(&self) -> Vec<(LockName, u64)> {
        Vec::new()
    }

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
