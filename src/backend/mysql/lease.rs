//! The hold: a `GET_LOCK` lock has no lease, it lives as long as the session. The
//! [`Keeper`] heartbeats at least every TTL/3 (`IS_USED_LOCK(key) = CONNECTION_ID()`: the lock must
//! still be our session's), and each heartbeat restarts the server's `wait_timeout` count,
//! which ends a session that went silent for the TTL: so the keeper's deadline arithmetic
//! applies as for a lease, with the TTL the server keeps (whole seconds).
//!
//! The session's end is the lock's end, and is noticed at once: a watcher on a second
//! connection waits in `GET_LOCK` for the session key that only our lock session holds
//! (`keys::session_key`), which the server grants the moment that session ends (`KILL`,
//! `release --force`). A watcher that cannot connect, or whose own connection fails (a
//! server restart, a failover, `KILL USER`: both connections end, in either order), has the
//! lock session checked at once: unless that proves the lock ours within the keeper's
//! margin it is lost, and if it does, the watcher connects again and waits anew. A
//! heartbeat that finds the lock gone or its connection closed is a loss at once, without
//! retries; one that gets no answer leaves the command until the keeper's deadline.
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
use crate::clock::BootInstant;
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
            schedule.margin(),
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
    /// Our lock session ended (or its lock is gone, or it could not be proved alive when
    /// the watcher lost its connection): why, in words.
    Ended(String),
    /// Nothing more to see: the server refuses the watcher's connection for good (a
    /// privilege, a setting) while the lock session answers; the keeper's heartbeats remain.
    Unwatched,
}

/// The first pause before the watcher connects again after its connection failed twice in a
/// row (the first reconnection is immediate), and the longest (doubling in between): a
/// server that refuses new connections while the lock session answers is not hammered, and
/// the lock session is checked before each try.
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(1);

/// Wait on a connection of its own for `session_key`, which our lock session holds until it
/// ends: a grant means it ended. A watcher that cannot connect, or whose connection fails,
/// may have lost it with the lock session (a failover, `KILL USER`, a network cut end both,
/// not always in the same order): the lock session is checked at once with `heartbeat`,
/// and unless that proves it alive within the keeper's margin the lock counts as lost; a
/// session that is alive is watched again from a new connection, whose wait is granted at
/// once if the session ended in between.
async fn watch(
    backend: MysqlBackend,
    session_key: String,
    lock_session: Arc<Mutex<Session>>,
    heartbeat: String,
    margin: Duration,
) -> Watched {
    let sql = format!(
        "SELECT GET_LOCK({}, {})",
        quoted(&session_key),
        super::acquire::UNBOUNDED.as_secs()
    );
    let mut pause = Duration::ZERO;
    // Bounded: each round ends in a report, or waits (in the server, or a pause that grows
    // to WATCH_RETRY_MAX) before the next; the lease's release aborts the task.
    for _ in 0..u32::MAX {
        // A slow connection is no sign of a lost session (a busy machine or server): it gets
        // the connect timeout, and a session that ended meanwhile has the wait granted at once.
        let failure = match backend.connect(None).await {
            Err(e) => {
                let retry = matches!(e, Error::Unavailable(_) | Error::Capacity(_));
                let why = format!("the watcher cannot connect: {e}");
                if let Some(ended) = check(&lock_session, &heartbeat, margin, &why).await {
                    return ended;
                }
                if !retry {
                    tracing::debug!("no watcher for the lock session (heartbeats only): {e}");
                    return Watched::Unwatched;
                }
                why
            }
            Ok(mut conn) => {
                let since = BootInstant::now();
                // Bounded by the lock session's life: the server grants this when that
                // session ends.
                let waited = conn
                    .rows(&sql, super::acquire::UNBOUNDED + OP_TIMEOUT)
                    .await;
                if BootInstant::now().saturating_since(since) > WATCH_RETRY_MAX {
                    pause = Duration::ZERO;
                }
                let why = match waited {
                    Ok(rows) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => {
                        return Watched::Ended(
                            "the server ended our session (KILL, release --force, or a restart)"
                                .into(),
                        )
                    }
                    Ok(_) => "the watcher's wait ended without a grant".to_owned(),
                    Err(f) => format!("the watcher's connection failed: {}", f.describe()),
                };
                if let Some(ended) = check(&lock_session, &heartbeat, margin, &why).await {
                    return ended;
                }
                why
            }
        };
        tracing::debug!("{failure}; the lock session answers, watching it again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).clamp(WATCH_RETRY_FIRST, WATCH_RETRY_MAX);
    }
    Watched::Unwatched
}

/// The check of the lock session after the watcher failed (`why`): `None` when `heartbeat`
/// proves the lock still ours within `margin` (the wait for the connection included),
/// otherwise the end to report.
async fn check(
    lock_session: &Mutex<Session>,
    heartbeat: &str,
    margin: Duration,
    why: &str,
) -> Option<Watched> {
    let checked = tokio::time::timeout(margin, async {
        lock_session.lock().await.rows(heartbeat, margin).await
    })
    .await;
    match checked {
        Ok(Ok(rows)) if rows.first().and_then(|r| cell::<i64>(r, 0)) == Some(1) => None,
        Ok(Ok(_)) => Some(Watched::Ended(gone_reason())),
        Ok(Err(f)) if f.closed() => Some(Watched::Ended(closed_reason(&f))),
        Ok(Err(f)) => Some(Watched::Ended(format!(
            "{why}, and the lock session failed to answer ({}): the server may have ended both",
            f.describe()
        ))),
        Err(_) => Some(Watched::Ended(format!(
            "{why}, and the lock session did not answer within {}: the server may have ended both",
            humantime::format_duration(margin)
        ))),
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

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
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
