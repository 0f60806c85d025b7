//! The MySQL / MariaDB backend: `GET_LOCK` on a connection of dlock's own.
//!
//! Keys: a lock name never reaches the server as it is (MySQL limits lock names to 64
//! characters and folds their case, MariaDB does not): `keys::key` maps it to `dlock:` and 40
//! hex digits of a SHA-256, the same on both, stable across versions (pinned by tests), so
//! SQL can take the same lock (README). With `--limit N` the slots are the keys of
//! `name ‖ "\0slot\0" ‖ i` for `1 ≤ i < N` (slot 0 is the plain key) and waiters queue on a
//! turnstile key, `name ‖ "\0queue"`.
//!
//! One connection per waiting dlock process, and one round trip after connecting on the
//! uncontended path (`sql`): the session settings (`wait_timeout` = `interactive_timeout`
//! = `--ttl`, so the server ends a silent holder's session and frees its lock), the
//! `--limit` check, the `GET_LOCK` call, and, only if it granted, the fencing token (a
//! per-name InnoDB counter bumped with `LAST_INSERT_ID(GREATEST(token + 1, clock))`, the
//! server's clock in µs as its floor), the holder's row in the table `dlock_locks`
//! (readable name and metadata, for `status` and `list`), and the session key the lease's
//! watcher waits for. The transaction is committed with the session's next statement, which
//! the lease sends while the command starts: no reply waits for InnoDB's flush, and the
//! floor keeps tokens increasing when a crash loses the commit. The same reply says whether the server is
//! read-only (refused: 78) and which connection id the statements ran on (a proxy that
//! multiplexes sessions answers with another: 78).
//!
//! Waiting happens in the server, in one `GET_LOCK` call for the whole wait (`acquire`), so
//! waiters are served in arrival order; a signal ends it with `KILL QUERY`, and a waiter
//! whose connection closes connects again. The hold has no lease of its own: the
//! [`Keeper`](crate::keeper::Keeper) heartbeats at least every TTL/3 (`lease`), each heartbeat
//! restarting the server's idle count, so its deadline arithmetic applies; a watcher on a
//! second connection notices the end of the lock session at once.
//!
//! The parts: `target` (the URL), `conn` (connecting, TLS, bounded statements, error
//! classes), `keys`, `sql` (the statements), `acquire` (waiting, slots, refusals), `lease`
//! (the hold and its heartbeat), `admin` (`status`, `list`, `release --force`, `check`).

mod acquire;
mod admin;
mod conn;
pub mod keys;
pub mod kind;
mod lease;
mod sql;
pub mod target;

use std::time::Duration;

pub use lease::MysqlLease;
pub use target::{MysqlHost, MysqlTarget, SslMode};

use crate::error::Error;
// The bound of one statement, for this module's children (`super::OP_TIMEOUT`).
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus};

/// Bound for giving back, ending a waiting call, and the unlock at release.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct MysqlBackend {
    target: MysqlTarget,
    prefix: String,
    display: String,
}

impl MysqlBackend {
    pub fn new(target: &MysqlTarget, prefix: &str, display: &str) -> MysqlBackend {
        MysqlBackend {
            target: target.clone(),
            prefix: prefix.to_owned(),
            display: display.to_owned(),
        }
    }
}

impl Backend for MysqlBackend {
    type Lease = MysqlLease;

    /// Connecting and the lock call get `--wait` and [`conn::WAIT_GRACE`] (the lock call's
    /// timeout is in whole seconds: up to a second more), then a grant that came by then is
    /// checked ([`crate::keeper::confirm_if_old`]) on the server's whole-second TTL, at most ours,
    /// and one that did not count is given back ([`CANCEL_TIMEOUT`]).
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        conn::WAIT_GRACE + crate::keeper::confirm_bound(request.ttl) + CANCEL_TIMEOUT
    }

    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<MysqlLease, Error> {
        // Nothing is queued on the server yet: a cancel during connect just drops it.
        let mut session = tokio::select! {
            session = self.connect(request.budget.left()) => session?,
            () = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let granted = self.take(&mut session, request, &mut cancel).await?;
        MysqlLease::start(self.clone(), session, request, granted).await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        let mut session = self.admin().await?;
        self.status_on(&mut session, name).await
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
