//! The S3 backend (`s3://BUCKET[/PREFIX]`, AWS S3 and the S3-compatible servers that honour
//! conditional writes): one object per lock, every write conditional on the ETag read
//! before it, and leases judged on the server's clock alone.
//!
//! - **The lock object** (`keys.rs`) holds the token counter, the `--limit` and the holders,
//!   each with the server time of its last write (`record.rs`). dlock never deletes it: a
//!   release, an expiry and `release --force` rewrite it without the holder, so the counter
//!   survives them, and tokens strictly increase. A new object's counter starts at the
//!   server's clock in µs, so that one deleted by hand does not start again below old tokens.
//! - **Every write** is a PutObject with `If-None-Match: *` (create) or `If-Match: ETAG` of
//!   the version read (or last written). Every body carries a fresh nonce: S3's ETag is a
//!   digest of the content, and an old ETag must never match a newer object that happens to
//!   repeat an older body. A lost condition (412, or 409 ConditionalRequestConflict) means
//!   somebody wrote in between: read again and decide again.
//! - **Expiry on the server's clock.** A holder counts its lease from the moment it sent the
//!   write that created or renewed its entry (the keeper's rule, on this host's monotonic
//!   clock). The server stamps that write with `Last-Modified`, whole seconds, floored: the
//!   write happened in `[LM, LM + 1)`, after the send. A reader judges the entry expired
//!   only when the `Date` of its own answer (floored too) is at least `LM + TTL + 1`: then
//!   real time ≥ Date ≥ LM + TTL + 1 > write time + TTL ≥ send time + TTL, past the holder's
//!   lease. No host's wall clock enters: a holder or a waiter whose clock is minutes off
//!   neither steals a live lock nor keeps a dead one. The price is the resolution: a dead
//!   holder's lock is taken between TTL + 1 and TTL + 2 s after its last write, plus a poll.
//! - **Waiting** is polling (`wait.rs`): S3 has no notification.
//! - **A server that ignores the conditions** would let two writers in silently. Where an
//!   acquisition creates a lock object, it repeats the create (`If-None-Match: *`) and
//!   writes on an ETag that cannot match (`If-Match`): both must fail (412), or the server is
//!   refused (78); so does `check`. A server that answers 501 NotImplemented to the headers
//!   is refused at once.
//!
//! The parts: `target.rs` and `settings.rs` (the URL and the AWS settings), `sign.rs`
//! (SigV4), `client.rs` (the requests and what their answers mean), `keys.rs`, `record.rs`,
//! `wait.rs`, `lease.rs`, `admin.rs` (status, list, release --force, check), `acquire.rs`.

mod acquire;
mod admin;
mod client;
mod keys;
pub mod kind;
mod lease;
mod record;
mod settings;
mod sign;
pub mod target;
mod wait;

use std::time::Duration;

use crate::error::Error;
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};

use client::S3;
use keys::Keys;

pub use lease::S3Lease;
pub use target::S3Target;

/// What an acquisition adds to `--wait` for the request in flight when the wait ends.
const WAIT_GRACE: Duration = Duration::from_millis(300);

pub struct S3Backend {
    /// The client, or why the target cannot have one (a bad endpoint).
    s3: Result<S3, String>,
    keys: Keys,
}

impl S3Backend {
    pub fn new(target: &S3Target, prefix: &str) -> S3Backend {
        S3Backend {
            s3: S3::new(target).map_err(|e| e.to_string()),
            keys: Keys::new(&target.prefix, prefix),
        }
    }

    fn s3(&self) -> Result<&S3, Error> {
        self.s3.as_ref().map_err(|e| Error::Config(e.clone()))
    }
}

impl Backend for S3Backend {
    type Lease = S3Lease;

    /// The request in flight at the end of the wait ([`WAIT_GRACE`]), and a grant's
    /// confirmation before the command starts ([`crate::keeper::confirm_bound`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        WAIT_GRACE + crate::keeper::confirm_bound(request.ttl)
    }

    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel) -> Result<S3Lease, Error> {
        acquire::acquire(self, request, cancel).await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        admin::status(self, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        admin::list(self).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        admin::force_release(self, name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        admin::check(self).await
    }
}
