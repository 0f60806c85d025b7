//! The hold: a session lock has no lease, it lives as long as the session. The [`Keeper`]
//! heartbeats at least every TTL/3 (the lock must still show up for our backend; each heartbeat also
//! restarts the server's idle count, so its deadline arithmetic applies as for a lease), and
//! the end of the connection is noticed at once; either ends the hold. The holder's metadata
//! is the comment of the heartbeat statement; `--min-hold`'s finish ([`Lease::finished`])
//! replaces it and sends it at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::claim::give_back;
use super::conn::{describe, End, Session};
use super::holders::metadata_comment;
use super::token::Granted;
use super::CANCEL_TIMEOUT;
use crate::clock::BootInstant;
use crate::error::Error;
use crate::keeper::{confirm_if_old, Keeper, Renew, RenewError, Schedule};
use crate::lock::{AcquireRequest, Holder, Lease, Lost, Mode};

/// A held advisory lock on our own connection.
pub struct PgLease {
    keeper: Keeper<Renewer>,
    session: Session,
    key: i64,
    /// How `key` is held (`--shared`: in share mode).
    mode: Mode,
    /// Our [`limit_key`](super::limit::limit_key), held in shared mode.
    limit_key: i64,
    token: u64,
    /// With `--limit N > 1`: the channel to NOTIFY on release, and the others' key we hold
    /// ([`others_key`](super::keys::others_key)).
    notify: Option<(String, i64)>,
    schedule: Schedule,
    last_ack: Arc<Mutex<BootInstant>>,
    /// The heartbeat statement, shared with the renewer: its comment is what `status` shows,
    /// and [`Lease::finished`] replaces it.
    heartbeat: Arc<Mutex<String>>,
}

impl PgLease {
    /// Start keeping the lock `key` that `granted` took on `session`; a grant that may be
    /// old news is confirmed by one heartbeat first (and given back if it cannot be).
    pub(super) async fn start(
        session: Session,
        request: &AcquireRequest,
        key: i64,
        granted: Granted,
        limit_key: i64,
        notify: Option<(String, i64)>,
    ) -> Result<PgLease, Error> {
        let schedule = Schedule::new(request.ttl, request.kill_after);
        let last_ack = Arc::new(Mutex::new(granted.sent));
        let heartbeat = Arc::new(Mutex::new(heartbeat_sql(&Holder {
            token: granted.token,
            ..request.holder.clone()
        })));
        let mut renewer = Renewer {
            client: session.client.clone(),
            marker: session.marker.clone(),
            ended: session.ended.clone(),
            key,
            ttl: request.ttl,
            sql: heartbeat.clone(),
            last_ack: last_ack.clone(),
        };
        // The server ends a session that was idle for the TTL, counting from the end of its
        // last statement, which it ran after we sent it. After a prompt grant that is the
        // token statement, sent with the lock call; after a wait (or a stopped process)
        // the grant may be old news, so a heartbeat confirms the hold and restarts the count
        // ([`confirm_if_old`]).
        let since = match confirm_if_old(&mut renewer, schedule, granted.sent).await {
            Ok(since) => since,
            Err(why) => {
                give_back(&session.client, key, request.mode, &session.marker).await;
                return Err(Error::Unavailable(format!(
                    "'{}' was granted but could not be confirmed: {why}; the command was not started",
                    request.name
                )));
            }
        };
        let keeper = Keeper::start(renewer, since, request.ttl, request.kill_after);
        Ok(PgLease {
            keeper,
            session,
            key,
            mode: request.mode,
            limit_key,
            token: granted.token,
            notify,
            schedule,
            last_ack,
            heartbeat,
        })
    }
}

impl Lease for PgLease {
    fn token(&self) -> u64 {
        self.token
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Some(self.keeper.proven_until())
    }

    async fn lost(&mut self) -> Lost {
        let mut ended = self.session.ended.clone();
        // Biased: when the connection ended, that (with its deadline) is the truth, not the
        // keeper's reading of the same event.
        tokio::select! {
            biased;
            _ = ended.wait_for(Option::is_some) => {
                let end = self.session.ended.borrow().clone();
                let end = end.unwrap_or(End { reason: "connection closed".into(), server_ended: false });
                if end.server_ended {
                    Lost::gone(format!("the server ended our session, which frees the lock: {}", end.reason))
                } else {
                    // The server may keep the session until it notices the silence. A poisoned
                    // lock still holds the last value written (only ever a plain assignment):
                    // a later instant would put the deadline after the real one.
                    let last = *self.last_ack.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    self.schedule.lost_after(format!("the connection to the server broke: {}", end.reason), last)
                }
            }
            lost = self.keeper.lost() => lost,
        }
    }

    /// The metadata is the comment of our session's latest statement, which `status` shows
    /// only while that session holds the key: so the new comment goes out as a heartbeat
    /// (which says whether the key is still ours), and the renewer's heartbeats carry it
    /// from now on. A session that lost the key shows nothing of it; one that was ended
    /// cannot send.
    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        let sql = heartbeat_sql(holder);
        self.heartbeat
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone_from(&sql);
        let rows = self
            .session
            .client
            .query_typed(
                &sql,
                &[(&self.key, Type::INT8), (&self.session.marker, Type::TEXT)],
            )
            .await
            .map_err(|e| {
                Error::Unavailable(format!("cannot record the finish: {}", describe(&e)))
            })?;
        Ok(rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true))
    }

    async fn release(self) -> Result<(), Error> {
        drop(self.keeper.stop().await);
        let client = &self.session.client;
        // Bounded: after a lost hold the connection may be a black hole.
        let bound = (self.schedule.ttl / 3).min(CANCEL_TIMEOUT);
        let unlock = async {
            match &self.notify {
                Some((channel, others)) => {
                    client
                        .query_typed(
                            "SELECT pg_advisory_unlock($1), pg_notify($2, ''), \
                             set_config('dlock.owner', '', false), pg_advisory_unlock_shared($3), \
                             pg_advisory_unlock_shared($4)",
                            &[
                                (&self.key, Type::INT8),
                                (channel, Type::TEXT),
                                (&self.limit_key, Type::INT8),
                                (others, Type::INT8),
                            ],
                        )
                        .await
                }
                None => {
                    client
                        .query_typed(
                            match self.mode {
                                Mode::Exclusive => UNLOCK_SQL,
                                Mode::Shared => UNLOCK_SHARED_SQL,
                            },
                            &[(&self.key, Type::INT8), (&self.limit_key, Type::INT8)],
                        )
                        .await
                }
            }
        };
        let unlocked = tokio::time::timeout(bound, unlock).await;
        tracing::debug!(target: crate::logging::HANDOFF, "unlocked");
        let Ok(unlocked) = unlocked else {
            tracing::warn!(
                "the server did not answer the unlock; closing the session frees the lock"
            );
            return Ok(());
        };
        match unlocked {
            Ok(rows) if rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true) => {
                Ok(())
            }
            Ok(_) => {
                crate::lock::warn_gone_at_release(format_args!(
                    "the lock was no longer held by our session when it was released"
                ));
                Ok(())
            }
            // Closing the session frees the lock anyway.
            Err(e) => {
                tracing::debug!(
                    "unlock failed ({}); closing the session frees the lock",
                    describe(&e)
                );
                Ok(())
            }
        }
    }
}

/// The release of a `--limit 1` hold: our key, our mark, our recorded `--limit`.
const UNLOCK_SQL: &str = "SELECT pg_advisory_unlock($1), set_config('dlock.owner', '', false), \
                          pg_advisory_unlock_shared($2)";

/// The same for a shared hold, whose key is held in share mode too.
const UNLOCK_SHARED_SQL: &str = "SELECT pg_advisory_unlock_shared($1), \
                                 set_config('dlock.owner', '', false), pg_advisory_unlock_shared($2)";

/// Heartbeats for the [`Keeper`]: the lock must still show up for our backend.
struct Renewer {
    client: Arc<Client>,
    marker: String,
    ended: watch::Receiver<Option<End>>,
    key: i64,
    ttl: Duration,
    /// The heartbeat statement (see [`PgLease::heartbeat`]).
    sql: Arc<Mutex<String>>,
    last_ack: Arc<Mutex<BootInstant>>,
}

impl Renew for Renewer {
    async fn renew(&mut self) -> Result<Duration, RenewError> {
        let ended = self.ended.borrow().clone();
        if let Some(end) = ended {
            // A session the server ended is gone; a broken connection may still hold the
            // lock on the server until it notices, so the deadline applies.
            let reason = format!("the connection to the server ended: {}", end.reason);
            return Err(if end.server_ended {
                RenewError::Gone(reason)
            } else {
                RenewError::Failed(reason)
            });
        }
        let sql = self
            .sql
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let sent = BootInstant::now();
        match self
            .client
            .query_typed(
                &sql,
                &[(&self.key, Type::INT8), (&self.marker, Type::TEXT)],
            )
            .await
        {
            Ok(rows) if rows.first().and_then(|r| r.try_get::<_, bool>(0).ok()) == Some(true) => {
                if let Ok(mut last) = self.last_ack.lock() {
                    *last = sent;
                }
                Ok(self.ttl)
            }
            Ok(_) => Err(RenewError::Gone(
                "the advisory lock is no longer held by our session (or the session is no longer ours)".into(),
            )),
            Err(e) if e.as_db_error().is_some() => Err(RenewError::Gone(format!(
                "the heartbeat failed: {}",
                describe(&e)
            ))),
            Err(e) => Err(RenewError::Failed(describe(&e))),
        }
    }
}

/// The heartbeat: does our session still hold the key, and is it still our session?
fn heartbeat_sql(holder: &Holder) -> String {
    format!(
        "{} SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
         AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
         AND classid = (($1 >> 32) & 4294967295)::oid AND objid = ($1 & 4294967295)::oid) \
         AND coalesce(current_setting('dlock.owner', true), '') = $2",
        metadata_comment(holder)
    )
}
