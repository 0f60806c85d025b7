//! The hold: a `GET_LOCK` lock has no lease, it lives as long as the session. The
//! [`Keeper`] heartbeats at least every TTL/3 (`IS_USED_LOCK(key) = CONNECTION_ID()`: the lock must
//! still be our session's), and each heartbeat restarts the server's `wait_timeout` count,
//! which ends a session that went silent for the TTL: so the keeper's deadline arithmetic
//! applies as for a lease, with the TTL the server keeps (whole seconds).
//!
//! The session's end is the lock's end, and is noticed at once: a watcher on a second
//! connection waits in `GET_LOCK` for the session key that only our lock session holds
//! (`keys::session_key`), which the server grants the moment that session ends (`KILL`,
//! `release --force`); a watcher whose own connection closes (a server restart) has the
//! lock session checked at once. A heartbeat that finds the lock gone or its connection
//! closed is a loss at once, without retries; one that gets no answer leaves the command
//! until the keeper's deadline.
//!
//! `--min-hold`'s finish ([`Lease::finished`]) rewrites the holder's row on our connection
//! (shared with the renewer), only while the row and the lock are still ours.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::acquire::Granted;
use super::conn::{cell, Failure, Session};
use super::keys::quoted;
use super::sql::{finished_sql, server_seconds};
use super::{MysqlBackend, CANCEL_TIMEOUT};
use crate::error::Error;
use crate::keeper::{confirm_if_old, Keeper, Renew, RenewError, Schedule};
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{AcquireRequest, Holder, Lease, Lost};

/// A held `GET_LOCK` lock on our own connection.
pub struct MysqlLease {
    keeper: Keeper<Renewer>,
    token: u64,
    schedule: Schedule,
    /// Our connection, shared with the renewer (for [`Lease::finished`]).
    session: Arc<Mutex<Session>>,
    /// The key we hold (the slot's, for `--limit N`).
    key: String,
    /// Notices the end of our lock session at once (`watch`); `None` once it has reported.
    watcher: Option<JoinHandle<Watched>>,
}

impl MysqlLease {
    /// Start keeping the lock `granted` took on `session`; a grant that may be old news (a
    /// long wait, a stopped process) is confirmed by a heartbeat first.
    pub(super) async fn start(
        backend: MysqlBackend,
        session: Session,
        request: &AcquireRequest,
        granted: Granted,
    ) -> Result<MysqlLease, Error> {
        // The server counts wait_timeout in whole seconds: that is the lease we have.
        let ttl = Duration::from_secs(server_seconds(request.ttl));
        let schedule = Schedule::new(ttl, request.kill_after);
        let session = Arc::new(Mutex::new(session));
        // The grant's transaction ends on its own, while the command starts: nothing waits
        // for InnoDB's flush of its commit (the token's floor covers a commit that a crash
        // loses), and every later statement of the session queues behind it.
        if let Ok(mut ending) = session.clone().try_lock_owned() {
            tokio::spawn(async move {
                if let Err(f) = ending.finish(OP_TIMEOUT).await {
                    tracing::debug!("the grant's transaction did not commit: {}", f.describe());
                }
            });
        }
        let mut renewer = Renewer {
            heartbeat: format!(
                "SELECT IS_USED_LOCK({}) = CONNECTION_ID()",
                quoted(&granted.key)
            ),
            key: granted.key.clone(),
            session,
            ttl,
        };
        let since = match confirm_if_old(&mut renewer, schedule, granted.sent).await {
            Ok(since) => since,
            Err(why) => {
                super::acquire::give_back(&mut *renewer.session.lock().await).await;
                return Err(Error::Unavailable(format!(
                    "'{}' was granted but could not be confirmed: {why}; the command was not started",
                    request.name
                )));
            }
        };
        let session = renewer.session.clone();
        let watcher = tokio::spawn(watch(
            backend,
            granted.session_key,
            session.clone(),
            renewer.heartbeat.clone(),
            schedule.attempt_timeout(),
        ));
        let keeper = Keeper::start(renewer, since, ttl, request.kill_after);
        Ok(MysqlLease {
            keeper,
            token: granted.token,
            schedule,
            session,
            key: granted.key,
            watcher: Some(watcher),
        })
    }
}

/// What the watcher saw.
enum Watched {
    /// Our lock session ended (or its lock is gone): why, in words.
    Ended(String),
    /// Nothing more to see: no watcher connection, or ours broke while the lock session
    /// still answers; the keeper's heartbeats remain.
    Unwatched,
}

/// Wait on a connection of its own for `session_key`, which our lock session holds until it
/// ends: a grant means it ended. When the watcher's own connection closes instead, the lock
/// session is checked at once with `heartbeat` (a server restart closes both).
async fn watch(
    backend: MysqlBackend,
    session_key: String,
    lock_session: Arc<Mutex<Session>>,
    heartbeat: String,
    bound: Duration,
) -> Watched {
    let mut conn = match backend.connect(None).await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!("no watcher for the lock session (heartbeats only): {e}");
            return Watched::Unwatched;
        }
    };
    let sql = format!(
        "SELECT GET_LOCK({}, {})",
        quoted(&session_key),
        super::acquire::UNBOUNDED.as_secs()
    );
    // Bounded by the lock session's life: the server grants this when that session ends.
    let failure = match conn
        .rows(&sql, super::acquire::UNBOUNDED + OP_TIMEOUT)
        .await
    {
        Ok(rows) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => {
            return Watched::Ended(
                "the server ended our session (KILL, release --force, or a restart)".into(),
            )
        }
        Ok(_) => return Watched::Unwatched,
        Err(f) => f,
    };
    tracing::debug!("the watcher's connection ended: {}", failure.describe());
    let checked =
        tokio::time::timeout(bound, lock_session.lock().await.rows(&heartbeat, bound)).await;
    match checked {
        Ok(Ok(rows)) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => {
            Watched::Unwatched
        }
        Ok(Ok(_)) => Watched::Ended(gone_reason()),
        Ok(Err(f)) if f.closed() => Watched::Ended(closed_reason(&f)),
        _ => Watched::Unwatched,
    }
}

fn gone_reason() -> String {
    "the lock is no longer held by our session (killed, released by force, or the server restarted)"
        .into()
}

fn closed_reason(f: &Failure) -> String {
    format!(
        "the connection of our lock session closed, which ends the session and frees the lock ({})",
        f.describe()
    )
}

impl Lease for MysqlLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
        // Bounded: the watcher reports once, then only the keeper is left.
        for _ in 0..2 {
            let Some(watcher) = self.watcher.as_mut() else {
                break;
            };
            tokio::select! {
                biased;
                seen = watcher => {
                    self.watcher = None;
                    if let Ok(Watched::Ended(reason)) = seen {
                        return Lost::gone(reason);
                    }
                }
                lost = self.keeper.lost() => return lost,
            }
        }
        self.keeper.lost().await
    }

    /// Rewrite our row's metadata, only while the row and the lock are still ours (see
    /// [`finished_sql`]); on our own connection, between heartbeats. A connection that was
    /// killed (`release --force`) answers with an error and writes nothing.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let sql = finished_sql(&self.key, self.token, holder);
        let rows = self
            .session
            .lock()
            .await
            .rows(&sql, OP_TIMEOUT)
            .await
            .map_err(|f| {
                Error::Unavailable(format!("cannot record the finish: {}", f.describe()))
            })?;
        Ok(rows.first().and_then(|r| cell::<i64>(r, 0)).unwrap_or(0) > 0)
    }

    async fn release(mut self) -> Result<(), Error> {
        if let Some(watcher) = self.watcher.take() {
            // Its connection closes; the server drops its wait within a second, or grants
            // it the session key when our session ends, and then drops it.
            watcher.abort();
        }
        let Some(renewer) = self.keeper.stop().await else {
            return Ok(());
        };
        // Bounded: after a lost hold the connection may be a black hole.
        let bound = (self.schedule.ttl / 3).min(CANCEL_TIMEOUT);
        let sql = format!("SELECT RELEASE_LOCK({})", quoted(&renewer.key));
        let unlocked = renewer.session.lock().await.rows(&sql, bound).await;
        tracing::debug!(target: crate::logging::HANDOFF, "unlocked");
        match unlocked {
            Ok(rows) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => {}
            Ok(_) => crate::lock::warn_gone_at_release(format_args!(
                "the lock was no longer held by our session when it was released"
            )),
            // Closing the session frees the lock anyway.
            Err(f) => tracing::debug!(
                "unlock failed ({}); closing the session frees the lock",
                f.describe()
            ),
        }
        Ok(())
    }
}

/// Heartbeats for the [`Keeper`]: the lock must still be our session's.
struct Renewer {
    session: Arc<Mutex<Session>>,
    key: String,
    heartbeat: String,
    ttl: Duration,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        // The keeper bounds the attempt by dropping it; the statement goes on in a task of its
        // own, so its answer is still read (the next statement waits for it) and the
        // connection stays in step. Its own bound, the TTL, is past the keeper's give-up.
        let session = self.session.clone();
        let heartbeat = self.heartbeat.clone();
        let ttl = self.ttl;
        let sent = tokio::spawn(async move { session.lock().await.rows(&heartbeat, ttl).await });
        let answer = match sent.await {
            Ok(answer) => answer,
            Err(e) => return Err(RenewError::Failed(format!("the heartbeat task ended: {e}"))),
        };
        match answer {
            Ok(rows) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => Ok(self.ttl),
            Ok(_) => Err(RenewError::Gone(gone_reason())),
            // The lock does not outlive its session's connection.
            Err(f) if f.closed() => Err(RenewError::Gone(closed_reason(&f))),
            // The server answered with an error: the session is no longer usable as ours.
            Err(f @ Failure::Driver(mysql_async::Error::Server(_))) => Err(RenewError::Gone(
                format!("the heartbeat failed: {}", f.describe()),
            )),
            Err(f) => Err(RenewError::Failed(f.describe())),
        }
    }
}
