//! The PostgreSQL backend: a session advisory lock on a connection of dlock's own.
//!
//! Key: `key(prefix, name)` is the first 8 bytes, big-endian, of
//! `SHA-256("dlock\0v1\0" ‖ prefix ‖ "\0" ‖ name)` as a signed 64-bit integer: one bigint
//! advisory key, stable across versions (pinned by tests), so SQL can take the same lock (see
//! the README). With `--limit N` the slots are the keys of `name ‖ "\0slot\0" ‖ i` for
//! `1 ≤ i < N` (slot 0 is the plain key) and waiters queue on a turnstile key,
//! `name ‖ "\0queue"`.
//!
//! One connection per dlock process. Session settings travel in the start-up packet (no extra
//! round trip): no statement or idle-in-transaction timeouts, `lock_timeout` = `--wait`,
//! `idle_session_timeout` = `--ttl` (14+) so the server ends a session that went silent
//! behind a live connection, server-side TCP keepalives that notice a silent client only
//! after `--ttl`, and `client_connection_check_interval` so a killed waiter leaves the
//! queue. Acquiring is one
//! pipelined round trip after connecting: the lock call (the server's own FIFO lock queue),
//! which also marks the server session as ours (`dlock.owner`) and, as the grant comes, in
//! the same statement, reads the fencing token (the server's clock in µs × 1000 plus
//! `txid_current()`: it grows across a crash without waiting for the disk, see
//! `token::TOKEN`), checks that the start-up settings arrived and labels the session in
//! `pg_stat_activity`; then a trivial statement checks that it still runs on the session our
//! mark is on (a pooler could route the statements to different server sessions, share one
//! between clients, or drop the settings). No round trip follows the grant, and no statement
//! is planned between the grant and its answer.
//!
//! `--shared` takes the same key in share mode (`pg_advisory_lock_shared`, `single`): the
//! server's lock queue lets any number of shared holders in together, none beside an
//! exclusive one, and queues a shared request behind a waiting exclusive one. Everything
//! else (claim, token, heartbeat, `status`, `release --force`) is the same for both modes;
//! `pg_locks` shows each session's mode.
//!
//! A session lock has no lease: it lives as long as the session. The
//! [`Keeper`](crate::keeper::Keeper) heartbeats at least every TTL/3 (the lock must still show up for
//! our backend; each heartbeat also restarts the server's idle count, so its deadline
//! arithmetic applies as for a lease), and the end of the connection is noticed at once;
//! either ends the hold (README: "Signals", lock loss).
//!
//! The parts: `keys` (the advisory-lock keys), `limit` (the shared `--limit` key),
//! `conn` (connecting, error classes) with `settings` (session settings, keepalives),
//! `single` (`--limit 1`) and `slots` (`--limit N`) on top of `wait` (`--wait` as
//! `lock_timeout` and a client limit, and giving up),
//! `claim` and `token` (what a grant's statements check), `lease` (the hold and its
//! heartbeat), `holders` and `admin` (what others see, and the admin commands).

mod admin;
mod claim;
mod conn;
mod holders;
mod keys;
pub mod kind;
mod lease;
mod limit;
mod pgpass;
mod settings;
mod single;
mod slots;
pub mod target;
mod tls;
mod token;
mod wait;

use std::time::Duration;

pub use keys::key;
pub use lease::PgLease;
pub use target::{PgHost, PgTarget, SslMode};

use crate::budget::Wait;
use crate::error::Error;
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};
use keys::{channel, others_key};
use limit::limit_key;

/// Bound for a cancel request and for the cancelled statement to answer.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest `application_name` the server keeps (NAMEDATALEN − 1).
const MAX_APPLICATION_NAME: usize = 63;

pub struct PgBackend {
    target: PgTarget,
    prefix: String,
    display: String,
}

impl PgBackend {
    pub fn new(target: &PgTarget, prefix: &str, display: &str) -> PgBackend {
        PgBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
        }
    }
}

impl Backend for PgBackend {
    type Lease = PgLease;

    /// After the server's time to answer: the client's own limit on a lock call
    /// [`wait::CLIENT_LIMIT`] after it, the check of a grant that came by then
    /// ([`crate::keeper::confirm_if_old`]), and giving back one that did not count
    /// ([`CANCEL_TIMEOUT`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        wait::CLIENT_LIMIT + crate::keeper::confirm_bound(request.ttl) + CANCEL_TIMEOUT
    }

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<PgLease, Error> {
        if request.mode.is_shared() && request.limit > 1 {
            // Refused with the flags (`Kind::check_shared`); the slots are exclusive keys.
            return Err(Error::Usage(format!(
                "--shared and --limit {} cannot be combined",
                request.limit
            )));
        }
        let lock_timeout = match request.budget.wait() {
            Wait::For(d) if request.limit <= 1 => Some(d),
            _ => None,
        };
        let label = format!("dlock {} wait {}", request.holder.pid, request.holder.host);
        // Nothing is queued on the server yet: a cancel during connect just drops it.
        let mut session = tokio::select! {
            session = self.connect(&label, request.ttl, lock_timeout, Some(&request.budget)) => session?,
            () = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let (granted, key) = if request.limit <= 1 {
            let key = key(&self.prefix, request.name.as_str());
            let granted = self
                .acquire_single(&mut session, request, key, &mut cancel)
                .await?;
            (granted, key)
        } else {
            self.acquire_slot(&mut session, request, &mut cancel)
                .await?
        };
        let name = request.name.as_str();
        let notify = (request.limit > 1)
            .then(|| (channel(&self.prefix, name), others_key(&self.prefix, name)));
        let limit_key = limit_key(&self.prefix, name, request.limit);
        PgLease::start(session, request, key, granted, limit_key, notify).await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let session = self.admin().await?;
        self.status_with(&session, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        self.list_locks().await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        self.release_by_force(name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        self.check_server().await
    }
}
