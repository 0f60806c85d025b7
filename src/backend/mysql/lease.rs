//! The hold: a `GET_LOCK` lock has no lease, it lives as long as the session. The
//! [`Keeper`] heartbeats every TTL/3 (`IS_USED_LOCK(key) = CONNECTION_ID()`: the lock must
//! still be our session's), and each heartbeat restarts the server's `wait_timeout` count,
//! which ends a session that went silent for the TTL: so the keeper's deadline arithmetic
//! applies as for a lease, with the TTL the server keeps (whole seconds).
//!
//! A heartbeat that finds the lock gone (`KILL`, `release --force`, a server restart) is a
//! loss at once; one that cannot reach the server leaves the command until the deadline.
//!
//! `--min-hold`'s finish ([`Lease::finished`]) rewrites the holder's row on our connection
//! (shared with the renewer), only while the row and the lock are still ours.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::acquire::Granted;
use super::conn::{cell, Failure, Session};
use super::keys::quoted;
use super::sql::{finished_sql, server_seconds};
use super::{CANCEL_TIMEOUT, OP_TIMEOUT};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{Keeper, Renew, RenewError, Schedule};
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
}

impl MysqlLease {
    /// Start keeping the lock `granted` took on `session`; a grant that may be old news (a
    /// long round, a stopped process) is confirmed by one heartbeat first.
    pub(super) async fn start(
        session: Session,
        request: &AcquireRequest,
        granted: Granted,
    ) -> Result<MysqlLease, Error> {
        // The server counts wait_timeout in whole seconds: that is the lease we have.
        let ttl = Duration::from_secs(server_seconds(request.ttl));
        let schedule = Schedule::new(ttl, request.kill_after);
        let mut renewer = Renewer {
            heartbeat: format!(
                "SELECT IS_USED_LOCK({}) = CONNECTION_ID()",
                quoted(&granted.key)
            ),
            key: granted.key.clone(),
            session: Arc::new(Mutex::new(session)),
            ttl,
        };
        let mut since = granted.sent;
        if BootInstant::now().saturating_since(granted.sent) > schedule.attempt_timeout() {
            since = BootInstant::now();
            let confirmed = tokio::time::timeout(schedule.attempt_timeout(), renewer.renew()).await;
            let failure = match confirmed {
                Ok(Ok(_)) => {
                    tracing::debug!(target: crate::logging::HANDOFF, "confirmed");
                    None
                }
                Ok(Err(RenewError::Gone(why) | RenewError::Failed(why))) => Some(why),
                Err(_) => Some(format!(
                    "the server did not confirm it within {}",
                    humantime::format_duration(schedule.attempt_timeout())
                )),
            };
            if let Some(why) = failure {
                super::acquire::give_back(&mut *renewer.session.lock().await).await;
                return Err(Error::Unavailable(format!(
                    "'{}' was granted but could not be confirmed: {why}; the command was not started",
                    request.name
                )));
            }
        }
        let session = renewer.session.clone();
        let keeper = Keeper::start(renewer, since, ttl, request.kill_after);
        Ok(MysqlLease {
            keeper,
            token: granted.token,
            schedule,
            session,
            key: granted.key,
        })
    }
}

impl Lease for MysqlLease {
    fn token(&self) -> u64 {
        self.token
    }

    async fn lost(&mut self) -> Lost {
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

    async fn release(self) -> Result<(), Error> {
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
        // The keeper bounds the attempt; this bound only keeps a stuck call from lingering.
        match self
            .session
            .lock()
            .await
            .rows(&self.heartbeat, self.ttl)
            .await
        {
            Ok(rows) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => Ok(self.ttl),
            Ok(_) => Err(RenewError::Gone(format!(
                "the lock is no longer held by our session (IS_USED_LOCK of {} is not our connection: killed, released by force, or the server restarted)",
                self.key
            ))),
            // The server answered with an error: the session is no longer usable as ours.
            Err(f @ Failure::Driver(mysql_async::Error::Server(_))) => Err(RenewError::Gone(
                format!("the heartbeat failed: {}", f.describe()),
            )),
            Err(f) => Err(RenewError::Failed(f.describe())),
        }
    }
}
